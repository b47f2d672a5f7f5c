package modelproxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/infra/park"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// BenchmarkParticipantCallPath drives the participant's hooks as every
// captured call meets them (admit, describe, deliver, settle, unregister)
// from many goroutines at once, each allocating a reply's worth between
// the hooks as a handler does, so collections pause some goroutines while
// they hold a lock, as in a fleet.
func BenchmarkParticipantCallPath(b *testing.B) {
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Upstream.BaseURL = "http://127.0.0.1:1/v1"
	cfg.Capture.Dir = b.TempDir()
	cfg.Checkpoint = ctlplanetest.Config()
	s, err := New(cfg, Deps{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	p := s.ckpt
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	var next atomic.Int64
	var sink atomic.Pointer[[]byte]
	b.SetParallelism(1000)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := rollout.EpisodeID{RolloutID: "rollout-" + strconv.FormatInt(next.Add(1)%100_000, 10)}
			t := &ticket{callID: newCallID(), route: "chat", admittedAt: time.Now(), captureKey: id.CaptureKey(), episode: id}
			r, err := p.admit(req, t)
			if err != nil {
				b.Error(err)
				return
			}
			work := make([]byte, 4<<10)
			sink.Store(&work)
			p.describe(t, "digest", false, false)
			park.Run(func(task *park.Task) {
				p.deliver(task, r.Context(), t, func(error) {})
			})
			work = make([]byte, 4<<10)
			sink.Store(&work)
			p.settle(t, true)
			p.unregister(t)
		}
	})
}
