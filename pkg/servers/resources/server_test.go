package resources_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/servers/resources"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testServer is a resources server listening on a loopback port.
type testServer struct {
	t   *testing.T
	srv *resources.Server
	url string
}

func start(t *testing.T, typ string, mutate ...func(*resources.Config)) *testServer {
	t.Helper()
	cfg := resources.DefaultConfig()
	cfg.Name, cfg.Type = typ, typ
	for _, m := range mutate {
		m(&cfg)
	}
	srv, err := resources.New(cfg, resources.Deps{})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatalf("Listen: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		http.DefaultClient.CloseIdleConnections()
	})
	return &testServer{t: t, srv: srv, url: srv.URL()}
}

type reply struct {
	status int
	header http.Header
	body   string
}

// post sends body to path with the session header (if not empty).
func (ts *testServer) post(path, session, body string) reply {
	ts.t.Helper()
	return ts.do(http.MethodPost, path, session, body)
}

func (ts *testServer) do(method, path, session, body string) reply {
	ts.t.Helper()
	// Errors are replies with status -1, not t.Fatal: some calls run on
	// goroutines other than the test's.
	req, err := http.NewRequest(method, ts.url+path, strings.NewReader(body))
	if err != nil {
		return reply{status: -1, body: err.Error()}
	}
	if session != "" {
		req.Header.Set(resources.SessionHeader, session)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{status: -1, body: err.Error()}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{status: -1, body: err.Error()}
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: strings.TrimSpace(string(b))}
}

func expect(t *testing.T, what string, got reply, status int, body string) {
	t.Helper()
	if got.status != status || got.body != body {
		t.Errorf("%s: got %d %s\nwant %d %s", what, got.status, got.body, status, body)
	}
}

func expectCode(t *testing.T, what string, got reply, status int, code string) {
	t.Helper()
	if got.status != status || !strings.Contains(got.body, `"code":"`+code+`"`) {
		t.Errorf("%s: got %d %s, want %d with code %s", what, got.status, got.body, status, code)
	}
}

func TestWeather_GetWeather(t *testing.T) {
	ts := start(t, resources.TypeWeather)
	cases := []struct {
		name, session, body string
		status              int
		want                string
	}{
		{"paris", "", `{"city":"Paris"}`, 200, `{"city":"Paris","weather_description":"The weather in Paris is cold."}`},
		{"tokyo with unknown session", "s-unknown", `{"city":"Tokyo"}`, 200, `{"city":"Tokyo","weather_description":"The weather in Tokyo is sunny."}`},
		{"space in name", "", `{"city":"San Francisco","extra":1}`, 200, `{"city":"San Francisco","weather_description":"The weather in San Francisco is cloudy."}`},
		{"missing city", "", `{}`, 400, ""},
		{"city not a string", "", `{"city":3}`, 400, ""},
		{"not an object", "", `["Paris"]`, 400, ""},
		{"malformed", "", `{"city":`, 400, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := ts.post("/get_weather", c.session, c.body)
			if c.status != 200 {
				expectCode(t, "get_weather", got, c.status, "invalid_request")
				return
			}
			expect(t, "get_weather", got, c.status, c.want)
		})
	}
	// Deterministic: the same city gives the same weather every time.
	if a, b := ts.post("/get_weather", "", `{"city":"Berlin"}`), ts.post("/get_weather", "", `{"city":"Berlin"}`); a.body != b.body {
		t.Errorf("get_weather not deterministic: %s vs %s", a.body, b.body)
	}
}

func TestUnknownTool(t *testing.T) {
	ts := start(t, resources.TypeCounter)
	expectCode(t, "unknown tool", ts.post("/get_weather", "", `{"city":"Paris"}`), 404, "unknown_tool")
	expectCode(t, "unknown tool under prefix", ts.post("/ng-rollout/r1/nope", "", `{}`), 404, "unknown_tool")
}

func TestTools(t *testing.T) {
	ts := start(t, resources.TypeCounter)
	expect(t, "GET /tools", ts.do(http.MethodGet, "/tools", "", ""), 200,
		`[{"name":"increment","description":"Add an integer to the counter and return the new count.","parameters":{"type":"object","properties":{"by":{"type":"integer","description":"How much to add."}},"required":["by"],"additionalProperties":false}},`+
			`{"name":"increment_counter","description":"Add an integer to the counter.","parameters":{"type":"object","properties":{"count":{"type":"integer","description":""}},"required":["count"],"additionalProperties":false}},`+
			`{"name":"get_counter_value","description":"Return the counter's current value.","parameters":{"type":"object","properties":{},"additionalProperties":false}}]`)
}

// weatherOutput is a Responses output with one get_weather round and a final message.
func weatherOutput(finalText string) string {
	return `[{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},` +
		`{"type":"function_call_output","call_id":"c1","output":"{\"city\":\"Paris\",\"weather_description\":\"The weather in Paris is cold.\"}"},` +
		`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"` + finalText + `","annotations":[]}]}]`
}

func TestWeather_Verify(t *testing.T) {
	ts := start(t, resources.TypeWeather)
	params := `{"input":"What is the weather in Paris?"}`
	cases := []struct {
		name   string
		output string
		reward string
	}{
		{"quotes the description", weatherOutput("Sure. The weather in Paris is cold. Wrap up."), "1.0"},
		{"does not quote it", weatherOutput("It is warm."), "0.0"},
		{"no tool call", `[{"type":"message","role":"assistant","content":"The weather in Paris is cold."}]`, "0.0"},
		{"output of another tool", strings.ReplaceAll(weatherOutput("The weather in Paris is cold."), `"name":"get_weather"`, `"name":"other"`), "0.0"},
		{"quote in an earlier message only", `[` + strings.TrimSuffix(strings.TrimPrefix(weatherOutput("The weather in Paris is cold."), "["), "]") +
			`,{"type":"message","role":"assistant","content":"Bye."}]`, "0.0"},
		{"empty output", `[]`, "0.0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			response := `{"id":"resp_1","object":"response","output":` + c.output + `}`
			body := `{"responses_create_params":` + params + `,"response":` + response + `,"task":"weather","_ng_task_index":0}`
			got := ts.post("/verify", "", body)
			// Every field of the body comes back; reward is added.
			want := `{"_ng_task_index":0,"response":` + compact(t, response) + `,"responses_create_params":` + params + `,"reward":` + c.reward + `,"task":"weather"}`
			expect(t, "verify", got, 200, want)
		})
	}
}

func compact(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestVerify_BadBodies(t *testing.T) {
	ts := start(t, resources.TypeWeather)
	for name, body := range map[string]string{
		"empty":                  ``,
		"array":                  `[]`,
		"no response":            `{"responses_create_params":{}}`,
		"no params":              `{"response":{"output":[]}}`,
		"response not an object": `{"responses_create_params":{},"response":"x"}`,
		"bad output item":        `{"responses_create_params":{},"response":{"output":[{"content":"no type or role"}]}}`,
	} {
		t.Run(name, func(t *testing.T) {
			expectCode(t, "verify", ts.post("/verify", "", body), 400, "invalid_request")
		})
	}
}

var generatedID = regexp.MustCompile(`^resources-session-[0-9a-f]{32}$`)

func TestSeed_SessionHeader(t *testing.T) {
	ts := start(t, resources.TypeCounter)
	got := ts.post("/seed_session", "", `{"initial_count":2}`)
	expect(t, "seed without header", got, 200, `{}`)
	id := got.header.Get(resources.SessionHeader)
	if !generatedID.MatchString(id) {
		t.Fatalf("generated session id %q does not match %s", id, generatedID)
	}
	expect(t, "the generated session counts", ts.post("/get_counter_value", id, `{}`), 200, `{"count":2}`)

	got = ts.post("/seed_session", "mine-1", `{"initial_count":5}`)
	expect(t, "seed with header", got, 200, `{}`)
	if h := got.header.Get(resources.SessionHeader); h != "mine-1" {
		t.Errorf("seed reply header = %q, want the caller's id", h)
	}
	if another := ts.post("/seed_session", "", `{}`).header.Get(resources.SessionHeader); another == id {
		t.Errorf("two seeds without header got the same id %q", id)
	}
	expectCode(t, "invalid session id", ts.post("/seed_session", "bad id!", `{}`), 400, "invalid_request")
	// Checkpointing is off: no checkpoint headers.
	if v := got.header.Get(resources.VerifyModeHeader); v != "" {
		t.Errorf("checkpointing off, but seed announced verify mode %q", v)
	}
}

func TestSeed_CheckpointHeaders(t *testing.T) {
	on := func(mode string) func(*resources.Config) {
		return func(c *resources.Config) {
			c.Checkpoint = ctlplane.Config{Enabled: true, ControlAuthToken: "t", LeaseGraceSeconds: 600, Root: os.TempDir()}
			c.CheckpointMode = mode
		}
	}
	cases := []struct {
		typ, mode, verify, restart string
	}{
		{resources.TypeWeather, "", "replay", ""},
		{resources.TypeCounter, "", "replay", ""},
		{resources.TypeSlowVerify, "", "wait", ""},
		{resources.TypeCounter, resources.ModeRestartOnly, "replay", "1"},
	}
	for _, c := range cases {
		t.Run(c.typ+"/"+c.mode, func(t *testing.T) {
			ts := start(t, c.typ, on(c.mode))
			got := ts.post("/seed_session", "s1", `{}`)
			if v, r := got.header.Get(resources.VerifyModeHeader), got.header.Get(resources.RestartHeader); v != c.verify || r != c.restart {
				t.Errorf("seed headers verify=%q restart=%q, want %q %q", v, r, c.verify, c.restart)
			}
		})
	}
}

func TestCounter(t *testing.T) {
	ts := start(t, resources.TypeCounter)
	expect(t, "seed", ts.post("/seed_session", "s1", `{"initial_count":3,"expected_count":6,"responses_create_params":{"input":"x"}}`), 200, `{}`)
	expect(t, "increment 1", ts.post("/increment", "s1", `{"by":1}`), 200, `{"count":4}`)
	expect(t, "increment 2", ts.post("/increment", "s1", `{"by":2}`), 200, `{"count":6}`)
	expect(t, "get", ts.post("/get_counter_value", "s1", `{}`), 200, `{"count":6}`)
	expect(t, "get with empty body", ts.post("/get_counter_value", "s1", ``), 200, `{"count":6}`)
	// Re-seeding keeps the count (NeMo Gym's setdefault).
	expect(t, "re-seed", ts.post("/seed_session", "s1", `{"initial_count":0}`), 200, `{}`)
	expect(t, "count after re-seed", ts.post("/get_counter_value", "s1", `{}`), 200, `{"count":6}`)
	// Sessions are independent; the default initial count is 0.
	expect(t, "seed s2", ts.post("/seed_session", "s2", `{}`), 200, `{}`)
	expect(t, "increment s2", ts.post("/increment", "s2", `{"by":-2}`), 200, `{"count":-2}`)
	expect(t, "s1 unchanged", ts.post("/get_counter_value", "s1", `{}`), 200, `{"count":6}`)

	params := `{"input":"count"}`
	resp := `{"output":[]}`
	verify := func(session, expected string) reply {
		return ts.post("/verify", session, `{"responses_create_params":`+params+`,"response":`+resp+`,"expected_count":`+expected+`}`)
	}
	expect(t, "verify hit", verify("s1", "6"), 200, `{"expected_count":6,"response":{"output":[]},"responses_create_params":{"input":"count"},"reward":1.0}`)
	expect(t, "verify miss", verify("s1", "7"), 200, `{"expected_count":7,"response":{"output":[]},"responses_create_params":{"input":"count"},"reward":0.0}`)
	expect(t, "verify unknown session", verify("nope", "6"), 200, `{"expected_count":6,"response":{"output":[]},"responses_create_params":{"input":"count"},"reward":0.0}`)
	expectCode(t, "verify without expected_count", ts.post("/verify", "s1", `{"responses_create_params":{},"response":{"output":[]}}`), 400, "invalid_request")

	for name, c := range map[string]struct{ session, path, body, code string }{
		"unknown session":       {"nope", "/increment", `{"by":1}`, "unknown_session"},
		"no session header":     {"", "/increment", `{"by":1}`, "unknown_session"},
		"by missing":            {"s1", "/increment", `{}`, "invalid_request"},
		"by fractional":         {"s1", "/increment", `{"by":1.5}`, "invalid_request"},
		"by a string":           {"s1", "/increment", `{"by":"1"}`, "invalid_request"},
		"seed count a string":   {"s3", "/seed_session", `{"initial_count":"3"}`, "invalid_request"},
		"seed count fractional": {"s3", "/seed_session", `{"initial_count":2.5}`, "invalid_request"},
		"seed not an object":    {"s3", "/seed_session", `[1]`, "invalid_request"},
	} {
		t.Run(name, func(t *testing.T) {
			status := 400
			if c.code == "unknown_session" {
				status = 404
			}
			expectCode(t, name, ts.post(c.path, c.session, c.body), status, c.code)
		})
	}
	expectCode(t, "failed seed created no session", ts.post("/get_counter_value", "s3", `{}`), 404, "unknown_session")
	expect(t, "integral float counts", ts.post("/increment", "s1", `{"by":1.0}`), 200, `{"count":7}`)
	expectCode(t, "overflow", ts.post("/increment", "s1", `{"by":9223372036854775807}`), 400, "invalid_request")
}

func TestCloseSession(t *testing.T) {
	ts := start(t, resources.TypeCounter)
	ts.post("/seed_session", "s1", `{}`)
	expect(t, "close", ts.post("/close_session", "s1", ``), 200, `{"closed":true}`)
	expect(t, "close again", ts.post("/close_session", "s1", `{}`), 200, `{"closed":false}`)
	expect(t, "close unknown", ts.post("/close_session", "never", ``), 200, `{"closed":false}`)
	expect(t, "close without header", ts.post("/close_session", "", ``), 200, `{"closed":false}`)
	expectCode(t, "tool after close", ts.post("/get_counter_value", "s1", `{}`), 404, "unknown_session")
	// A closed id can be seeded afresh.
	ts.post("/seed_session", "s1", `{"initial_count":9}`)
	expect(t, "re-seeded after close", ts.post("/get_counter_value", "s1", `{}`), 200, `{"count":9}`)
}

func TestRolloutPrefix_BindsSession(t *testing.T) {
	ts := start(t, resources.TypeCounter)
	expect(t, "seed as r-a1", ts.post("/ng-rollout/r-a1/seed_session", "s1", `{"initial_count":1}`), 200, `{}`)
	expect(t, "tool as r-a1", ts.post("/ng-rollout/r-a1/increment", "s1", `{"by":1}`), 200, `{"count":2}`)
	expect(t, "tool without prefix", ts.post("/increment", "s1", `{"by":1}`), 200, `{"count":3}`)
	expectCode(t, "tool as an earlier attempt", ts.post("/ng-rollout/r/increment", "s1", `{"by":1}`), 409, "stale_attempt")
	expectCode(t, "tool as another rollout", ts.post("/ng-rollout/q-a1/get_counter_value", "s1", `{}`), 409, "stale_attempt")
	expectCode(t, "seed as an earlier attempt", ts.post("/ng-rollout/r/seed_session", "s1", `{}`), 409, "stale_attempt")
	expectCode(t, "verify as another rollout", ts.post("/ng-rollout/q/verify", "s1", `{"responses_create_params":{},"response":{"output":[]},"expected_count":3}`), 409, "stale_attempt")
	expectCode(t, "malformed capture key", ts.post("/ng-rollout/bad!key/increment", "s1", `{"by":1}`), 400, "invalid_request")
	// The next attempt re-seeds the same id and continues its state.
	expect(t, "seed as r-a2", ts.post("/ng-rollout/r-a2/seed_session", "s1", `{}`), 200, `{}`)
	expectCode(t, "r-a1 is now stale", ts.post("/ng-rollout/r-a1/increment", "s1", `{"by":1}`), 409, "stale_attempt")
	expect(t, "r-a2 continues", ts.post("/ng-rollout/r-a2/increment", "s1", `{"by":1}`), 200, `{"count":4}`)
	// A session seeded without a prefix is bound by the first prefixed seed.
	ts.post("/seed_session", "s2", `{}`)
	expect(t, "unbound session accepts any episode", ts.post("/ng-rollout/x/increment", "s2", `{"by":1}`), 200, `{"count":1}`)
	ts.post("/ng-rollout/y/seed_session", "s2", `{}`)
	expectCode(t, "bound by the later seed", ts.post("/ng-rollout/x/increment", "s2", `{"by":1}`), 409, "stale_attempt")
	// Close is never refused. An earlier attempt's close leaves the session
	// to the attempt that took it over (TestCloseSession_EarlierAttempt).
	expect(t, "close as an earlier attempt", ts.post("/ng-rollout/r/close_session", "s1", ``), 200, `{"closed":false}`)
	expect(t, "close as another rollout", ts.post("/ng-rollout/q/close_session", "s1", ``), 200, `{"closed":true}`)
}

// TestCloseSession_EarlierAttempt: once a later attempt of the rollout has
// taken a session over (re-seeded the caller-assigned id), a close of an
// earlier attempt (its final cleanup, sent again after its first try got no
// answer) is answered, not refused, with closed false, and leaves the later
// attempt's session and its state alone; the later attempt closes it.
func TestCloseSession_EarlierAttempt(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) *testServer
	}{
		{"plain", func(t *testing.T) *testServer { return start(t, resources.TypeCounter) }},
		{"checkpointing", func(t *testing.T) *testServer { return checkpointed(t, resources.TypeCounter, "", "") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := tc.start(t)
			sessions := func() string {
				for line := range strings.Lines(ts.do(http.MethodGet, "/metrics", "", "").body) {
					if strings.HasPrefix(line, "gymfleet_resources_sessions ") {
						return strings.TrimSpace(line)
					}
				}
				return "no gymfleet_resources_sessions"
			}
			expect(t, "seed as r-a1", ts.post("/ng-rollout/r-a1/seed_session", "s1", `{"initial_count":1}`), 200, `{}`)
			expect(t, "tool as r-a1", ts.post("/ng-rollout/r-a1/increment", "s1", `{"by":1}`), 200, `{"count":2}`)
			expect(t, "seed as r-a2 takes the session over", ts.post("/ng-rollout/r-a2/seed_session", "s1", `{"initial_count":0}`), 200, `{}`)

			expect(t, "close as r-a1", ts.post("/ng-rollout/r-a1/close_session", "s1", `{}`), 200, `{"closed":false}`)
			expect(t, "close as r-a1 again", ts.post("/ng-rollout/r-a1/close_session", "s1", `{}`), 200, `{"closed":false}`)
			expect(t, "close as r, earlier still", ts.post("/ng-rollout/r/close_session", "s1", ``), 200, `{"closed":false}`)
			if got := sessions(); got != "gymfleet_resources_sessions 1" {
				t.Errorf("after the earlier attempts' closes: %s, want 1", got)
			}
			// The session is r-a2's still, with its state.
			expect(t, "tool as r-a2", ts.post("/ng-rollout/r-a2/increment", "s1", `{"by":1}`), 200, `{"count":3}`)
			expect(t, "verify as r-a2", ts.post("/ng-rollout/r-a2/verify", "s1", `{"responses_create_params":{},"response":{"output":[]},"expected_count":3}`),
				200, `{"expected_count":3,"response":{"output":[]},"responses_create_params":{},"reward":1.0}`)
			expectCode(t, "tool as r-a1 is still stale", ts.post("/ng-rollout/r-a1/increment", "s1", `{"by":1}`), 409, "stale_attempt")

			expect(t, "close as r-a2", ts.post("/ng-rollout/r-a2/close_session", "s1", `{}`), 200, `{"closed":true}`)
			expect(t, "close as r-a2 again", ts.post("/ng-rollout/r-a2/close_session", "s1", `{}`), 200, `{"closed":false}`)
			expectCode(t, "tool after r-a2's close", ts.post("/ng-rollout/r-a2/increment", "s1", `{"by":1}`), 404, "unknown_session")
			if got := sessions(); got != "gymfleet_resources_sessions 0" {
				t.Errorf("after r-a2's close: %s, want 0", got)
			}
		})
	}
}

func TestSlowVerify_HoldRelease(t *testing.T) {
	ts := start(t, resources.TypeSlowVerify)
	body := `{"responses_create_params":{},"response":{"output":` + weatherOutput("The weather in Paris is cold.") + `}}`
	expect(t, "count at start", ts.do(http.MethodGet, "/_ctl/verify/count", "", ""), 200, `{"started":0,"finished":0,"waiting":0}`)
	expect(t, "unheld verify", ts.post("/verify", "", body), 200, `{"response":{"output":`+compact(t, weatherOutput("The weather in Paris is cold."))+`},"responses_create_params":{},"reward":1.0}`)
	expect(t, "hold", ts.post("/_ctl/verify/hold", "", ``), 200, `{"held":true}`)
	expect(t, "hold twice", ts.post("/_ctl/verify/hold", "", ``), 200, `{"held":true}`)

	held := make(chan reply, 1)
	go func() { held <- ts.post("/verify", "", body) }()
	ts.waitCount(`{"started":2,"finished":1,"waiting":1}`)
	select {
	case r := <-held:
		t.Fatalf("verify answered while held: %d %s", r.status, r.body)
	default:
	}

	// A held verify whose caller goes away leaves the gate.
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.url+"/verify", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		gone <- err
	}()
	ts.waitCount(`{"started":3,"finished":1,"waiting":2}`)
	cancel()
	if err := <-gone; err == nil {
		t.Error("cancelled verify returned no error")
	}
	ts.waitCount(`{"started":3,"finished":1,"waiting":1}`)

	expect(t, "release", ts.post("/_ctl/verify/release", "", ``), 200, `{"held":false}`)
	if r := <-held; r.status != 200 || !strings.Contains(r.body, `"reward":1.0`) {
		t.Errorf("released verify: %d %s", r.status, r.body)
	}
	expect(t, "count at end", ts.do(http.MethodGet, "/_ctl/verify/count", "", ""), 200, `{"started":3,"finished":2,"waiting":0}`)
	expect(t, "release when not held", ts.post("/_ctl/verify/release", "", ``), 200, `{"held":false}`)
}

func TestSlowVerify_CloseReleasesHeldVerify(t *testing.T) {
	ts := start(t, resources.TypeSlowVerify)
	ts.post("/_ctl/verify/hold", "", ``)
	held := make(chan reply, 1)
	go func() {
		held <- ts.post("/verify", "", `{"responses_create_params":{},"response":{"output":[]}}`)
	}()
	ts.waitCount(`{"started":1,"finished":0,"waiting":1}`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	if err := ts.srv.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v with a held verify", d)
	}
	expectCode(t, "held verify at close", <-held, 503, "unavailable")
}

func TestControlRoutesOnlyOnSlowVerify(t *testing.T) {
	ts := start(t, resources.TypeWeather)
	expectCode(t, "hold on weather", ts.post("/_ctl/verify/hold", "", ``), 404, "not_found")
}

// waitCount polls /_ctl/verify/count until it reads want, with a deadline.
func (ts *testServer) waitCount(want string) {
	ts.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		last = ts.do(http.MethodGet, "/_ctl/verify/count", "", "").body
		if last == want {
			return
		}
		<-time.After(5 * time.Millisecond)
	}
	ts.t.Fatalf("verify count is %s, want %s", last, want)
}

func TestMetrics(t *testing.T) {
	ts := start(t, resources.TypeCounter)
	ts.post("/seed_session", "s1", `{}`)
	ts.post("/seed_session", "s2", `{}`)
	ts.post("/increment", "s1", `{"by":1}`)
	ts.post("/increment", "s1", `{"by":1}`)
	ts.post("/verify", "s1", `{"responses_create_params":{},"response":{"output":[]},"expected_count":2}`)
	ts.post("/close_session", "s2", ``)
	m := ts.do(http.MethodGet, "/metrics", "", "").body
	for _, want := range []string{
		"gymfleet_resources_sessions 1",
		`gymfleet_resources_tool_calls_total{tool="increment"} 2`,
		"gymfleet_resources_verify_total 1",
		`gymfleet_resources_verify_reward_bucket{le="0.75"} 0`,
		`gymfleet_resources_verify_reward_bucket{le="1"} 1`,
		"gymfleet_resources_verify_reward_sum 1",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestConfig_Validate(t *testing.T) {
	ok := resources.DefaultConfig()
	cases := []struct {
		name   string
		mutate func(*resources.Config)
		errHas string
	}{
		{"default", func(*resources.Config) {}, ""},
		{"counter saved", func(c *resources.Config) { c.Type, c.CheckpointMode = resources.TypeCounter, resources.ModeSaved }, ""},
		{"bad name", func(c *resources.Config) { c.Name = "a b" }, "name"},
		{"bad type", func(c *resources.Config) { c.Type = "judge" }, "type"},
		{"no listen", func(c *resources.Config) { c.Listen = "" }, "listen"},
		{"bad checkpoint mode", func(c *resources.Config) { c.CheckpointMode = "exported" }, "checkpoint_mode"},
		{"weather saved", func(c *resources.Config) { c.CheckpointMode = resources.ModeSaved }, "saved"},
		{"bad verify mode", func(c *resources.Config) { c.VerifyMode = "maybe" }, "verify_mode"},
		{"checkpoint without token", func(c *resources.Config) { c.Checkpoint.Enabled = true }, "control_auth_token"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := ok
			c.mutate(&cfg)
			err := cfg.Validate()
			if (err == nil) != (c.errHas == "") || (err != nil && !strings.Contains(err.Error(), c.errHas)) {
				t.Errorf("Validate() = %v, want error containing %q", err, c.errHas)
			}
		})
	}
	if got := (resources.Config{Type: resources.TypeCounter}).EffectiveCheckpointMode(); got != resources.ModeSaved {
		t.Errorf("counter default checkpoint mode = %q", got)
	}
	if got := (resources.Config{Type: resources.TypeSlowVerify}).EffectiveVerifyMode(); got != resources.VerifyWait {
		t.Errorf("slow_verify default verify mode = %q", got)
	}
	if got := (resources.Config{Type: resources.TypeWeather, VerifyMode: resources.VerifyWait}).EffectiveVerifyMode(); got != resources.VerifyWait {
		t.Errorf("explicit verify mode = %q", got)
	}
}

func TestProcessConfig_Validate(t *testing.T) {
	srv := func(name, listen string) resources.Config {
		c := resources.DefaultConfig()
		c.Name, c.Listen = name, listen
		return c
	}
	cases := []struct {
		name    string
		servers []resources.Config
		errHas  string
	}{
		{"one", []resources.Config{srv("a", "127.0.0.1:1")}, ""},
		{"none", nil, "servers is empty"},
		{"duplicate name", []resources.Config{srv("a", "127.0.0.1:1"), srv("a", "127.0.0.1:2")}, "twice"},
		{"duplicate listen", []resources.Config{srv("a", "127.0.0.1:1"), srv("b", "127.0.0.1:1")}, "both listen"},
		{"two on port 0", []resources.Config{srv("a", "127.0.0.1:0"), srv("b", "127.0.0.1:0")}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := resources.DefaultProcessConfig()
			p.Servers = c.servers
			err := p.Validate()
			if (err == nil) != (c.errHas == "") || (err != nil && !strings.Contains(err.Error(), c.errHas)) {
				t.Errorf("Validate() = %v, want error containing %q", err, c.errHas)
			}
		})
	}
	p := resources.DefaultProcessConfig()
	p.Checkpoint = ctlplane.Config{Enabled: true, ControlAuthToken: "x", LeaseGraceSeconds: 5, Root: os.TempDir()}
	p.Servers = []resources.Config{srv("a", "127.0.0.1:0")}
	if got := p.ServerConfigs()[0].Checkpoint; got != p.Checkpoint {
		t.Errorf("ServerConfigs did not copy the checkpoint block: %+v", got)
	}
}
