package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ops/collect"
	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
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

// The same scenarios with two replicas of every kind sharing one inference
// worker, the last cell of the one-or-two replicas by one-or-two workers
// matrix: both model replicas' holds, cuts and call logs meet on one worker.
func twoOfEachOneWorker() shape { return shape{workers: 1, replicas: 2} }

func TestTwoReplicasOneWorker_Scenario01_SingleAgentTurnContinuesAfterCrash(t *testing.T) {
	continueAfterCrash(t, "weather_agent", twoOfEachOneWorker())
}

func TestTwoReplicasOneWorker_Scenario04_TokenLineageContinues(t *testing.T) {
	lineageContinues(t, twoOfEachOneWorker())
}

func TestTwoReplicasOneWorker_Scenario05_GenerationCutIsContinued(t *testing.T) {
	generationCutContinued(t, twoOfEachOneWorker())
}

func TestTwoReplicasOneWorker_Scenario06_CheckpointWithoutCrashParksAndReleases(t *testing.T) {
	parksAndReleases(t, twoOfEachOneWorker())
}

func TestTwoReplicasOneWorker_Scenario09_SecondCrashBeforeTheReplacementStarts(t *testing.T) {
	secondCrash(t, twoOfEachOneWorker())
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

	workerPorts := f.workerPorts()
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

// TestReplicas_LegacyRunsRestoreOnlyIntoTheSameAgents checkpoints two agent
// replicas holding legacy /run episodes (the environment relays each row to
// the agent replica.Pick names), kills every process, and asks fresh
// processes with three agent replicas to restore: a replacement /run would
// reach a replica by the new count while the episode was placed by its
// former owner, so the restore is refused with replicas_unsupported before
// any participant is called. Fresh processes with the checkpoint's two agent
// replicas then restore it, and every rollout finishes once with no
// delivered model call repeated.
func TestReplicas_LegacyRunsRestoreOnlyIntoTheSameAgents(t *testing.T) {
	f := startFleetWith(t, fleetOptions{topo: func(tp *fleet.Topology) { tp.Replicas.Agent = 2 }})
	var rows []map[string]any
	var scope []rollout.EpisodeID
	for i := range 2 {
		id := fmt.Sprintf("legacy-w%d", i)
		rows = append(rows, weatherRow(id, "weather_agent_legacy", "Oslo"))
		scope = append(scope, ep(id, 0))
	}
	f.HoldSecondCalls()
	var firsts []*Run
	for _, row := range rows {
		firsts = append(firsts, f.Start(row))
	}
	for _, row := range rows {
		f.WaitHeld(row[rollout.FieldRolloutID].(string), 2)
	}
	f.Checkpoint(f.Coord(), "c1", scope...)
	f.Crash()
	workerPorts := f.workerPorts()

	three := startFleetWith(t, fleetOptions{noInference: true, topo: func(tp *fleet.Topology) {
		tp.Replicas.Agent = 3
		tp.Ports = reusePorts{first: workerPorts, rest: ports}
	}})
	_, err := three.Coord().Restore(context.Background(), "c1", f.Dir("c1"), scope, deadline(30*time.Second))
	if !apierror.HasCode(err, apierror.ReplicasUnsupported) || !strings.Contains(err.Error(), "legacy /run") {
		t.Fatalf("restore of legacy runs into three agent replicas: %v, want replicas_unsupported naming them", err)
	}
	three.Crash()

	two := startFleetWith(t, fleetOptions{noInference: true, topo: func(tp *fleet.Topology) {
		tp.Replicas.Agent = 2
		tp.Ports = reusePorts{first: workerPorts, rest: ports}
	}})
	c := two.Coord()
	if _, err := c.Restore(context.Background(), "c1", f.Dir("c1"), scope, deadline(30*time.Second)); err != nil {
		t.Fatalf("restore c1 into the same two agent replicas: %v", err)
	}
	two.Resume(c, "c1")
	two.Release()
	for _, r := range firsts {
		if rep := r.Wait(t, 30*time.Second); rep.Status == http.StatusOK {
			t.Fatalf("the first attempt of %v replied across the crash: %v", r.Row[rollout.FieldRolloutID], rep.Body)
		}
	}
	for _, row := range rows {
		assertReward(t, two.RunOK(withAttempt(row, 1)), 1.0)
		id := row[rollout.FieldRolloutID].(string)
		if got, want := two.MessageCounts(id), []int{2, 4, 4}; !slices.Equal(got, want) {
			t.Fatalf("%s: model calls (messages each) %v, want %v: delivered calls are never repeated", id, got, want)
		}
	}
}

// workerPorts are the ports of the fleet's inference workers, which a
// regenerated fleet reuses (reusePorts).
func (f *Fleet) workerPorts() []int {
	f.t.Helper()
	var out []int
	for _, e := range f.Cfg.Endpoints(fleet.KindFakeInference) {
		u, err := url.Parse(e.URL)
		if err != nil {
			f.t.Fatal(err)
		}
		port, err := strconv.Atoi(u.Port())
		if err != nil {
			f.t.Fatalf("port of %s: %v", e.URL, err)
		}
		out = append(out, port)
	}
	return out
}

// TestReplicas_RestoreIntoOtherCountsOfEachKind checkpoints a fleet with
// two replicas of every kind (environment, agent, resources, model server)
// holding rollouts on each, kills every process, and restores into three of
// each and into one of each (and a fleet of one of each into two; and two
// into three, checkpointed again mid-flight and restored back into two, so
// the restored fleet's own checkpoint names its live replicas). Agents move
// by recorded owner and aliases; environments, resources and model servers
// are reached by rollout id, so each of their replicas installs the records
// of the rollouts replica.Pick now sends to it. Every rollout finishes once
// with the reward of an uninterrupted run (the counter's state continues on
// its new resources replica), no delivered model call is repeated, and each
// replacement's capture ledger, on the model replica its calls now reach,
// continues the lineage of the calls delivered before the crashes.
func TestReplicas_RestoreIntoOtherCountsOfEachKind(t *testing.T) {
	for _, counts := range [][]int{{2, 3}, {2, 1}, {1, 2}, {2, 3, 2}} {
		var name strings.Builder
		for i, n := range counts {
			if i > 0 {
				name.WriteString("Into")
			}
			fmt.Fprint(&name, n)
		}
		t.Run(name.String(), func(t *testing.T) { restoreIntoCounts(t, counts) })
	}
}

// restoreIntoCounts runs rollouts on a fleet of counts[0] replicas of each
// kind, then, for each later count, checkpoints them mid-flight (the
// second model call of the attempt held), kills every process and restores
// into that count; the last fleet runs every rollout to its end.
func restoreIntoCounts(t *testing.T, counts []int) {
	workers := twoOfEach().workers
	if len(counts) > 2 {
		// An inference worker holds the calls of a rollout after the first
		// it has seen itself: with one worker, every restored attempt's
		// call 1 is held again, to be checkpointed again.
		workers = 1
	}
	f := startFleetOn(t, shape{workers: workers, replicas: counts[0]}, nil)
	var rows []map[string]any
	was, moved := map[int]bool{}, 0
	for i := range 4 {
		for _, row := range []map[string]any{
			weatherRow(fmt.Sprintf("each-w%d", i), "weather_agent", "Paris"),
			counterRow(fmt.Sprintf("each-c%d", i), "counter_agent", 3, 1, 2),
		} {
			id := row[rollout.FieldRolloutID].(string)
			rows = append(rows, row)
			was[replica.Pick(id, counts[0])] = true
			if replica.Pick(id, counts[0]) != replica.Pick(id, counts[1]) {
				moved++
			}
		}
	}
	if len(was) != counts[0] || (counts[1] > 1 && moved == 0) {
		t.Fatalf("the rollouts use replicas %v of %d, %d move: the test needs all, and some moving", was, counts[0], moved)
	}
	f.HoldSecondCalls()
	var runs []*Run
	for _, row := range rows {
		runs = append(runs, f.Start(row))
	}
	// undelivered are the calls held at a crash, by rollout.
	undelivered := map[string][]string{}
	for gen, to := range counts[1:] {
		from := counts[gen]
		var scope []rollout.EpisodeID
		for _, row := range rows {
			id := row[rollout.FieldRolloutID].(string)
			// Call 0 is delivered once; each attempt then has call 1 held,
			// the rollout's n-th call.
			n := 2 + gen
			f.WaitHeld(id, n)
			undelivered[id] = append(undelivered[id], f.Calls(id)[n-1].CallID)
			scope = append(scope, ep(id, gen))
		}
		ckpt := fmt.Sprintf("c%d", gen+1)
		_, commit := f.Checkpoint(f.Coord(), ckpt, scope...)
		bases := []string{"env", "policy_model", "counter"}
		if gen == 0 {
			// A restore keeps agent sessions on their owners: a new agent
			// replica holds only rollouts started after it.
			bases = append(bases, "weather_agent", "counter_agent")
		}
		for _, base := range bases {
			for _, inst := range replica.Names(base, from) {
				if len(commit.ExportedBy(inst)) == 0 {
					t.Fatalf("%s: replica %s exported nothing: every replica must hold rollouts", ckpt, inst)
				}
			}
		}
		f.Crash()
		for _, r := range runs {
			if rep := r.Wait(t, 30*time.Second); rep.Status == http.StatusOK {
				t.Fatalf("attempt %d of %v replied across the crash: %v", gen, r.Row[rollout.FieldRolloutID], rep.Body)
			}
		}

		workerPorts := f.workerPorts()
		g := startFleetWith(t, fleetOptions{noInference: true, topo: func(tp *fleet.Topology) {
			tp.InferenceWorkers = workers
			tp.Replicas = fleet.Each(to)
			tp.Ports = reusePorts{first: workerPorts, rest: ports}
		}})
		c := g.Coord()
		plan, err := c.PlanReplicas(context.Background(), f.Dir(ckpt))
		if err != nil {
			t.Fatal(err)
		}
		for _, kind := range []string{fleet.KindEnvironment, fleet.KindResources, fleet.KindModel} {
			for _, e := range g.Cfg.Endpoints(kind) {
				p := plan[e.Name]
				want := replica.Names(replica.Family(e.Name), from)
				if p == nil || p.Partition == nil || p.Partition.Count != to || !slices.Equal(p.Sources, want) {
					t.Fatalf("%s: plan of %s %+v, want sources %v and a partition of %d", ckpt, e.Name, p, want, to)
				}
			}
		}
		if _, err := c.Restore(context.Background(), ckpt, f.Dir(ckpt), scope, deadline(30*time.Second)); err != nil {
			t.Fatalf("restore %s from %d into %d replicas of each kind: %v", ckpt, from, to, err)
		}
		g.Resume(c, ckpt)
		f = g
		runs = runs[:0]
		for _, row := range rows {
			runs = append(runs, f.Start(withAttempt(row, gen+1)))
		}
	}
	f.Release()
	to, crashes := counts[len(counts)-1], len(counts)-1
	models := f.Cfg.Endpoints(fleet.KindModel)
	for i, r := range runs {
		assertReward(t, r.Wait(t, 2*time.Minute), 1.0)
		id := rows[i][rollout.FieldRolloutID].(string)
		// An uninterrupted run's calls, with call 1 made once more for
		// each crash that found it held.
		want := []int{2}
		for range crashes {
			want = append(want, 4)
		}
		want = append(want, 4)
		if _, counter := rows[i]["expected_count"]; counter {
			want = append(want, 6)
		}
		if got := f.MessageCounts(id); !slices.Equal(got, want) {
			t.Fatalf("%s: model calls (messages each) %v, want %v: delivered calls are never repeated", id, got, want)
		}
		key := ep(id, crashes).CaptureKey()
		owner := replica.Name("policy_model", replica.Pick(id, to), to)
		for _, m := range models {
			ledger := f.ledgerOn(m.URL, key)
			if m.Name != owner {
				if len(ledger) != 0 {
					t.Fatalf("%s: model replica %s holds %d ledger rows, want them all on %s", key, m.Name, len(ledger), owner)
				}
				continue
			}
			if len(ledger) != len(want)-crashes {
				t.Fatalf("%s: the ledger on %s has %d rows, want %d (the delivered calls): %v", key, owner, len(ledger), len(want)-crashes, ledger)
			}
			for j, row := range ledger {
				if slices.Contains(undelivered[id], row["call_id"].(string)) {
					t.Fatalf("%s: the undelivered call %v is in the ledger", key, row["call_id"])
				}
				if j > 0 && row["parent_call_id"] != ledger[j-1]["call_id"] {
					t.Fatalf("%s: lineage is broken: %v", key, ledger)
				}
			}
		}
	}
	// A new rollout on the last replica runs.
	id := ""
	for i := 0; id == ""; i++ {
		if cand := fmt.Sprintf("new-%d", i); replica.Pick(cand, to) == to-1 {
			id = cand
		}
	}
	assertReward(t, f.RunOK(counterRow(id, "counter_agent", 1, 2)), 1.0)
}

// ledgerOn is the capture ledger of key on one model server replica: its
// rows, none when the replica has no ledger of it.
func (f *Fleet) ledgerOn(modelURL, key string) []map[string]any {
	f.t.Helper()
	rep, err := httpclient.Do(context.Background(), f.ctl, http.MethodGet, modelURL+"/capture/rollouts/"+key+"/manifest", nil, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	if rep.Status == http.StatusNotFound {
		return nil
	}
	var m map[string]any
	if err := codec.Unmarshal(rep.Body, &m); err != nil || rep.Status != http.StatusOK {
		f.t.Fatalf("manifest of %s on %s: %d %v", key, modelURL, rep.Status, err)
	}
	if fails, _ := m["failures"].([]any); len(fails) > 0 {
		f.t.Fatalf("manifest of %s on %s has failures: %v", key, modelURL, fails)
	}
	var out []map[string]any
	recs, _ := m["records"].([]any)
	for _, r := range recs {
		out = append(out, r.(map[string]any))
	}
	return out
}

// TestReplicas_CollectResumesIntoOtherCounts preempts gymctl collect on a
// fleet of two replicas of each kind (SIGTERM: a checkpoint, exit 75),
// kills the fleet, and resumes the collection on a fleet of three of each
// and on one of one of each. collect restores the checkpoint itself and
// sends each continued row where replica.Pick over the live environments
// names: every row is in the output once, as its continued attempt, with
// the reward of an uninterrupted run and no delivered model call repeated.
func TestReplicas_CollectResumesIntoOtherCounts(t *testing.T) {
	for _, to := range []int{3, 1} {
		t.Run(fmt.Sprintf("2Into%d", to), func(t *testing.T) {
			f := startFleetOn(t, twoOfEach(), nil)
			f.HoldSecondCalls()
			var rows []map[string]any
			var ids []string
			for i := range 3 {
				rows = append(rows, weatherRow(fmt.Sprintf("col-w%d", i), "weather_agent", "Paris"), counterRow(fmt.Sprintf("col-c%d", i), "counter_agent", 3, 1, 2))
			}
			was, moved := map[int]bool{}, 0
			for _, r := range rows {
				id := r[rollout.FieldRolloutID].(string)
				ids = append(ids, id)
				was[replica.Pick(id, 2)] = true
				if replica.Pick(id, 2) != replica.Pick(id, to) {
					moved++
				}
			}
			if len(was) != 2 || moved == 0 {
				t.Fatalf("the rows use environments %v of two, %d move: the test needs both, and some moving", was, moved)
			}
			ws := newWorkspace(t, rows...)
			c := f.collect(ws)
			for _, id := range ids {
				f.WaitHeld(id, 2)
			}
			c.signal(syscall.SIGTERM)
			c.requireExit(time.Minute, collect.ExitPreempted)
			m, ok := ws.latest()
			if !ok || len(m.Continued) != len(ids) {
				t.Fatalf("the preemption checkpoint continues %v, want all %d rows", m, len(ids))
			}
			f.Crash()

			workerPorts := f.workerPorts()
			g := startFleetWith(t, fleetOptions{noInference: true, topo: func(tp *fleet.Topology) {
				tp.InferenceWorkers = twoOfEach().workers
				tp.Replicas = fleet.Each(to)
				tp.Ports = reusePorts{first: workerPorts, rest: ports}
			}})
			g.Release()
			r := g.collect(ws, "--resume")
			r.requireExit(2*time.Minute, 0)
			for id, attempt := range ws.exactlyOnce(ids...) {
				if attempt != 1 {
					t.Errorf("%s finished as attempt %d, want 1 (the continued attempt)", id, attempt)
				}
			}
			for _, row := range rows {
				id := row[rollout.FieldRolloutID].(string)
				want := []int{2, 4, 4}
				if _, counter := row["expected_count"]; counter {
					want = []int{2, 4, 4, 6}
				}
				if got := g.MessageCounts(id); !slices.Equal(got, want) {
					t.Errorf("%s: model calls (messages each) %v, want %v: delivered calls are never repeated", id, got, want)
				}
			}
			if want := fmt.Sprintf("continued %d, restarted 0", len(ids)); !strings.Contains(r.out.String(), want) {
				t.Errorf("the resumed run's summary does not say %q:\n%s", want, r.out.String())
			}
		})
	}
}
