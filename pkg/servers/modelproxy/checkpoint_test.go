package modelproxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

const chatPath = "/v1/chat/completions"

func TestCheckpoint_Conformance(t *testing.T) {
	w := startWorker(t, 0)
	ctlplanetest.Run(t, func(t *testing.T, cfg ctlplane.Config) ctlplanetest.Subject {
		m := startModel(t, w.url, t.TempDir(), cfg, nil)
		return ctlplanetest.Subject{
			URL: m.url, Kind: ctlplane.KindModel, Instance: modelproxy.DefaultName,
			Probe: func(_ context.Context, id rollout.EpisodeID) (int, string) {
				r := m.call(id.CaptureKey(), chatPath, chatRequest("probe", "ok"))
				if r.err != nil {
					t.Fatalf("probe: %v", r.err)
				}
				if r.status == http.StatusOK {
					return r.status, ""
				}
				return r.status, errorCode(r.body)
			},
		}
	})
}

func TestCheckpoint_Disabled(t *testing.T) {
	w := startWorker(t, 0)
	m := startModel(t, w.url, t.TempDir(), ctlplane.DefaultConfig(), nil)
	ctlplanetest.RunDisabled(t, m.url)
	// The ledger routes answer as before: nothing is open.
	status, _ := m.get(t, "/capture/rollouts/r/manifest")
	if status != http.StatusOK {
		t.Fatalf("manifest with checkpointing off: %d", status)
	}
}

// A non-streaming response that completes while a checkpoint is open is
// held: the client gets nothing, the ledger has no row, the record leaves
// it out, and it is delivered after resume.
func TestCheckpoint_HeldNonStreaming(t *testing.T) {
	for _, tc := range []struct{ name, path, body string }{
		{"chat", chatPath, chatRequest("hello", "hi there")},
		{"responses", "/v1/responses", `{"input":"hello"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := startWorker(t, 0)
			m := startModel(t, w.url, t.TempDir(), ctlplanetest.Config(), nil)
			key := "held-" + tc.name
			m.mustCall(t, key, tc.path, tc.body)
			first := m.rowIDs(t, key)
			if len(first) != 1 {
				t.Fatalf("rows after the first call: %v", first)
			}

			// The next call reaches the worker and waits there.
			if _, err := w.ctl.HoldAfterCalls(context.Background(), 1); err != nil {
				t.Fatal(err)
			}
			pending := m.callAsync(key, tc.path, tc.body)
			waitFor(t, "the worker to hold the second call", func() bool {
				n, err := w.ctl.CallCount(context.Background())
				return err == nil && n.Held == 1
			})
			prep := m.mustOp(t, "prepare", ckReq("c1"))
			if prep["phase"] != "prepared" {
				t.Fatalf("prepare = %v", prep)
			}
			// The worker answers while the checkpoint is open: the reply waits.
			if _, err := w.ctl.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the reply to be held", func() bool {
				held, _ := m.status(t)["held"].(float64)
				return held == 1
			})
			notYet(t, "the held call", pending)
			if got := m.rowIDs(t, key); !slices.Equal(got, first) {
				t.Fatalf("a held call has no row yet: %v, want %v", got, first)
			}
			rep := m.report(t)
			if rep["ready"] != true || !reflect.DeepEqual(rep["blockers"], []any{}) {
				t.Fatalf("a held response never blocks: %v", rep)
			}

			dir := t.TempDir()
			m.mustOp(t, "commit", commitReq("c1", dir, key))
			recs := records(t, dir, "c1")
			if rec := recs[key]; rec == nil || len(rec.Rows) != 1 || rec.Rows[0].CallID != first[0] || len(rec.GenerationCuts) != 0 {
				t.Fatalf("record of %s = %+v, want only the delivered row %s", key, rec, first[0])
			}
			notYet(t, "the held call", pending)

			m.mustOp(t, "resume", ckReq("c1"))
			r := await(t, "the held call", pending)
			if r.err != nil || r.status != http.StatusOK {
				t.Fatalf("held call after resume: %d %s %v", r.status, r.body, r.err)
			}
			_, man := m.ledger(t, key)
			if len(man.Records) != 2 || man.Records[1].ParentCallID != first[0] {
				t.Fatalf("after delivery the row follows the first: %+v", man.Records)
			}
		})
	}
}

// Calls of many rollouts, spread over the participant's shards, are all
// held by one prepare, none delivers before the resume, and the resume
// releases every one.
func TestCheckpoint_HeldAcrossRollouts(t *testing.T) {
	t.Parallel()
	const rollouts = 256
	w := startWorker(t, 0)
	m := startModel(t, w.url, t.TempDir(), ctlplanetest.Config(), nil)
	body := chatRequest("hello", "hi there")
	keys := make([]string, rollouts)
	first := map[string][]string{}
	for i := range keys {
		keys[i] = fmt.Sprintf("spread-%03d", i)
		m.mustCall(t, keys[i], chatPath, body)
		first[keys[i]] = m.rowIDs(t, keys[i])
	}
	if _, err := w.ctl.HoldAfterCalls(context.Background(), rollouts); err != nil {
		t.Fatal(err)
	}
	pending := make([]<-chan result, rollouts)
	for i, key := range keys {
		pending[i] = m.callAsync(key, chatPath, body)
	}
	waitFor(t, "the worker to hold every second call", func() bool {
		n, err := w.ctl.CallCount(context.Background())
		return err == nil && n.Held == rollouts
	})
	m.mustOp(t, "prepare", ckReq("c1"))
	if _, err := w.ctl.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every reply to be held", func() bool {
		held, _ := m.status(t)["held"].(float64)
		return held == rollouts
	})
	for i, key := range keys {
		notYet(t, "a held call", pending[i])
		if got := m.rowIDs(t, key); !slices.Equal(got, first[key]) {
			t.Fatalf("%s: a held call has no row yet: %v, want %v", key, got, first[key])
		}
	}
	dir := t.TempDir()
	m.mustOp(t, "commit", commitReq("c1", dir, keys...))
	recs := records(t, dir, "c1")
	for _, key := range keys {
		if rec := recs[key]; rec == nil || len(rec.Rows) != 1 || rec.Rows[0].CallID != first[key][0] {
			t.Fatalf("record of %s = %+v, want only the delivered row %s", key, rec, first[key][0])
		}
	}
	m.mustOp(t, "resume", ckReq("c1"))
	for i, key := range keys {
		if r := await(t, "a held call", pending[i]); r.err != nil || r.status != http.StatusOK {
			t.Fatalf("%s: held call after resume: %d %s %v", key, r.status, r.body, r.err)
		}
		if got := m.rowIDs(t, key); len(got) != 2 {
			t.Fatalf("%s: rows after the resume: %v", key, got)
		}
	}
	if held, _ := m.status(t)["held"].(float64); held != 0 {
		t.Fatalf("held after the resume = %v", held)
	}
}

// A stream that already started blocks prepare until it ends (its capture
// key is the blocker); one that has not started is held and does not block.
func TestCheckpoint_StreamingBlocksPrepare(t *testing.T) {
	t.Parallel()
	w := startWorker(t, 25)
	m := startModel(t, w.url, t.TempDir(), ctlplanetest.Config(), nil)
	streamBody := func(final string) string {
		var v map[string]any
		_ = json.Unmarshal([]byte(chatRequest("stream please", final)), &v)
		v["stream"] = true
		b, _ := json.Marshal(v)
		return string(b)
	}

	started := m.streamCall(t, "stream-1", streamBody(words(40)))
	defer started.Body.Close()
	rd := bufio.NewReader(started.Body)
	if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line of the started stream: %q %v", line, err)
	}

	// A second stream waits at the worker, so its response has not started.
	if _, err := w.ctl.HoldAfterCalls(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	unstarted := m.callAsync("stream-2", chatPath, streamBody("short answer"))
	waitFor(t, "the worker to hold the second stream", func() bool {
		n, err := w.ctl.CallCount(context.Background())
		return err == nil && n.Held == 1
	})

	prepared := make(chan map[string]any, 1)
	go func() {
		_, out := m.op(t, "prepare", map[string]any{"checkpoint_id": "s1", "deadline_ts": future(30 * time.Second)})
		prepared <- out
	}()
	waitFor(t, "the started stream to block", func() bool {
		st := m.status(t)
		rep, _ := st["report"].(map[string]any)
		return st["phase"] == "preparing" && reflect.DeepEqual(rep["blockers"], []any{"stream-1"}) && rep["blocker_count"] == float64(1)
	})
	if _, err := w.ctl.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second stream to be held", func() bool {
		held, _ := m.status(t)["held"].(float64)
		return held == 1
	})
	notYet(t, "the unstarted stream", unstarted)
	select {
	case out := <-prepared:
		t.Fatalf("prepare returned while a stream was still running: %v", out)
	default:
	}

	rest, err := io.ReadAll(rd)
	if err != nil || !strings.Contains(string(rest), "data: [DONE]") {
		t.Fatalf("the started stream did not finish: %v", err)
	}
	out := <-prepared
	rep, _ := out["report"].(map[string]any)
	counts, _ := rep["counts"].(map[string]any)
	if out["phase"] != "prepared" || rep["blocker_count"] != float64(0) || counts["held"] != float64(1) || counts["streaming"] != float64(0) {
		t.Fatalf("prepare after the stream ended = %v", out)
	}
	dir := t.TempDir()
	m.mustOp(t, "commit", commitReq("s1", dir, "stream-1", "stream-2"))
	recs := records(t, dir, "s1")
	if len(recs) != 1 || recs["stream-1"] == nil || len(recs["stream-1"].Rows) != 1 {
		t.Fatalf("records = %v, want the finished stream's row only", recs)
	}
	m.mustOp(t, "resume", ckReq("s1"))
	r := await(t, "the held stream", unstarted)
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("held stream after resume: %d %v", r.status, r.err)
	}
	if data := sseData(r.body); len(data) < 2 || data[len(data)-1] != "[DONE]" {
		t.Fatalf("held stream body: %s", r.body)
	}
	if got := m.rowIDs(t, "stream-2"); len(got) != 1 {
		t.Fatalf("the held stream's row after delivery: %v", got)
	}
}

// cutFixture drives a generation cut: a delivered first call, then a long
// generation in flight (and a constrained one, which is skipped) when the
// checkpoint prepares and commits.
type cutFixture struct {
	w       *worker
	m       *model
	dir     string
	key     string
	body    string
	first   string
	cutCall fakeinference.CallInfo
	pending <-chan result
	other   <-chan result
	commit  map[string]any
}

const cutTPS = 30

func newCutFixture(t *testing.T, key string) *cutFixture {
	f := &cutFixture{w: startWorker(t, cutTPS), dir: t.TempDir(), key: key}
	f.m = startModel(t, f.w.url, f.dir, ctlplanetest.Config(), nil)
	f.m.mustCall(t, key, chatPath, chatRequest("first", "ok"))
	f.first = f.m.rowIDs(t, key)[0]

	f.body = chatRequest("tell me a long story", words(30))
	f.pending = f.m.callAsync(key, chatPath, f.body)
	// A long tool call (its arguments come from the user's message), so it
	// is still generating when the checkpoint closes.
	args, _ := json.Marshal(map[string]string{"query": words(30)})
	user, _ := json.Marshal("Call lookup with " + string(args))
	constrained := `{"messages":[{"role":"user","content":` + string(user) + `}],"tool_choice":"required",` +
		`"tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}}]}`
	f.other = f.m.callAsync(key+"-other", chatPath, constrained)
	waitFor(t, "both calls to be generating", func() bool {
		gen := 0
		for _, c := range f.w.calls(t) {
			if c.Status == fakeinference.StatusGenerating && c.CompletionTokens >= 3 {
				gen++
				if c.CaptureKey != nil && *c.CaptureKey == key {
					f.cutCall = c
				}
			}
		}
		return gen == 2 && f.cutCall.CallID != ""
	})
	prep := f.m.mustOp(t, "prepare", ckReq("cut1"))
	rep, _ := prep["report"].(map[string]any)
	counts, _ := rep["counts"].(map[string]any)
	if prep["phase"] != "prepared" || counts["cut"] != float64(1) || counts["cut_skipped"] != float64(1) || counts["cut_failed"] != float64(0) {
		t.Fatalf("prepare = %v, want prepared with one cut and one skipped", prep)
	}
	rounds, err := f.w.ctl.Cuts(context.Background())
	if err != nil || !reflect.DeepEqual(rounds, [][]string{{f.cutCall.CallID}}) {
		t.Fatalf("worker cut rounds = %v %v, want [[%s]]", rounds, err, f.cutCall.CallID)
	}
	f.commit = f.m.mustOp(t, "commit", commitReq("cut1", f.dir, key))
	return f
}

// check asserts the record and the commit reply carry the cut.
func (f *cutFixture) check(t *testing.T) (stagingKey string, prefix int) {
	t.Helper()
	rec := records(t, f.dir, "cut1")[f.key]
	if rec == nil || len(rec.Rows) != 1 || rec.Rows[0].CallID != f.first || len(rec.GenerationCuts) != 1 {
		t.Fatalf("record = %+v, want the first row and one cut", rec)
	}
	c := rec.GenerationCuts[0]
	stagingKey = fakeinference.StagingKey(f.key, f.cutCall.CallID)
	k := c.Continuation
	if c.ModelCallID != f.cutCall.CallID || len(c.RequestDigest) != 64 || k.SourceCaptureKey != f.key ||
		k.SourceModelCallID != f.cutCall.CallID || !slices.Equal(k.StagingKeys, []string{stagingKey}) ||
		k.PrefixTokenCount < 3 || k.PrefixDigest == "" {
		t.Fatalf("cut = %+v", c)
	}
	if !reflect.DeepEqual(f.commit["staging_keys"], []any{stagingKey}) ||
		!reflect.DeepEqual(f.commit["staging_keys_by_episode"], map[string]any{f.key: []any{stagingKey}}) {
		t.Fatalf("commit reply staging keys = %v / %v", f.commit["staging_keys"], f.commit["staging_keys_by_episode"])
	}
	notYet(t, "the cut call", f.pending)
	return stagingKey, k.PrefixTokenCount
}

// uncut is the reply the same request gets from an uncut generation.
func uncut(t *testing.T, body string) message {
	w := startWorker(t, 0)
	m := startModel(t, w.url, t.TempDir(), ctlplane.DefaultConfig(), nil)
	msg, finish := replyMessage(t, m.mustCall(t, "", chatPath, body))
	if finish != "stop" {
		t.Fatalf("uncut finish = %s", finish)
	}
	return msg
}

// Without a crash: the cut call waits for resume, then continues the staged
// prefix and delivers the whole generation.
func TestCheckpoint_GenerationCutResume(t *testing.T) {
	t.Parallel()
	f := newCutFixture(t, "cut-1")
	stagingKey, prefix := f.check(t)
	want := uncut(t, f.body)

	f.m.mustOp(t, "resume", ckReq("cut1"))
	r := await(t, "the cut call", f.pending)
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("cut call after resume: %d %s %v", r.status, r.body, r.err)
	}
	got, finish := replyMessage(t, r.body)
	if finish != "stop" || !reflect.DeepEqual(got, want) {
		t.Fatalf("continued reply = %+v (%s), want the uncut generation %+v", got, finish, want)
	}
	calls := f.w.callsOf(t, f.key)
	last := calls[len(calls)-1]
	if last.ContinuedFrom == nil || *last.ContinuedFrom != f.cutCall.CallID || last.ReusedPrefixTokens != prefix {
		t.Fatalf("the re-issued call = %+v, want continued_from %s with %d reused tokens", last, f.cutCall.CallID, prefix)
	}
	_, man := f.m.ledger(t, f.key)
	if len(man.Records) != 2 || man.Records[1].CallID != f.cutCall.CallID || man.Records[1].ParentCallID != f.first ||
		man.Records[1].ContinuedFrom != stagingKey || !slices.Equal(man.Records[1].GenerationTokenIDs, want.GenerationTokenIDs) {
		t.Fatalf("ledger after the continued call = %+v", man.Records)
	}
	if r := await(t, "the constrained call", f.other); r.err != nil || r.status != http.StatusOK {
		t.Fatalf("the skipped call regenerates normally: %d %s %v", r.status, r.body, r.err)
	}
	_, metrics := f.m.get(t, "/metrics")
	for _, line := range []string{
		`gymfleet_model_generation_cuts_total{disposition="durable_prefix"} 1`,
		`gymfleet_model_generation_cuts_total{disposition="skipped"} 1`,
		`gymfleet_model_held_calls 0`,
	} {
		if !strings.Contains(string(metrics), line+"\n") {
			t.Errorf("metrics lack %q", line)
		}
	}
}

// With a crash: a fresh model server restores the checkpoint, and the
// re-issued identical call continues the staged prefix; its row's parent is
// the last delivered call.
func TestCheckpoint_GenerationCutCrashRestore(t *testing.T) {
	t.Parallel()
	f := newCutFixture(t, "crash-1")
	stagingKey, prefix := f.check(t)
	want := uncut(t, f.body)

	f.m.stop()
	if r := await(t, "the cut call", f.pending); r.err == nil && r.status == http.StatusOK {
		t.Fatalf("an undelivered call must not be answered by a crash: %d %s", r.status, r.body)
	}
	await(t, "the constrained call", f.other)

	m2 := startModel(t, f.w.url, f.dir, ctlplanetest.Config(), nil)
	if st, out := m2.op(t, "restore", restoreReq("cut1", f.dir, f.key)); st != http.StatusOK || !reflect.DeepEqual(out["restored"], []any{"crash-1-a1"}) {
		t.Fatalf("restore = %d %v", st, out)
	}
	st := m2.status(t)
	if !reflect.DeepEqual(st["restored_generation_cuts"], []any{"crash-1-a1"}) || !reflect.DeepEqual(st["restored_pending"], []any{"crash-1-a1"}) {
		t.Fatalf("status after restore = %v", st)
	}
	m2.mustOp(t, "resume", ckReq("cut1"))

	msg, _ := replyMessage(t, m2.mustCall(t, "crash-1-a1", chatPath, f.body))
	if !reflect.DeepEqual(msg, want) {
		t.Fatalf("continued reply = %+v, want %+v", msg, want)
	}
	calls := f.w.callsOf(t, "crash-1-a1")
	if len(calls) != 1 || calls[0].ContinuedFrom == nil || *calls[0].ContinuedFrom != f.cutCall.CallID || calls[0].ReusedPrefixTokens != prefix || prefix <= 0 {
		t.Fatalf("the re-issued call = %+v, want it to continue %s (%d tokens)", calls, f.cutCall.CallID, prefix)
	}
	_, man := m2.ledger(t, "crash-1-a1")
	if len(man.Records) != 2 || man.Records[0].CallID != f.first || man.Records[1].ParentCallID != f.first ||
		man.Records[1].ContinuedFrom != stagingKey || len(man.Failures) != 0 {
		t.Fatalf("restored lineage = %+v", man)
	}
	if status, _ := m2.ledger(t, f.key); status != http.StatusGone {
		t.Fatalf("the source attempt's ledger is retired on restore: %d", status)
	}
	st = m2.status(t)
	if !reflect.DeepEqual(st["restored_generation_cuts"], []any{}) || !reflect.DeepEqual(st["restored_pending"], []any{}) {
		t.Fatalf("the delivered call consumes the restored cut: %v", st)
	}
}

// A restored cut stays until its call delivers: a re-issue undelivered at
// the next checkpoint is exported with the same cut.
func TestCheckpoint_RestoredCutCarriedForward(t *testing.T) {
	t.Parallel()
	f := newCutFixture(t, "carry-1")
	f.check(t)
	f.m.stop()
	await(t, "the cut call", f.pending)
	await(t, "the constrained call", f.other)

	m2 := startModel(t, f.w.url, f.dir, ctlplanetest.Config(), nil)
	m2.mustOp(t, "restore", restoreReq("cut1", f.dir, f.key))
	m2.mustOp(t, "resume", ckReq("cut1"))
	// The replacement has not re-issued the call yet: the next checkpoint
	// continues the restored attempt and carries the cut.
	m2.mustOp(t, "prepare", ckReq("cut2"))
	dir2 := t.TempDir()
	out := m2.mustOp(t, "commit", commitReq("cut2", dir2, "carry-1-a1"))
	rec := records(t, dir2, "cut2")["carry-1-a1"]
	first := records(t, f.dir, "cut1")[f.key]
	if rec == nil || !reflect.DeepEqual(rec.GenerationCuts, first.GenerationCuts) || len(rec.Rows) != 1 || rec.Rows[0].CallID != f.first {
		t.Fatalf("second record = %+v, want the first's rows and cut %+v", rec, first)
	}
	if !reflect.DeepEqual(out["staging_keys"], f.commit["staging_keys"]) {
		t.Fatalf("second commit's staging keys = %v", out["staging_keys"])
	}
	m2.mustOp(t, "resume", ckReq("cut2"))

	// The worker lost its staged prefixes: the re-issue is refused as a
	// continuation and regenerates instead of failing.
	if err := f.w.ctl.Reset(context.Background()); err != nil {
		t.Fatal(err)
	}
	m2.mustCall(t, "carry-1-a1", chatPath, f.body)
	calls := f.w.callsOf(t, "carry-1-a1")
	if len(calls) != 1 || calls[0].ContinuedFrom != nil || calls[0].Status != fakeinference.StatusReturned {
		t.Fatalf("worker calls after a lost prefix = %+v, want one regenerated call", calls)
	}
	_, man := m2.ledger(t, "carry-1-a1")
	if len(man.Records) != 2 || man.Records[1].ContinuedFrom != "" || man.Records[1].ParentCallID != f.first {
		t.Fatalf("ledger after the regenerated call = %+v", man.Records)
	}
}

// Restoring a checkpoint again after its replacement made calls replaces
// the dead run's rows: the lineage continues from the checkpoint.
func TestCheckpoint_RestoreAgainReplacesDeadRun(t *testing.T) {
	t.Parallel()
	w := startWorker(t, 0)
	ledgerDir, dir := t.TempDir(), t.TempDir()
	m1 := startModel(t, w.url, ledgerDir, ctlplanetest.Config(), nil)
	m1.mustCall(t, "again-1", chatPath, chatRequest("one", "a"))
	call0 := m1.rowIDs(t, "again-1")
	m1.mustOp(t, "prepare", ckReq("k"))
	m1.mustOp(t, "commit", commitReq("k", dir, "again-1"))
	m1.stop()

	m2 := startModel(t, w.url, ledgerDir, ctlplanetest.Config(), nil)
	m2.mustOp(t, "restore", restoreReq("k", dir, "again-1"))
	m2.mustOp(t, "resume", ckReq("k"))
	m2.mustCall(t, "again-1-a1", chatPath, chatRequest("two", "b"))
	m2.mustCall(t, "again-1-a1", chatPath, chatRequest("three", "c"))
	m2.mustCall(t, "again-1-a2", chatPath, chatRequest("later attempt", "d"))
	dead := m2.rowIDs(t, "again-1-a1")
	if len(dead) != 3 {
		t.Fatalf("dead run's ledger = %v", dead)
	}
	m2.stop()

	m3 := startModel(t, w.url, ledgerDir, ctlplanetest.Config(), nil)
	m3.mustOp(t, "restore", restoreReq("k", dir, "again-1"))
	m3.mustOp(t, "resume", ckReq("k"))
	if got := m3.rowIDs(t, "again-1-a1"); !slices.Equal(got, call0) {
		t.Fatalf("the second import holds %v, want only %v", got, call0)
	}
	if got := m3.rowIDs(t, "again-1-a2"); len(got) != 0 {
		t.Fatalf("a later attempt's ledger survived the restore: %v", got)
	}
	m3.mustCall(t, "again-1-a1", chatPath, chatRequest("two", "b"))
	_, man := m3.ledger(t, "again-1-a1")
	if len(man.Records) != 2 || man.Records[1].ParentCallID != call0[0] || len(man.Failures) != 0 {
		t.Fatalf("lineage after the second restore = %+v", man)
	}
	for _, r := range man.Records {
		if slices.Contains(dead[1:], r.CallID) {
			t.Fatalf("a dead run's call %s is in the lineage", r.CallID)
		}
	}
}

// Retire cancels a call in flight and answers only once its handler
// returned; the ledger is retired, late calls are refused until forget.
func TestCheckpoint_RetireCancelsCalls(t *testing.T) {
	t.Parallel()
	w := startWorker(t, 0)
	m := startModel(t, w.url, t.TempDir(), ctlplanetest.Config(), nil)
	m.mustCall(t, "ret-1", chatPath, chatRequest("one", "a"))
	if _, err := w.ctl.HoldAfterCalls(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	pending := m.callAsync("ret-1", chatPath, chatRequest("two", "b"))
	waitFor(t, "the call to reach the worker", func() bool {
		inflight, _ := m.status(t)["inflight"].(float64)
		n, err := w.ctl.CallCount(context.Background())
		return inflight == 1 && err == nil && n.Held == 1
	})
	out := m.mustOp(t, "retire", map[string]any{"checkpoint_id": "ops", "deadline_ts": future(10 * time.Second), "episode_ids": scopeOf("ret-1")})
	if !reflect.DeepEqual(out["retired"], []any{"ret-1"}) {
		t.Fatalf("retire = %v", out)
	}
	if inflight := m.status(t)["inflight"]; inflight != float64(0) {
		t.Fatalf("retire returned with %v calls still admitted", inflight)
	}
	r := await(t, "the retired call", pending)
	if r.status != http.StatusConflict || errorCode(r.body) != "stale_attempt" {
		t.Fatalf("the retired call = %d %s %v", r.status, r.body, r.err)
	}
	if status, _ := m.ledger(t, "ret-1"); status != http.StatusGone {
		t.Fatalf("manifest of a retired attempt: %d, want 410", status)
	}
	if _, err := w.ctl.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := m.call("ret-1", chatPath, chatRequest("late", "c")); r.status != http.StatusConflict || errorCode(r.body) != "stale_attempt" {
		t.Fatalf("late call: %d %s", r.status, r.body)
	}
	m.mustOp(t, "forget", map[string]any{"checkpoint_id": "ops", "deadline_ts": future(10 * time.Second), "rollout_ids": []string{"ret-1"}})
	m.mustCall(t, "ret-1", chatPath, chatRequest("again", "d"))
	if got := m.rowIDs(t, "ret-1"); len(got) != 1 {
		t.Fatalf("after forget the attempt starts a new ledger: %v", got)
	}
}

// The ledger's retire and delete routes refuse while a checkpoint is open;
// the manifest stays readable.
func TestCheckpoint_LedgerRoutesRefuseWhileOpen(t *testing.T) {
	t.Parallel()
	w := startWorker(t, 0)
	m := startModel(t, w.url, t.TempDir(), ctlplanetest.Config(), nil)
	m.mustCall(t, "open-1", chatPath, chatRequest("one", "a"))
	remove := func(route string) (int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, m.url+"/capture/rollouts/"+route, strings.NewReader(`{"rollout_ids":["open-1"]}`))
		resp, err := m.ctl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	m.mustOp(t, "prepare", ckReq("o1"))
	for _, route := range []string{"retire", "delete"} {
		if st, body := remove(route); st != http.StatusConflict || errorCode([]byte(body)) != "checkpoint_open" {
			t.Fatalf("%s while open: %d %s", route, st, body)
		}
	}
	if got := m.rowIDs(t, "open-1"); len(got) != 1 {
		t.Fatalf("manifest while open: %v", got)
	}
	m.mustOp(t, "resume", ckReq("o1"))
	if st, body := remove("delete"); st != http.StatusOK || strings.TrimSpace(body) != `{"removed":["open-1"],"absent":[]}` {
		t.Fatalf("delete after resume: %d %s", st, body)
	}
}

// A call arriving while a checkpoint is open waits unadmitted: it never
// blocks the prepare and runs after resume.
func TestCheckpoint_CallWhileClosedWaits(t *testing.T) {
	t.Parallel()
	w := startWorker(t, 0)
	m := startModel(t, w.url, t.TempDir(), ctlplanetest.Config(), nil)
	m.mustOp(t, "prepare", ckReq("w1"))
	pending := m.callAsync("wait-1", chatPath, chatRequest("hi", "a"))
	// Nothing is admitted while closed; the models route still answers.
	if st, _ := m.get(t, "/v1/models"); st != http.StatusOK {
		t.Fatalf("models while closed: %d", st)
	}
	notYet(t, "the call sent while closed", pending)
	if inflight := m.status(t)["inflight"]; inflight != float64(0) {
		t.Fatalf("a call waiting for admission is not in flight: %v", inflight)
	}
	m.mustOp(t, "resume", ckReq("w1"))
	if r := await(t, "the waiting call", pending); r.status != http.StatusOK {
		t.Fatalf("after resume: %d %s %v", r.status, r.body, r.err)
	}
	if st := m.status(t); st["served"] != float64(1) {
		t.Fatalf("served = %v", st["served"])
	}
	if _, code := freshRestore(t, m); code != "checkpoint_error" {
		t.Fatalf("restore into a server that served calls: %s", code)
	}
}

// freshRestore tries a restore and returns its status and code.
func freshRestore(t *testing.T, m *model) (int, string) {
	t.Helper()
	st, out := m.op(t, "restore", restoreReq("never", t.TempDir()))
	e, _ := out["error"].(map[string]any)
	code, _ := e["code"].(string)
	if detail, _ := e["detail"].(string); code == "checkpoint_error" && !strings.Contains(detail, "freshly started model server") {
		t.Fatalf("refusal detail = %q", detail)
	}
	return st, code
}

// Commit deletes a restored attempt the scope leaves out and no call used.
func TestCheckpoint_CommitDropsUnusedRestored(t *testing.T) {
	t.Parallel()
	w := startWorker(t, 0)
	ledgerDir, dir := t.TempDir(), t.TempDir()
	m1 := startModel(t, w.url, ledgerDir, ctlplanetest.Config(), nil)
	for _, k := range []string{"keep-1", "drop-1"} {
		m1.mustCall(t, k, chatPath, chatRequest("one", "a"))
	}
	m1.mustOp(t, "prepare", ckReq("d1"))
	m1.mustOp(t, "commit", commitReq("d1", dir, "keep-1", "drop-1"))
	m1.stop()

	m2 := startModel(t, w.url, ledgerDir, ctlplanetest.Config(), nil)
	m2.mustOp(t, "restore", restoreReq("d1", dir, "keep-1", "drop-1"))
	m2.mustOp(t, "resume", ckReq("d1"))
	if st := m2.status(t); !reflect.DeepEqual(st["restored_pending"], []any{"drop-1-a1", "keep-1-a1"}) {
		t.Fatalf("pending = %v", st["restored_pending"])
	}
	m2.mustOp(t, "prepare", ckReq("d2"))
	m2.mustOp(t, "commit", commitReq("d2", t.TempDir(), "keep-1-a1"))
	m2.mustOp(t, "resume", ckReq("d2"))
	if got := m2.rowIDs(t, "drop-1-a1"); len(got) != 0 {
		t.Fatalf("the dropped restored attempt kept %v", got)
	}
	if got := m2.rowIDs(t, "keep-1-a1"); len(got) != 1 {
		t.Fatalf("the kept restored attempt = %v", got)
	}
	if st := m2.status(t); !reflect.DeepEqual(st["restored_pending"], []any{"keep-1-a1"}) {
		t.Fatalf("pending after commit = %v", st["restored_pending"])
	}
	// Deleted without a fence: the attempt may start afresh.
	m2.mustCall(t, "drop-1-a1", chatPath, chatRequest("fresh", "b"))
}

// Install refuses bad records and changes nothing.
func TestCheckpoint_InstallValidatesFirst(t *testing.T) {
	t.Parallel()
	w := startWorker(t, 0)
	ledgerDir, dir := t.TempDir(), t.TempDir()
	m1 := startModel(t, w.url, ledgerDir, ctlplanetest.Config(), nil)
	m1.mustCall(t, "v-1", chatPath, chatRequest("one", "a"))
	m1.stop()

	// A hand-written checkpoint whose second record holds two cuts.
	cut := modelproxy.GenerationCut{ModelCallID: "c", RequestDigest: strings.Repeat("a", 64), Continuation: modelproxy.Continuation{
		SourceCaptureKey: "v-2", SourceModelCallID: "c", StagingKeys: []string{"k"}, PrefixTokenCount: 1, PrefixDigest: "d"}}
	good, _ := json.Marshal(modelproxy.ModelRecord{Rows: nil, GenerationCuts: []modelproxy.GenerationCut{cut}})
	bad, _ := json.Marshal(modelproxy.ModelRecord{GenerationCuts: []modelproxy.GenerationCut{cut, cut}})
	writeCheckpoint(t, dir, "bad", map[string][]byte{"v-1": good, "v-2": bad})

	m2 := startModel(t, w.url, ledgerDir, ctlplanetest.Config(), nil)
	st, out := m2.op(t, "restore", restoreReq("bad", dir, "v-1", "v-2"))
	if st != http.StatusUnprocessableEntity || !strings.Contains(fmt.Sprint(out), "at most one generation cut") {
		t.Fatalf("restore of a bad record = %d %v", st, out)
	}
	if got := m2.rowIDs(t, "v-1"); len(got) != 1 {
		t.Fatalf("a refused restore changed the ledger: %v", got)
	}
	if st := m2.status(t); st["phase"] != "idle" || !reflect.DeepEqual(st["restored_pending"], []any{}) {
		t.Fatalf("status after a refused restore = %v", st)
	}
}
