package e2e

import (
	"sync"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
)

// TestFleet_RunsRolloutsAndSurvivesAKill runs both tasks through both
// protocols on real processes, kills the whole fleet with SIGKILL, starts
// fresh processes and runs again.
func TestFleet_RunsRolloutsAndSurvivesAKill(t *testing.T) {
	f := startFleet(t, func(tp *fleet.Topology) { tp.GenerationCuts = false })
	runAll := func(prefix string) {
		var wg sync.WaitGroup
		rows := []map[string]any{
			weatherRow(prefix+"-w1", "weather_agent", "Paris"),
			weatherRow(prefix+"-w2", "weather_agent_legacy", "Oslo"),
			counterRow(prefix+"-c1", "counter_agent", 3, 1, 2),
			counterRow(prefix+"-c2", "counter_agent_legacy", 0, 5),
		}
		wants := []int{2, 2, 3, 2}
		for i, row := range rows {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rep := f.RunOK(row)
				if rep.Reward() != 1.0 {
					t.Errorf("%v: reward %v, want 1.0: %v", row["_ng_rollout_id"], rep.Reward(), rep.Body)
				}
				id := row["_ng_rollout_id"].(string)
				if got := len(f.Calls(id)); got != wants[i] {
					t.Errorf("%s made %d model calls, want %d", id, got, wants[i])
				}
			}()
		}
		wg.Wait()
	}
	runAll("before")
	f.Crash()
	f.Restart()
	runAll("after")
	if got := len(f.Calls("before-w1")); got != 2 {
		t.Fatalf("fakeinference survives the crash with its call log: %d calls of before-w1", got)
	}
}
