package collect_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/infra/atomicfile"
	"github.com/gymfleet/gymfleet/pkg/ops/collect"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver/h2ctest"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

const fakeToken = "fake-token"

// fakeFleet is an environment server (POST /run and a control plane) and
// a policy model (control plane only) that play the checkpoint protocol
// just far enough to drive a Collection in process: /run waits while its
// rollout is held, prepare closes admission, commit exports the scope
// episodes whose /run is still waiting, resume reopens.
type fakeFleet struct {
	t          *testing.T
	env, model *httptest.Server

	mu       sync.Mutex
	changed  chan struct{}
	closed   bool
	held     map[string]bool          // rollout ids whose /run waits
	release  map[string]chan struct{} // per rollout id, closed to release
	running  map[string]bool          // capture keys of waiting /runs
	abort    map[string]int           // rollout id → /runs to cut off without a reply
	refuse   map[string]int           // rollout id → /runs to answer admission_closed
	notReady bool                     // prepare replies "preparing" with a blocker
	failRest bool                     // restore fails
	onPrep   func()                   // runs inside prepare
	runs     []string                 // capture keys of every /run, in arrival order
	ops      []string                 // control calls: "<op> <detail>"
	events   []string                 // control calls and "run <key>", in order
	openID   string                   // the checkpoint prepare opened, until resume
	stops    []bool                   // commit's stop flags
	dirs     []string                 // "<op> <checkpoint_dir>" of each commit and restore
}

func newFakeFleet(t *testing.T) *fakeFleet {
	f := &fakeFleet{t: t, changed: make(chan struct{}), held: map[string]bool{}, release: map[string]chan struct{}{},
		running: map[string]bool{}, abort: map[string]int{}, refuse: map[string]int{}}
	f.env = h2c(t, f.handler("environment", "env"))
	f.model = h2c(t, f.handler("model", "policy_model"))
	return f
}

func h2c(t *testing.T, h http.Handler) *httptest.Server { return h2ctest.Start(t, h) }

func (f *fakeFleet) endpoints() []coordination.Endpoint {
	return []coordination.Endpoint{{Name: "env", URL: f.env.URL}, {Name: "policy_model", URL: f.model.URL}}
}

// hold makes the /runs of ids wait until releaseAll or releaseOne.
func (f *fakeFleet) hold(ids ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		f.held[id] = true
		f.release[id] = make(chan struct{})
	}
}

func (f *fakeFleet) releaseOne(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ch, ok := f.release[id]; ok && f.held[id] {
		close(ch)
		delete(f.held, id)
	}
}

func (f *fakeFleet) releaseAll() {
	f.mu.Lock()
	ids := make([]string, 0, len(f.held))
	for id := range f.held {
		ids = append(ids, id)
	}
	f.mu.Unlock()
	for _, id := range ids {
		f.releaseOne(id)
	}
}

func (f *fakeFleet) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// waitFor waits until cond holds (checked under the fleet's lock).
func (f *fakeFleet) waitFor(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		f.mu.Lock()
		ok, ch := cond(), f.changed
		f.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			f.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func (f *fakeFleet) opsSnapshot() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ops)
}

func (f *fakeFleet) eventsSnapshot() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.events)
}

// before reports whether event a happened, and before event b (or b never).
func before(events []string, a, b string) bool {
	i, j := slices.Index(events, a), slices.Index(events, b)
	return i >= 0 && (j < 0 || i < j)
}

func (f *fakeFleet) runsSnapshot() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.runs)
}

func writeErr(w http.ResponseWriter, status int, code, detail string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": code, "detail": detail}})
}

func keysOf(ids []rollout.EpisodeID) string {
	keys := make([]string, len(ids))
	for i, e := range ids {
		keys[i] = e.CaptureKey()
	}
	slices.Sort(keys)
	return strings.Join(keys, ",")
}

func (f *fakeFleet) handler(kind, instance string) http.Handler {
	mux := http.NewServeMux()
	ctl := func(op string, fn func(body map[string]json.RawMessage) (any, int)) {
		handle := func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer "+fakeToken {
				writeErr(w, 401, "unauthorized", "no")
				return
			}
			var body map[string]json.RawMessage
			b, _ := io.ReadAll(r.Body)
			_ = json.Unmarshal(b, &body)
			out, status := fn(body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_ = json.NewEncoder(w).Encode(out)
		}
		// The routes of both prefixes, as our servers mount them; the
		// coordinator calls NeMo Gym's.
		mux.HandleFunc("/_ckpt/"+op, handle)
		mux.HandleFunc("/ng-control/v1/checkpoint/"+op, handle)
	}
	episodes := func(body map[string]json.RawMessage) []rollout.EpisodeID {
		var ids []rollout.EpisodeID
		_ = json.Unmarshal(body["episode_ids"], &ids)
		return ids
	}
	record := func(op string) {
		f.mu.Lock()
		f.ops = append(f.ops, op)
		f.events = append(f.events, op)
		f.notifyLocked()
		f.mu.Unlock()
	}
	ctl("status", func(map[string]json.RawMessage) (any, int) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.openID != "" {
			return map[string]any{"kind": kind, "instance": instance, "phase": "committed", "checkpoint_id": f.openID}, 200
		}
		return map[string]any{"kind": kind, "instance": instance, "phase": "idle"}, 200
	})
	ctl("prepare", func(body map[string]json.RawMessage) (any, int) {
		if kind == "environment" {
			record("prepare")
			f.mu.Lock()
			f.closed = true
			_ = json.Unmarshal(body["checkpoint_id"], &f.openID)
			onPrep, notReady := f.onPrep, f.notReady
			f.mu.Unlock()
			if onPrep != nil {
				onPrep()
			}
			if notReady {
				return map[string]any{"phase": "preparing", "report": map[string]any{"ready": false, "blockers": []string{"slow-1"}, "blocker_count": 1}}, 200
			}
		}
		return map[string]any{"phase": "prepared", "report": map[string]any{"ready": true, "blockers": []string{}}}, 200
	})
	ctl("commit", func(body map[string]json.RawMessage) (any, int) {
		scope := episodes(body)
		if kind != "environment" {
			return map[string]any{"phase": "committed", "episode_ids": []string{}}, 200
		}
		var stop bool
		_ = json.Unmarshal(body["stop"], &stop)
		f.mu.Lock()
		var exported []string
		for _, e := range scope {
			if f.running[e.CaptureKey()] {
				exported = append(exported, e.CaptureKey())
			}
		}
		f.stops = append(f.stops, stop)
		var d string
		_ = json.Unmarshal(body["checkpoint_dir"], &d)
		f.dirs = append(f.dirs, "commit "+d)
		f.mu.Unlock()
		record("commit " + keysOf(scope))
		return map[string]any{"phase": "committed", "episode_ids": exported}, 200
	})
	ctl("resume", func(map[string]json.RawMessage) (any, int) {
		if kind == "environment" {
			f.mu.Lock()
			f.closed, f.openID = false, ""
			f.notifyLocked()
			f.mu.Unlock()
			record("resume")
		}
		return map[string]any{"phase": "idle"}, 200
	})
	ctl("retire", func(body map[string]json.RawMessage) (any, int) {
		if kind == "environment" {
			record("retire " + keysOf(episodes(body)))
		}
		return map[string]any{"retired": []string{}}, 200
	})
	ctl("forget", func(body map[string]json.RawMessage) (any, int) {
		if kind == "environment" {
			var ids []string
			_ = json.Unmarshal(body["rollout_ids"], &ids)
			slices.Sort(ids)
			record("forget " + strings.Join(ids, ","))
		}
		return map[string]any{"forgotten": 0}, 200
	})
	ctl("restore", func(body map[string]json.RawMessage) (any, int) {
		f.mu.Lock()
		fail := f.failRest
		f.mu.Unlock()
		if kind == "environment" {
			var d string
			_ = json.Unmarshal(body["checkpoint_dir"], &d)
			f.mu.Lock()
			f.dirs = append(f.dirs, "restore "+d)
			f.mu.Unlock()
			record("restore " + keysOf(episodes(body)))
		}
		if fail && kind == "model" {
			return map[string]any{"error": map[string]any{"code": "checkpoint_error", "detail": "restore requires a fresh process"}}, 409
		}
		return map[string]any{"phase": "restored", "restored": []string{}}, 200
	})
	if kind != "environment" {
		return mux
	}
	mux.HandleFunc("POST /run", func(w http.ResponseWriter, r *http.Request) {
		var row map[string]any
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &row); err != nil {
			writeErr(w, 400, "invalid_request", "bad body")
			return
		}
		id, _ := row[rollout.FieldRolloutID].(string)
		attempt := 0
		if a, ok := row[rollout.FieldAttemptIndex].(float64); ok {
			attempt = int(a)
		}
		key := rollout.EpisodeID{RolloutID: id, Attempt: attempt}.CaptureKey()
		f.mu.Lock()
		f.runs = append(f.runs, key)
		f.events = append(f.events, "run "+key)
		f.notifyLocked()
		switch {
		case f.closed:
			f.mu.Unlock()
			writeErr(w, 409, "admission_closed", "a checkpoint is open")
			return
		case f.refuse[id] > 0:
			f.refuse[id]--
			f.mu.Unlock()
			writeErr(w, 409, "admission_closed", "an outside checkpoint is open")
			return
		case f.abort[id] > 0:
			f.abort[id]--
			f.mu.Unlock()
			panic(http.ErrAbortHandler) // the connection drops: no reply
		}
		release, held := f.release[id], f.held[id]
		if held {
			f.running[key] = true
			f.notifyLocked()
		}
		f.mu.Unlock()
		if held {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			f.mu.Lock()
			delete(f.running, key)
			f.notifyLocked()
			f.mu.Unlock()
			if r.Context().Err() != nil {
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"reward": 1.0, "observations": map[string]any{"model_calls": 1}})
	})
	return mux
}

// setup writes the input rows (rollout ids) and returns its paths.
func setupCollection(t *testing.T, ids ...string) (input, output, dir string) {
	t.Helper()
	tmp := t.TempDir()
	var lines []string
	for _, id := range ids {
		lines = append(lines, fmt.Sprintf(`{"responses_create_params":{"input":"q"},"_ng_rollout_id":%q}`, id))
	}
	input = writeInput(t, lines)
	return input, filepath.Join(tmp, "out.jsonl"), filepath.Join(tmp, "ckpt")
}

func (f *fakeFleet) collector(t *testing.T, dir string, resume bool, mutate func(*collect.Options)) *collect.Collector {
	t.Helper()
	opts := collect.Options{
		EnvURL: f.env.URL, Concurrency: 4,
		Fleet:       &collect.FleetControl{Endpoints: f.endpoints(), Token: fakeToken},
		Checkpoints: &collect.CheckpointOptions{Dir: dir, Timeout: 5 * time.Second, Resume: resume},
	}
	if mutate != nil {
		mutate(&opts)
	}
	c, err := collect.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// runAsync runs a collection; the result arrives on the channel.
type runResult struct {
	sum *collect.Summary
	err error
}

func runAsync(ctx context.Context, coll *collect.Collection) <-chan runResult {
	ch := make(chan runResult, 1)
	go func() {
		sum, err := coll.Run(ctx)
		ch <- runResult{sum, err}
	}()
	return ch
}

func waitRun(t *testing.T, ch <-chan runResult) runResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
		return runResult{}
	}
}

func attemptsIn(t *testing.T, path string) map[string][]int {
	t.Helper()
	out := map[string][]int{}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return out
	}
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var row struct {
			ID      string `json:"_ng_rollout_id"`
			Attempt int    `json:"_ng_attempt_index"`
		}
		if err := json.Unmarshal(line, &row); err != nil {
			t.Fatalf("%s: %q: %v", path, line, err)
		}
		out[row.ID] = append(out[row.ID], row.Attempt)
	}
	return out
}

// The continued set is what the environment exported, never client-side
// timing: a row whose episode ended during prepare (its reply on the wire
// while the checkpoint runs) is in the scope but not continued.
func TestCheckpoint_ContinuesWhatTheEnvironmentExported(t *testing.T) {
	f := newFakeFleet(t)
	input, output, dir := setupCollection(t, "a", "b", "c", "d", "e")
	f.hold("a", "b", "c", "d", "e")
	f.mu.Lock()
	f.onPrep = func() {
		f.releaseOne("c")
		f.waitFor("c's episode ended", func() bool { return !f.running["c"] })
	}
	f.mu.Unlock()
	coll, err := f.collector(t, dir, false, nil).Open(t.Context(), input, output)
	if err != nil {
		t.Fatal(err)
	}
	ran := runAsync(t.Context(), coll)
	f.waitFor("four rows in flight", func() bool { return len(f.running) == 4 })

	st, err := coll.Checkpoint(t.Context(), false)
	if err != nil {
		t.Fatal(err)
	}
	if got := keysOf(st.Continued); got != "a,b,d" {
		t.Fatalf("continued %s, want a,b,d (c ended during prepare)", got)
	}
	if st.InFlight < 3 || !st.Published || len(st.PrepareStages) != 2 || st.PrepareStages[0].Kind != "environment" {
		t.Fatalf("stats %+v", st)
	}
	m, err := collect.ReadLatest(dir)
	if err != nil || m.CheckpointID != st.ID || m.RunID != coll.RunID() || keysOf(m.Continued) != "a,b,d" {
		t.Fatalf("LATEST: %+v %v", m, err)
	}
	if p := coll.Progress(); p.LastCheckpoint == nil || p.LastCheckpoint.ID != st.ID {
		t.Fatalf("progress does not name the last checkpoint: %+v", p)
	}
	f.releaseAll()
	res := waitRun(t, ran)
	if res.err != nil || res.sum.Succeeded != 5 {
		t.Fatalf("run: %+v %v", res.sum, res.err)
	}
	for id, as := range attemptsIn(t, output) {
		if !slices.Equal(as, []int{0}) {
			t.Errorf("%s written %v", id, as)
		}
	}
	// e was queued behind the gate: never sent while the fleet was closed.
	ev := f.eventsSnapshot()
	i, j := slices.Index(ev, "prepare"), slices.Index(ev, "resume")
	if i < 0 || j < i || !strings.HasPrefix(ev[i+1], "commit ") || !before(ev, "resume", "run e") {
		t.Fatalf("events %v: want prepare, commit, resume, and e sent only after", ev)
	}
	if len(res.sum.Checkpoints) != 1 || res.sum.PublishedCheckpoints() != 1 {
		t.Errorf("summary checkpoints %+v", res.sum.Checkpoints)
	}
}

// A checkpoint with stop commits with stop=true, does not resume, and the
// run returns ErrStopped.
func TestCheckpoint_StopEndsTheRun(t *testing.T) {
	f := newFakeFleet(t)
	input, output, dir := setupCollection(t, "a", "b")
	f.hold("a", "b")
	coll, err := f.collector(t, dir, false, nil).Open(t.Context(), input, output)
	if err != nil {
		t.Fatal(err)
	}
	ran := runAsync(t.Context(), coll)
	f.waitFor("two rows in flight", func() bool { return len(f.running) == 2 })
	coll.RequestCheckpoint(true)
	res := waitRun(t, ran)
	if !errors.Is(res.err, collect.ErrStopped) {
		t.Fatalf("Run = %v, want ErrStopped", res.err)
	}
	f.mu.Lock()
	stops := slices.Clone(f.stops)
	f.mu.Unlock()
	if slices.Contains(f.opsSnapshot(), "resume") || !slices.Equal(stops, []bool{true}) {
		t.Fatalf("a stop checkpoint resumed or committed without stop: %v %v", f.opsSnapshot(), stops)
	}
	if m, err := collect.ReadLatest(dir); err != nil || keysOf(m.Continued) != "a,b" {
		t.Fatalf("LATEST %+v %v", m, err)
	}
	if res.sum.Interrupted != 2 || res.sum.Succeeded != 0 {
		t.Errorf("summary %+v", res.sum)
	}
	f.releaseAll()
}

// A prepare that is not prepared by its deadline: the fleet is resumed, no
// checkpoint is published, and dispatch reopens.
func TestCheckpoint_NotPreparedResumesAndContinues(t *testing.T) {
	f := newFakeFleet(t)
	input, output, dir := setupCollection(t, "a")
	f.hold("a")
	f.mu.Lock()
	f.notReady = true
	f.mu.Unlock()
	coll, err := f.collector(t, dir, false, nil).Open(t.Context(), input, output)
	if err != nil {
		t.Fatal(err)
	}
	ran := runAsync(t.Context(), coll)
	f.waitFor("a in flight", func() bool { return len(f.running) == 1 })
	st, err := coll.Checkpoint(t.Context(), false)
	if !errors.Is(err, collect.ErrNotPrepared) || st.Published || !slices.Equal(st.Blockers["env"], []string{"slow-1"}) {
		t.Fatalf("checkpoint: %+v %v", st, err)
	}
	if _, err := collect.ReadLatest(dir); !errors.Is(err, collect.ErrNoLatest) {
		t.Fatalf("LATEST after a failed prepare: %v", err)
	}
	if ops := f.opsSnapshot(); !slices.Equal(ops, []string{"prepare", "resume"}) {
		t.Fatalf("control calls %v, want prepare then resume", ops)
	}
	f.releaseAll()
	if res := waitRun(t, ran); res.err != nil || res.sum.Succeeded != 1 {
		t.Fatalf("run %+v %v", res.sum, res.err)
	}
}

// A /run without a reply is retired (before the next attempt is sent) and
// retried as the next attempt; its rollout is forgotten at the end. One
// that never gets a reply fails after MaxAttempts. admission_closed from an
// outside checkpoint resends the same attempt.
func TestCollection_NoReplyRetiresAndRetries(t *testing.T) {
	f := newFakeFleet(t)
	input, output, dir := setupCollection(t, "flaky", "dead", "refused")
	f.mu.Lock()
	f.abort["flaky"] = 1
	f.abort["dead"] = 100
	f.refuse["refused"] = 1
	f.mu.Unlock()
	coll, err := f.collector(t, dir, false, func(o *collect.Options) { o.MaxAttempts = 3 }).Open(t.Context(), input, output)
	if err != nil {
		t.Fatal(err)
	}
	res := waitRun(t, runAsync(t.Context(), coll))
	if res.err != nil || res.sum.Succeeded != 2 || res.sum.Failed != 1 {
		t.Fatalf("run %+v %v", res.sum, res.err)
	}
	got := attemptsIn(t, output)
	if !slices.Equal(got["flaky"], []int{1}) || !slices.Equal(got["refused"], []int{0}) || len(got["dead"]) != 0 {
		t.Fatalf("output attempts %v", got)
	}
	fails := attemptsIn(t, collect.FailuresPath(output))
	if !slices.Equal(fails["dead"], []int{2}) {
		t.Fatalf("failures %v, want dead at attempt 2", fails)
	}
	b, _ := os.ReadFile(collect.FailuresPath(output))
	if !strings.Contains(string(b), "no reply after 3 attempt(s)") {
		t.Errorf("failure row %s", b)
	}
	runs, ops, ev := f.runsSnapshot(), f.opsSnapshot(), f.eventsSnapshot()
	retired := map[string]bool{}
	for _, op := range ops {
		if keys, ok := strings.CutPrefix(op, "retire "); ok {
			for _, k := range strings.Split(keys, ",") {
				retired[k] = true
			}
		}
	}
	for _, k := range []string{"flaky", "dead", "dead-a1", "dead-a2"} {
		if !retired[k] {
			t.Errorf("%s was not retired: %v", k, ops)
		}
	}
	retireFlaky := slices.IndexFunc(ev, func(e string) bool {
		keys, ok := strings.CutPrefix(e, "retire ")
		return ok && slices.Contains(strings.Split(keys, ","), "flaky")
	})
	if retireFlaky < 0 || retireFlaky > slices.Index(ev, "run flaky-a1") || !slices.Contains(ev, "run flaky-a1") {
		t.Errorf("events %v: the attempt without a reply is retired before the next is sent", ev)
	}
	if !slices.Contains(ops, "forget dead,flaky") {
		t.Errorf("the retired rollouts are not forgotten at the end: %v", ops)
	}
	if n := strings.Count(strings.Join(runs, " "), "refused"); n != 2 || slices.Contains(runs, "refused-a1") {
		t.Errorf("the refused row: runs %v, want refused sent twice as attempt 0", runs)
	}
	log, _ := collect.LoadDispatchLog(filepath.Join(dir, collect.DispatchLogName))
	if log.Attempts["flaky"] != 1 || log.Attempts["dead"] != 2 {
		t.Errorf("dispatch log %v", log.Attempts)
	}
	if res.sum.Retired != 4 || res.sum.Forgotten != 2 || res.sum.Restarted != 2 {
		t.Errorf("summary retired %d forgotten %d restarted %d", res.sum.Retired, res.sum.Forgotten, res.sum.Restarted)
	}
}

// preempt runs rows a..c with a and b held, takes a stop checkpoint, and
// leaves c finished: the state a SIGTERM leaves.
func preempt(t *testing.T, f *fakeFleet) (input, output, dir string) {
	t.Helper()
	input, output, dir = setupCollection(t, "a", "b", "c", "d")
	f.hold("a", "b", "d")
	coll, err := f.collector(t, dir, false, func(o *collect.Options) { o.Concurrency = 3 }).Open(t.Context(), input, output)
	if err != nil {
		t.Fatal(err)
	}
	ran := runAsync(t.Context(), coll)
	f.waitFor("a, b and d in flight, c done", func() bool { return len(f.running) == 3 })
	if _, err := coll.Checkpoint(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	if res := waitRun(t, ran); !errors.Is(res.err, collect.ErrStopped) {
		t.Fatal(res.err)
	}
	// d was not continued: drop it from the manifest, as if the
	// environment had not exported it.
	m, err := collect.ReadLatest(dir)
	if err != nil {
		t.Fatal(err)
	}
	m.Continued = slices.DeleteFunc(m.Continued, func(e rollout.EpisodeID) bool { return e.RolloutID == "d" })
	if err := collect.PublishCheckpoint(atomicfile.OS, dir, *m); err != nil {
		t.Fatal(err)
	}
	f.releaseAll()
	// A crash and fresh processes: nothing open, nothing remembered.
	f.mu.Lock()
	f.ops, f.runs, f.events = nil, nil, nil
	f.closed, f.openID = false, ""
	f.mu.Unlock()
	return input, output, dir
}

// Resuming: the new dispatch log is written before anything else happens,
// LATEST's continued rows are restored and sent as attempt + 1, the other
// sent rows are retired before any /run and sent again one attempt later,
// and finished rows are not sent again.
func TestCollection_ResumeRestoresAndRestarts(t *testing.T) {
	f := newFakeFleet(t)
	input, output, dir := preempt(t, f)
	coll, err := f.collector(t, dir, true, nil).Open(t.Context(), input, output)
	if err != nil {
		t.Fatal(err)
	}
	log, err := collect.LoadDispatchLog(filepath.Join(dir, collect.DispatchLogName))
	if err != nil || log.RunID != coll.RunID() || log.Attempts["a"] != 1 || log.Attempts["b"] != 1 || log.Attempts["d"] != 0 || len(log.Attempts) != 3 {
		t.Fatalf("the new dispatch log before any /run: %+v %v", log, err)
	}
	if runs := f.runsSnapshot(); len(runs) != 0 {
		t.Fatalf("rows were sent by Open: %v", runs)
	}
	res := waitRun(t, runAsync(t.Context(), coll))
	if res.err != nil || res.sum.Succeeded != 3 || res.sum.AlreadyFinished != 1 || res.sum.Continued != 2 || res.sum.Restarted != 1 {
		t.Fatalf("run %+v %v", res.sum, res.err)
	}
	ev := f.eventsSnapshot()
	if len(ev) < 3 || ev[0] != "restore a,b" || ev[1] != "resume" || ev[2] != "retire d" {
		t.Fatalf("events %v, want restore a,b, resume, retire d before any /run", ev)
	}
	runs := f.runsSnapshot()
	slices.Sort(runs)
	if !slices.Equal(runs, []string{"a-a1", "b-a1", "d-a1"}) {
		t.Fatalf("runs %v", runs)
	}
	got := attemptsIn(t, output)
	if !slices.Equal(got["a"], []int{1}) || !slices.Equal(got["c"], []int{0}) || !slices.Equal(got["d"], []int{1}) || len(got) != 4 {
		t.Fatalf("output %v: every row once", got)
	}
	if rs := res.sum.Restore; rs == nil || !rs.Restored || keysOf(rs.Continued) != "a,b" {
		t.Fatalf("restore stats %+v", rs)
	}
}

// A failed restore starts the continued rows over as attempt + 2.
func TestCollection_FailedRestoreStartsOverAtAttemptPlusTwo(t *testing.T) {
	f := newFakeFleet(t)
	input, output, dir := preempt(t, f)
	f.mu.Lock()
	f.failRest = true
	f.mu.Unlock()
	var notices bytes.Buffer
	res, err := f.collector(t, dir, true, func(o *collect.Options) { o.Notices = &notices }).CollectFile(t.Context(), input, output)
	if err != nil {
		t.Fatal(err)
	}
	got := attemptsIn(t, output)
	if !slices.Equal(got["a"], []int{2}) || !slices.Equal(got["b"], []int{2}) || !slices.Equal(got["d"], []int{1}) {
		t.Fatalf("output %v: a and b at attempt 2, d at 1", got)
	}
	if !slices.ContainsFunc(f.opsSnapshot(), func(op string) bool { return op == "retire a,a-a1,b,b-a1,d" }) {
		t.Errorf("control calls %v: the continued attempts and their next ones are retired", f.opsSnapshot())
	}
	if res.Restore == nil || res.Restore.Restored || !strings.Contains(notices.String(), "start over (as attempt + 2)") {
		t.Errorf("restore %+v, notices %s", res.Restore, notices.String())
	}
}

// --checkpoint-every: checkpoints are taken while rows are in flight.
func TestCheckpoint_Periodic(t *testing.T) {
	f := newFakeFleet(t)
	input, output, dir := setupCollection(t, "a")
	f.hold("a")
	coll, err := f.collector(t, dir, false, func(o *collect.Options) { o.Checkpoints.Every = 20 * time.Millisecond }).Open(t.Context(), input, output)
	if err != nil {
		t.Fatal(err)
	}
	ran := runAsync(t.Context(), coll)
	f.waitFor("two periodic checkpoints", func() bool {
		n := 0
		for _, op := range f.ops {
			if op == "resume" {
				n++
			}
		}
		return n >= 2
	})
	f.releaseAll()
	res := waitRun(t, ran)
	if res.err != nil || res.sum.PublishedCheckpoints() < 2 {
		t.Fatalf("run %+v %v", res.sum, res.err)
	}
	withA := 0
	for _, c := range res.sum.Checkpoints {
		switch keysOf(c.Continued) {
		case "a":
			withA++
		case "":
			// Taken after the release, while a's reply was on its way.
		default:
			t.Errorf("checkpoint %s continued %v", c.ID, c.Continued)
		}
	}
	if withA < 2 {
		t.Errorf("%d checkpoints continued a while it was held, want at least 2", withA)
	}
	// Only the two newest stay.
	entries, _ := os.ReadDir(dir)
	n := 0
	for _, e := range entries {
		if e.IsDir() {
			n++
		}
	}
	if n > 2 {
		t.Errorf("%d checkpoint directories kept, want at most 2", n)
	}
}

// With an s3:// checkpoint directory the servers commit to and restore
// from s3://<dir>/<id>, while the collector's own state (dispatch log,
// collection.json, LATEST) lives in the local state directory; a run
// stopped at a checkpoint and resumed from that state finishes every row
// exactly once. (The fake fleet writes no records: the servers' S3
// commit and restore are the ckptstore kit's, against gofakes3.)
func TestCollection_S3CheckpointDirWithLocalState(t *testing.T) {
	const s3Dir = "s3://bucket/ck/run1"
	f := newFakeFleet(t)
	input, output, state := setupCollection(t, "a", "b", "c", "d")
	s3 := func(o *collect.Options) { o.Checkpoints.Dir, o.Checkpoints.StateDir = s3Dir, state }
	if _, err := collect.New(collect.Options{
		EnvURL: f.env.URL, Fleet: &collect.FleetControl{Endpoints: f.endpoints(), Token: fakeToken},
		Checkpoints: &collect.CheckpointOptions{Dir: s3Dir},
	}); err == nil || !strings.Contains(err.Error(), "state directory") {
		t.Fatalf("an s3:// directory without a state directory: %v, want a refusal", err)
	}

	f.hold("a", "b")
	coll, err := f.collector(t, "", false, func(o *collect.Options) { s3(o); o.Concurrency = 3 }).Open(t.Context(), input, output)
	if err != nil {
		t.Fatal(err)
	}
	if coll.Dir() != state || coll.RecordsDir() != s3Dir {
		t.Fatalf("state %s, records %s", coll.Dir(), coll.RecordsDir())
	}
	ran := runAsync(t.Context(), coll)
	f.waitFor("a and b in flight, c and d done", func() bool {
		return len(f.running) == 2 && len(f.runs) == 4
	})
	st, err := coll.Checkpoint(t.Context(), true)
	if err != nil {
		t.Fatal(err)
	}
	if res := waitRun(t, ran); !errors.Is(res.err, collect.ErrStopped) {
		t.Fatal(res.err)
	}
	m, err := collect.ReadLatest(state)
	if err != nil || m.CheckpointID != st.ID || keysOf(m.Continued) != "a,b" {
		t.Fatalf("LATEST in the state directory: %+v %v", m, err)
	}
	if _, err := os.Stat(filepath.Join(state, collect.DispatchLogName)); err != nil {
		t.Fatalf("the dispatch log is not in the state directory: %v", err)
	}
	f.releaseAll()
	// Every process dies: the fleet comes back fresh.
	f.mu.Lock()
	f.ops, f.runs, f.events = nil, nil, nil
	f.closed, f.openID = false, ""
	f.mu.Unlock()

	res, err := f.collector(t, "", true, s3).CollectFile(t.Context(), input, output)
	if err != nil || res.Succeeded != 2 || res.AlreadyFinished != 2 || res.Continued != 2 {
		t.Fatalf("resume %+v %v", res, err)
	}
	f.mu.Lock()
	dirs := slices.Clone(f.dirs)
	f.mu.Unlock()
	want := []string{"commit " + s3Dir + "/" + st.ID, "restore " + s3Dir + "/" + st.ID}
	if !slices.Equal(dirs, want) {
		t.Fatalf("the servers were sent %v, want %v", dirs, want)
	}
	got := attemptsIn(t, output)
	if !slices.Equal(got["a"], []int{1}) || !slices.Equal(got["b"], []int{1}) || !slices.Equal(got["c"], []int{0}) || !slices.Equal(got["d"], []int{0}) || len(got) != 4 {
		t.Fatalf("output %v: every row exactly once", got)
	}
}
