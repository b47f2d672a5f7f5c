package modelproxy_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// benchModel is a model server at scale, as a commit finds it when every
// rollout is held at its second model call: one ledger row per capture key
// (the first call, delivered) and one undelivered call per key, held at
// delivery because admission is closed.
type benchModel struct {
	srv  *modelproxy.Server
	p    ctlplane.Participant
	stop context.CancelFunc
	wg   sync.WaitGroup
	// release closes the server (once) and lets it be collected.
	release func()
}

// benchWeatherCall is the first Responses call of weather rollout i.
func benchWeatherCall(i int) string {
	return fmt.Sprintf(`{"model":"policy","instructions":"You are a weather assistant. Use the get_weather tool, then answer in one short sentence.","input":[{"role":"user","content":"What is the weather in City-%d today?"}],"max_output_tokens":20,"metadata":{"fake_script":"{\"final_text\":\"The weather in City-%d is sunny, with a light breeze from the west and clear skies all afternoon.\"}"}}`, i, i)
}

// benchCallOrder is the order in which newBenchModel delivers the first
// calls of n episodes (positions in its ids): the first, then the others
// shuffled, as in a fleet, where the first calls finish in no particular
// order and the ledger holds their rows in that order, not the scope's.
func benchCallOrder(n int) []int {
	order := []int{0}
	for _, i := range rand.New(rand.NewPCG(1, 2)).Perm(max(n-1, 0)) {
		order = append(order, i+1)
	}
	return order
}

// newBenchModel builds a model server whose upstream is a fake inference
// worker served in process. Given episodes, it plays the scale scenario
// (see benchModel), the first calls finishing in a random order; without,
// it is a fresh process for a restore.
//
// The first call of ids[0] goes through the server's router and the
// worker, which makes a realistic ledger row (about 60 prompt and 20
// generated token ids with log-probs); every other call takes the same
// tokens through the participant's call path directly
// (modelproxy.RunCompletedCall), since 200,000 calls through HTTP handlers
// and conversion would dominate the setup.
func newBenchModel(b testing.TB, ids []rollout.EpisodeID) *benchModel {
	b.Helper()
	wcfg := fakeinference.DefaultConfig()
	wcfg.TokensPerSecond, wcfg.MinCallSeconds = 0, 0
	worker, err := fakeinference.New(wcfg, fakeinference.Deps{})
	if err != nil {
		b.Fatal(err)
	}
	cfg := modelproxy.DefaultConfig()
	cfg.Upstream.BaseURL = "http://worker.invalid/v1"
	cfg.Capture.Dir = b.TempDir()
	cfg.Checkpoint = ctlplanetest.Config()
	srv, err := modelproxy.New(cfg, modelproxy.Deps{Upstream: ctlplanetest.HandlerClient(worker.Handler())})
	if err != nil {
		b.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	m := &benchModel{srv: srv, p: modelproxy.CheckpointParticipant(srv), stop: stop}
	m.release = ctlplanetest.BenchOwn(b, m.close)
	if len(ids) == 0 {
		return m
	}

	r := httptest.NewRequestWithContext(ctx, http.MethodPost, rollout.Path(ids[0], "/v1/responses"), strings.NewReader(benchWeatherCall(0)))
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	srv.Handler().ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		b.Fatalf("first call of %s: %d %s", ids[0], w.Code, w.Body)
	}
	rows, err := srv.Ledger().Rows(ids[0].CaptureKey())
	if err != nil || len(rows) != 1 {
		b.Fatalf("ledger of %s: %d rows, %v", ids[0], len(rows), err)
	}
	row := rows[0]
	call := func(i int) modelproxy.CompletedCall {
		digest := sha256.Sum256(fmt.Appendf(nil, "%s %d", row.RequestDigest, i))
		return modelproxy.CompletedCall{
			Model: row.Model, RequestDigest: hex.EncodeToString(digest[:]), FinishReason: row.FinishReason,
			Tokens: openai.TokenFields{PromptTokenIDs: row.PromptTokenIDs, GenerationTokenIDs: row.GenerationTokenIDs, GenerationLogProbs: row.GenerationLogProbs},
		}
	}
	for _, i := range benchCallOrder(len(ids))[1:] {
		if err := modelproxy.RunCompletedCall(ctx, srv, ids[i], call(i)); err != nil {
			b.Fatal(err)
		}
	}

	if err := m.p.CloseAdmission(ctx); err != nil {
		b.Fatal(err)
	}
	for i, id := range ids {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			_ = modelproxy.RunCompletedCall(ctx, srv, id, call(len(ids)+i))
		}()
	}
	deadline := time.Now().Add(time.Minute)
	for modelproxy.HeldCalls(srv) < len(ids) {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d second calls held after a minute", modelproxy.HeldCalls(srv), len(ids))
		}
		<-time.After(10 * time.Millisecond)
	}
	return m
}

// close ends the held calls and closes the server.
func (m *benchModel) close() {
	m.stop()
	m.wg.Wait()
	_ = m.srv.Close(context.Background())
}

// BenchmarkExport measures the model server's export: per episode, its
// ledger rows read back from the capture log, written through the
// checkpoint store.
func BenchmarkExport(b *testing.B) {
	for _, size := range ctlplanetest.BenchSizes() {
		b.Run(size.Name, func(b *testing.B) {
			ids := ctlplanetest.EpisodeIDs(size.Episodes)
			m := newBenchModel(b, ids)
			ctlplanetest.BenchExport(b, m.p.Kind(), m.p.Instance(), ctlplane.NewScope(ids), size.Episodes, m.p.Export)
		})
	}
}

// BenchmarkInstall measures the model server's restore: read the records
// back, import every episode's rows under its next attempt and retire the
// source attempts' ledgers, in a fresh server.
func BenchmarkInstall(b *testing.B) {
	for _, size := range ctlplanetest.BenchSizes() {
		b.Run(size.Name, func(b *testing.B) {
			ids := ctlplanetest.EpisodeIDs(size.Episodes)
			scope := ctlplane.NewScope(ids)
			src := newBenchModel(b, ids)
			target := ctlplanetest.BenchTarget(b, src.p.Kind(), src.p.Instance())
			if _, err := ctlplanetest.WriteCheckpoint(context.Background(), target, scope, src.p.Export); err != nil {
				b.Fatal(err)
			}
			// A restore runs in a fresh process: nothing of the source stays.
			src.release()
			ctlplanetest.BenchInstall(b, target, scope, size.Episodes, func() (ctlplanetest.InstallFunc, func()) {
				m := newBenchModel(b, nil)
				if err := m.p.CloseAdmission(context.Background()); err != nil {
					b.Fatal(err)
				}
				return m.p.Install, m.release
			})
		})
	}
}
