package episode_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/episode"
	"github.com/gymfleet/gymfleet/pkg/servers/environment"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// benchFleet is an environment's tracker at scale: every episode is a
// weather rollout inside its invoke_agent stage (a replay step), standing
// at the boundary {next: invoke_agent, handles}, with admission closed as
// a commit finds it. Each episode's step runs on its own goroutine, as
// /run does.
type benchFleet struct {
	tracker *episode.Tracker
	ids     []rollout.EpisodeID
	scope   ctlplane.Scope
	stop    context.CancelFunc
	wg      sync.WaitGroup
	// release ends the episodes (once) and lets the fleet be collected.
	release func()
}

// weatherTask is the row a weather rollout runs (without its _ng_ fields),
// as the environment digests it.
func weatherTask(i int) map[string]any {
	return map[string]any{
		"agent_ref": map[string]any{"name": "simple_agent"},
		"responses_create_params": map[string]any{
			"input": []any{map[string]any{"role": "user", "content": fmt.Sprintf("What is the weather in City-%d? Use the tool.", i)}},
			"tools": []any{map[string]any{
				"type": "function", "name": "get_weather", "description": "Get the current weather of a city.", "strict": true,
				"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []any{"city"}, "additionalProperties": false},
			}},
		},
	}
}

func newBenchFleet(b *testing.B, n int) *benchFleet {
	b.Helper()
	ctx, stop := context.WithCancel(context.Background())
	f := &benchFleet{tracker: episode.NewTracker(), ids: ctlplanetest.EpisodeIDs(n), stop: stop}
	f.release = ctlplanetest.BenchOwn(b, f.close)
	var inStep sync.WaitGroup
	for i, id := range f.ids {
		digest, err := episode.TaskDigest(weatherTask(i))
		if err != nil {
			b.Fatal(err)
		}
		ep, _, err := f.tracker.Begin(id, digest, stop)
		if err != nil {
			b.Fatal(err)
		}
		bd := environment.Boundary{Next: environment.StageInvokeAgent, Handles: environment.Handles{
			ResourcesSessionID: fmt.Sprintf("resources-session-%032x", i),
			AgentSessionID:     fmt.Sprintf("agent-session-%032x", i),
			ResourcesVerify:    environment.ModeReplay,
		}}
		if err := ep.Boundary(ctx, bd); err != nil {
			b.Fatal(err)
		}
		inStep.Add(1)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer ep.End()
			_ = ep.Step(ctx, episode.Replay, func(ctx context.Context) error {
				inStep.Done()
				<-ctx.Done()
				return ctx.Err()
			})
		}()
	}
	inStep.Wait()
	f.tracker.CloseAdmission()
	f.scope = ctlplane.NewScope(f.ids)
	return f
}

func (f *benchFleet) close() {
	f.stop()
	f.wg.Wait()
}

func (f *benchFleet) export(_ context.Context, scope ctlplane.Scope, emit func(ctlplane.Record) error) (ctlplane.Extras, error) {
	return ctlplane.Extras{}, f.tracker.Export(scope, emit)
}

// BenchmarkExport measures the environment participant's export: one
// record per episode, written through the checkpoint store.
func BenchmarkExport(b *testing.B) {
	for _, size := range ctlplanetest.BenchSizes() {
		b.Run(size.Name, func(b *testing.B) {
			f := newBenchFleet(b, size.Episodes)
			ctlplanetest.BenchExport(b, ctlplane.KindEnvironment, "env", f.scope, size.Episodes, f.export)
		})
	}
}

// BenchmarkInstall measures the environment participant's restore: read
// the records back and install them as pending continuations in a fresh
// tracker.
func BenchmarkInstall(b *testing.B) {
	for _, size := range ctlplanetest.BenchSizes() {
		b.Run(size.Name, func(b *testing.B) {
			f := newBenchFleet(b, size.Episodes)
			target := ctlplanetest.BenchTarget(b, ctlplane.KindEnvironment, "env")
			if _, err := ctlplanetest.WriteCheckpoint(context.Background(), target, f.scope, f.export); err != nil {
				b.Fatal(err)
			}
			// A restore runs in a fresh process: nothing of the source stays.
			scope := f.scope
			f.release()
			ctlplanetest.BenchInstall(b, target, scope, size.Episodes, func() (ctlplanetest.InstallFunc, func()) {
				tr := episode.NewTracker()
				tr.CloseAdmission()
				return func(_ context.Context, recs []ctlplane.Record, _ ctlplane.Scope, _ ctlplane.Extras) ([]rollout.EpisodeID, error) {
					return tr.Install(recs)
				}, func() {}
			})
		})
	}
}
