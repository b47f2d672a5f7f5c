package e2e

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// The scenarios of the crash suite (issue 4, reference protocol.md §10.1).
// Message counts: a weather call 0 sees the developer and user messages (2);
// call 1 adds the assistant's tool call and the tool output (4).

// continueAfterCrash is scenarios 1 and 2: an episode whose second model
// call is undelivered at the checkpoint continues from its last boundary
// after every fleet process is killed; the delivered first call is never
// repeated. The fleet runs in shape sh.
func continueAfterCrash(t *testing.T, route string, sh shape) {
	f := startFleetOn(t, sh, nil)
	f.HoldSecondCalls()
	row := weatherRow("native-1", route, "Paris")
	first := f.Start(row)
	f.WaitHeld("native-1", 2)
	f.Checkpoint(f.Coord(), "c1", ep("native-1", 0))
	f.CrashAndRestore("c1", ep("native-1", 0))
	if rep := first.Wait(t, 30*time.Second); rep.Status == http.StatusOK {
		t.Fatalf("the first attempt replied across a crash: %v", rep.Body)
	}
	f.Release()
	assertReward(t, f.RunOK(withAttempt(row, 1)), 1.0)
	if got, want := f.MessageCounts("native-1"), []int{2, 4, 4}; !slices.Equal(got, want) {
		t.Fatalf("model calls (messages each) %v, want %v: the delivered call 0 is never repeated, the undelivered call 1 is re-issued once", got, want)
	}
}

func TestScenario01_SingleAgentTurnContinuesAfterCrash(t *testing.T) {
	continueAfterCrash(t, "weather_agent", shape{})
}

func TestScenario02_LegacyRunContinuesAfterCrash(t *testing.T) {
	continueAfterCrash(t, "weather_agent_legacy", shape{})
}

// Scenario 3: the counter's state (4 after the first increment) must be
// restored for the right reward; without the resources restore the reply is
// still 200 and the reward exactly 0.0.
func TestScenario03_ResourcesStateIsRequired(t *testing.T) {
	run := func(t *testing.T, restoreResources bool) Reply {
		f := startFleet(t, nil)
		f.HoldSecondCalls()
		row := counterRow("counter-1", "counter_agent", 3, 1, 2)
		f.Start(row)
		f.WaitHeld("counter-1", 2)
		f.Checkpoint(f.Coord(), "c1", ep("counter-1", 0))
		f.Crash()
		f.Restart()
		c := f.Coord()
		var res []coordination.Member
		if !restoreResources {
			var ms []coordination.Member
			for _, m := range c.Members() {
				if m.Kind != "resources" {
					ms = append(ms, m)
				} else {
					res = append(res, m)
				}
			}
			c = coordination.New(ms, coordination.Options{Token: token, HTTP: httpConf()})
		}
		if _, err := c.Restore(context.Background(), "c1", f.Dir("c1"), []rollout.EpisodeID{ep("counter-1", 0)}, deadline(30*time.Second)); err != nil {
			t.Fatal(err)
		}
		if len(res) > 0 {
			// The resources servers restore nothing, and join the
			// restored fleet's epoch (a process the restore left out
			// would be an earlier incarnation its peers refuse).
			rc := coordination.New(res, coordination.Options{Token: token, HTTP: httpConf()})
			if _, err := rc.Restore(context.Background(), "c1", f.Dir("c1"), []rollout.EpisodeID{}, deadline(30*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		f.Resume(f.Coord(), "c1")
		f.Release()
		return f.Start(withAttempt(row, 1)).Wait(t, time.Minute)
	}
	t.Run("Restored", func(t *testing.T) { assertReward(t, run(t, true), 1.0) })
	t.Run("NegativeControlWithoutResourcesRestore", func(t *testing.T) { assertReward(t, run(t, false), 0.0) })
}

// Scenario 4: token lineage continues across the crash: the replacement's
// first call has the last delivered call as its parent, and the undelivered
// call is not in the ledger.
func TestScenario04_TokenLineageContinues(t *testing.T) {
	lineageContinues(t, shape{})
}

func lineageContinues(t *testing.T, sh shape) {
	f := startFleetOn(t, sh, nil)
	f.HoldSecondCalls()
	row := counterRow("lineage-1", "counter_agent", 3, 1, 2)
	f.Start(row)
	f.WaitHeld("lineage-1", 2)
	undelivered := f.Calls("lineage-1")[1].CallID
	f.Checkpoint(f.Coord(), "c1", ep("lineage-1", 0))
	f.CrashAndRestore("c1", ep("lineage-1", 0))
	f.Release()
	assertReward(t, f.RunOK(withAttempt(row, 1)), 1.0)
	rows := f.ledger("lineage-1-a1")
	if len(rows) != 3 {
		t.Fatalf("the replacement's ledger has %d rows, want 3 (call 0 imported, then two new calls): %v", len(rows), rows)
	}
	for _, r := range rows {
		if r["call_id"] == undelivered {
			t.Fatalf("the undelivered call %s is in the ledger", undelivered)
		}
	}
	if rows[1]["parent_call_id"] != rows[0]["call_id"] || rows[2]["parent_call_id"] != rows[1]["call_id"] {
		t.Fatalf("lineage is broken: %v", rows)
	}
	if st, _ := f.Manifest("lineage-1"); st != http.StatusGone {
		t.Fatalf("the source attempt's ledger is retired after the restore: manifest answered %d, want 410", st)
	}
}

// Scenario 5: an in-flight generation is cut at the checkpoint and the
// re-issued call continues from the staged prefix.
func TestScenario05_GenerationCutIsContinued(t *testing.T) {
	generationCutContinued(t, shape{})
}

func generationCutContinued(t *testing.T, sh shape) {
	f := startFleetOn(t, sh, func(tp *fleet.Topology) { tp.TokensPerSecond = 40 })
	row := weatherRow("cut-1", "weather_agent", "Reykjavik")
	f.Start(row)
	f.WaitFor("call 1 generating with a prefix", time.Minute, func() bool {
		calls := f.Calls("cut-1")
		return len(calls) >= 2 && calls[1].Status == fakeinference.StatusGenerating && calls[1].CompletionTokens >= 3
	})
	cutCall := f.Calls("cut-1")[1].CallID
	f.Checkpoint(f.Coord(), "c1", ep("cut-1", 0))
	cuts, err := f.Fake.Cuts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(cuts) != 1 || !slices.Contains(cuts[0], cutCall) {
		t.Fatalf("cut rounds %v, want [[%s]]", cuts, cutCall)
	}
	f.CrashAndRestore("c1", ep("cut-1", 0))
	assertReward(t, f.RunOK(withAttempt(row, 1)), 1.0)
	calls := f.Calls("cut-1")
	last := calls[len(calls)-1]
	if last.ContinuedFrom == nil || *last.ContinuedFrom != cutCall || last.ReusedPrefixTokens < 3 {
		t.Fatalf("the replacement's call must continue cut %s with its prefix: continued_from %v reused %d", cutCall, last.ContinuedFrom, last.ReusedPrefixTokens)
	}
	if len(calls) != 3 {
		t.Fatalf("%d calls, want 3 (call 0, the cut call 1, its continuation)", len(calls))
	}
}

// Scenario 6: a checkpoint without a crash parks the episode (a generation
// finishing while prepared is held, not delivered) and resume releases it.
func TestScenario06_CheckpointWithoutCrashParksAndReleases(t *testing.T) {
	parksAndReleases(t, shape{})
}

func parksAndReleases(t *testing.T, sh shape) {
	f := startFleetOn(t, sh, nil)
	f.HoldSecondCalls()
	row := weatherRow("park-1", "weather_agent", "Lima")
	run := f.Start(row)
	f.WaitHeld("park-1", 2)
	c := f.Coord()
	f.Checkpoint(c, "c1", ep("park-1", 0))
	f.Release()
	f.WaitFor("call 1 returned by fakeinference", 30*time.Second, func() bool {
		return f.Calls("park-1")[1].Status == fakeinference.StatusReturned
	})
	if run.Replied() {
		t.Fatal("the episode replied while the fleet is prepared")
	}
	f.Resume(c, "c1")
	assertReward(t, run.Wait(t, time.Minute), 1.0)
	if got := len(f.Calls("park-1")); got != 2 {
		t.Fatalf("%d model calls, want 2", got)
	}
}

// Scenario 7: verification in flight is replayed or waited for, by the mode
// the resources server declares.
func TestScenario07_VerificationInFlight(t *testing.T) {
	for _, mode := range []string{"replay", "wait"} {
		t.Run(mode, func(t *testing.T) {
			f := startFleet(t, func(tp *fleet.Topology) { tp.Resources[2].VerifyMode = mode })
			f.slow("hold")
			row := weatherRow("verify-1", "slow_agent", "Quito")
			row["city"] = "Quito"
			f.Start(row)
			f.WaitFor("verify started", time.Minute, func() bool { return f.slow("count")["started"] == float64(1) })
			c := f.Coord()
			if mode == "wait" {
				// An early prepare reports the verification as the blocker
				// and keeps admission closed; once it finishes, the episode
				// parks at next: return and the same prepare succeeds.
				res, err := c.Prepare(context.Background(), "c1", deadline(500*time.Millisecond))
				if err != nil {
					t.Fatal(err)
				}
				if res.Prepared || !slices.Equal(res.Blockers()["env"], []string{"verify-1"}) {
					t.Fatalf("a verify in wait mode must block the environment: prepared %v blockers %v", res.Prepared, res.Blockers())
				}
				f.slow("release")
			}
			f.Checkpoint(c, "c1", ep("verify-1", 0))
			wantNext := map[string]string{"replay": "verify", "wait": "return"}[mode]
			if got := f.EnvBoundary("c1", "verify-1"); got != wantNext {
				t.Fatalf("environment record says next %q, want %q", got, wantNext)
			}
			f.CrashAndRestore("c1", ep("verify-1", 0))
			assertReward(t, f.RunOK(withAttempt(row, 1)), 1.0)
			wantVerifies := map[string]float64{"replay": 1, "wait": 0}[mode]
			if got := f.slow("count")["started"]; got != wantVerifies {
				t.Fatalf("the fresh resources server verified %v times, want %v", got, wantVerifies)
			}
		})
	}
}

// Scenario 8: an episode that finishes during prepare is neither lost nor
// redone: its reply waits for resume, and its record says next: return.
func TestScenario08_EpisodeFinishingDuringPrepare(t *testing.T) {
	for _, crash := range []bool{false, true} {
		name := map[bool]string{false: "WithoutCrash", true: "WithCrash"}[crash]
		t.Run(name, func(t *testing.T) {
			f := startFleet(t, func(tp *fleet.Topology) { tp.Resources[2].VerifyMode = "wait" })
			f.slow("hold")
			row := weatherRow("finish-1", "slow_agent", "Oslo")
			run := f.Start(row)
			f.WaitFor("verify started", time.Minute, func() bool { return f.slow("count")["started"] == float64(1) })
			c := f.Coord()
			prepared := make(chan *coordination.PrepareResult, 1)
			go func() {
				res, err := c.Prepare(context.Background(), "c1", deadline(30*time.Second))
				if err != nil {
					t.Error(err)
				}
				prepared <- res
			}()
			f.WaitFor("environment preparing", 10*time.Second, func() bool {
				return f.Status(c)["env"]["phase"] == "preparing"
			})
			f.slow("release")
			if res := <-prepared; res == nil || !res.Prepared {
				t.Fatalf("prepare after the verify finished: %+v", res)
			}
			if _, err := c.Commit(context.Background(), "c1", f.Dir("c1"), []rollout.EpisodeID{ep("finish-1", 0)}, deadline(30*time.Second), false); err != nil {
				t.Fatal(err)
			}
			if got := f.EnvBoundary("c1", "finish-1"); got != "return" {
				t.Fatalf("record next %q, want return", got)
			}
			if run.Replied() {
				t.Fatal("the episode replied while the fleet is prepared")
			}
			if !crash {
				f.Resume(c, "c1")
				assertReward(t, run.Wait(t, time.Minute), 1.0)
				if got := f.slow("count")["started"]; got != float64(1) {
					t.Fatalf("verified %v times, want 1", got)
				}
				return
			}
			f.CrashAndRestore("c1", ep("finish-1", 0))
			assertReward(t, f.RunOK(withAttempt(row, 1)), 1.0)
			if got := f.slow("count")["started"]; got != float64(0) {
				t.Fatalf("the replacement verified again (%v times); its result was recorded", got)
			}
		})
	}
}

// Scenario 9: a second crash, after a checkpoint taken before the
// replacement started, still continues the episode.
func TestScenario09_SecondCrashBeforeTheReplacementStarts(t *testing.T) {
	secondCrash(t, shape{})
}

func secondCrash(t *testing.T, sh shape) {
	f := startFleetOn(t, sh, nil)
	f.HoldSecondCalls()
	row := weatherRow("twice-1", "weather_agent", "Rome")
	f.Start(row)
	f.WaitHeld("twice-1", 2)
	f.Checkpoint(f.Coord(), "c1", ep("twice-1", 0))
	c := f.CrashAndRestore("c1", ep("twice-1", 0))
	// The replacement (attempt 1) has not started: the scope names it.
	f.Checkpoint(c, "c2", ep("twice-1", 1))
	if got := f.EnvBoundary("c2", "twice-1-a1"); got != "invoke_agent" {
		t.Fatalf("the restored-but-unstarted episode is exported again at %q, want invoke_agent", got)
	}
	f.CrashAndRestore("c2", ep("twice-1", 1))
	f.Release()
	assertReward(t, f.RunOK(withAttempt(row, 2)), 1.0)
	if got, want := f.MessageCounts("twice-1"), []int{2, 4, 4}; !slices.Equal(got, want) {
		t.Fatalf("model calls %v, want %v", got, want)
	}
}

// Scenario 10: the same checkpoint restores again after its replacement
// made model calls and the fleet crashed before the next checkpoint; none of
// the dead run's calls are in the lineage.
func TestScenario10_RestoreAgainAfterTheReplacementMadeCalls(t *testing.T) {
	f := startFleet(t, nil)
	f.HoldSecondCalls()
	row := counterRow("again-1", "counter_agent", 3, 1, 2)
	f.Start(row)
	f.WaitHeld("again-1", 2)
	f.Checkpoint(f.Coord(), "c1", ep("again-1", 0))
	f.CrashAndRestore("c1", ep("again-1", 0))
	// The replacement's first call (the rollout's third) passes, its
	// second is held; then the fleet dies again.
	if _, err := f.Fake.HoldAfterCallsPerRollout(context.Background(), 3); err != nil {
		t.Fatal(err)
	}
	f.Release()
	if _, err := f.Fake.HoldAfterCallsPerRollout(context.Background(), 3); err != nil {
		t.Fatal(err)
	}
	dead := f.Start(withAttempt(row, 1))
	f.WaitHeld("again-1", 4)
	deadCall := f.Calls("again-1")[2].CallID
	f.CrashAndRestore("c1", ep("again-1", 0))
	if rep := dead.Wait(t, 30*time.Second); rep.Status == http.StatusOK {
		t.Fatalf("the dead run replied: %v", rep.Body)
	}
	f.Release()
	assertReward(t, f.RunOK(withAttempt(row, 1)), 1.0)
	rows := f.ledger("again-1-a1")
	if len(rows) != 3 {
		t.Fatalf("ledger of the second run: %d rows, want 3: %v", len(rows), rows)
	}
	for _, r := range rows {
		if r["call_id"] == deadCall {
			t.Fatalf("the dead run's call %s is in the lineage", deadCall)
		}
	}
	if rows[1]["parent_call_id"] != rows[0]["call_id"] {
		t.Fatalf("the second run's first call must have call 0 as parent: %v", rows)
	}
}

// Scenario 11: a saved environment mixed with a restart_only one: the
// restart never holds a checkpoint up and starts over after a crash while
// the saved episode continues; without a crash it keeps running.
func TestScenario11_SavedAndRestartOnly(t *testing.T) {
	mixed := func(tp *fleet.Topology) {
		tp.Resources = append(tp.Resources, fleet.ResourcesSpec{Name: "volatile", Type: "weather", CheckpointMode: "restart_only"})
		tp.Agents = append(tp.Agents, fleet.AgentSpec{Name: "volatile_agent", Resources: "volatile", MaxSteps: 10})
		tp.Routes = append(tp.Routes, fleet.RouteSpec{Name: "volatile_agent", Agent: "volatile_agent", Protocol: "single_agent_turn"})
	}
	for _, crash := range []bool{true, false} {
		t.Run(map[bool]string{true: "WithCrash", false: "WithoutCrash"}[crash], func(t *testing.T) {
			f := startFleet(t, mixed)
			f.HoldSecondCalls()
			saved := weatherRow("saved-1", "weather_agent", "Bern")
			restart := weatherRow("restart-1", "volatile_agent", "Bonn")
			savedRun, restartRun := f.Start(saved), f.Start(restart)
			f.WaitHeld("saved-1", 2)
			f.WaitHeld("restart-1", 2)
			c := f.Coord()
			res, err := c.Prepare(context.Background(), "c1", deadline(30*time.Second))
			if err != nil || !res.Prepared {
				t.Fatalf("a restart must never hold a checkpoint up: %+v %v", res, err)
			}
			if got := res.Restarts(); !slices.Equal(got, []string{"restart-1"}) {
				t.Fatalf("restarts %v, want [restart-1]", got)
			}
			scope := res.Continued([]rollout.EpisodeID{ep("saved-1", 0), ep("restart-1", 0)})
			if _, err := c.Commit(context.Background(), "c1", f.Dir("c1"), scope, deadline(30*time.Second), false); err != nil {
				t.Fatal(err)
			}
			if !crash {
				f.Resume(c, "c1")
				f.Release()
				assertReward(t, savedRun.Wait(t, time.Minute), 1.0)
				assertReward(t, restartRun.Wait(t, time.Minute), 1.0)
				return
			}
			c = f.CrashAndRestore("c1", scope...)
			// The restart is retired everywhere and starts over from its input.
			if err := c.Retire(context.Background(), "", []rollout.EpisodeID{ep("restart-1", 0)}, deadline(30*time.Second)); err != nil {
				t.Fatal(err)
			}
			f.Release()
			assertReward(t, f.RunOK(withAttempt(saved, 1)), 1.0)
			assertReward(t, f.RunOK(withAttempt(restart, 1)), 1.0)
			if got, want := f.MessageCounts("saved-1"), []int{2, 4, 4}; !slices.Equal(got, want) {
				t.Fatalf("saved calls %v, want %v", got, want)
			}
			if got, want := f.MessageCounts("restart-1"), []int{2, 4, 2, 4}; !slices.Equal(got, want) {
				t.Fatalf("restart calls %v, want %v (started over)", got, want)
			}
		})
	}
}

// Scenario 12: a rollout retired mid-flight stops everywhere.
func TestScenario12_RetiredRolloutStopsEverywhere(t *testing.T) {
	f := startFleet(t, nil)
	f.HoldSecondCalls()
	row := weatherRow("retire-1", "weather_agent", "Cairo")
	run := f.Start(row)
	f.WaitHeld("retire-1", 2)
	c := f.Coord()
	if err := c.Retire(context.Background(), "", []rollout.EpisodeID{ep("retire-1", 0)}, deadline(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if rep := run.Wait(t, 30*time.Second); rep.Status != http.StatusConflict || rep.Code() != "stale_attempt" {
		t.Fatalf("the retired /run answers %d %q, want 409 stale_attempt", rep.Status, rep.Code())
	}
	f.Release()
	calls := len(f.Calls("retire-1"))
	for name, st := range f.Status(c) {
		if st["retired_rollouts"] != float64(1) {
			t.Errorf("%s retired_rollouts %v, want 1", name, st["retired_rollouts"])
		}
		rep, _ := st["report"].(map[string]any)
		counts, _ := rep["counts"].(map[string]any)
		for _, k := range []string{"episodes", "sessions", "inflight"} {
			if v, ok := counts[k]; ok && v != float64(0) {
				t.Errorf("%s still tracks %s=%v after the retire", name, k, v)
			}
		}
	}
	if st, _ := f.Manifest("retire-1"); st != http.StatusGone {
		t.Fatalf("the retired attempt's ledger answers %d, want 410", st)
	}
	if rep := f.Start(row).Wait(t, 30*time.Second); rep.Status != http.StatusConflict || rep.Code() != "stale_attempt" {
		t.Fatalf("a duplicate /run of the retired attempt: %d %q", rep.Status, rep.Code())
	}
	if got := len(f.Calls("retire-1")); got != calls {
		t.Fatalf("the model got %d more calls after the retire", got-calls)
	}
	if err := c.Forget(context.Background(), []string{"retire-1"}, deadline(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	for name, st := range f.Status(c) {
		if st["retired_rollouts"] != float64(0) {
			t.Errorf("%s retired_rollouts %v after forget, want 0", name, st["retired_rollouts"])
		}
	}
	assertReward(t, f.RunOK(withAttempt(row, 1)), 1.0)
}

// Scenario 14: a controller that dies after prepare: the lease expires and
// every server reopens by itself.
func TestScenario14_LeaseExpiryReopensTheFleet(t *testing.T) {
	f := startFleet(t, func(tp *fleet.Topology) { tp.LeaseGraceSeconds = 1 })
	c := f.Coord()
	res, err := c.Prepare(context.Background(), "orphan", deadline(time.Second))
	if err != nil || !res.Prepared {
		t.Fatalf("prepare: %+v %v", res, err)
	}
	if rep := f.Start(weatherRow("during-1", "weather_agent", "Kyiv")).Wait(t, 10*time.Second); rep.Code() != "admission_closed" {
		t.Fatalf("a /run while prepared: %d %q, want admission_closed", rep.Status, rep.Code())
	}
	f.WaitFor("every participant idle after the lease", 30*time.Second, func() bool {
		for _, st := range f.Status(c) {
			if st["phase"] != "idle" {
				return false
			}
		}
		return true
	})
	assertReward(t, f.RunOK(weatherRow("after-1", "weather_agent", "Kyiv")), 1.0)
}
