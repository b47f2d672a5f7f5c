package resources_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/servers/resources"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// newBenchServer is a weather server (stateless checkpoints) with
// checkpointing on, not listening: requests go to its handler.
func newBenchServer(b *testing.B) *resources.Server {
	b.Helper()
	cfg := resources.DefaultConfig()
	cfg.Checkpoint = ctlplanetest.Config()
	s, err := resources.New(cfg, resources.Deps{})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

func closeBenchServer(b *testing.B, s *resources.Server) {
	if err := s.Close(context.Background()); err != nil {
		b.Error(err)
	}
}

// seedWeatherSessions seeds one session per episode through the server's
// router, as the environment's seed stage does (the /ng-rollout prefix and
// a caller-assigned session id), and then closes admission as a prepare
// does.
func seedWeatherSessions(b *testing.B, s *resources.Server, ids []rollout.EpisodeID) ctlplane.Participant {
	b.Helper()
	h := s.Handler()
	for i, id := range ids {
		row := fmt.Sprintf(`{"responses_create_params":{"input":[{"role":"user","content":"What is the weather in City-%d? Use the tool."}]},"agent_ref":{"name":"simple_agent"},"_ng_rollout_id":%q}`, i, id.RolloutID)
		r := httptest.NewRequest(http.MethodPost, rollout.Path(id, "/seed_session"), strings.NewReader(row))
		r.Header.Set(resources.SessionHeader, fmt.Sprintf("resources-session-%032x", i))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			b.Fatalf("seed %s: %d %s", id, w.Code, w.Body)
		}
	}
	p := resources.Participant(s)
	if err := p.CloseAdmission(context.Background()); err != nil {
		b.Fatal(err)
	}
	return p
}

// BenchmarkExport measures a weather server's export: one stateless
// session record per episode, written through the checkpoint store.
func BenchmarkExport(b *testing.B) {
	for _, size := range ctlplanetest.BenchSizes() {
		b.Run(size.Name, func(b *testing.B) {
			s := newBenchServer(b)
			defer closeBenchServer(b, s)
			ids := ctlplanetest.EpisodeIDs(size.Episodes)
			p := seedWeatherSessions(b, s, ids)
			ctlplanetest.BenchExport(b, p.Kind(), p.Instance(), ctlplane.NewScope(ids), size.Episodes, p.Export)
		})
	}
}

// BenchmarkInstall measures a weather server's restore: read the records
// back and install every session, bound to the next attempt, in a fresh
// server.
func BenchmarkInstall(b *testing.B) {
	for _, size := range ctlplanetest.BenchSizes() {
		b.Run(size.Name, func(b *testing.B) {
			ids := ctlplanetest.EpisodeIDs(size.Episodes)
			scope := ctlplane.NewScope(ids)
			src := newBenchServer(b)
			p := seedWeatherSessions(b, src, ids)
			target := ctlplanetest.BenchTarget(b, p.Kind(), p.Instance())
			if _, err := ctlplanetest.WriteCheckpoint(context.Background(), target, scope, p.Export); err != nil {
				b.Fatal(err)
			}
			// A restore runs in a fresh process: nothing of the source stays.
			closeBenchServer(b, src)
			ctlplanetest.BenchInstall(b, target, scope, size.Episodes, func() (ctlplanetest.InstallFunc, func()) {
				s := newBenchServer(b)
				fresh := resources.Participant(s)
				if err := fresh.CloseAdmission(context.Background()); err != nil {
					b.Fatal(err)
				}
				return fresh.Install, func() { closeBenchServer(b, s) }
			})
		})
	}
}
