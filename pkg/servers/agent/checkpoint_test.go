package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/servers/agent"
	ckptcontrol "github.com/gymfleet/gymfleet/pkg/wire/control"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// withCheckpoint enables checkpointing as the conformance suite does.
func withCheckpoint(c *agent.Config) { c.Checkpoint = ctlplanetest.Config() }

func TestCheckpoint_Conformance(t *testing.T) {
	ctlplanetest.Run(t, func(t *testing.T, cfg ctlplane.Config) ctlplanetest.Subject {
		ta := newFixture(t, func(c *agent.Config) { c.Checkpoint = cfg })
		return ctlplanetest.Subject{
			URL: ta.url, Kind: ctlplane.KindAgent, Instance: agent.DefaultConfig().Name,
			Probe: func(_ context.Context, id rollout.EpisodeID) (int, string) {
				r := ta.post("/ng-rollout/"+id.CaptureKey()+"/v1/agent_sessions", nil,
					`{"session_id":"probe-`+id.CaptureKey()+`","resources_session_id":"rs"}`)
				return r.status, errorCode(r.body)
			},
		}
	})
}

func TestCheckpoint_Disabled(t *testing.T) {
	ctlplanetest.RunDisabled(t, newFixture(t, nil).url)
}

func errorCode(body string) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal([]byte(body), &e)
	return e.Error.Code
}

// control drives one agent's control API.
type control struct {
	t   *testing.T
	url string
}

func (c control) call(op string, body any) (int, map[string]any, error) {
	method, rd := http.MethodPost, io.Reader(nil)
	if op == "status" {
		method = http.MethodGet
	} else {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.url+ctlplane.RoutePrefix+"/"+op, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+ctlplanetest.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var m map[string]any
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &m); err != nil {
		return resp.StatusCode, nil, fmt.Errorf("%s reply %q: %v", op, b, err)
	}
	return resp.StatusCode, m, nil
}

// must runs an operation that must answer 200.
func (c control) must(op string, body any) map[string]any {
	c.t.Helper()
	st, m, err := c.call(op, body)
	if err != nil || st != http.StatusOK {
		c.t.Fatalf("%s %v: %d %v %v", op, body, st, m, err)
	}
	return m
}

func deadline(seconds float64) float64 {
	return float64(time.Now().Add(time.Duration(seconds*float64(time.Second))).UnixNano()) / 1e9
}

func episodes(t *testing.T, keys ...string) []rollout.EpisodeID {
	t.Helper()
	out := []rollout.EpisodeID{}
	for _, k := range keys {
		id, err := rollout.ParseCaptureKey(k)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, id)
	}
	return out
}

func (c control) prepare(id string, seconds float64) map[string]any {
	c.t.Helper()
	return c.must("prepare", map[string]any{"checkpoint_id": id, "deadline_ts": deadline(seconds)})
}

func (c control) commit(id, dir string, keys ...string) map[string]any {
	c.t.Helper()
	return c.must("commit", map[string]any{"checkpoint_id": id, "deadline_ts": deadline(30), "checkpoint_dir": dir, "episode_ids": episodes(c.t, keys...), "stop": false})
}

func (c control) restore(id, dir string, keys ...string) map[string]any {
	c.t.Helper()
	return c.must("restore", map[string]any{"checkpoint_id": id, "deadline_ts": deadline(30), "checkpoint_dir": dir, "episode_ids": episodes(c.t, keys...)})
}

func (c control) resume(id string) {
	c.t.Helper()
	c.must("resume", map[string]any{"checkpoint_id": id, "deadline_ts": deadline(30)})
}

func (c control) retire(keys ...string) map[string]any {
	c.t.Helper()
	// The body names a checkpoint (NeMo Gym's RetireRequest requires one):
	// the restored one while the server is restored, any other outside.
	id, _ := c.status()["checkpoint_id"].(string)
	if id == "" {
		id = "ops"
	}
	return c.must("retire", map[string]any{"checkpoint_id": id, "deadline_ts": deadline(30), "episode_ids": episodes(c.t, keys...)})
}

func (c control) status() map[string]any {
	c.t.Helper()
	return c.must("status", nil)
}

// counts is the report's counts as "name=n" strings, sorted.
func (c control) counts() []string {
	c.t.Helper()
	rep, _ := c.status()["report"].(map[string]any)
	m, _ := rep["counts"].(map[string]any)
	var out []string
	for k, v := range m {
		out = append(out, fmt.Sprintf("%s=%v", k, v))
	}
	slices.Sort(out)
	return out
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// records reads the agent's committed records of a checkpoint.
func records(t *testing.T, dir, id string) []map[string]json.RawMessage {
	t.Helper()
	store := ctlplanetest.Store(t, dir)
	_, recs, _, err := store.Read(context.Background(), ckptstore.Target{Dir: dir, Kind: ctlplane.KindAgent, Instance: agent.DefaultConfig().Name, CheckpointID: id}, nil)
	if err != nil {
		t.Fatalf("reading checkpoint %s: %v", id, err)
	}
	var out []map[string]json.RawMessage
	for _, r := range recs {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(r.Data, &m); err != nil {
			t.Fatalf("record %s: %v", r.Data, err)
		}
		out = append(out, m)
	}
	return out
}

// manifestOf reads the agent's manifest of checkpoint id in dir.
func manifestOf(t *testing.T, dir, id string) ckptstore.Manifest {
	t.Helper()
	store := ctlplanetest.Store(t, dir)
	m, _, _, err := store.Read(context.Background(), ckptstore.Target{Dir: dir, Kind: ctlplane.KindAgent, Instance: agent.DefaultConfig().Name, CheckpointID: id}, nil)
	if err != nil {
		t.Fatalf("reading checkpoint %s: %v", id, err)
	}
	return m
}

// waitUntil polls cond until it holds or 10 s pass.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		<-time.After(5 * time.Millisecond)
	}
}

func receive[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}

func notYet[T any](t *testing.T, what string, ch <-chan T) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("%s arrived while the checkpoint was open: %v", what, v)
	default:
	}
}

// crash kills an agent as SIGKILL would: every request is cut at once.
func crash(ta *testAgent) { _ = ta.srv.CloseNow() }

func TestCheckpoint_RunningToolRoundBlocksUntilItsBoundary(t *testing.T) {
	rec := &recorder{}
	model := newModel(t, rec, oneRound()...)
	rs := newResources(t, rec)
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	rs.tool = func(name, body string) (int, string) {
		entered <- struct{}{}
		<-gate
		return weatherTool(name, body)
	}
	ta := startAgent(t, model, rs, rec, withCheckpoint)
	c := control{t, ta.url}
	ta.open("r", "s", "rs")
	done := make(chan reply, 1)
	go func() { done <- ta.activate("r", "s", "1", weatherParams) }()
	receive(t, "the tool call", entered)

	rep := c.prepare("c1", 0.3)
	if got := jsonOf(rep); got != `{"phase":"preparing","report":{"blocker_count":1,"blockers":["r"],"counts":{"at_boundary":0,"legacy_runs":0,"legacy_runs_parked":0,"sessions":1},"ready":false,"restarts":[]}}` {
		t.Fatalf("prepare while a tool round runs: %s", got)
	}
	close(gate)
	// The same prepare again: ready once the activation parks after its
	// tool round.
	rep = c.prepare("c1", 10)
	if got := jsonOf(rep); got != `{"phase":"prepared","report":{"blocker_count":0,"blockers":[],"counts":{"at_boundary":1,"legacy_runs":0,"legacy_runs_parked":0,"sessions":1},"ready":true,"restarts":[]}}` {
		t.Fatalf("prepare after the tool round: %s", got)
	}
	if got := agent.SessionBoundary(ta.srv, "s"); got != "after_tool_round" {
		t.Errorf("parked at %q, want after_tool_round", got)
	}
	if n := model.callCount(); n != 1 {
		t.Errorf("model calls while parked: %d, want 1", n)
	}
	notYet(t, "the activation's reply", done)
	if st := c.status(); st["accepting"] != false || st["sessions"] != float64(1) {
		t.Errorf("status while closed: %v", st)
	}
	c.resume("c1")
	r := receive(t, "the activation's reply", done)
	if r.status != 200 || field(t, r.body, "id") != `"resp_2"` {
		t.Fatalf("activation after resume: %d %s", r.status, r.body)
	}
	if st := c.status(); st["accepting"] != true {
		t.Errorf("status after resume: %v", st)
	}
}

func TestCheckpoint_InvokedWhileClosedParksBeforeAnyWork(t *testing.T) {
	ta := newFixture(t, withCheckpoint, oneRound()...)
	c := control{t, ta.url}
	ta.open("r", "s", "rs")
	c.prepare("c1", 10)
	done := make(chan reply, 1)
	go func() { done <- ta.activate("r", "s", "1", weatherParams) }()
	waitUntil(t, "the activation parks", func() bool { return slices.Contains(c.counts(), "at_boundary=1") })
	if got := agent.SessionBoundary(ta.srv, "s"); got != "before_model_call" {
		t.Errorf("parked at %q, want before_model_call", got)
	}
	if n := len(ta.rec.all()); n != 0 {
		t.Errorf("the parked activation did work: %q", ta.rec.lines())
	}
	notYet(t, "the activation's reply", done)
	c.resume("c1")
	if r := receive(t, "the activation's reply", done); r.status != 200 {
		t.Fatalf("activation after resume: %d %s", r.status, r.body)
	}
	if n := ta.model.callCount(); n != 2 {
		t.Errorf("model calls %d, want 2", n)
	}
}

func TestCheckpoint_AwaitingHeldModelCallIsAtItsBoundary(t *testing.T) {
	rec := &recorder{}
	model := newModel(t, rec, oneRound()...)
	model.block, model.entered = make(chan struct{}), make(chan struct{}, 4)
	ta := startAgent(t, model, newResources(t, rec), rec, withCheckpoint)
	c := control{t, ta.url}
	ta.open("r", "s", "rs")
	done := make(chan reply, 1)
	go func() { done <- ta.activate("r", "s", "1", weatherParams) }()
	receive(t, "the model call", model.entered)
	rep := c.prepare("c1", 10)
	if rep["phase"] != "prepared" || !slices.Contains(c.counts(), "at_boundary=1") {
		t.Fatalf("prepare while the model call is held: %v (counts %v)", rep, c.counts())
	}
	c.resume("c1")
	close(model.block)
	if r := receive(t, "the activation's reply", done); r.status != 200 {
		t.Fatalf("activation: %d %s", r.status, r.body)
	}
}

// TestCheckpoint_RestoreContinuesPendingTools is the native crash scenario:
// call 0 delivered, its tool not run yet. A second checkpoint of the
// restored process, taken before the replacement runs, carries the session
// on; the replacement of that one runs the tool first and makes exactly one
// model call.
func TestCheckpoint_RestoreContinuesPendingTools(t *testing.T) {
	rec := &recorder{}
	model := newModel(t, rec, oneRound()...)
	model.block, model.entered = make(chan struct{}), make(chan struct{}, 4)
	old := startAgent(t, model, newResources(t, rec), rec, withCheckpoint)
	c := control{t, old.url}
	old.open("r", "s", "rs")
	oldDone := make(chan reply, 1)
	go func() { oldDone <- old.activate("r", "s", "1", weatherParams) }()
	receive(t, "model call 0", model.entered)
	c.prepare("c1", 10)
	// Call 0 is delivered during the checkpoint (it was already on its
	// way): the loop moves to its pending-tools boundary and parks there.
	close(model.block)
	waitUntil(t, "the activation parks with its tools pending", func() bool { return agent.SessionBoundary(old.srv, "s") == "pending_tools" })
	if r := c.prepare("c1", 10); r["phase"] != "prepared" {
		t.Fatalf("prepare: %v", r)
	}
	dir := t.TempDir()
	cm := c.commit("c1", dir, "r")
	if got := jsonOf(cm["episode_ids"]); got != `["r"]` {
		t.Errorf("commit episode_ids %s", got)
	}
	recs := records(t, dir, "c1")
	if len(recs) != 1 {
		t.Fatalf("records: %v", recs)
	}
	// Native sessions follow their recorded owner into any agent count.
	if extras := manifestOf(t, dir, "c1").Extras; extras != nil {
		t.Errorf("manifest extras %v, want none", extras)
	}
	first := recs[0]
	if string(first["type"]) != `"agent_session"` || string(first["session_id"]) != `"s"` || compact(t, string(first["episode_id"])) != `{"rollout_id":"r","attempt":0}` {
		t.Errorf("record header: %v", first)
	}
	wantSession := `{"request":{"responses_create_params":{"input":"hi"}},"resources_session_id":"rs","activations":1,"completed_activation":0,"completed_reply":null,"observations":{"activations":0,"steps":0,"model_calls":0,"tool_calls":0,"usage":null,"resources_session_id":"rs"}}`
	if got := compact(t, string(first["session"])); got != wantSession {
		t.Errorf("session:\n got %s\nwant %s", got, wantSession)
	}
	boundary := string(first["boundary"])
	if field(t, boundary, "pending_tools") != "true" || field(t, boundary, "step") != "1" || field(t, boundary, "model_calls") != "1" ||
		field(t, boundary, "new_outputs") != compact(t, items(fc("c1", "get_weather", getWeatherParis))) {
		t.Errorf("loop boundary: %s", boundary)
	}
	crash(old)
	if r := receive(t, "the crashed activation's reply", oldDone); r.status == 200 {
		t.Errorf("the crashed activation replied 200: %s", r.body)
	}

	// A restored process that is checkpointed again before its replacement
	// starts carries the session on, named by the replacement attempt.
	relayRec := &recorder{}
	relay := startAgent(t, newModel(t, relayRec), newResources(t, relayRec), relayRec, withCheckpoint)
	rc := control{t, relay.url}
	if got := jsonOf(rc.restore("c1", dir, "r")["restored"]); got != `["r-a1"]` {
		t.Fatalf("restored %s", got)
	}
	if got := jsonOf(rc.status()["restored_pending"]); got != `["r-a1"]` {
		t.Errorf("restored_pending %s", got)
	}
	rc.resume("c1")
	rc.prepare("c2", 10)
	dir2 := t.TempDir()
	rc.commit("c2", dir2, "r-a1")
	again := records(t, dir2, "c2")
	if len(again) != 1 || compact(t, string(again[0]["boundary"])) != compact(t, boundary) || compact(t, string(again[0]["episode_id"])) != `{"rollout_id":"r","attempt":1}` {
		t.Fatalf("re-exported record: %v", again)
	}
	rc.resume("c2")
	if n := len(relayRec.all()); n != 0 {
		t.Errorf("the relay did work: %q", relayRec.lines())
	}

	freshRec := &recorder{}
	freshModel := newModel(t, freshRec, oneRound()[1])
	fresh := startAgent(t, freshModel, newResources(t, freshRec), freshRec, withCheckpoint)
	fctl2 := control{t, fresh.url}
	fctl2.restore("c2", dir2, "r-a1")
	fctl2.resume("c2")
	r := fresh.activate("r-a2", "s", "1", weatherParams)
	if r.status != 200 {
		t.Fatalf("continued activation: %d %s", r.status, r.body)
	}
	want := []string{"resources /ng-rollout/r-a2/get_weather session=rs", "model /ng-rollout/r-a2/v1/responses"}
	if got := freshRec.lines(); !slices.Equal(got, want) {
		t.Errorf("requests:\n got %q\nwant %q", got, want)
	}
	toolOut := `{"city":"Paris","weather_description":"The weather in Paris is cold."}`
	wantInput := compact(t, items(`{"type":"message","role":"user","content":"Weather in Paris?"}`, fc("c1", "get_weather", getWeatherParis), fco("c1", toolOut)))
	if got := field(t, freshRec.of("model")[0].body, "input"); got != wantInput {
		t.Errorf("model input:\n got %s\nwant %s", got, wantInput)
	}
	if got, want := field(t, r.body, "output"), compact(t, items(fc("c1", "get_weather", getWeatherParis), fco("c1", toolOut), msg("The weather in Paris is cold."))); got != want {
		t.Errorf("output:\n got %s\nwant %s", got, want)
	}
	if got, want := field(t, r.body, "usage"), compact(t, usage(30, 12, "3")); got != want {
		t.Errorf("usage %s, want both calls' %s", got, want)
	}
	cl := fresh.closeSession("r-a2", "s")
	if !strings.Contains(cl.body, `"activations":1,"steps":2,"model_calls":2,"tool_calls":1`) {
		t.Errorf("observations: %s", cl.body)
	}
}

func TestCheckpoint_ActivationIndexAfterRestore(t *testing.T) {
	old := newFixture(t, withCheckpoint, oneRound()...)
	old.open("r", "s", "rs")
	first := old.activate("r", "s", "1", weatherParams)
	if first.status != 200 {
		t.Fatalf("activation 1: %d %s", first.status, first.body)
	}
	c := control{t, old.url}
	dir := t.TempDir()
	c.prepare("c1", 10)
	c.commit("c1", dir, "r")
	recs := records(t, dir, "c1")
	if len(recs) != 1 || string(recs[0]["boundary"]) != "null" || field(t, string(recs[0]["session"]), "completed_activation") != "1" {
		t.Fatalf("records of an idle session: %v", recs)
	}
	c.resume("c1")

	fresh := newFixture(t, withCheckpoint, oneRound()...)
	fctl := control{t, fresh.url}
	fctl.restore("c1", dir, "r")
	fctl.resume("c1")
	again := fresh.activate("r-a1", "s", "1", weatherParams)
	if again.status != 200 || again.body != first.body {
		t.Errorf("activation 1 after restore: %d, same reply %v", again.status, again.body == first.body)
	}
	if n := fresh.model.callCount(); n != 0 {
		t.Errorf("the stored reply called the model %d times", n)
	}
	expectCode(t, "activation 3", fresh.activate("r-a1", "s", "3", weatherParams), 409, "activation_out_of_order")
	expectCode(t, "the old attempt", fresh.activate("r", "s", "2", weatherParams), 409, "stale_attempt")
	if r := fresh.activate("r-a1", "s", "2", weatherParams); r.status != 200 {
		t.Fatalf("activation 2: %d %s", r.status, r.body)
	}
	cl := fresh.closeSession("r-a1", "s")
	if !strings.Contains(cl.body, `"activations":2,"steps":4,"model_calls":4,"tool_calls":2`) {
		t.Errorf("observations carried across the restore: %s", cl.body)
	}
}

func TestCheckpoint_CommitDropsUntouchedRestoredSessions(t *testing.T) {
	old := newFixture(t, withCheckpoint)
	for _, k := range []string{"r1", "r2", "r3", "r4"} {
		old.open(k, "s-"+k, "rs-"+k)
	}
	c := control{t, old.url}
	dir := t.TempDir()
	c.prepare("c1", 10)
	c.commit("c1", dir, "r1", "r2", "r3", "r4")
	c.resume("c1")

	fresh := newFixture(t, withCheckpoint)
	fctl := control{t, fresh.url}
	if got := jsonOf(fctl.restore("c1", dir, "r1", "r2", "r3", "r4")["restored"]); got != `["r1-a1","r2-a1","r3-a1","r4-a1"]` {
		t.Fatalf("restored %s", got)
	}
	// Retire works while restored and frees restored sessions.
	fctl.retire("r4-a1")
	fctl.resume("c1")
	if got := jsonOf(fctl.status()["restored_pending"]); got != `["r1-a1","r2-a1","r3-a1"]` {
		t.Errorf("restored_pending %s", got)
	}
	// r3's replacement touched its session: it is no longer only restored.
	if r := fresh.open("r3-a1", "s-r3", "rs-r3"); r.status != 200 {
		t.Fatalf("reopen: %d %s", r.status, r.body)
	}
	fctl.prepare("c2", 10)
	dir2 := t.TempDir()
	fctl.commit("c2", dir2, "r1-a1")
	if recs := records(t, dir2, "c2"); len(recs) != 1 || string(recs[0]["session_id"]) != `"s-r1"` {
		t.Errorf("records: %v", recs)
	}
	fctl.resume("c2")
	st := fctl.status()
	if st["sessions"] != float64(2) || jsonOf(st["restored_pending"]) != `["r1-a1"]` {
		t.Errorf("after a commit leaving r2 out: %v", st)
	}
	expectCode(t, "the dropped session", fresh.activate("r2-a1", "s-r2", "1", weatherParams), 404, "unknown_session")
	expectCode(t, "the retired session", fresh.activate("r4-a2", "s-r4", "1", weatherParams), 404, "unknown_session")
}

func TestCheckpoint_RestoreNeedsAFreshProcess(t *testing.T) {
	ta := newFixture(t, withCheckpoint)
	ta.open("r", "s", "rs")
	st, m, err := control{t, ta.url}.call("restore", map[string]any{"checkpoint_id": "c1", "deadline_ts": deadline(30), "checkpoint_dir": t.TempDir(), "episode_ids": []any{}})
	if err != nil || st != 409 || !strings.Contains(jsonOf(m), "requires a process without live sessions") {
		t.Errorf("restore into a used process: %d %v %v", st, m, err)
	}
}

func TestCheckpoint_RetireStopsAndFrees(t *testing.T) {
	rec := &recorder{}
	model := newModel(t, rec, oneRound()...)
	model.block, model.entered = make(chan struct{}), make(chan struct{}, 4)
	defer close(model.block)
	ta := startAgent(t, model, newResources(t, rec), rec, withCheckpoint)
	c := control{t, ta.url}
	ta.open("r", "s", "rs")
	ta.open("r-a1", "s-next", "rs-next")
	done := make(chan reply, 1)
	go func() { done <- ta.activate("r", "s", "1", weatherParams) }()
	receive(t, "the model call", model.entered)

	if got := jsonOf(c.retire("r")["retired"]); got != `["r"]` {
		t.Errorf("retired %s", got)
	}
	// Retire replied only after the activation stopped: its session, freed
	// only then, is gone; the later attempt's stays.
	if got := c.counts(); !slices.Equal(got, []string{"at_boundary=0", "legacy_runs=0", "legacy_runs_parked=0", "sessions=1"}) {
		t.Errorf("counts after retire: %v", got)
	}
	expectCode(t, "the retired activation", receive(t, "the activation's reply", done), 409, "stale_attempt")
	expectCode(t, "open by the retired attempt", ta.open("r", "s2", "rs"), 409, "stale_attempt")
	expectCode(t, "activation by the retired attempt", ta.activate("r", "s", "1", weatherParams), 409, "stale_attempt")
	expectCode(t, "close of the freed session", ta.closeSession("", "s"), 404, "unknown_session")
	c.must("forget", map[string]any{"checkpoint_id": "ops", "deadline_ts": deadline(30), "rollout_ids": []string{"r"}})
	if r := ta.open("r", "s2", "rs"); r.status != 200 {
		t.Errorf("open after forget: %d %s", r.status, r.body)
	}
}

// legacyRow is a /run row of rollout r with attempt n.
func legacyRow(attempt int, task string) string {
	return fmt.Sprintf(`{"responses_create_params":%s,"_ng_rollout_id":"r","_ng_attempt_index":%d,"task":%q}`, weatherParams, attempt, task)
}

// TestLegacy_ContinuesFromItsLoopBoundary is the legacy crash scenario: call
// 0 delivered and its tool run, call 1 undelivered; the replacement makes
// call 1 only (the one an uncrashed run would make), then verifies.
func TestLegacy_ContinuesFromItsLoopBoundary(t *testing.T) {
	rec := &recorder{}
	model := newModel(t, rec, oneRound()...)
	model.block, model.entered, model.blockFrom = make(chan struct{}), make(chan struct{}, 4), 1
	defer close(model.block)
	old := startAgent(t, model, newResources(t, rec), rec, withCheckpoint)
	c := control{t, old.url}
	done := make(chan reply, 1)
	go func() { done <- old.post("/run", nil, legacyRow(0, "paris")) }()
	receive(t, "model call 1", model.entered)
	if rep := c.prepare("c1", 10); rep["phase"] != "prepared" {
		t.Fatalf("prepare while call 1 is held: %v", rep)
	}
	dir := t.TempDir()
	c.commit("c1", dir, "r")
	recs := records(t, dir, "c1")
	if len(recs) != 1 || string(recs[0]["type"]) != `"legacy_run"` {
		t.Fatalf("records: %v", recs)
	}
	// What keeps a coordinator from restoring it into other agent replicas.
	if n := manifestOf(t, dir, "c1").Extras[ckptcontrol.ManifestLegacyRuns]; n != float64(1) {
		t.Errorf("manifest %s = %v, want 1", ckptcontrol.ManifestLegacyRuns, n)
	}
	b := field(t, string(recs[0]["episode"]), "boundary")
	rsid := old.rec.all()[0].session
	if field(t, b, "next") != `"loop"` || field(t, b, "resources_session_id") != `"`+rsid+`"` || field(t, b, "verify_mode") != `"wait"` {
		t.Errorf("boundary: %s", b)
	}
	toolOut := `{"city":"Paris","weather_description":"The weather in Paris is cold."}`
	loop := field(t, b, "loop")
	if field(t, loop, "pending_tools") != "false" || field(t, loop, "new_outputs") != compact(t, items(fc("c1", "get_weather", getWeatherParis), fco("c1", toolOut))) {
		t.Errorf("loop boundary: %s", loop)
	}
	crash(old)
	receive(t, "the crashed /run", done)

	freshRec := &recorder{}
	fresh := startAgent(t, newModel(t, freshRec, oneRound()[1]), newResources(t, freshRec), freshRec, withCheckpoint)
	fctl := control{t, fresh.url}
	fctl.restore("c1", dir, "r")
	fctl.resume("c1")
	r := fresh.post("/run", nil, legacyRow(1, "paris"))
	if r.status != 200 || r.body != `{"episode_id":{"rollout_id":"r","attempt":1},"reward":1.0,"verified":true}` {
		t.Fatalf("replacement /run: %d %s", r.status, r.body)
	}
	want := []string{
		"model /ng-rollout/r-a1/v1/responses",
		"resources /ng-rollout/r-a1/verify session=" + rsid,
		"resources /ng-rollout/r-a1/close_session session=" + rsid,
	}
	if got := freshRec.lines(); !slices.Equal(got, want) {
		t.Errorf("requests:\n got %q\nwant %q", got, want)
	}
	all := freshRec.all()
	wantInput := compact(t, items(`{"type":"message","role":"user","content":"Weather in Paris?"}`, fc("c1", "get_weather", getWeatherParis), fco("c1", toolOut)))
	if got := field(t, all[0].body, "input"); got != wantInput {
		t.Errorf("model input:\n got %s\nwant %s", got, wantInput)
	}
	if got, want := field(t, field(t, all[1].body, "response"), "output"), compact(t, items(fc("c1", "get_weather", getWeatherParis), fco("c1", toolOut), msg("The weather in Paris is cold."))); got != want {
		t.Errorf("verified output:\n got %s\nwant %s", got, want)
	}
	if got := fctl.counts(); !slices.Contains(got, "legacy_runs=0") {
		t.Errorf("counts after the run: %v", got)
	}
}

// TestLegacy_VerifyInFlight: a wait-mode verify holds the checkpoint and
// the run then parks at return, replying only after the resume; restored,
// the replacement replies the recorded result without verifying again. A
// replay-mode verify holds nothing and is recorded as next: verify.
func TestLegacy_VerifyInFlight(t *testing.T) {
	for _, mode := range []string{"wait", "replay"} {
		t.Run(mode, func(t *testing.T) {
			rec := &recorder{}
			rs := newResources(t, rec)
			rs.verifyGate, rs.verifyEntered = make(chan struct{}), make(chan struct{}, 1)
			if mode == "replay" {
				rs.seedHeader = http.Header{agent.VerifyModeHeader: {"replay"}}
			}
			gateOpen := false
			openGate := func() {
				if !gateOpen {
					gateOpen = true
					close(rs.verifyGate)
				}
			}
			defer openGate()
			old := startAgent(t, newModel(t, rec, oneRound()...), rs, rec, withCheckpoint)
			c := control{t, old.url}
			done := make(chan reply, 1)
			go func() { done <- old.post("/run", nil, legacyRow(0, "paris")) }()
			receive(t, "the verify call", rs.verifyEntered)

			want := "verify"
			if mode == "wait" {
				rep := c.prepare("c1", 0.3)
				if rep["phase"] != "preparing" || jsonOf(rep["report"].(map[string]any)["blockers"]) != `["r"]` {
					t.Fatalf("prepare while a wait verify runs: %v", rep)
				}
				openGate()
				want = "return"
			}
			if rep := c.prepare("c1", 10); rep["phase"] != "prepared" {
				t.Fatalf("prepare: %v", rep)
			}
			dir := t.TempDir()
			c.commit("c1", dir, "r")
			recs := records(t, dir, "c1")
			if len(recs) != 1 {
				t.Fatalf("records: %v", recs)
			}
			b := field(t, string(recs[0]["episode"]), "boundary")
			if field(t, b, "next") != `"`+want+`"` || field(t, b, "verify_mode") != `"`+mode+`"` {
				t.Fatalf("boundary: %s", b)
			}
			if mode == "wait" && field(t, b, "result") != `{"reward":1.0,"verified":true}` {
				t.Errorf("return boundary lacks the result: %s", b)
			}
			notYet(t, "the /run reply", done)

			freshRec := &recorder{}
			fresh := startAgent(t, newModel(t, freshRec), newResources(t, freshRec), freshRec, withCheckpoint)
			fctl := control{t, fresh.url}
			fctl.restore("c1", dir, "r")
			fctl.resume("c1")
			r := fresh.post("/ng-rollout/r-a1/run", nil, legacyRow(1, "paris"))
			if r.status != 200 || r.body != `{"episode_id":{"rollout_id":"r","attempt":1},"reward":1.0,"verified":true}` {
				t.Fatalf("replacement /run: %d %s", r.status, r.body)
			}
			rsid := rec.all()[0].session
			wantSeq := []string{"resources /ng-rollout/r-a1/close_session session=" + rsid}
			if mode == "replay" {
				wantSeq = append([]string{"resources /ng-rollout/r-a1/verify session=" + rsid}, wantSeq...)
			}
			if got := freshRec.lines(); !slices.Equal(got, wantSeq) {
				t.Errorf("replacement requests:\n got %q\nwant %q", got, wantSeq)
			}

			// Without a crash, the original replies after the resume.
			c.resume("c1")
			openGate()
			if r := receive(t, "the /run reply", done); r.status != 200 || r.body != `{"episode_id":{"rollout_id":"r","attempt":0},"reward":1.0,"verified":true}` {
				t.Errorf("original /run after resume: %d %s", r.status, r.body)
			}
			if got := len(rs.verifyEntered); got != 0 {
				t.Errorf("verify ran again: %d", got)
			}
		})
	}
}

func TestLegacy_AdmissionAndTask(t *testing.T) {
	rec := &recorder{}
	model := newModel(t, rec, oneRound()...)
	model.block, model.entered, model.blockFrom = make(chan struct{}), make(chan struct{}, 4), 1
	defer close(model.block)
	old := startAgent(t, model, newResources(t, rec), rec, withCheckpoint)
	c := control{t, old.url}
	c.prepare("c0", 10)
	expectCode(t, "/run while closed", old.post("/run", nil, legacyRow(0, "paris")), 409, "admission_closed")
	c.resume("c0")
	if n := len(rec.all()); n != 0 {
		t.Fatalf("the refused /run did work: %q", rec.lines())
	}
	done := make(chan reply, 1)
	go func() { done <- old.post("/run", nil, legacyRow(0, "paris")) }()
	receive(t, "model call 1", model.entered)
	expectCode(t, "a duplicate of the running attempt", old.post("/run", nil, legacyRow(0, "paris")), 409, "episode_running")
	c.prepare("c1", 10)
	dir := t.TempDir()
	c.commit("c1", dir, "r")
	crash(old)
	receive(t, "the crashed /run", done)

	freshRec := &recorder{}
	fresh := startAgent(t, newModel(t, freshRec, oneRound()[1]), newResources(t, freshRec), freshRec, withCheckpoint)
	fctl := control{t, fresh.url}
	fctl.restore("c1", dir, "r")
	fctl.resume("c1")
	expectCode(t, "another task", fresh.post("/run", nil, legacyRow(1, "tokyo")), 409, "task_mismatch")
	if r := fresh.post("/run", nil, legacyRow(1, "paris")); r.status != 200 {
		t.Fatalf("the same task: %d %s", r.status, r.body)
	}
	if got := len(freshRec.of("model")); got != 1 {
		t.Errorf("model calls %d, want 1", got)
	}
}

func TestLegacy_RetireStopsRunAndClosesItsSession(t *testing.T) {
	rec := &recorder{}
	model := newModel(t, rec, oneRound()...)
	model.block, model.entered = make(chan struct{}), make(chan struct{}, 4)
	defer close(model.block)
	ta := startAgent(t, model, newResources(t, rec), rec, withCheckpoint)
	c := control{t, ta.url}
	done := make(chan reply, 1)
	go func() { done <- ta.post("/run", nil, legacyRow(0, "paris")) }()
	receive(t, "model call 0", model.entered)
	c.retire("r")
	// Retire replied after the run's cleanup closed its resources session.
	lines := rec.lines()
	if len(lines) == 0 || !strings.Contains(lines[len(lines)-1], "close_session") {
		t.Errorf("the retired run did not close its resources session: %q", lines)
	}
	if got := c.counts(); !slices.Contains(got, "legacy_runs=0") {
		t.Errorf("counts after retire: %v", got)
	}
	expectCode(t, "the retired /run", receive(t, "the /run reply", done), 409, "stale_attempt")
	expectCode(t, "/run of the retired attempt", ta.post("/run", nil, legacyRow(0, "paris")), 409, "stale_attempt")
}

func FuzzRecord(f *testing.F) {
	f.Add([]byte(`{"type":"agent_session","episode_id":{"rollout_id":"r","attempt":0},"session_id":"s","session":{"request":null,"resources_session_id":"rs","activations":1,"completed_activation":0,"completed_reply":null,"observations":{"activations":0,"steps":0,"model_calls":0,"tool_calls":0,"usage":null,"resources_session_id":"rs"}},"boundary":{"step":1,"pending_tools":true,"new_outputs":[],"usage":null,"last_model_response":null,"turns":[],"tool_records":[],"model_calls":1}}`))
	f.Add([]byte(`{"type":"legacy_run","episode_id":{"rollout_id":"r","attempt":0},"episode":{"episode_id":{"rollout_id":"r","attempt":0},"task_digest":"d","boundary":{"next":"return","resources_session_id":"rs","verify_mode":"wait","result":{"reward":1}}}}`))
	f.Add([]byte(`{"type":"legacy_run","episode_id":{"rollout_id":"r","attempt":0},"episode":{"episode_id":{"rollout_id":"r","attempt":0},"task_digest":"d","boundary":null}}`))
	f.Add([]byte(`{"type":"other"}`))
	f.Add([]byte(`[]`))
	id := rollout.EpisodeID{RolloutID: "r"}
	f.Fuzz(func(t *testing.T, data []byte) {
		_ = agent.ValidateRecord(id, data)
	})
}

func TestRecordValidation(t *testing.T) {
	id := rollout.EpisodeID{RolloutID: "r"}
	session := func(boundary, state string) string {
		return `{"type":"agent_session","episode_id":{"rollout_id":"r","attempt":0},"session_id":"s","session":` + state + `,"boundary":` + boundary + `}`
	}
	okState := `{"request":null,"resources_session_id":"rs","activations":1,"completed_activation":0,"completed_reply":null,"observations":{"activations":0,"steps":0,"model_calls":0,"tool_calls":0,"usage":null,"resources_session_id":"rs"}}`
	legacy := func(boundary string) string {
		return `{"type":"legacy_run","episode_id":{"rollout_id":"r","attempt":0},"episode":{"episode_id":{"rollout_id":"r","attempt":0},"task_digest":"d","boundary":` + boundary + `}}`
	}
	cases := []struct {
		name, data string
		ok         bool
	}{
		{"session without boundary", session("null", okState), true},
		{"session with a loop", session(`{"step":0}`, okState), true},
		{"pending tools without response", session(`{"pending_tools":true}`, okState), false},
		{"loop without an activation in progress", session(`{"step":0}`, strings.Replace(okState, `"activations":1`, `"activations":0`, 1)), false},
		{"completed without reply", session("null", strings.Replace(okState, `"completed_activation":0`, `"completed_activation":1`, 1)), false},
		{"bad resources session", session("null", strings.Replace(okState, `"rs"`, `"a b"`, 1)), false},
		{"unknown field", strings.Replace(session("null", okState), `"type"`, `"x":1,"type"`, 1), false},
		{"filed under another episode", strings.Replace(session("null", okState), `"attempt":0`, `"attempt":3`, 1), false},
		{"legacy at return", legacy(`{"next":"return","resources_session_id":"rs","verify_mode":"wait","result":{"reward":1}}`), true},
		{"legacy without boundary", legacy(`null`), true},
		{"legacy at loop", legacy(`{"next":"loop","resources_session_id":"rs","verify_mode":"replay","loop":{"step":1}}`), true},
		{"legacy unknown stage", legacy(`{"next":"dance","resources_session_id":"rs","verify_mode":"wait"}`), false},
		{"legacy verify without response", legacy(`{"next":"verify","resources_session_id":"rs","verify_mode":"wait"}`), false},
		{"legacy bad mode", legacy(`{"next":"seed","resources_session_id":"rs","verify_mode":"later"}`), false},
		{"legacy without digest", strings.Replace(legacy(`null`), `"task_digest":"d"`, `"task_digest":""`, 1), false},
		{"unknown type", `{"type":"model_call"}`, false},
		{"not an object", `[]`, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := agent.ValidateRecord(id, []byte(c.data))
			if (err == nil) != c.ok {
				t.Errorf("ValidateRecord = %v, want ok %v", err, c.ok)
			}
		})
	}
}

// A legacy run seeded on a restart-only resources server is a restart: it
// never blocks or parks, is reported, and cannot be in a commit's scope.
func TestLegacy_RestartOnlyResources(t *testing.T) {
	rec := &recorder{}
	model := newModel(t, rec, oneRound()...)
	model.block, model.entered = make(chan struct{}), make(chan struct{}, 4)
	rs := newResources(t, rec)
	rs.seedHeader = http.Header{agent.RestartHeader: {"1"}}
	ta := startAgent(t, model, rs, rec, withCheckpoint)
	c := control{t, ta.url}
	done := make(chan reply, 1)
	go func() { done <- ta.post("/run", nil, legacyRow(0, "paris")) }()
	receive(t, "model call 0", model.entered)
	rep := c.prepare("c1", 10)
	if rep["phase"] != "prepared" || jsonOf(rep["report"].(map[string]any)["restarts"]) != `["r"]` {
		t.Fatalf("prepare with a restart in flight: %v", rep)
	}
	st, m, err := c.call("commit", map[string]any{"checkpoint_id": "c1", "deadline_ts": deadline(30), "checkpoint_dir": t.TempDir(), "episode_ids": episodes(t, "r"), "stop": false})
	if err != nil || st != 409 || errorCode(jsonOf(m)) != "restart_in_scope" {
		t.Errorf("commit naming the restart: %d %v %v", st, m, err)
	}
	// A restart keeps running through the checkpoint.
	close(model.block)
	if r := receive(t, "the /run reply", done); r.status != 200 {
		t.Errorf("restart /run: %d %s", r.status, r.body)
	}
	c.resume("c1")
}

// Install checks a restored loop state's shape and leaves the rest of it to
// the activation that continues it: a state whose items cannot be decoded
// is accepted, fails that activation with invalid_checkpoint_state every
// time it is retried, calls nothing upstream, and is exported again as the
// checkpoint held it.
func TestCheckpoint_RestoredLoopThatCannotBeContinued(t *testing.T) {
	ta := newFixture(t, withCheckpoint)
	boundary := `{"step":0,"pending_tools":false,"new_outputs":[{"type":"message"}],"usage":"many"}`
	state := `{"request":null,"resources_session_id":"rs","activations":1,"completed_activation":0,"completed_reply":null,"observations":{"activations":0,"steps":0,"model_calls":0,"tool_calls":0,"usage":null,"resources_session_id":"rs"}}`
	data := `{"type":"agent_session","episode_id":{"rollout_id":"r","attempt":0},"session_id":"s","session":` + state + `,"boundary":` + boundary + `}`
	if err := agent.ValidateRecord(rollout.EpisodeID{RolloutID: "r"}, []byte(data)); err != nil {
		t.Fatalf("ValidateRecord refused a record of the right shape: %v", err)
	}
	p := agent.CheckpointParticipant(ta.srv)
	rec := ctlplane.Record{EpisodeID: rollout.EpisodeID{RolloutID: "r"}, Data: []byte(data)}
	installed, err := p.Install(context.Background(), []ctlplane.Record{rec}, ctlplane.NewScope([]rollout.EpisodeID{{RolloutID: "r"}}), ctlplane.Extras{})
	if err != nil || len(installed) != 1 || installed[0] != (rollout.EpisodeID{RolloutID: "r", Attempt: 1}) {
		t.Fatalf("Install = %v, %v", installed, err)
	}
	for try := range 2 {
		r := ta.activate("r-a1", "s", "1", weatherParams)
		if r.status != http.StatusUnprocessableEntity || !strings.Contains(r.body, `"invalid_checkpoint_state"`) {
			t.Fatalf("try %d: activation = %d %s, want 422 invalid_checkpoint_state", try, r.status, r.body)
		}
	}
	if got := ta.rec.lines(); len(got) != 0 {
		t.Errorf("a state that cannot be continued called upstream: %q", got)
	}
	var out []ctlplane.Record
	scope := ctlplane.NewScope([]rollout.EpisodeID{{RolloutID: "r", Attempt: 1}})
	if _, err := p.Export(context.Background(), scope, func(r ctlplane.Record) error {
		// emit must not keep Data: Export reuses its buffers.
		out = append(out, ctlplane.Record{EpisodeID: r.EpisodeID, Data: slices.Clone(r.Data)})
		return nil
	}); err != nil {
		t.Fatalf("Export: %v", err)
	}
	if len(out) != 1 {
		t.Fatalf("exported %d records", len(out))
	}
	var got struct{ Boundary json.RawMessage }
	if err := json.Unmarshal(out[0].Data, &got); err != nil || string(got.Boundary) != boundary {
		t.Errorf("re-exported boundary %s (%v), want the restored bytes %s", got.Boundary, err, boundary)
	}
}
