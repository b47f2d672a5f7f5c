package e2e

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/infra/faultpoint"
	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// The crash sweep (issue 36, "a crash at every step"): the fleet's binaries
// built with the gymfleet_faults tag, one fleet per (point, process), the
// point armed in that process only. The process dies at the point with
// SIGKILL, the rest of the fleet is killed, fresh processes restore the last
// published checkpoint, and every rollout must finish exactly once with the
// right reward, no delivered model call repeated and no tool side effect
// applied twice. GYMFLEET_CRASHSWEEP=full sweeps every point in every
// process it can run in (make soak); otherwise every point once, the shared
// ones rotated over the participants.

// faultBin is the directory of the binaries built with the tag, once.
var faultBin struct {
	once sync.Once
	dir  string
	tmp  bool
	err  error
}

// faultBinaries returns GYMFLEET_FAULT_BIN, or builds the binaries with
// the tag into a temp directory the first time it is called.
func faultBinaries(t *testing.T) string {
	t.Helper()
	faultBin.once.Do(func() {
		if d := os.Getenv("GYMFLEET_FAULT_BIN"); d != "" {
			faultBin.dir = d
			return
		}
		dir, err := os.MkdirTemp("", "gymfleet-e2e-faults-")
		if err != nil {
			faultBin.err = err
			return
		}
		faultBin.dir, faultBin.tmp = dir, true
		_, file, _, _ := runtime.Caller(0)
		args := []string{"build", "-tags", "gymfleet_faults", "-o", dir + "/"}
		for _, b := range binaries {
			args = append(args, "./cmd/"+b)
		}
		cmd := exec.Command("go", args...)
		cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			faultBin.err = fmt.Errorf("building with gymfleet_faults: %v\n%s", err, out)
		}
	})
	if faultBin.err != nil {
		t.Fatal(faultBin.err)
	}
	for _, b := range binaries {
		if _, err := os.Stat(filepath.Join(faultBin.dir, b)); err != nil {
			t.Fatalf("binary %s missing in %s: %v", b, faultBin.dir, err)
		}
	}
	return faultBin.dir
}

// removeFaultBinaries removes a directory faultBinaries built.
func removeFaultBinaries() {
	if faultBin.tmp {
		_ = os.RemoveAll(faultBin.dir)
	}
}

// sweepFlow is how a case reaches its point.
type sweepFlow string

const (
	// flowCommit: checkpoint c1 and resume, arm, checkpoint c2: the
	// process dies during c2's commit.
	flowCommit sweepFlow = "commit"
	// flowRestore: checkpoint c1, crash, fresh processes with the point
	// armed, restore c1: the process dies during the restore.
	flowRestore sweepFlow = "restore"
	// flowRelease: checkpoint c1 and resume, arm, release the held model
	// calls: the model server dies capturing one.
	flowRelease sweepFlow = "release"
	// flowCollect: gymctl collect checkpoints on SIGUSR1 (c1), is armed,
	// and dies publishing the second checkpoint.
	flowCollect sweepFlow = "collect"
)

// The fleet's processes a point can be armed in (fleet.Standard's names).
const (
	procEnv       = "env"
	procModel     = "policy_model"
	procAgents    = "agents"
	procResources = "resources"
	procGymctl    = "gymctl"
)

var participantProcs = []string{procEnv, procModel, procAgents, procResources}

// sweepCase is one point armed in one process.
type sweepCase struct {
	point faultpoint.Point
	proc  string
	flow  sweepFlow
}

func (c sweepCase) name() string { return string(c.point) + "@" + c.proc }

// pointPlaces is, for every point, the flow that reaches it and the
// processes it can fire in.
func pointPlaces(p faultpoint.Point) (sweepFlow, []string) {
	switch p {
	case faultpoint.AtomicTempSynced:
		return flowCommit, append(slices.Clone(participantProcs), procGymctl)
	case faultpoint.AtomicLinked, faultpoint.StoreRecordsSynced, faultpoint.StoreRecordsCommitted,
		faultpoint.StoreManifestPublished, faultpoint.CommitWritten, faultpoint.CommitAcked:
		return flowCommit, participantProcs
	case faultpoint.EnvExportPartial:
		return flowCommit, []string{procEnv}
	case faultpoint.AgentExportPartial:
		return flowCommit, []string{procAgents}
	case faultpoint.ModelExportPartial:
		return flowCommit, []string{procModel}
	case faultpoint.ResourcesExportPartial:
		return flowCommit, []string{procResources}
	case faultpoint.RestoreRead, faultpoint.RestoreInstalled:
		return flowRestore, participantProcs
	case faultpoint.EpisodeInstallValidated:
		return flowRestore, []string{procEnv, procAgents}
	case faultpoint.AgentInstallPartial:
		return flowRestore, []string{procAgents}
	case faultpoint.ResourcesInstallPartial:
		return flowRestore, []string{procResources}
	case faultpoint.ModelInstallImported, faultpoint.ModelInstallDeleted,
		faultpoint.LedgerImportWritten, faultpoint.LedgerRemoveWritten:
		return flowRestore, []string{procModel}
	case faultpoint.LedgerAppendWritten:
		return flowRelease, []string{procModel}
	case faultpoint.AtomicRenamed, faultpoint.CollectManifestWritten, faultpoint.CollectLatestWritten:
		return flowCollect, []string{procGymctl}
	}
	return "", nil
}

// sweepCases lists the sweep: every point in every process (full), or
// every point once, points shared by the participants rotated over them.
func sweepCases(full bool) ([]sweepCase, error) {
	var out []sweepCase
	shared := 0
	for _, p := range faultpoint.All() {
		flow, procs := pointPlaces(p)
		if len(procs) == 0 {
			return nil, fmt.Errorf("point %s has no place in the sweep", p)
		}
		if full {
			for _, proc := range procs {
				if proc == procGymctl {
					// gymctl reaches a point only as the controller.
					out = append(out, sweepCase{point: p, proc: proc, flow: flowCollect})
					continue
				}
				out = append(out, sweepCase{point: p, proc: proc, flow: flow})
			}
			continue
		}
		proc := procs[0]
		if len(procs) > 1 {
			proc = procs[shared%len(procs)]
			shared++
		}
		if proc == procGymctl && flow != flowCollect {
			// A shared point runs in a participant here; in gymctl in the
			// full sweep.
			proc = procs[0]
		}
		out = append(out, sweepCase{point: p, proc: proc, flow: flow})
	}
	return out, nil
}

// sweepResult is one row of the sweep's table.
type sweepResult struct {
	c      sweepCase
	failed bool
	notes  []string
}

func TestCrashSweep(t *testing.T) {
	full := os.Getenv("GYMFLEET_CRASHSWEEP") == "full"
	cases, err := sweepCases(full)
	if err != nil {
		t.Fatal(err)
	}
	bin := faultBinaries(t)
	var mu sync.Mutex
	var results []sweepResult
	t.Run("points", func(t *testing.T) {
		for _, c := range cases {
			t.Run(c.name(), func(t *testing.T) {
				t.Parallel()
				res := sweepResult{c: c}
				defer func() {
					res.failed = t.Failed()
					mu.Lock()
					results = append(results, res)
					mu.Unlock()
				}()
				runSweepCase(t, bin, c, func(format string, args ...any) {
					res.notes = append(res.notes, fmt.Sprintf(format, args...))
				})
			})
		}
	})
	// Every point was reached: each case requires its process to die
	// there, and every point has a case.
	reached := map[faultpoint.Point]bool{}
	slices.SortFunc(results, func(a, b sweepResult) int {
		return slices.Index(cases, a.c) - slices.Index(cases, b.c)
	})
	var b strings.Builder
	fmt.Fprintf(&b, "crash sweep (%d cases, %s):\n", len(results), map[bool]string{true: "full", false: "every point once"}[full])
	fmt.Fprintf(&b, "  %-32s %-13s %-8s %-7s %s\n", "POINT", "PROCESS", "FLOW", "RESULT", "OUTCOME")
	for _, r := range results {
		outcome := "ok"
		if r.failed {
			outcome = "FAIL"
		} else {
			reached[r.c.point] = true
		}
		fmt.Fprintf(&b, "  %-32s %-13s %-8s %-7s %s\n", r.c.point, r.c.proc, r.c.flow, outcome, strings.Join(r.notes, "; "))
	}
	fmt.Print(b.String())
	if len(results) < len(cases) {
		return // -run chose some cases
	}
	for _, p := range faultpoint.All() {
		if !reached[p] {
			t.Errorf("point %s was not swept successfully", p)
		}
	}
}

// The sweep's rollouts: a native and a legacy weather rollout (one tool
// round) and a native counter rollout whose tool state is checkpointed.
// Each is held at its second model call: call 0 is delivered, call 1 is not.
func sweepRows() []map[string]any {
	return []map[string]any{
		weatherRow("sw-w", "weather_agent", "Paris"),
		weatherRow("sw-l", "weather_agent_legacy", "Oslo"),
		counterRow("sw-k", "counter_agent", 3, 1, 2),
	}
}

// sweepWant is each rollout's model calls (messages each) once restored:
// call 0 once, the undelivered call 1 re-issued once, then the rest.
var sweepWant = map[string][]int{"sw-w": {2, 4, 4}, "sw-l": {2, 4, 4}, "sw-k": {2, 4, 4, 6}}

// sweepLedgerRows is the rows of each replacement's capture ledger: call 0
// imported, then its own calls.
var sweepLedgerRows = map[string]int{"sw-w": 2, "sw-l": 2, "sw-k": 3}

// holdSweep holds the second model call of every rollout on f and
// returns the sweep's rows, their rollout ids and the scope naming their
// first attempts.
func holdSweep(f *Fleet) (rows []map[string]any, ids []string, scope []rollout.EpisodeID) {
	rows = sweepRows()
	for _, r := range rows {
		id := r[rollout.FieldRolloutID].(string)
		ids, scope = append(ids, id), append(scope, ep(id, 0))
	}
	f.HoldSecondCalls()
	return rows, ids, scope
}

// startHeld starts every row and returns once each rollout's second model
// call is held.
func startHeld(f *Fleet, rows []map[string]any, ids []string) []*Run {
	var runs []*Run
	for _, r := range rows {
		runs = append(runs, f.Start(r))
	}
	for _, id := range ids {
		f.WaitHeld(id, 2)
	}
	return runs
}

func runSweepCase(t *testing.T, bin string, c sweepCase, note func(string, ...any)) {
	arm := filepath.Join(t.TempDir(), "arm")
	armEnv := faultpoint.EnvFile + "=" + arm
	f := startFleetWith(t, fleetOptions{bin: bin, cfg: func(cfg *fleet.Config) {
		for i := range cfg.Processes {
			if cfg.Processes[i].Name == c.proc {
				cfg.Processes[i].Env = append(cfg.Processes[i].Env, fleet.EnvVar{Name: faultpoint.EnvFile, Value: arm})
			}
		}
	}})
	armPoint := func() {
		if err := os.WriteFile(arm, []byte(c.point+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	disarm := func() {
		if err := os.Remove(arm); err != nil {
			t.Fatal(err)
		}
	}
	rows, ids, scope := holdSweep(f)
	ctx := context.Background()

	if c.flow == flowCollect {
		sweepCollect(t, f, c, bin, armEnv, armPoint, disarm, rows, ids, note)
		return
	}

	firsts := startHeld(f, rows, ids)
	coord := f.Coord()
	f.Checkpoint(coord, "c1", scope...)
	switch c.flow {
	case flowCommit:
		f.Resume(coord, "c1")
		armPoint()
		res, err := coord.Prepare(ctx, "c2", deadline(30*time.Second))
		if err != nil || !res.Prepared {
			t.Fatalf("prepare c2: %+v %v", res, err)
		}
		if _, err := coord.Commit(ctx, "c2", f.Dir("c2"), scope, deadline(30*time.Second), false); err == nil {
			t.Fatalf("commit c2 succeeded though %s was to die at %s", c.proc, c.point)
		}
	case flowRelease:
		f.Resume(coord, "c1")
		armPoint()
		f.Release()
	case flowRestore:
		f.Crash()
		armPoint()
		f.Restart()
		if _, err := f.Coord().Restore(ctx, "c1", f.Dir("c1"), scope, deadline(30*time.Second)); err == nil {
			t.Fatalf("restore c1 succeeded though %s was to die at %s", c.proc, c.point)
		}
	}
	waitFired(t, f, c)
	note("died at the point")
	disarm()
	if c.flow == flowCommit {
		have, all := manifestsOf(t, f.Dir("c1"), f.Dir("c2"))
		note("c2 left %d of %d participant manifests", have, all)
		if have < all {
			// A partial checkpoint never restores: the restore is refused
			// as a whole (and undone), whoever could have installed.
			f.Crash()
			f.Restart()
			_, err := f.Coord().Restore(ctx, "c2", f.Dir("c2"), scope, deadline(30*time.Second))
			var ce *coordination.Error
			if !errors.As(err, &ce) || !slices.ContainsFunc(slices.Collect(maps.Values(ce.Failures)), func(e error) bool {
				return apierror.HasCode(e, apierror.InvalidCheckpointState)
			}) {
				t.Fatalf("restoring the partial c2: %v, want invalid_checkpoint_state", err)
			}
			note("its restore refused")
		}
	}

	// The rest of the fleet dies too; fresh processes restore the last
	// published checkpoint, c1, which must still verify.
	f.Crash()
	store := ctlplanetest.Store(t, f.Dir("c1"))
	if _, err := store.Verify(ctx, f.Dir("c1")); err != nil {
		t.Fatalf("c1 no longer verifies: %v", err)
	}
	f.Restart()
	coord = f.Coord()
	if _, err := coord.Restore(ctx, "c1", f.Dir("c1"), scope, deadline(30*time.Second)); err != nil {
		t.Fatalf("restore c1 after the crash: %v", err)
	}
	f.Resume(coord, "c1")
	f.Release()
	for i, r := range firsts {
		if rep := r.Wait(t, 30*time.Second); rep.Status == http.StatusOK {
			t.Fatalf("%s's first attempt replied across the crash: %v", ids[i], rep.Body)
		}
	}
	var seconds []*Run
	for _, r := range rows {
		seconds = append(seconds, f.Start(withAttempt(r, 1)))
	}
	for _, r := range seconds {
		assertReward(t, r.Wait(t, 2*time.Minute), 1.0)
	}
	checkCalls(t, f, ids)
	note("restored c1: %d rollouts once, reward 1.0, no delivered call repeated", len(ids))
}

// sweepCollect is flowCollect: gymctl collect is the controller and the
// process that dies.
func sweepCollect(t *testing.T, f *Fleet, c sweepCase, bin, armEnv string, armPoint, disarm func(), rows []map[string]any, ids []string, note func(string, ...any)) {
	ws := newWorkspace(t, rows...)
	g := startGymctlIn(t, bin, []string{armEnv}, f.collectArgs(ws)...)
	for _, id := range ids {
		f.WaitHeld(id, 2)
	}
	g.signal(syscall.SIGUSR1)
	// Armed only once the first checkpoint is through: LATEST appears
	// before its own publish has passed the points after it.
	f.WaitFor("the first checkpoint published and the fleet resumed", 30*time.Second, func() bool {
		return strings.Contains(g.out.String(), " published: ")
	})
	first, ok := ws.latest()
	if !ok {
		t.Fatal("no LATEST after the first checkpoint")
	}
	armPoint()
	g.signal(syscall.SIGUSR1)
	if code := g.wait(time.Minute); code != -1 {
		t.Fatalf("gymctl exited %d, want killed at %s:\n%s", code, c.point, g.out.String())
	}
	if !strings.Contains(g.out.String(), faultpoint.FiredPrefix+string(c.point)) {
		t.Fatalf("gymctl died, but not at %s:\n%s", c.point, g.out.String())
	}
	note("died at the point")
	disarm()
	latest, ok := ws.latest()
	if !ok {
		t.Fatal("no usable LATEST after the crash")
	}
	// LATEST moves only once it is written: at every point before, it
	// still names the first checkpoint.
	second := latest.CheckpointID != first.CheckpointID
	if want := c.point == faultpoint.CollectLatestWritten; second != want {
		t.Fatalf("LATEST names %s (the first is %s) after a crash at %s", latest.CheckpointID, first.CheckpointID, c.point)
	}
	if second {
		note("LATEST the second checkpoint")
	} else {
		note("LATEST still the first checkpoint")
	}
	f.Crash()
	f.Restart()
	f.Release()
	r := f.collect(ws, "--resume")
	r.requireExit(2*time.Minute, 0)
	for id, a := range ws.exactlyOnce(ids...) {
		if a != 1 {
			t.Errorf("%s finished as attempt %d, want 1 (continued from the checkpoint)", id, a)
		}
	}
	if !strings.Contains(r.out.String(), fmt.Sprintf("continued %d, restarted 0", len(ids))) {
		t.Errorf("the resumed run does not report %d continued rows:\n%s", len(ids), r.out.String())
	}
	checkCalls(t, f, ids)
	note("resumed: %d rows once in the output, reward 1.0, no delivered call repeated", len(ids))
}

// waitFired waits for c's process to die and requires its log to say it
// died at c's point.
func waitFired(t *testing.T, f *Fleet, c sweepCase) {
	t.Helper()
	select {
	case <-f.L.Exited(c.proc):
	case <-time.After(time.Minute):
		t.Fatalf("%s never reached %s (still running after a minute)", c.proc, c.point)
	}
	if !strings.Contains(f.L.Logs(c.proc), faultpoint.FiredPrefix+string(c.point)) {
		t.Fatalf("%s died, but not at %s", c.proc, c.point)
	}
}

// checkCalls requires each rollout's model calls and its replacement's
// capture ledger to be as if no crash had happened but the one restore:
// no delivered call repeated, no call twice in the lineage.
func checkCalls(t *testing.T, f *Fleet, ids []string) {
	t.Helper()
	for _, id := range ids {
		if got := f.MessageCounts(id); !slices.Equal(got, sweepWant[id]) {
			t.Errorf("%s model calls (messages each) %v, want %v", id, got, sweepWant[id])
		}
		rows := f.ledger(id + "-a1")
		if len(rows) != sweepLedgerRows[id] {
			t.Errorf("%s-a1's ledger has %d rows, want %d: %v", id, len(rows), sweepLedgerRows[id], rows)
			continue
		}
		seen := map[any]bool{}
		for i, r := range rows {
			if seen[r["call_id"]] {
				t.Errorf("%s-a1's ledger holds call %v twice", id, r["call_id"])
			}
			seen[r["call_id"]] = true
			if i > 0 && r["parent_call_id"] != rows[i-1]["call_id"] {
				t.Errorf("%s-a1's lineage is broken at row %d: %v", id, i, rows)
			}
		}
	}
}

// manifestsOf counts the participant manifests the checkpoint at dir
// holds, and those c1 has.
func manifestsOf(t *testing.T, c1, dir string) (have, all int) {
	t.Helper()
	count := func(d string) int {
		m, err := filepath.Glob(filepath.Join(d, "gym", "*", "*", "manifest.json"))
		if err != nil {
			t.Fatal(err)
		}
		return len(m)
	}
	return count(dir), count(c1)
}
