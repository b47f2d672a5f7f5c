package agent_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/tests/gymstandin"
)

// gymCookieName is the session cookie of Gym's counter stand-in.
const gymCookieName = gymstandin.CounterCookie

// newGymCounter serves NeMo Gym's counter stand-in (a cookie-only resources
// server, tests/gymstandin) over h2c like the agent's other stand-ins, and
// returns it with its URL.
func newGymCounter(t *testing.T) (*gymstandin.Counter, string) {
	gym := gymstandin.NewCounter(gymstandin.CounterOptions{})
	return gym, newH2C(t, gym).URL
}

// gymCounterParams is the responses_create_params of the first row of Gym's
// resources_servers/example_session_state_mgmt/data/example.jsonl (commit
// 07d6b0d07b22).
const gymCounterParams = `{"input": [{"content": "add 1 then add 2 then get the count", "role": "user"}], "tools": [{"name": "increment_counter", "parameters": {"type": "object", "properties": {"count": {"type": "integer", "description": ""}}, "required": ["count"], "additionalProperties": false}, "strict": true, "type": "function", "description": ""}, {"name": "get_counter_value", "parameters": {"type": "object", "properties": {}, "required": [], "additionalProperties": false}, "strict": true, "type": "function", "description": ""}]}`

// gymCounterRow is that row with the ids rollout collection adds.
const gymCounterRow = `{"responses_create_params": ` + gymCounterParams + `, "expected_count": 6, "initial_count": 3, "_ng_task_index": 0, "_ng_rollout_index": 0}`

// gymCounterReplies is a policy solving that row: add 1, add 2, read, answer.
func gymCounterReplies() []string {
	return []string{
		resp("resp_1", usage(10, 5, "0"), fc("c1", "increment_counter", `{"count": 1}`)),
		resp("resp_2", usage(10, 5, "0"), fc("c2", "increment_counter", `{"count": 2}`)),
		resp("resp_3", usage(10, 5, "0"), fc("c3", "get_counter_value", `{}`)),
		resp("resp_4", usage(10, 5, "0"), msg("The count is 6.")),
	}
}

// TestGymCounter_LegacyRun: our legacy /run drives a cookie-only resources
// server: the seed's cookie goes on every tool call, the verify and the
// close, which it does not have (404, and the run still succeeds).
func TestGymCounter_LegacyRun(t *testing.T) {
	rec := &recorder{}
	gym, gymURL := newGymCounter(t)
	ta := startAgent(t, newModel(t, rec, gymCounterReplies()...), &resourcesStandIn{url: gymURL}, rec)
	r := ta.post("/run", nil, gymCounterRow)
	if r.status != 200 || !strings.Contains(r.body, `"reward":1.0`) {
		t.Fatalf("run: %d %s", r.status, r.body)
	}
	want := []string{
		"/seed_session session=new",
		"/increment_counter session=s1",
		"/increment_counter session=s1",
		"/get_counter_value session=s1",
		"/verify session=s1",
		"/close_session session=s1",
	}
	if got := gym.Requests(); !slices.Equal(got, want) {
		t.Errorf("resources requests:\n got %q\nwant %q", got, want)
	}
	if got := field(t, field(t, r.body, "response"), "output"); !strings.Contains(got, `"output":"{\"count\":6}"`) {
		t.Errorf("the model did not see the count 6: %s", got)
	}
}

// TestGymCounter_SessionCookies: an agent session opened with the cookies
// of a seed sends them on every tool call; malformed or oversized cookies
// are refused at the open.
func TestGymCounter_SessionCookies(t *testing.T) {
	rec := &recorder{}
	gym, gymURL := newGymCounter(t)
	ta := startAgent(t, newModel(t, rec, gymCounterReplies()...), &resourcesStandIn{url: gymURL}, rec)
	cookie := gymCookieName + "=s7.1"
	open := func(sid, cookies string) reply {
		b, _ := json.Marshal(map[string]any{"session_id": sid, "resources_session_id": "rs", "resources_cookies": cookies, "request": json.RawMessage(gymCounterRow)})
		return ta.post("/ng-rollout/0-0/v1/agent_sessions", nil, string(b))
	}
	if r := open("a", cookie); r.status != 200 {
		t.Fatalf("open: %d %s", r.status, r.body)
	}
	gym.SetCount("s7", 3)
	if r := ta.activate("0-0", "a", "1", gymCounterParams); r.status != 200 {
		t.Fatalf("activate: %d %s", r.status, r.body)
	}
	if n, _ := gym.Count("s7"); n != 6 {
		t.Errorf("counter = %d, want 6; requests %q", n, gym.Requests())
	}
	for _, l := range gym.Requests() {
		if !strings.HasSuffix(l, "session=s7") {
			t.Errorf("a tool call outside the session: %q", l)
		}
	}
	expectCode(t, "malformed cookies", open("b", "a=1; ;;b"), 400, "invalid_request")
	expectCode(t, "oversized cookies", open("c", "a="+strings.Repeat("x", 5000)), 400, "invalid_request")
}

// TestGymCounter_StatelessForwardsCookies: a /v1/responses without an
// agent session sends the caller's cookies to the tools, as Gym's
// /v1/responses does with request.cookies.
func TestGymCounter_StatelessForwardsCookies(t *testing.T) {
	rec := &recorder{}
	gym, gymURL := newGymCounter(t)
	ta := startAgent(t, newModel(t, rec, gymCounterReplies()...), &resourcesStandIn{url: gymURL}, rec)
	gym.SetCount("s9", 3)
	r := ta.post("/ng-rollout/0-0/v1/responses", map[string]string{"Cookie": gymCookieName + "=s9.1; SimpleAgent___x=y"}, gymCounterParams)
	if r.status != 200 {
		t.Fatalf("stateless: %d %s", r.status, r.body)
	}
	if n, _ := gym.Count("s9"); n != 6 {
		t.Errorf("counter = %d, want 6; requests %q", n, gym.Requests())
	}
	// Unprefixed, as Gym's own /run calls it without capture: the loop's
	// calls carry no prefix either, and the reply sets the cookies again
	// (Gym's /run verifies with the cookies of this reply alone).
	gym.SetCount("s10", 3)
	model := ta.model
	model.mu.Lock()
	model.replies, model.calls = gymCounterReplies(), 0
	model.mu.Unlock()
	r = ta.post("/v1/responses", map[string]string{"Cookie": gymCookieName + "=s10.1"}, gymCounterParams)
	if r.status != 200 {
		t.Fatalf("stateless unprefixed: %d %s", r.status, r.body)
	}
	if n, _ := gym.Count("s10"); n != 6 {
		t.Errorf("counter = %d, want 6; requests %q", n, gym.Requests())
	}
	if sc := r.header.Get("Set-Cookie"); !strings.HasPrefix(sc, gymCookieName+"=s10.1") {
		t.Errorf("reply Set-Cookie %q, want the resources cookie again", sc)
	}
	for _, s := range rec.of("model")[4:] {
		if s.path != "/v1/responses" {
			t.Errorf("an unprefixed loop called the model at %s", s.path)
		}
	}
}

// TestGymCounter_RestoredSessionKeepsCookies: the cookies are part of the
// agent session's record: a session checkpointed while its model call was
// held continues, restored in a fresh process, in the same cookie session.
func TestGymCounter_RestoredSessionKeepsCookies(t *testing.T) {
	rec := &recorder{}
	gym, gymURL := newGymCounter(t)
	replies := gymCounterReplies()
	model := newModel(t, rec, replies...)
	model.block, model.entered, model.blockFrom = make(chan struct{}), make(chan struct{}, 4), 1
	defer close(model.block)
	old := startAgent(t, model, &resourcesStandIn{url: gymURL}, rec, withCheckpoint)
	c := control{t, old.url}
	cookie := gymCookieName + "=s5.1"
	gym.SetCount("s5", 3)
	b, _ := json.Marshal(map[string]any{"session_id": "a", "resources_session_id": "rs", "resources_cookies": cookie, "request": json.RawMessage(gymCounterRow)})
	if r := old.post("/ng-rollout/0-0/v1/agent_sessions", nil, string(b)); r.status != 200 {
		t.Fatalf("open: %d %s", r.status, r.body)
	}
	done := make(chan reply, 1)
	go func() { done <- old.activate("0-0", "a", "1", gymCounterParams) }()
	receive(t, "model call 1", model.entered)
	if rep := c.prepare("c1", 10); rep["phase"] != "prepared" {
		t.Fatalf("prepare while call 1 is held: %v", rep)
	}
	dir := t.TempDir()
	c.commit("c1", dir, "0-0")
	recs := records(t, dir, "c1")
	if len(recs) != 1 || field(t, string(recs[0]["session"]), "resources_cookies") != `"`+cookie+`"` {
		t.Fatalf("records: %v", recs)
	}
	crash(old)
	receive(t, "the crashed activation", done)

	freshRec := &recorder{}
	fresh := startAgent(t, newModel(t, freshRec, replies[1:]...), &resourcesStandIn{url: gymURL}, freshRec, withCheckpoint)
	fc := control{t, fresh.url}
	fc.restore("c1", dir, "0-0")
	fc.resume("c1")
	if r := fresh.activate("0-0-a1", "a", "1", gymCounterParams); r.status != 200 {
		t.Fatalf("continued activation: %d %s", r.status, r.body)
	}
	if n, _ := gym.Count("s5"); n != 6 {
		t.Errorf("counter = %d, want 6; requests %q", n, gym.Requests())
	}
	for _, l := range gym.Requests() {
		if !strings.HasSuffix(l, "session=s5") {
			t.Errorf("a tool call outside the session: %q", l)
		}
	}
}

// TestGymCounter_LegacyRestoreKeepsCookies: a legacy /run's boundary keeps
// the seed's cookies: the replacement attempt, restored in a fresh process
// at its loop boundary, finishes and verifies in the same cookie session.
func TestGymCounter_LegacyRestoreKeepsCookies(t *testing.T) {
	rec := &recorder{}
	gym, gymURL := newGymCounter(t)
	replies := gymCounterReplies()
	model := newModel(t, rec, replies...)
	model.block, model.entered, model.blockFrom = make(chan struct{}), make(chan struct{}, 4), 1
	defer close(model.block)
	old := startAgent(t, model, &resourcesStandIn{url: gymURL}, rec, withCheckpoint)
	c := control{t, old.url}
	done := make(chan reply, 1)
	go func() { done <- old.post("/run", nil, gymCounterRow) }()
	receive(t, "model call 1", model.entered)
	if rep := c.prepare("c1", 10); rep["phase"] != "prepared" {
		t.Fatalf("prepare while call 1 is held: %v", rep)
	}
	dir := t.TempDir()
	c.commit("c1", dir, "0-0")
	recs := records(t, dir, "c1")
	if len(recs) != 1 {
		t.Fatalf("records: %v", recs)
	}
	b := field(t, string(recs[0]["episode"]), "boundary")
	if got := field(t, b, "resources_cookies"); !strings.HasPrefix(got, `"`+gymCookieName+`=s1.`) {
		t.Fatalf("boundary cookies %s: %s", got, b)
	}
	crash(old)
	receive(t, "the crashed /run", done)

	freshRec := &recorder{}
	fresh := startAgent(t, newModel(t, freshRec, replies[1:]...), &resourcesStandIn{url: gymURL}, freshRec, withCheckpoint)
	fc := control{t, fresh.url}
	fc.restore("c1", dir, "0-0")
	fc.resume("c1")
	row := strings.TrimSuffix(gymCounterRow, "}") + `, "_ng_attempt_index": 1}`
	r := fresh.post("/run", nil, row)
	if r.status != 200 || !strings.Contains(r.body, `"reward":1.0`) {
		t.Fatalf("replacement /run: %d %s", r.status, r.body)
	}
	for _, l := range gym.Requests() {
		if !strings.HasSuffix(l, "session=s1") && l != "/seed_session session=new" {
			t.Errorf("a call outside the session: %q (all %q)", l, gym.Requests())
		}
	}
}
