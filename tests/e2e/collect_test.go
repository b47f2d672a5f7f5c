package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/gymfleet/gymfleet/pkg/ops/collect"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// The process-level collection suite (reference protocol.md §10.1
// scenarios 15–16 and the SIGKILL cases of §8): gymctl collect runs as its
// own process against a real fleet, is signalled or killed, and resumed.

// workspace is one collection's files.
type workspace struct {
	t                        *testing.T
	dir, input, output, ckpt string
}

func newWorkspace(t *testing.T, rows ...map[string]any) *workspace {
	t.Helper()
	dir := t.TempDir()
	ws := &workspace{t: t, dir: dir, input: filepath.Join(dir, "input.jsonl"), output: filepath.Join(dir, "output.jsonl"), ckpt: filepath.Join(dir, "ckpt")}
	var b bytes.Buffer
	for _, r := range rows {
		line, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(append(line, '\n'))
	}
	if err := os.WriteFile(ws.input, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return ws
}

// outputRows reads the output JSONL (a missing file has no rows).
func (ws *workspace) outputRows() []map[string]any {
	ws.t.Helper()
	return ws.readOutput(false)
}

// finishedOutput is the output of a collection that has exited: every line
// must be whole.
func (ws *workspace) finishedOutput() []map[string]any {
	ws.t.Helper()
	return ws.readOutput(true)
}

// readOutput parses the output's rows. While gymctl collect runs, its last
// line may be half written: polling reads (strict false) leave an
// unterminated last line out rather than fail on it.
func (ws *workspace) readOutput(strict bool) []map[string]any {
	ws.t.Helper()
	b, err := os.ReadFile(ws.output)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		ws.t.Fatal(err)
	}
	if i := bytes.LastIndexByte(b, '\n'); !strict && i+1 < len(b) {
		b = b[:i+1]
	}
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			ws.t.Fatalf("output line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

// dispatched counts the attempts the dispatch log names (torn last line
// ignored).
func (ws *workspace) dispatchLog() *collect.DispatchLog {
	ws.t.Helper()
	log, err := collect.LoadDispatchLog(filepath.Join(ws.ckpt, collect.DispatchLogName))
	if err != nil {
		ws.t.Fatal(err)
	}
	return log
}

func (ws *workspace) dispatchLines() int {
	ws.t.Helper()
	b, err := os.ReadFile(filepath.Join(ws.ckpt, collect.DispatchLogName))
	if err != nil {
		return 0
	}
	return max(0, bytes.Count(b, []byte("\n"))-1)
}

func (ws *workspace) latest() (*collect.CollectionManifest, bool) {
	ws.t.Helper()
	m, err := collect.ReadLatest(ws.ckpt)
	if errors.Is(err, collect.ErrNoLatest) {
		return nil, false
	}
	if err != nil {
		ws.t.Fatal(err)
	}
	return m, true
}

// exactlyOnce requires every rollout of ids once in the output with reward
// 1.0 and returns each row's attempt.
func (ws *workspace) exactlyOnce(ids ...string) map[string]int {
	ws.t.Helper()
	rows := ws.finishedOutput()
	attempts := map[string]int{}
	count := map[string]int{}
	for _, r := range rows {
		id, _ := r[rollout.FieldRolloutID].(string)
		count[id]++
		attempts[id] = int(r[rollout.FieldAttemptIndex].(float64))
		if r["reward"] != 1.0 {
			ws.t.Errorf("%s: reward %v, want 1.0", id, r["reward"])
		}
	}
	for _, id := range ids {
		if count[id] != 1 {
			ws.t.Errorf("%s is in the output %d times, want exactly once", id, count[id])
		}
	}
	if len(rows) != len(ids) {
		ws.t.Errorf("%d output rows, want %d", len(rows), len(ids))
	}
	return attempts
}

// lockedBuffer collects a process's output while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// collector is one gymctl collect process.
type collector struct {
	t    *testing.T
	cmd  *exec.Cmd
	out  lockedBuffer
	done chan struct{}
	code int
}

// fleetFile writes the fleet's configuration as a fleet file for gymctl.
func (f *Fleet) fleetFile() string {
	f.t.Helper()
	b, err := yaml.Marshal(f.Cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	path := filepath.Join(f.Cfg.BaseDir, "fleet.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		f.t.Fatal(err)
	}
	return path
}

// collect starts gymctl collect over the fleet with the workspace's files
// and checkpoint directory.
func (f *Fleet) collect(ws *workspace, args ...string) *collector {
	f.t.Helper()
	return startGymctl(f.t, f.collectArgs(ws, args...)...)
}

// collectArgs are gymctl's arguments to collect ws over the fleet.
func (f *Fleet) collectArgs(ws *workspace, args ...string) []string {
	f.t.Helper()
	return append([]string{"collect", "--config", f.fleetFile(), "--input", ws.input, "--output", ws.output,
		"--checkpoint-dir", ws.ckpt, "--no-progress", "--checkpoint-timeout", "30s"}, args...)
}

func startGymctl(t *testing.T, args ...string) *collector {
	t.Helper()
	return startGymctlIn(t, binDir, nil, args...)
}

// startGymctlIn starts bin's gymctl with env added to the test's
// environment.
func startGymctlIn(t *testing.T, bin string, env []string, args ...string) *collector {
	t.Helper()
	c := &collector{t: t, done: make(chan struct{})}
	c.cmd = exec.Command(filepath.Join(bin, "gymctl"), args...)
	if env != nil {
		c.cmd.Env = append(os.Environ(), env...)
	}
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = c.cmd.Wait()
		c.code = c.cmd.ProcessState.ExitCode()
		close(c.done)
	}()
	t.Cleanup(func() {
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Kill()
			<-c.done
		}
		if t.Failed() {
			t.Logf("--- gymctl %s ---\n%s", strings.Join(args[:1], " "), c.out.String())
		}
	})
	return c
}

// wait returns the exit status (-1 after a signal), failing after timeout.
func (c *collector) wait(timeout time.Duration) int {
	c.t.Helper()
	select {
	case <-c.done:
		return c.code
	case <-time.After(timeout):
		c.t.Fatalf("gymctl did not exit within %v; output:\n%s", timeout, c.out.String())
		return 0
	}
}

func (c *collector) signal(sig syscall.Signal) {
	c.t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		c.t.Fatal(err)
	}
}

func (c *collector) requireExit(timeout time.Duration, want int) {
	c.t.Helper()
	if got := c.wait(timeout); got != want {
		c.t.Fatalf("gymctl exited %d, want %d; output:\n%s", got, want, c.out.String())
	}
}

func (f *Fleet) heldCalls() int {
	f.t.Helper()
	n, err := f.Fake.CallCount(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return n.Held
}

func continuedKeys(m *collect.CollectionManifest) []string {
	var out []string
	for _, e := range m.Continued {
		out = append(out, e.CaptureKey())
	}
	slices.Sort(out)
	return out
}

// Scenario 15: SIGTERM checkpoints and exits 75; the fleet is crashed and
// restarted; --resume restores the checkpoint and finishes the continued
// rows as attempt 1 without repeating their delivered first model call
// (single_agent_turn and legacy).
func TestCollect_SIGTERMExits75AndResumeContinuesAfterACrash(t *testing.T) {
	f := startFleet(t, nil)
	f.HoldSecondCalls()
	ws := newWorkspace(t, weatherRow("long-1", "weather_agent", "Paris"), weatherRow("long-2", "weather_agent_legacy", "Oslo"))
	c := f.collect(ws)
	f.WaitHeld("long-1", 2)
	f.WaitHeld("long-2", 2)
	c.signal(syscall.SIGTERM)
	c.requireExit(time.Minute, collect.ExitPreempted)

	m, ok := ws.latest()
	if !ok {
		t.Fatal("no LATEST after the preemption checkpoint")
	}
	if got := continuedKeys(m); !slices.Equal(got, []string{"long-1", "long-2"}) {
		t.Fatalf("the manifest continues %v, want [long-1 long-2] (attempt 0)", got)
	}
	if log := ws.dispatchLog(); log.RunID != m.RunID {
		t.Fatalf("the manifest's run %s is not the dispatch log's %s", m.RunID, log.RunID)
	}
	if rows := ws.outputRows(); len(rows) != 0 {
		t.Fatalf("rows were written before the checkpoint: %v", rows)
	}

	f.Crash()
	f.Restart()
	f.Release()
	r := f.collect(ws, "--resume")
	r.requireExit(time.Minute, 0)
	attempts := ws.exactlyOnce("long-1", "long-2")
	for _, id := range []string{"long-1", "long-2"} {
		if attempts[id] != 1 {
			t.Errorf("%s finished as attempt %d, want 1 (the continued attempt)", id, attempts[id])
		}
		if got := f.MessageCounts(id); !slices.Equal(got, []int{2, 4, 4}) {
			t.Errorf("%s model calls (messages each) %v, want [2 4 4]: call 0 is never repeated", id, got)
		}
	}
	if !strings.Contains(r.out.String(), "continued 2, restarted 0") {
		t.Errorf("the resumed run's summary does not report 2 continued rows:\n%s", r.out.String())
	}
}

// Scenario 16: SIGUSR1 checkpoints and the collection continues.
func TestCollect_SIGUSR1CheckpointsAndContinues(t *testing.T) {
	f := startFleet(t, nil)
	f.HoldSecondCalls()
	ws := newWorkspace(t, weatherRow("usr-1", "weather_agent", "Lima"), weatherRow("usr-2", "weather_agent_legacy", "Rome"))
	c := f.collect(ws)
	f.WaitHeld("usr-1", 2)
	f.WaitHeld("usr-2", 2)
	pid, err := os.ReadFile(filepath.Join(ws.ckpt, collect.PIDFileName))
	if err != nil || strings.TrimSpace(string(pid)) != itoa(c.cmd.Process.Pid) {
		t.Fatalf("collector.pid holds %q (%v), want %d", pid, err, c.cmd.Process.Pid)
	}
	c.signal(syscall.SIGUSR1)
	f.WaitFor("LATEST", 30*time.Second, func() bool { _, ok := ws.latest(); return ok })
	f.Release()
	c.requireExit(time.Minute, 0)
	m, _ := ws.latest()
	if got := continuedKeys(m); !slices.Equal(got, []string{"usr-1", "usr-2"}) {
		t.Fatalf("the manifest continues %v, want [usr-1 usr-2]", got)
	}
	attempts := ws.exactlyOnce("usr-1", "usr-2")
	for _, id := range []string{"usr-1", "usr-2"} {
		if attempts[id] != 0 {
			t.Errorf("%s finished as attempt %d, want 0", id, attempts[id])
		}
		if got := f.MessageCounts(id); !slices.Equal(got, []int{2, 4}) {
			t.Errorf("%s model calls %v, want [2 4]", id, got)
		}
	}
	if _, err := os.Stat(filepath.Join(ws.ckpt, collect.PIDFileName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("collector.pid outlives the run: %v", err)
	}
}

// The seed's rollout-collection run, scaled down: a SIGUSR1 checkpoint,
// more rows sent, then the collector killed with SIGKILL while the fleet
// keeps running. The resumed run retires the rows sent after the
// checkpoint and sends them again as attempt 1; every row finishes exactly
// once with reward 1.0.
func TestCollect_SIGKILLAfterACheckpointRetiresTheRowsSentSince(t *testing.T) {
	f := startFleet(t, nil)
	f.HoldSecondCalls()
	var rows []map[string]any
	var ids []string
	for i, city := range []string{"Paris", "Oslo", "Lima", "Rome", "Kyiv", "Doha", "Baku", "Riga"} {
		id := "k" + itoa(i)
		ids = append(ids, id)
		rows = append(rows, weatherRow(id, []string{"weather_agent", "weather_agent_legacy"}[i%2], city))
	}
	ws := newWorkspace(t, rows...)
	c := f.collect(ws, "--concurrency", "4")
	f.WaitFor("the first four rows held at their second call", time.Minute, func() bool { return f.heldCalls() == 4 })
	c.signal(syscall.SIGUSR1)
	f.WaitFor("LATEST", 30*time.Second, func() bool { _, ok := ws.latest(); return ok })
	m, _ := ws.latest()
	if got := continuedKeys(m); !slices.Equal(got, ids[:4]) {
		t.Fatalf("the checkpoint continues %v, want %v", got, ids[:4])
	}
	// The four continued rows finish; four more are sent and held.
	if _, err := f.Fake.ReleaseCalls(context.Background(), 4); err != nil {
		t.Fatal(err)
	}
	f.WaitFor("four rows finished and four more held", time.Minute, func() bool {
		return len(ws.outputRows()) == 4 && f.heldCalls() == 4 && ws.dispatchLines() == 8
	})
	c.signal(syscall.SIGKILL)
	c.wait(30 * time.Second)
	f.Release()

	r := f.collect(ws, "--resume")
	r.requireExit(time.Minute, 0)
	attempts := ws.exactlyOnce(ids...)
	for i, id := range ids {
		want := 0
		if i >= 4 {
			want = 1
		}
		if attempts[id] != want {
			t.Errorf("%s finished as attempt %d, want %d", id, attempts[id], want)
		}
	}
	for _, want := range []string{"4 rows already in the output", "0 continue", "4 start over", "retired attempts: 4  forgotten rollouts: 4"} {
		if !strings.Contains(r.out.String(), want) {
			t.Errorf("the resumed run does not say %q:\n%s", want, r.out.String())
		}
	}
	log := ws.dispatchLog()
	if _, has := log.Attempts["k0"]; log.RunID == m.RunID || has || len(log.Attempts) != 4 || log.Attempts["k4"] != 1 || log.Attempts["k7"] != 1 {
		t.Errorf("the resumed run's dispatch log: run %s (the checkpoint's %s), attempts %v; want a new run sending k4..k7 as attempt 1", log.RunID, m.RunID, log.Attempts)
	}
}

// SIGKILL before any checkpoint: nothing is restored, the rows sent start
// over as attempt 1, finished rows are not sent again, and nothing is
// written twice.
func TestCollect_SIGKILLBeforeAnyCheckpointStartsOver(t *testing.T) {
	f := startFleet(t, nil)
	f.HoldSecondCalls()
	ids := []string{"s0", "s1", "s2", "s3"}
	ws := newWorkspace(t, weatherRow("s0", "weather_agent", "Paris"), weatherRow("s1", "weather_agent_legacy", "Oslo"),
		weatherRow("s2", "weather_agent", "Lima"), weatherRow("s3", "weather_agent_legacy", "Rome"))
	c := f.collect(ws, "--concurrency", "2")
	f.WaitFor("two rows held", time.Minute, func() bool { return f.heldCalls() == 2 })
	if _, err := f.Fake.ReleaseCalls(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	f.WaitFor("two rows finished and two more held", time.Minute, func() bool {
		return len(ws.outputRows()) == 2 && f.heldCalls() == 2 && ws.dispatchLines() == 4
	})
	c.signal(syscall.SIGKILL)
	c.wait(30 * time.Second)
	if _, ok := ws.latest(); ok {
		t.Fatal("a LATEST exists though no checkpoint was taken")
	}
	f.Release()
	r := f.collect(ws, "--resume")
	r.requireExit(time.Minute, 0)
	attempts := ws.exactlyOnce(ids...)
	if attempts["s0"] != 0 || attempts["s1"] != 0 || attempts["s2"] != 1 || attempts["s3"] != 1 {
		t.Errorf("attempts %v, want s0 s1 at 0 (finished before the kill) and s2 s3 at 1", attempts)
	}
	for _, id := range ids[:2] {
		if n := len(f.Calls(id)); n != 2 {
			t.Errorf("%s made %d model calls, want 2: a finished row is never sent again", id, n)
		}
	}
}

// Bad input never gets a row sent twice or half a run: bad lines are named
// with their line number and stop the run before anything is sent (unless
// --skip-bad-lines), an unusable checkpoint directory stops it too, and a
// LATEST that points at a partial checkpoint starts the rows over.
func TestCollect_BadInput(t *testing.T) {
	f := startFleet(t, nil)
	good := func(id string) string {
		b, _ := json.Marshal(weatherRow(id, "weather_agent", "Paris"))
		return string(b)
	}
	writeLines := func(ws *workspace, lines ...string) {
		if err := os.WriteFile(ws.input, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	calls := func() int {
		n, err := f.Fake.CallCount(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return n.Received
	}

	t.Run("MalformedLine", func(t *testing.T) {
		ws := newWorkspace(t)
		writeLines(ws, good("bad-a"), `{"responses_create_params": {"input": "cut`, good("bad-b"))
		before := calls()
		c := f.collect(ws)
		c.requireExit(30*time.Second, 1)
		if !strings.Contains(c.out.String(), "line 2: not a JSON object") || !strings.Contains(c.out.String(), "--skip-bad-lines") {
			t.Errorf("the error does not name line 2:\n%s", c.out.String())
		}
		if calls() != before || len(ws.outputRows()) != 0 {
			t.Fatal("rows were sent from an input with a bad line")
		}
		c = f.collect(ws, "--skip-bad-lines")
		c.requireExit(time.Minute, 0)
		ws.exactlyOnce("bad-a", "bad-b")
		if !strings.Contains(c.out.String(), "skipped line 2") {
			t.Errorf("the summary does not report the skipped line:\n%s", c.out.String())
		}
	})
	t.Run("RowWithoutATask", func(t *testing.T) {
		ws := newWorkspace(t)
		writeLines(ws, good("task-a"), `{"city": "Paris", "_ng_rollout_id": "task-b"}`)
		c := f.collect(ws)
		c.requireExit(30*time.Second, 1)
		if !strings.Contains(c.out.String(), "line 2: no responses_create_params") {
			t.Errorf("the error does not name line 2's missing task:\n%s", c.out.String())
		}
	})
	t.Run("UnusableCheckpointDir", func(t *testing.T) {
		ws := newWorkspace(t, weatherRow("dir-a", "weather_agent", "Paris"))
		if err := os.WriteFile(ws.ckpt, []byte("a file, not a directory"), 0o644); err != nil {
			t.Fatal(err)
		}
		before := calls()
		c := f.collect(ws)
		c.requireExit(30*time.Second, 1)
		if !strings.Contains(c.out.String(), "checkpoint directory") {
			t.Errorf("the error does not name the checkpoint directory:\n%s", c.out.String())
		}
		if calls() != before {
			t.Fatal("rows were sent without a usable checkpoint directory")
		}
	})
	// A preempted run on a fleet that keeps running (no crash), then its
	// checkpoint damaged.
	preempted := func(t *testing.T, id string) *workspace {
		f.HoldSecondCalls()
		ws := newWorkspace(t, weatherRow(id, "weather_agent", "Paris"))
		c := f.collect(ws)
		f.WaitHeld(id, 2)
		c.signal(syscall.SIGTERM)
		c.requireExit(time.Minute, collect.ExitPreempted)
		if _, ok := ws.latest(); !ok {
			t.Fatal("no LATEST")
		}
		f.Release()
		return ws
	}
	t.Run("LatestPointsAtAPartialCheckpoint", func(t *testing.T) {
		ws := preempted(t, "partial-a")
		m, _ := ws.latest()
		if err := os.Remove(filepath.Join(ws.ckpt, m.CheckpointID, collect.ManifestName)); err != nil {
			t.Fatal(err)
		}
		r := f.collect(ws, "--resume")
		r.requireExit(time.Minute, 0)
		if attempts := ws.exactlyOnce("partial-a"); attempts["partial-a"] != 1 {
			t.Errorf("the row finished as attempt %d, want 1 (started over, the logged attempt retired)", attempts["partial-a"])
		}
		if !strings.Contains(r.out.String(), "LATEST is not usable") {
			t.Errorf("the resumed run does not say LATEST is unusable:\n%s", r.out.String())
		}
	})
	t.Run("LatestWhoseRestoreFails", func(t *testing.T) {
		// The fleet kept running, so restore (fresh processes only) fails;
		// the participants' records are damaged too.
		ws := preempted(t, "tampered-a")
		m, _ := ws.latest()
		if err := os.RemoveAll(filepath.Join(ws.ckpt, m.CheckpointID, "gym", "environment")); err != nil {
			t.Fatal(err)
		}
		r := f.collect(ws, "--resume")
		r.requireExit(time.Minute, 0)
		if attempts := ws.exactlyOnce("tampered-a"); attempts["tampered-a"] != 2 {
			t.Errorf("the row finished as attempt %d, want 2 (restore failed: attempt + 2)", attempts["tampered-a"])
		}
		if !strings.Contains(r.out.String(), "restoring "+m.CheckpointID+" failed") {
			t.Errorf("the resumed run does not report the failed restore:\n%s", r.out.String())
		}
	})
}

func itoa(i int) string { return strconv.Itoa(i) }
