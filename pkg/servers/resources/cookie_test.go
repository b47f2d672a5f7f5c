package resources_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/servers/resources"
)

// gymCaller drives a resources server as NeMo Gym's simple agent does
// (responses_api_agents/simple_agent/app.py, Gym 07d6b0d07b22): no
// X-Ng-Session-Id, no cookie jar (its aiohttp client has DummyCookieJar);
// each call sends the cookies of the reply before it (`cookies =
// response.cookies`), plus whatever other cookies it carries along (the
// agent's own session cookie rides on /verify).
type gymCaller struct {
	t       *testing.T
	url     string
	cookies []*http.Cookie
	extra   []*http.Cookie
}

func (g *gymCaller) post(path, body string) reply {
	g.t.Helper()
	req, err := http.NewRequest(http.MethodPost, g.url+path, strings.NewReader(body))
	if err != nil {
		g.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for _, c := range append(append([]*http.Cookie(nil), g.cookies...), g.extra...) {
		req.AddCookie(c)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		g.t.Fatal(err)
	}
	g.cookies = resp.Cookies()
	return reply{status: resp.StatusCode, header: resp.Header, body: strings.TrimSpace(string(b))}
}

// gymCounterRow is the first row of Gym's
// resources_servers/example_session_state_mgmt/data/example.jsonl (commit
// 07d6b0d07b22), as rollout collection materializes it for /run (with
// _ng_task_index, _ng_rollout_index and agent_ref), which the simple agent
// sends whole to /seed_session.
const gymCounterRow = `{"responses_create_params": {"input": [{"content": "add 1 then add 2 then get the count", "role": "user"}], "tools": [{"name": "increment_counter", "parameters": {"type": "object", "properties": {"count": {"type": "integer", "description": ""}}, "required": ["count"], "additionalProperties": false}, "strict": true, "type": "function", "description": ""}, {"name": "get_counter_value", "parameters": {"type": "object", "properties": {}, "required": [], "additionalProperties": false}, "strict": true, "type": "function", "description": ""}]}, "expected_count": 6, "initial_count": 3, "_ng_task_index": 0, "_ng_rollout_index": 0, "agent_ref": {"type": "responses_api_agents", "name": "example_session_state_mgmt_simple_agent"}}`

// gymResponse is a NeMoGymResponse as the simple agent dumps it into its
// verify body (model_dump(): every declared field, unset ones null;
// nemo_gym/openai_utils.py at Gym 07d6b0d07b22), around output.
func gymResponse(output string) string {
	return `{"id": "resp_1", "created_at": 1735000000.0, "error": null, "incomplete_details": null, "instructions": null, "metadata": null, "model": "policy", "object": "response", "output": ` + output +
		`, "parallel_tool_calls": true, "temperature": null, "tool_choice": "auto", "tools": [{"name": "get_weather", "parameters": {"type": "object"}, "strict": true, "type": "function", "description": ""}], "top_p": null, "background": null, "conversation": null, "max_output_tokens": null, "max_tool_calls": null, "previous_response_id": null, "prompt": null, "prompt_cache_key": null, "reasoning": null, "safety_identifier": null, "service_tier": null, "status": "completed", "text": null, "top_logprobs": null, "truncation": null, "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": null}, "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": null}, "total_tokens": 15}, "user": null}`
}

// gymItems are output items as Gym dumps them, nulls included.
func gymItems(tool, args, toolOutput, text string) string {
	return `[{"id": "rs_1", "summary": [{"text": "thinking", "type": "summary_text"}], "type": "reasoning", "content": null, "encrypted_content": null, "status": null},` +
		` {"arguments": ` + args + `, "call_id": "call_1", "name": "` + tool + `", "type": "function_call", "id": "call_1", "status": "completed"},` +
		` {"call_id": "call_1", "output": ` + toolOutput + `, "type": "function_call_output", "id": null, "status": null},` +
		` {"id": "msg_1", "content": [{"annotations": [], "text": "` + text + `", "type": "output_text", "logprobs": null}], "role": "assistant", "status": "completed", "type": "message"}]`
}

// withResponse is row ∪ {"response": response}, the simple agent's verify body.
func withResponse(row, response string) string {
	return strings.TrimSuffix(strings.TrimSpace(row), "}") + `, "response": ` + response + `}`
}

// TestGymCaller_Counter: Gym's whole sequence against our counter, in Gym's
// tool shapes, carried by the cookie alone, reaches reward 1.0.
func TestGymCaller_Counter(t *testing.T) {
	ts := start(t, resources.TypeCounter)
	g := &gymCaller{t: t, url: ts.url}
	seed := g.post("/seed_session", gymCounterRow)
	expect(t, "seed", seed, 200, `{}`)
	if len(g.cookies) != 1 || g.cookies[0].Name != "CounterResourcesServer___counter" {
		t.Fatalf("seed set cookies %v, want one named CounterResourcesServer___counter", g.cookies)
	}
	c := g.cookies[0]
	if c.Value != seed.header.Get(resources.SessionHeader) || c.Path != "/" || !c.HttpOnly || c.SameSite != http.SameSiteLaxMode {
		t.Fatalf("seed cookie %+v: want the session id %q, path /, HttpOnly, SameSite=Lax", c, seed.header.Get(resources.SessionHeader))
	}
	expect(t, "increment_counter 1", g.post("/increment_counter", `{"count": 1}`), 200, `{"success":true}`)
	expect(t, "increment_counter 2", g.post("/increment_counter", `{"count": 2}`), 200, `{"success":true}`)
	expect(t, "get_counter_value", g.post("/get_counter_value", `{}`), 200, `{"count":6}`)
	// A tool error keeps the session too: the next call carries only the
	// cookies of this reply.
	expectCode(t, "a bad tool call", g.post("/increment_counter", `{"count": "x"}`), 400, "invalid_request")
	expectCode(t, "an unknown tool", g.post("/nope", `{}`), 404, "unknown_tool")
	expect(t, "after the errors", g.post("/get_counter_value", `{}`), 200, `{"count":6}`)
	// The agent's own session cookie rides along on /verify (its
	// /v1/responses reply set it); it names nothing here.
	g.extra = []*http.Cookie{{Name: "SimpleAgent___example_session_state_mgmt_simple_agent", Value: "eyJzZXNzaW9uX2lkIjogIngifQ==.aB9x.Zk"}}
	got := g.post("/verify", withResponse(gymCounterRow, gymResponse(gymItems("get_counter_value", `"{}"`, `"{\"count\":6}"`, "The count is 6."))))
	if got.status != 200 || !strings.Contains(got.body, `"reward":1.0`) {
		t.Fatalf("verify = %d %s, want reward 1.0", got.status, got.body)
	}
	if len(g.cookies) != 1 || g.cookies[0].Value != c.Value {
		t.Fatalf("verify reply set cookies %v, want the session's", g.cookies)
	}
	// Our own shape keeps working in the same session.
	expect(t, "increment", g.post("/increment", `{"by": 1}`), 200, `{"count":7}`)
}

// TestGymCaller_Weather: the same sequence against weather.
func TestGymCaller_Weather(t *testing.T) {
	ts := start(t, resources.TypeWeather)
	g := &gymCaller{t: t, url: ts.url}
	row := `{"responses_create_params": {"input": [{"role": "user", "content": "What is the weather in Paris?"}]}, "_ng_task_index": 0, "_ng_rollout_index": 0}`
	expect(t, "seed", g.post("/seed_session", row), 200, `{}`)
	if len(g.cookies) != 1 || g.cookies[0].Name != "WeatherResourcesServer___weather" {
		t.Fatalf("seed set cookies %v", g.cookies)
	}
	expect(t, "get_weather", g.post("/get_weather", `{"city": "Paris"}`), 200, `{"city":"Paris","weather_description":"The weather in Paris is cold."}`)
	got := g.post("/verify", withResponse(row, gymResponse(gymItems("get_weather", `"{\"city\": \"Paris\"}"`,
		`"{\"city\":\"Paris\",\"weather_description\":\"The weather in Paris is cold.\"}"`, "The weather in Paris is cold."))))
	if got.status != 200 || !strings.Contains(got.body, `"reward":1.0`) {
		t.Fatalf("verify = %d %s, want reward 1.0", got.status, got.body)
	}
}

func TestSessionCookie_Rules(t *testing.T) {
	ts := start(t, resources.TypeCounter)
	name := ts.srv.CookieName()
	withCookie := func(path, header, cookie, body string) reply {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, ts.url+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if header != "" {
			req.Header.Set(resources.SessionHeader, header)
		}
		if cookie != "" {
			req.Header.Set("Cookie", cookie)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return reply{status: resp.StatusCode, header: resp.Header, body: strings.TrimSpace(string(b))}
	}
	expect(t, "seed h1 by header", ts.post("/seed_session", "h1", `{"initial_count":1}`), 200, `{}`)
	expect(t, "seed c1 by cookie", withCookie("/seed_session", "", name+"=c1", `{"initial_count":10}`), 200, `{}`)
	// The cookie names the same sessions the header does.
	expect(t, "header session by cookie", withCookie("/get_counter_value", "", name+"=h1", `{}`), 200, `{"count":1}`)
	expect(t, "cookie session by header", ts.post("/get_counter_value", "c1", `{}`), 200, `{"count":10}`)
	// The header wins over the cookie.
	expect(t, "both", withCookie("/get_counter_value", "h1", name+"=c1", `{}`), 200, `{"count":1}`)
	// Another server's cookie names nothing here.
	expectCode(t, "another server's cookie", withCookie("/get_counter_value", "", "WeatherResourcesServer___weather=c1", `{}`), 404, "unknown_session")
	// A cookie is checked as the header is.
	for _, bad := range []string{"-x", "a%2Fb", strings.Repeat("a", 200)} {
		expectCode(t, "cookie "+bad, withCookie("/get_counter_value", "", name+"="+bad, `{}`), 400, "invalid_request")
	}
	// Neither: a tool of a stateful server refuses (Gym would start a
	// session no later call could name); a verify scores the unknown
	// session 0.0 as Gym's does; a seed starts a new session.
	expectCode(t, "tool without session", ts.post("/increment_counter", "", `{"count":1}`), 404, "unknown_session")
	expect(t, "verify without session", ts.post("/verify", "", `{"responses_create_params":{},"response":{"output":[]},"expected_count":0}`), 200,
		`{"expected_count":0,"response":{"output":[]},"responses_create_params":{},"reward":0.0}`)
	seed := ts.post("/seed_session", "", `{}`)
	id := seed.header.Get(resources.SessionHeader)
	if !generatedID.MatchString(id) || !strings.Contains(seed.header.Get("Set-Cookie"), name+"="+id) {
		t.Fatalf("seed without session: header %q, Set-Cookie %q", id, seed.header.Get("Set-Cookie"))
	}
	// Tool and verify replies set the cookie again; close deletes it.
	if sc := withCookie("/increment_counter", "", name+"=c1", `{"count":1}`).header.Get("Set-Cookie"); !strings.HasPrefix(sc, name+"=c1;") {
		t.Fatalf("tool reply Set-Cookie %q", sc)
	}
	closed := withCookie("/close_session", "", name+"=c1", ``)
	expect(t, "close by cookie", closed, 200, `{"closed":true}`)
	if sc := closed.header.Get("Set-Cookie"); !strings.HasPrefix(sc, name+"=;") || !strings.Contains(sc, "Max-Age=0") {
		t.Fatalf("close reply Set-Cookie %q, want the cookie deleted", sc)
	}
	expectCode(t, "after close", withCookie("/get_counter_value", "", name+"=c1", `{}`), 404, "unknown_session")
}

// TestSessionCookie_AttemptFence: a cookie reaches a rollout's session no
// further than the header does: another attempt is refused the same way.
func TestSessionCookie_AttemptFence(t *testing.T) {
	ts := start(t, resources.TypeCounter)
	g := &gymCaller{t: t, url: ts.url}
	expect(t, "seed as r-a1", g.post("/ng-rollout/r-a1/seed_session", `{"initial_count":1}`), 200, `{}`)
	expectCode(t, "cookie under another rollout", g.post("/ng-rollout/q/increment_counter", `{"count":1}`), 409, "stale_attempt")
	g.cookies = nil
	expect(t, "seed again", g.post("/ng-rollout/r-a1/seed_session", `{"initial_count":1}`), 200, `{}`)
	expectCode(t, "cookie under an earlier attempt", g.post("/ng-rollout/r/increment_counter", `{"count":1}`), 409, "stale_attempt")
}

func TestReverifyMode(t *testing.T) {
	for typ, want := range map[string]string{
		resources.TypeWeather:    `"stateless"`,
		resources.TypeSlowVerify: `"stateless"`,
		resources.TypeCounter:    `"unsupported"`,
	} {
		ts := start(t, typ)
		expect(t, typ+" GET /reverify_mode", ts.do(http.MethodGet, "/reverify_mode", "", ""), 200, want)
		// NeMo Gym's liveness route, which its start-up polls.
		expect(t, typ+" GET /", ts.do(http.MethodGet, "/", "", ""), 200, `{"status":"ok"}`)
	}
}

// TestTrainingTokenCaptureSegment: Gym's capture segment after the key
// routes as the plain prefix and binds the session to the episode.
func TestTrainingTokenCaptureSegment(t *testing.T) {
	ts := start(t, resources.TypeCounter)
	expect(t, "seed", ts.post("/ng-rollout/r-a1/training-token-capture/seed_session", "s1", `{"initial_count":2}`), 200, `{}`)
	expect(t, "increment", ts.post("/ng-rollout/r-a1/increment_counter", "s1", `{"count":1}`), 200, `{"success":true}`)
	expectCode(t, "another attempt", ts.post("/ng-rollout/r-a2/training-token-capture/get_counter_value", "s1", `{}`), 409, "stale_attempt")
	expect(t, "get", ts.post("/ng-rollout/r-a1/training-token-capture/get_counter_value", "s1", `{}`), 200, `{"count":3}`)
}

func TestCounter_GymShapes(t *testing.T) {
	ts := start(t, resources.TypeCounter)
	ts.post("/seed_session", "s1", `{"initial_count":3}`)
	for name, body := range map[string]string{
		"count missing":    `{}`,
		"count fractional": `{"count":1.5}`,
		"count a string":   `{"count":"1"}`,
		"by, not count":    `{"by":1}`,
	} {
		expectCode(t, name, ts.post("/increment_counter", "s1", body), 400, "invalid_request")
	}
	expect(t, "negative", ts.post("/increment_counter", "s1", `{"count":-1}`), 200, `{"success":true}`)
	expect(t, "get", ts.post("/get_counter_value", "s1", ``), 200, `{"count":2}`)
	expectCode(t, "overflow", ts.post("/increment_counter", "s1", `{"count":9223372036854775807}`), 400, "invalid_request")
}

// TestSessionCookie_CheckpointRestore: a session a Gym caller holds by
// cookie alone checkpoints and restores as a header session does (the
// cookie is the session id): the next attempt, in a fresh process, reaches
// it with the same cookie and scores 1.0.
func TestSessionCookie_CheckpointRestore(t *testing.T) {
	src := checkpointed(t, resources.TypeCounter, "", "")
	g := &gymCaller{t: t, url: src.url}
	expect(t, "seed", g.post("/ng-rollout/3-0/seed_session", gymCounterRow), 200, `{}`)
	expect(t, "increment_counter", g.post("/ng-rollout/3-0/increment_counter", `{"count": 1}`), 200, `{"success":true}`)
	id := g.cookies[0].Value
	src.mustCtl("prepare", ckptReq("c1"))
	dir := t.TempDir()
	src.mustCtl("commit", scopeReq("c1", dir, episodes("3-0")...))
	want := `{"episode_id":{"rollout_id":"3-0","attempt":0},"session_id":"` + id + `","state":{"count":4}}`
	if got := records(t, dir, "counter", "c1"); len(got) != 1 || got[0] != want {
		t.Fatalf("records = %v, want [%s]", got, want)
	}
	src.mustCtl("resume", ckptReq("c1"))

	dst := checkpointed(t, resources.TypeCounter, "", "")
	dst.mustCtl("restore", scopeReq("c1", dir, episodes("3-0")...))
	dst.mustCtl("resume", ckptReq("c1"))
	g.url = dst.url
	expect(t, "re-seed by cookie as the next attempt", g.post("/ng-rollout/3-0-a1/seed_session", gymCounterRow), 200, `{}`)
	if g.cookies[0].Value != id {
		t.Fatalf("re-seed cookie %q, want the restored session %q", g.cookies[0].Value, id)
	}
	expect(t, "increment_counter", g.post("/ng-rollout/3-0-a1/increment_counter", `{"count": 2}`), 200, `{"success":true}`)
	got := g.post("/ng-rollout/3-0-a1/verify", withResponse(gymCounterRow, `{"id": "resp_1", "object": "response", "output": []}`))
	if got.status != 200 || !strings.Contains(got.body, `"reward":1.0`) {
		t.Fatalf("verify = %d %s, want reward 1.0", got.status, got.body)
	}
	expectCode(t, "the checkpointed attempt's cookie", g.post("/ng-rollout/3-0/get_counter_value", `{}`), 409, "stale_attempt")
}
