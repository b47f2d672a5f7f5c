package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/wire/replica"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// The scenarios below run again on a fleet of two replicas of every
// participant kind (environment, agents, resources, model server) over two
// inference workers (issue 35): a rollout's calls stay on the replicas that
// hold its state, every replica is a checkpoint participant of its own, and
// a restore installs each replica's records on the replica of its name.

func twoOfEach() shape { return shape{workers: 2, replicas: 2} }

func TestTwoReplicas_Scenario01_SingleAgentTurnContinuesAfterCrash(t *testing.T) {
	continueAfterCrash(t, "weather_agent", twoOfEach())
}

func TestTwoReplicas_Scenario04_TokenLineageContinues(t *testing.T) {
	lineageContinues(t, twoOfEach())
}

func TestTwoReplicas_Scenario05_GenerationCutIsContinued(t *testing.T) {
	generationCutContinued(t, twoOfEach())
}

func TestTwoReplicas_Scenario06_CheckpointWithoutCrashParksAndReleases(t *testing.T) {
	parksAndReleases(t, twoOfEach())
}

func TestTwoReplicas_Scenario09_SecondCrashBeforeTheReplacementStarts(t *testing.T) {
	secondCrash(t, twoOfEach())
}

// reusePorts hands a regenerated fleet the ports of the fleet it replaces
// for its first names (the inference workers, which survive the crash and
// keep their call logs), and fresh ports for the rest.
type reusePorts struct {
	first []int
	rest  fleet.PortSource
}

func (r reusePorts) Take(n int) ([]int, error) {
	more, err := r.rest.Take(n - len(r.first))
	if err != nil {
		return nil, err
	}
	return append(append([]int(nil), r.first...), more...), nil
}

// TestReplicas_RestoreIntoOtherAgentCounts checkpoints a fleet with two
// agent replicas holding rollouts on each, kills every process, and
// restores into a fleet with three agent replicas (the new one installs
// nothing; each session stays on its replica) and into one with a single
// agent (both former replicas' sessions on it, through the aliases). Every
// rollout finishes once with the reward of an uninterrupted run and no
// delivered model call repeated, and a new rollout on the new replica runs.
func TestReplicas_RestoreIntoOtherAgentCounts(t *testing.T) {
	for _, to := range []int{3, 1} {
		t.Run(fmt.Sprintf("TwoInto%d", to), func(t *testing.T) { restoreIntoAgents(t, to) })
	}
}

func restoreIntoAgents(t *testing.T, to int) {
	f := startFleetWith(t, fleetOptions{topo: func(tp *fleet.Topology) { tp.Replicas.Agent = 2 }})
	var rows []map[string]any
	var scope []rollout.EpisodeID
	on := map[int]bool{}
	for i := range 4 {
		id := fmt.Sprintf("grow-w%d", i)
		rows = append(rows, weatherRow(id, "weather_agent", "Paris"))
		on[replica.Pick(id, 2)] = true
		id = fmt.Sprintf("grow-c%d", i)
		rows = append(rows, counterRow(id, "counter_agent", 3, 1, 2))
		on[replica.Pick(id, 2)] = true
	}
	if len(on) != 2 {
		t.Fatalf("the rollouts use agent replicas %v: the test needs both", on)
	}
	f.HoldSecondCalls()
	var firsts []*Run
	for _, row := range rows {
		id := row[rollout.FieldRolloutID].(string)
		scope = append(scope, ep(id, 0))
		firsts = append(firsts, f.Start(row))
	}
	for _, row := range rows {
		f.WaitHeld(row[rollout.FieldRolloutID].(string), 2)
	}
	_, commit := f.Checkpoint(f.Coord(), "c1", scope...)
	for _, inst := range []string{"weather_agent-0", "weather_agent-1"} {
		if len(commit.ExportedBy(inst)) == 0 {
			t.Fatalf("agent replica %s exported nothing: every replica must hold sessions", inst)
		}
	}
	f.Crash()

	var workerPorts []int
	for _, e := range f.Cfg.Endpoints(fleet.KindFakeInference) {
		u, err := url.Parse(e.URL)
		if err != nil {
			t.Fatal(err)
		}
		port, err := strconv.Atoi(u.Port())
		if err != nil {
			t.Fatalf("port of %s: %v", e.URL, err)
		}
		workerPorts = append(workerPorts, port)
	}
	g := startFleetWith(t, fleetOptions{noInference: true, topo: func(tp *fleet.Topology) {
		tp.Replicas.Agent = to
		tp.Ports = reusePorts{first: workerPorts, rest: ports}
	}})
	c := g.Coord()
	plan, err := c.PlanReplicas(context.Background(), f.Dir("c1"))
	if err != nil {
		t.Fatal(err)
	}
	if to == 3 {
		if src := plan["weather_agent-2"]; src == nil || len(src.Sources) != 0 || len(src.Aliases) != 0 {
			t.Fatalf("plan of the new replica %+v, want no sources and no aliases", src)
		}
	} else if src := plan["weather_agent"]; src == nil || !slices.Equal(src.Sources, []string{"weather_agent-0", "weather_agent-1"}) || src.Aliases["weather_agent-1"] != "weather_agent" {
		t.Fatalf("plan of the single agent %+v, want both former replicas, aliased to it", src)
	}
	if _, err := c.Restore(context.Background(), "c1", f.Dir("c1"), scope, deadline(30*time.Second)); err != nil {
		t.Fatalf("restore c1 into %d agent replicas: %v", to, err)
	}
	g.Resume(c, "c1")
	g.Release()
	for _, r := range firsts {
		if rep := r.Wait(t, 30*time.Second); rep.Status == http.StatusOK {
			t.Fatalf("the first attempt of %v replied across the crash: %v", r.Row[rollout.FieldRolloutID], rep.Body)
		}
	}
	var replacements []*Run
	for _, row := range rows {
		replacements = append(replacements, g.Start(withAttempt(row, 1)))
	}
	for i, r := range replacements {
		assertReward(t, r.Wait(t, 2*time.Minute), 1.0)
		id := rows[i][rollout.FieldRolloutID].(string)
		want := []int{2, 4, 4}
		if _, counter := rows[i]["expected_count"]; counter {
			want = []int{2, 4, 4, 6}
		}
		if got := g.MessageCounts(id); !slices.Equal(got, want) {
			t.Fatalf("%s: model calls (messages each) %v, want %v: delivered calls are never repeated", id, got, want)
		}
	}
	if to == 3 {
		// A new rollout on the replica the checkpoint did not have.
		id := ""
		for i := 0; id == ""; i++ {
			if cand := fmt.Sprintf("new-%d", i); replica.Pick(cand, 3) == 2 {
				id = cand
			}
		}
		assertReward(t, g.RunOK(weatherRow(id, "weather_agent", "Oslo")), 1.0)
	}
}
