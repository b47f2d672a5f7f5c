package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Scenario 13: many concurrent rollouts of both tasks, checkpointed at a
// random point, crashed and restored: every one finishes exactly once with
// reward 1.0, and no delivered model call is repeated (each continued
// rollout's ledger holds exactly the calls its episode needs, in one chain).
// GYMFLEET_E2E_SEED picks the seed; it is printed either way.
func TestScenario13_ManyRolloutsCheckpointedAtARandomPoint(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("GYMFLEET_E2E_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (rerun with GYMFLEET_E2E_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	// Every model call takes at least 150 ms, so a rollout of n calls is in
	// flight for at least n×150 ms: with the checkpoint 100–800 ms in, some
	// rollouts have finished, some are in each stage, and the
	// five-increment counters (6 calls) are always in flight.
	f := startFleet(t, func(tp *fleet.Topology) {
		tp.TokensPerSecond, tp.MinCallSeconds, tp.LogLevel = 100, 0.15, "info"
	})

	type rowSpec struct {
		row    map[string]any
		needed int // model calls the episode needs
	}
	var specs []rowSpec
	for i := 0; i < 32; i++ {
		route := []string{"weather_agent", "weather_agent_legacy"}[i%2]
		specs = append(specs, rowSpec{weatherRow(fmt.Sprintf("w%02d", i), route, fmt.Sprintf("City%d", i)), 2})
	}
	for i := 0; i < 32; i++ {
		route := []string{"counter_agent", "counter_agent_legacy"}[i%2]
		incs := []int{1, 2, 3, 4, 5}[:1+i%5]
		specs = append(specs, rowSpec{counterRow(fmt.Sprintf("c%02d", i), route, i, incs...), len(incs) + 1})
	}
	runs := make([]*Run, len(specs))
	for i, s := range specs {
		runs[i] = f.Start(s.row)
	}
	<-time.After(time.Duration(100+rng.IntN(700)) * time.Millisecond)

	// The checkpoint: the scope is every /run not yet replied.
	c := f.Coord()
	var scope []rollout.EpisodeID
	for i, r := range runs {
		if !r.Replied() {
			scope = append(scope, ep(specs[i].row[rollout.FieldRolloutID].(string), 0))
		}
	}
	_, cm := f.Checkpoint(c, "c1", scope...)
	continued := map[string]bool{}
	for _, k := range cm.ExportedBy("env") {
		continued[k] = true
	}
	f.Crash()
	t.Logf("%d rollouts in scope, %d continued by the environment", len(scope), len(continued))
	if len(continued) == 0 {
		t.Fatal("no rollout was continued: the checkpoint came too late to test anything")
	}

	finished := map[string]int{}
	var restarts []rollout.EpisodeID
	var contIDs []rollout.EpisodeID
	for i, r := range runs {
		id := specs[i].row[rollout.FieldRolloutID].(string)
		rep := r.Wait(t, 30*time.Second)
		switch {
		case rep.Err == nil && rep.Status == http.StatusOK:
			if continued[id] {
				t.Fatalf("%s replied and was exported: it would be written twice", id)
			}
			if rep.Reward() != 1.0 {
				t.Fatalf("%s finished with reward %v", id, rep.Reward())
			}
			finished[id]++
		case continued[id]:
			contIDs = append(contIDs, ep(id, 0))
		default:
			// Cut off by the crash without a record: start it over.
			restarts = append(restarts, ep(id, 0))
		}
	}
	f.Restart()
	c = f.Coord()
	if _, err := c.Restore(context.Background(), "c1", f.Dir("c1"), contIDs, deadline(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	f.Resume(c, "c1")
	if len(restarts) > 0 {
		if err := c.Retire(context.Background(), "", restarts, deadline(30*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	var second []*Run
	var secondSpecs []rowSpec
	for i, s := range specs {
		id := s.row[rollout.FieldRolloutID].(string)
		if finished[id] > 0 {
			continue
		}
		second = append(second, f.Start(withAttempt(s.row, 1)))
		secondSpecs = append(secondSpecs, specs[i])
	}
	for i, r := range second {
		id := secondSpecs[i].row[rollout.FieldRolloutID].(string)
		rep := r.Wait(t, 2*time.Minute)
		assertReward(t, rep, 1.0)
		finished[id]++
	}
	for _, s := range specs {
		id := s.row[rollout.FieldRolloutID].(string)
		if finished[id] != 1 {
			t.Fatalf("%s finished %d times, want exactly once", id, finished[id])
		}
	}
	for _, id := range contIDs {
		var need int
		for _, s := range specs {
			if s.row[rollout.FieldRolloutID] == id.RolloutID {
				need = s.needed
			}
		}
		rows := f.ledger(id.Next().CaptureKey())
		if len(rows) != need {
			t.Fatalf("%s: %d ledger rows, want %d (a delivered call was repeated or lost): %v", id.Next(), len(rows), need, rows)
		}
		for k := 1; k < len(rows); k++ {
			if rows[k]["parent_call_id"] != rows[k-1]["call_id"] {
				t.Fatalf("%s: broken lineage at row %d", id.Next(), k)
			}
		}
	}
	t.Logf("finished before the checkpoint %d, continued %d, restarted %d", len(specs)-len(second), len(contIDs), len(restarts))
}
