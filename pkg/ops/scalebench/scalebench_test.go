package scalebench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// fakeProc writes a /proc tree holding one file of process pid (pid 0:
// a file of /proc itself) and returns its root.
func fakeProc(t *testing.T, pid int, name, text string) string {
	t.Helper()
	root := t.TempDir()
	dir := root
	if pid != 0 {
		dir = filepath.Join(root, strconv.Itoa(pid))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestParseStatus(t *testing.T) {
	tests := []struct {
		name, text string
		want       memStatus
		wantErr    bool
	}{
		{"both", "Name:\tenv\nVmPeak:\t 100 kB\nVmHWM:\t    2048 kB\nVmRSS:\t    1024 kB\nThreads:\t7\n", memStatus{HWM: 2 << 20, RSS: 1 << 20}, false},
		{"kernel thread", "Name:\tkthreadd\nThreads:\t1\n", memStatus{}, true},
		{"bad unit", "VmHWM:\t2 MB\nVmRSS:\t1 kB\n", memStatus{}, true},
		{"not a number", "VmHWM:\tlots kB\nVmRSS:\t1 kB\n", memStatus{}, true},
		{"absurd", "VmHWM:\t99999999999999999 kB\nVmRSS:\t1 kB\n", memStatus{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readStatusAt(fakeProc(t, 4242, "status", tc.text), 4242)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if !tc.wantErr && got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestReadStatusOfThisProcess(t *testing.T) {
	st, err := readStatus(0)
	if err != nil {
		t.Fatal(err)
	}
	if st.RSS == 0 || st.HWM < st.RSS {
		t.Fatalf("status %+v: want a resident set and a high-water mark at least as large", st)
	}
	if n, err := countFDs(os.Getpid()); err != nil || n < 3 {
		t.Fatalf("countFDs = %d, %v; want at least stdin, stdout and stderr", n, err)
	}
}

func TestParseStat(t *testing.T) {
	// The command name may hold spaces and parentheses.
	// A whole line, as Linux 6.x writes it (procfs reads every field).
	line := "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0 100 1000 200" +
		" 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
	got, err := readStatAt(fakeProc(t, 4242, "stat", line), 4242)
	if err != nil || got != (procTimes{CPU: 3 * time.Second, System: 500 * time.Millisecond, MinorFaults: 100}) {
		t.Fatalf("readStatAt = %+v, %v; want 3s (300 ticks), 0.5 s of it system (50 ticks) and 100 minor faults", got, err)
	}
	for _, bad := range []string{"", "1 (x) S 1 2", "1 (x) S 1 2 3 4 5 6 7 8 9 10 x 5 0", "1 (x) S 1 2 3 4 5 6 x 8 9 10 11 5 0"} {
		if _, err := readStatAt(fakeProc(t, 4242, "stat", bad), 4242); err == nil {
			t.Errorf("readStatAt(%q) succeeded", bad)
		}
	}
	if cpu, err := readCPU(0); err != nil || cpu < 0 {
		t.Fatalf("readCPU(self) = %v, %v", cpu, err)
	}
}

// The sampler aborts once, naming the limit, when the resident memory it
// reads passes the limit.
func TestSamplerAbortsOverTheLimit(t *testing.T) {
	var calls atomic.Int32
	aborted := make(chan error, 4)
	s := newSampler(1, func(err error) {
		calls.Add(1)
		aborted <- err
	})
	defer s.stop()
	s.track(nil)
	select {
	case err := <-aborted:
		if !strings.Contains(err.Error(), "over the limit") {
			t.Fatalf("abort error %q does not name the limit", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the sampler never aborted")
	}
	s.sample()
	if n := calls.Load(); n != 1 {
		t.Fatalf("abort called %d times, want once", n)
	}
	if p := s.peakOf(0); p.rss == 0 || p.fds == 0 {
		t.Fatalf("peak of the bench %+v: want its memory and descriptors", p)
	}
}

func TestWeatherRows(t *testing.T) {
	rows := weatherRows(1000)
	if len(rows) != 1000 || rows[0].id != "w000" || rows[999].id != "w999" {
		t.Fatalf("ids %s..%s of %d rows, want w000..w999 of 1000", rows[0].id, rows[len(rows)-1].id, len(rows))
	}
	for _, r := range []row{rows[0], rows[999]} {
		if !rollout.ValidID(r.id) {
			t.Fatalf("%q is not a valid rollout id", r.id)
		}
	}
	for _, attempt := range []int{0, 1} {
		b, err := rows[7].body(attempt)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		id, err := rollout.FromRow(m)
		if err != nil || id != (rollout.EpisodeID{RolloutID: "w007", Attempt: attempt}) {
			t.Fatalf("attempt %d: episode %+v, %v", attempt, id, err)
		}
		if ref := m["agent_ref"].(map[string]any)["name"]; ref != agentName || m["city"] != "City7" {
			t.Fatalf("attempt %d: agent_ref %v, city %v", attempt, ref, m["city"])
		}
	}
}

// A batch sends every row once, counts what was written and classifies
// each outcome: a 200 with reward 1.0, a 200 with another reward, an error
// reply, and a call the server cut off.
func TestBatchClassifiesOutcomes(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		var row map[string]any
		if err := json.NewDecoder(r.Body).Decode(&row); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		switch row[rollout.FieldRolloutID] {
		case "w0":
			_, _ = w.Write([]byte(`{"reward": 1.0}`))
		case "w1":
			_, _ = w.Write([]byte(`{"reward": 0.0}`))
		case "w2":
			w.WriteHeader(http.StatusConflict)
			_, _ = w.Write([]byte(`{"error":{"code":"admission_closed","detail":"later"}}`))
		default:
			panic(http.ErrAbortHandler) // the connection is cut
		}
	}))
	defer srv.Close()
	client := httpclient.New(httpclient.Options{})
	b := dispatch(context.Background(), client, runRouter([]string{srv.URL}), weatherRows(4), 1)
	defer b.close()
	if err := b.wait(context.Background(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if !b.allSent() || b.sent.Load() != 4 || hits.Load() != 4 {
		t.Fatalf("sent %d (all %v), server saw %d; want 4 each, every row sent once", b.sent.Load(), b.allSent(), hits.Load())
	}
	got := b.summary()
	want := batchSummary{replied: 3, transportErrors: 1, ok: 1, non200: 1, rewardNotOne: 1}
	if got != want || got.failed() != 2 {
		t.Fatalf("summary %+v (failed %d), want %+v (failed 2)", got, got.failed(), want)
	}
	if b.replied() != 3 {
		t.Fatalf("replied %d, want 3", b.replied())
	}
	if ex := b.example(); !strings.Contains(ex, "attempt 1") {
		t.Fatalf("example %q does not describe a failed call", ex)
	}
	if !math.IsNaN(b.out[3].reward) && b.out[3].err == "" {
		t.Fatalf("the cut-off call has no error: %+v", b.out[3])
	}
}

func TestBatchWaitTimesOut(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	b := dispatch(context.Background(), httpclient.New(httpclient.Options{}), runRouter([]string{srv.URL}), weatherRows(2), 0)
	err := b.wait(context.Background(), 50*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "2 of 2 /run calls still open") {
		t.Fatalf("wait = %v, want a timeout naming the open calls", err)
	}
	b.close() // cancels the calls and waits for their goroutines
	if b.done.Load() != 2 {
		t.Fatalf("%d calls ended after close, want 2", b.done.Load())
	}
}

func sampleResult() *Result {
	return &Result{
		Rollouts: 16000, Host: Host{Name: "box", CPUs: 2, GoVersion: "go1.26.8"},
		DispatchSentSeconds: 1.5, DispatchSeconds: 4.25, InFlight: 16000, FleetStartSeconds: 0.3,
		Prepare: Prepare{Seconds: 0.4, Prepared: true, Stages: []PrepareStage{
			{Kind: "environment", Seconds: 0.1, Servers: 1}, {Kind: "model", Seconds: 0.2, Servers: 1},
			{Kind: "agent", Seconds: 0.05, Servers: 1}, {Kind: "resources", Seconds: 0.05, Servers: 1},
		}},
		Commit: Commit{Seconds: 0.45, Records: 64000, Bytes: 110 << 20, Kinds: []CommitKind{
			{Kind: "environment", Participants: 1, Records: 16000, Bytes: 6 << 20, Exported: 16000},
			{Kind: "model", Seconds: 0.3, Participants: 1, Records: 16000, Bytes: 23 << 20, Exported: 16000},
		}},
		Exported: 16000, KillToReadySeconds: 1.25, RestoreSeconds: 0.48, Restored: 16000, ResumeSeconds: 0.01,
		RestoreKinds:        []RestoreKind{{Kind: "agent", ReadSeconds: 0.125, InstallSeconds: 0.25}},
		ReplacementsSeconds: 20, Replacements: 16000, OriginalsCutOff: 16000,
		Processes: []ProcessStat{
			{Name: "env", Fleet: "first", PID: 10, PeakRSSBytes: 800 << 20, FDsAtBoundary: 19, PeakFDs: 140, CPUSeconds: 12.5,
				StackBytesAtBoundary: 216 << 20, GoroutinesAtBoundary: 32075},
			{Name: "fakeinference", Fleet: "kept", PID: 9, PeakRSSBytes: 600 << 20, FDsAtBoundary: 13, PeakFDs: 13},
			{Name: "env", Fleet: "fresh", PID: 20, PeakRSSBytes: 500 << 20, PeakFDs: 30},
		},
		Bench: ProcessStat{Name: "bench", Fleet: "-", PeakRSSBytes: 400 << 20, FDsAtBoundary: 31, PeakFDs: 40},
		PhaseCPU: []PhaseCPU{{Phase: "commit", Seconds: 0.75, ByProcess: map[string]float64{
			"policy_model": 0.25, "agents": 0.375, "bench": 0.125,
		}, GCCycles: map[string]int64{"policy_model": 0, "agents": 2}}},
		Violations: []string{},
	}
}

func TestPhaseCPU_Since(t *testing.T) {
	before := cpuSnapshot{"env": {CPU: 2 * time.Second, System: time.Second, MinorFaults: 10}, "agents": {CPU: 5 * time.Second, System: time.Second, MinorFaults: 7}, "gone": {CPU: time.Second}}
	now := cpuSnapshot{"env": {CPU: 2500 * time.Millisecond, System: 1250 * time.Millisecond, MinorFaults: 1510}, "agents": {CPU: 5250 * time.Millisecond, System: 1010 * time.Millisecond, MinorFaults: 7}, "new": {CPU: time.Second}}
	pc := before.since("commit", now)
	want := map[string]float64{"env": 0.5, "agents": 0.25}
	wantSystem := map[string]float64{"env": 0.25, "agents": 0.01}
	wantFaults := map[string]int64{"env": 1500, "agents": 0}
	if pc.Phase != "commit" || pc.Seconds != 0.75 || !maps.Equal(pc.ByProcess, want) || !maps.Equal(pc.SystemByProcess, wantSystem) || !maps.Equal(pc.MinorFaults, wantFaults) {
		t.Fatalf("since = %+v, want 0.75 s in all, by process %v, system %v, faults %v (a process read at one end only is left out)", pc, want, wantSystem, wantFaults)
	}
	if got, want := pc.detail(), "agents 0.25, env 0.50 (0.25 sys, 2k faults)"; got != want {
		t.Errorf("detail = %q, want %q (system CPU named from 0.02 s, faults from 1,000)", got, want)
	}
}

func TestParseRuntimeStat(t *testing.T) {
	exposition := `# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 32075
# HELP go_memstats_stack_inuse_bytes Number of bytes obtained from system for stack allocator in non-CGO environments.
# TYPE go_memstats_stack_inuse_bytes gauge
go_memstats_stack_inuse_bytes 2.17186304e+08
go_memstats_stack_sys_bytes 2.17186304e+08
# HELP go_memstats_heap_inuse_bytes Number of heap bytes that are in use.
# TYPE go_memstats_heap_inuse_bytes gauge
go_memstats_heap_inuse_bytes 1.048576e+08
`
	st, err := parseRuntimeStat([]byte(exposition))
	if err != nil || st != (runtimeStat{stackBytes: 217186304, goroutines: 32075, heapBytes: 104857600}) {
		t.Fatalf("parseRuntimeStat = %+v, %v; want 217186304 bytes of stacks, 32075 goroutines, 104857600 of heap", st, err)
	}
	if _, err := parseRuntimeStat([]byte("go_goroutines 12\n")); err == nil {
		t.Fatal("an exposition without the stack figure parsed")
	}
}

func TestParseGCCounts(t *testing.T) {
	exposition := `# HELP go_gc_duration_seconds A summary of the wall-time pause (stop-the-world) duration in garbage collection cycles.
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0"} 2.1e-05
go_gc_duration_seconds_sum 0.0123
go_gc_duration_seconds_count 117
# TYPE go_memstats_alloc_bytes_total counter
go_memstats_alloc_bytes_total 4.2e+09
go_goroutines 42
`
	if c, err := parseGCCounts([]byte(exposition)); err != nil || c != (gcCounts{cycles: 117, allocBytes: 4_200_000_000}) {
		t.Fatalf("parseGCCounts = %+v, %v; want 117 collections, 4.2e9 bytes allocated", c, err)
	}
	for _, bad := range []string{
		"go_goroutines 42\n",
		"go_gc_duration_seconds_count x\ngo_memstats_alloc_bytes_total 1\n",
		"go_gc_duration_seconds_count -1\ngo_memstats_alloc_bytes_total 1\n",
		"go_gc_duration_seconds_count 3\n",
		"go_gc_duration_seconds_count_total 3\ngo_memstats_alloc_bytes_total 1\n",
		"go_gc_duration_seconds_count 3\ngo_memstats_alloc_bytes_total -5\n",
	} {
		if c, err := parseGCCounts([]byte(bad)); err == nil {
			t.Errorf("parseGCCounts(%q) = %+v, want an error", bad, c)
		}
	}
}

func TestGCSnapshot_Since(t *testing.T) {
	before := gcSnapshot{"env": {10, 1000}, "agents": {7, 500}, "gone": {3, 1}}
	now := gcSnapshot{"env": {12, 3_001_000}, "agents": {7, 500}, "new": {1, 1}}
	cycles, alloc := before.since(now)
	if want := map[string]int64{"env": 2, "agents": 0}; !maps.Equal(cycles, want) {
		t.Fatalf("since's collections = %v, want %v (a server read at one end only is left out)", cycles, want)
	}
	if want := map[string]int64{"env": 3_000_000, "agents": 0}; !maps.Equal(alloc, want) {
		t.Fatalf("since's bytes allocated = %v, want %v", alloc, want)
	}
	pc := PhaseCPU{Phase: "commit", ByProcess: map[string]float64{"env": 0.5, "agents": 0.25}, GCCycles: cycles, AllocBytes: alloc}
	if got, want := pc.detail(), "agents 0.25, env 0.50 (2 GC, 3 MB allocated)"; got != want {
		t.Errorf("detail = %q, want %q (bytes allocated named from 1 MB)", got, want)
	}
}

func TestWriteTable(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleResult().WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := squeeze(buf.String())
	for _, want := range []string{
		"16000 weather rollouts",
		"dispatch: every rollout at its 2nd call       4.250  16000 in flight",
		"prepare model                                 0.200  1 server(s)",
		"prepare total                                 0.400  every stage prepared",
		"commit                                        0.450  64000 records, 110.0 MiB; the environment exported 16000",
		"  model                                       0.300  16000 records, 23.0 MiB, 16000 exported",
		"kill to ready (fresh fleet)                   1.250",
		"restore                                       0.480  16000 restored by the environment",
		"  agent                                       0.375  read and verify 0.125, install 0.250",
		"replacements: every one finished             20.000  16000 sent, 0 failed, 0 reward != 1.0",
		"originals: 0 replied (want 0), 16000 cut off by the crash",
		"first fleet, sum of peaks",
		"216.0 MiB, 32075 goroutines (13.8 KiB per rollout)",
		"CPU in commit                                 0.750  agents 0.38 (2 GC), bench 0.12, policy_model 0.25",
		"contract: every rollout was exported",
	} {
		if !strings.Contains(out, squeeze(want)) {
			t.Errorf("the table lacks %q:\n%s", want, buf.String())
		}
	}
	// Only the first fleet's own processes count in its sum (not fakeinference).
	r := sampleResult()
	if got := r.FleetPeakRSS("first"); got != 800<<20 {
		t.Errorf("first fleet sum %d, want %d", got, 800<<20)
	}

	r.Violations = []string{"3 original /run replied"}
	r.Prepare.Prepared = false
	r.Prepare.Stages[1].Blockers = []string{"policy_model: phase preparing, 1 blocker(s) [w1]"}
	buf.Reset()
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CONTRACT VIOLATED: 3 original /run replied", "NOT PREPARED: policy_model", "prepare total                                 0.400  NOT PREPARED"} {
		if !strings.Contains(squeeze(buf.String()), squeeze(want)) {
			t.Errorf("the failing table lacks %q:\n%s", want, buf.String())
		}
	}
	if strings.Contains(buf.String(), "contract: every rollout") {
		t.Errorf("a failing table claims the contract held:\n%s", buf.String())
	}
}

// squeeze collapses runs of spaces, so the assertions do not depend on
// column widths.
func squeeze(s string) string {
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == ' ' }), " ")
}

func TestWriteJSONRoundTrips(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bench.json")
	want := sampleResult()
	if err := want.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got Result
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Prepare.Stages[1].Seconds != 0.2 || got.Commit.Kinds[1].Bytes != 23<<20 || got.Processes[0].CPUSeconds != 12.5 || got.RestoreSeconds != 0.48 || got.RestoreKinds[0].InstallSeconds != 0.25 || got.PhaseCPU[0].ByProcess["agents"] != 0.375 {
		t.Fatalf("round trip lost figures: %+v", got)
	}
	for _, key := range []string{`"prepare"`, `"kill_to_ready_seconds"`, `"peak_rss_bytes"`, `"replacement_failures"`, `"violations": []`} {
		if !bytes.Contains(b, []byte(key)) {
			t.Errorf("the JSON lacks %s", key)
		}
	}
}

func TestRunRefusesBadOptions(t *testing.T) {
	for name, opts := range map[string]Options{
		"no rollouts": {BinDir: "bin"},
		"no bin dir":  {Rollouts: 10},
	} {
		res, err := Run(context.Background(), opts)
		if err == nil || res != nil {
			t.Errorf("%s: Run = %v, %v; want an error and no result", name, res, err)
		}
	}
}

// A missing binary fails the start with a result that says so, and the
// failed run keeps its directory for the logs.
func TestRunWithoutBinariesFailsAtStart(t *testing.T) {
	dir := t.TempDir()
	res, err := Run(context.Background(), Options{Rollouts: 1, BinDir: filepath.Join(dir, "nobin"), Dir: filepath.Join(dir, "work")})
	if err == nil || !strings.Contains(err.Error(), "starting the fleet") {
		t.Fatalf("Run = %v, want a start failure", err)
	}
	if res == nil || res.Error == "" || res.Dir == "" {
		t.Fatalf("result %+v: want the error and the kept directory", res)
	}
	if _, statErr := os.Stat(filepath.Join(res.Dir, "fleet", "envserver.yaml")); statErr != nil {
		t.Fatalf("the failed run did not keep its fleet directory: %v", statErr)
	}
	if errors.Is(err, context.Canceled) {
		t.Fatal("a start failure is not a cancellation")
	}
	// The kept directory is not run in again: its checkpoint would be
	// committed over.
	again, err := Run(context.Background(), Options{Rollouts: 1, BinDir: filepath.Join(dir, "nobin"), Dir: res.Dir})
	if err == nil || again != nil || !strings.Contains(err.Error(), "earlier run") {
		t.Fatalf("a second run in the kept directory: %v, %v; want a refusal naming the earlier run", again, err)
	}
}

func TestSummarizeLog(t *testing.T) {
	log := strings.Join([]string{
		"=== gymfleet launcher: starting envserver",
		"env listening on http://127.0.0.1:1",
		`{"time":"t","level":"WARN","msg":"final cleanup step failed","step":"close resources session"}`,
		`{"time":"t","level":"ERROR","msg":"boom"}`,
		`{"time":"t","level":"WARN","msg":"again"}`,
		`{"time":"t","level":"INFO","msg":"fine"}`,
	}, "\n")
	got, err := summarizeLog("env", strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	if got.Process != "env" || got.Warnings != 2 || got.Errors != 1 || !strings.Contains(got.First, "final cleanup step failed") {
		t.Fatalf("summary %+v, want 2 warnings, 1 error, the first warning kept", got)
	}
}

func TestParseMemTotal(t *testing.T) {
	got, ok := memTotalAt(fakeProc(t, 0, "meminfo", "MemTotal:       24683648 kB\nMemFree:         8823388 kB\n"))
	if !ok || got != 24683648<<10 {
		t.Errorf("memTotalAt = %d, %v", got, ok)
	}
	for _, bad := range []string{"", "MemFree: 1 kB\n", "MemTotal: x kB\n", "MemTotal: 0 kB\n"} {
		if _, ok := memTotalAt(fakeProc(t, 0, "meminfo", bad)); ok {
			t.Errorf("memTotalAt(%q) ok", bad)
		}
	}
	if d := DefaultMaxRSSBytes(); d == 0 {
		t.Error("DefaultMaxRSSBytes is 0")
	}
}

func TestSampleValue(t *testing.T) {
	const exposition = `# HELP gymfleet_env_cleanup_retries_pending Final-cleanup steps that got no answer in time.
# TYPE gymfleet_env_cleanup_retries_pending gauge
gymfleet_env_cleanup_retries_pending 12
gymfleet_env_cleanup_retries_pending_other 99
gymfleet_env_cleanup_retries_total{outcome="abandoned"} 0
gymfleet_env_cleanup_retries_total{outcome="done"} 3.5e+03
gymfleet_resources_sessions 0
`
	for _, tc := range []struct {
		sample string
		want   float64
	}{
		{"gymfleet_env_cleanup_retries_pending", 12},
		{`gymfleet_env_cleanup_retries_total{outcome="done"}`, 3500},
		{`gymfleet_env_cleanup_retries_total{outcome="abandoned"}`, 0},
		{"gymfleet_resources_sessions", 0},
		// A counter never incremented for a label is not exposed: 0.
		{"gymfleet_agent_sessions", 0},
	} {
		got, err := sampleValue(strings.NewReader(exposition), tc.sample)
		if err != nil || got != tc.want {
			t.Errorf("sampleValue(%s) = %v, %v; want %v", tc.sample, got, err, tc.want)
		}
	}
	if _, err := sampleValue(strings.NewReader("gymfleet_agent_sessions many\n"), "gymfleet_agent_sessions"); err == nil {
		t.Error("a sample that is not a number was read")
	}
}
