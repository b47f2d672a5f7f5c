package fakeinference

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// BenchmarkGenerationCut is the worker's side of a bench-scale prepare's
// cut round: an inventory of 100,000 calls, all held (so each is answered
// with a durable_failure), parsed, looked up and answered.
func BenchmarkGenerationCut(b *testing.B) {
	const n = 100000
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.ControlAuthToken = "token"
	s, err := New(cfg, Deps{})
	if err != nil {
		b.Fatal(err)
	}
	ps := make([]gencut.ActivePrefix, n)
	now := time.Now()
	for i := range ps {
		sum := sha256.Sum256(fmt.Appendf(nil, "call-%d", i))
		id := hex.EncodeToString(sum[:16])
		ep := &rollout.EpisodeID{RolloutID: fmt.Sprintf("w%06d", i), Attempt: i % 2}
		s.byID[id] = &call{id: id, episode: ep, status: StatusHeld, receivedAt: now}
		ps[i] = gencut.ActivePrefix{TicketID: id, RolloutID: ep.RolloutID, Attempt: ep.Attempt, ModelCallID: id, AdmittedAt: 1765000000 + float64(i)/1e6}
	}
	body, err := gencut.BuildInventory("ckpt-1", "policy_model", ps).Body()
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		b.StopTimer()
		s.cuts = nil
		runtime.GC()
		runtime.GC()
		req := httptest.NewRequest(http.MethodPost, gencut.Path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer token")
		b.StartTimer()
		if _, err := s.handleGenerationCut(req); err != nil {
			b.Fatal(err)
		}
	}
}
