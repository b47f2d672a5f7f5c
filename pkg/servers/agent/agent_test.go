package agent_test

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/servers/agent"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

const getWeatherParis = `{"city":"Paris"}`

// oneRound is a model script: call get_weather, then answer.
func oneRound() []string {
	return []string{
		resp("resp_1", usage(10, 5, "0"), fc("c1", "get_weather", getWeatherParis)),
		resp("resp_2", usage(20, 7, "3"), msg("The weather in Paris is cold.")),
	}
}

func TestActivation_OneToolRound(t *testing.T) {
	ta := newFixture(t, nil, oneRound()...)
	if r := ta.open("r", "agent-session-1", "rs-1"); r.status != 200 || r.body != `{"session_id":"agent-session-1","episode_id":{"rollout_id":"r","attempt":0}}` {
		t.Fatalf("open: %d %s", r.status, r.body)
	}
	r := ta.activate("r", "agent-session-1", "1", weatherParams)
	if r.status != 200 {
		t.Fatalf("activation: %d %s", r.status, r.body)
	}
	toolOut := `{"city":"Paris","weather_description":"The weather in Paris is cold."}`
	wantOutput := compact(t, items(fc("c1", "get_weather", getWeatherParis), fco("c1", toolOut), msg("The weather in Paris is cold.")))
	if got := field(t, r.body, "output"); got != wantOutput {
		t.Errorf("output:\n got %s\nwant %s", got, wantOutput)
	}
	if got, want := field(t, r.body, "usage"), compact(t, usage(30, 12, "3")); got != want {
		t.Errorf("usage: got %s want %s", got, want)
	}
	if got := field(t, r.body, "id"); got != `"resp_2"` {
		t.Errorf("reply is not the last model response: id %s", got)
	}

	want := []string{
		"model /ng-rollout/r/v1/responses",
		"resources /ng-rollout/r/get_weather session=rs-1",
		"model /ng-rollout/r/v1/responses",
	}
	if got := ta.rec.lines(); !slices.Equal(got, want) {
		t.Errorf("requests:\n got %q\nwant %q", got, want)
	}
	calls := ta.rec.all()
	for _, c := range calls {
		if c.proto != 2 {
			t.Errorf("%s used HTTP/%d, want h2c", c, c.proto)
		}
	}
	if calls[1].body != getWeatherParis {
		t.Errorf("tool call body %q, want the arguments as the model wrote them", calls[1].body)
	}
	// The second model call sends the original input plus every new item,
	// and every other parameter unchanged.
	second := calls[2].body
	wantInput := compact(t, items(`{"type":"message","role":"user","content":"Weather in Paris?"}`, fc("c1", "get_weather", getWeatherParis), fco("c1", toolOut)))
	if got := field(t, second, "input"); got != wantInput {
		t.Errorf("second model input:\n got %s\nwant %s", got, wantInput)
	}
	if got := field(t, second, "temperature"); got != "0.5" {
		t.Errorf("temperature not passed through: %s", got)
	}
	if got := field(t, second, "tools"); got != compact(t, `[{"type":"function","name":"get_weather","parameters":{"type":"object"}}]`) {
		t.Errorf("tools not passed through: %s", got)
	}
	if strings.Contains(second, `"stream"`) {
		t.Errorf("non-streaming agent sent stream: %s", second)
	}
}

func TestActivation_TwoRoundsInOrder(t *testing.T) {
	ta := newFixture(t, nil,
		resp("resp_1", usage(1, 1, "0"), fc("a", "get_weather", `{"city":"Paris"}`), fc("b", "get_weather", `{"city":"Tokyo"}`)),
		resp("resp_2", usage(2, 2, "0"), reasoning(), fc("c", "get_weather", `{"city":"Oslo"}`)),
		resp("resp_3", usage(4, 4, "0"), msg("done")),
	)
	ta.open("r", "s", "rs")
	r := ta.activate("r", "s", "1", weatherParams)
	if r.status != 200 {
		t.Fatalf("activation: %d %s", r.status, r.body)
	}
	wantOutput := compact(t, items(
		fc("a", "get_weather", `{"city":"Paris"}`), fc("b", "get_weather", `{"city":"Tokyo"}`),
		fco("a", `{"city":"Paris","weather_description":"The weather in Paris is cold."}`),
		fco("b", `{"city":"Tokyo","weather_description":"The weather in Tokyo is cold."}`),
		reasoning(), fc("c", "get_weather", `{"city":"Oslo"}`),
		fco("c", `{"city":"Oslo","weather_description":"The weather in Oslo is cold."}`),
		msg("done"),
	))
	if got := field(t, r.body, "output"); got != wantOutput {
		t.Errorf("output:\n got %s\nwant %s", got, wantOutput)
	}
	var tools []string
	for _, s := range ta.rec.of("resources") {
		tools = append(tools, s.body)
	}
	if want := []string{`{"city":"Paris"}`, `{"city":"Tokyo"}`, `{"city":"Oslo"}`}; !slices.Equal(tools, want) {
		t.Errorf("tool calls %q, want %q in output order", tools, want)
	}
	c := ta.closeSession("r", "s")
	want := `{"session_id":"s","closed":true,"observations":{"activations":1,"steps":3,"model_calls":3,"tool_calls":3,"usage":` + compact(t, usage(7, 7, "0")) + `,"resources_session_id":"rs"}}`
	if c.status != 200 || c.body != want {
		t.Errorf("close:\n got %d %s\nwant %s", c.status, c.body, want)
	}
}

func TestActivation_StopRules(t *testing.T) {
	cases := []struct {
		name       string
		maxSteps   int
		replies    []string
		wantOutput string
		modelCalls int
		toolCalls  int
	}{
		{
			name:     "max_steps runs the last step's tools",
			maxSteps: 1,
			replies: []string{
				resp("resp_1", usage(1, 1, "0"), fc("a", "get_weather", `{"city":"Paris"}`)),
				resp("resp_2", usage(1, 1, "0"), msg("never asked")),
			},
			wantOutput: items(fc("a", "get_weather", `{"city":"Paris"}`), fco("a", `{"city":"Paris","weather_description":"The weather in Paris is cold."}`)),
			modelCalls: 1, toolCalls: 1,
		},
		{
			name:     "max_steps 2",
			maxSteps: 2,
			replies: []string{
				resp("resp_1", usage(1, 1, "0"), fc("a", "get_weather", `{"city":"A"}`)),
				resp("resp_2", usage(1, 1, "0"), fc("b", "get_weather", `{"city":"B"}`)),
				resp("resp_3", usage(1, 1, "0"), msg("never asked")),
			},
			wantOutput: items(fc("a", "get_weather", `{"city":"A"}`), fco("a", `{"city":"A","weather_description":"The weather in A is cold."}`),
				fc("b", "get_weather", `{"city":"B"}`), fco("b", `{"city":"B","weather_description":"The weather in B is cold."}`)),
			modelCalls: 2, toolCalls: 2,
		},
		{
			name: "incomplete stops before tools",
			replies: []string{strings.Replace(resp("resp_1", usage(1, 1, "0"), fc("a", "get_weather", `{"city":"Paris"}`)),
				`"incomplete_details":null`, `"incomplete_details":{"reason":"max_output_tokens"}`, 1)},
			wantOutput: items(fc("a", "get_weather", `{"city":"Paris"}`)),
			modelCalls: 1, toolCalls: 0,
		},
		{
			name: "reasoning only loops again",
			replies: []string{
				resp("resp_1", usage(1, 1, "0"), reasoning()),
				resp("resp_2", usage(1, 1, "0"), msg("ok")),
			},
			wantOutput: items(reasoning(), msg("ok")),
			modelCalls: 2, toolCalls: 0,
		},
		{
			name:       "invalid tool arguments are the tool's output",
			replies:    []string{resp("resp_1", usage(1, 1, "0"), fc("a", "get_weather", `{"city": "Par`)), resp("resp_2", usage(1, 1, "0"), msg("sorry"))},
			wantOutput: items(fc("a", "get_weather", `{"city": "Par`), fco("a", `{"error":"Invalid tool call arguments: {\"city\": \"Par"}`), msg("sorry")),
			modelCalls: 2, toolCalls: 0,
		},
		{
			name:    "a tool error body is the tool's output",
			replies: []string{resp("resp_1", usage(1, 1, "0"), fc("a", "no_such_tool", `{}`)), resp("resp_2", usage(1, 1, "0"), msg("sorry"))},
			wantOutput: items(fc("a", "no_such_tool", `{}`), fco("a", `{"error":{"code":"unknown_tool","detail":"no tool no_such_tool"}}`),
				msg("sorry")),
			modelCalls: 2, toolCalls: 1,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ta := newFixture(t, func(cfg *agent.Config) { cfg.MaxSteps = c.maxSteps }, c.replies...)
			ta.open("r", "s", "rs")
			r := ta.activate("r", "s", "1", weatherParams)
			if r.status != 200 {
				t.Fatalf("activation: %d %s", r.status, r.body)
			}
			if got, want := field(t, r.body, "output"), compact(t, c.wantOutput); got != want {
				t.Errorf("output:\n got %s\nwant %s", got, want)
			}
			if got := ta.model.callCount(); got != c.modelCalls {
				t.Errorf("model calls %d, want %d", got, c.modelCalls)
			}
			if got := len(ta.rec.of("resources")); got != c.toolCalls {
				t.Errorf("tool requests %d, want %d", got, c.toolCalls)
			}
		})
	}
}

func TestActivation_IndexRules(t *testing.T) {
	ta := newFixture(t, nil, append(oneRound(), oneRound()...)...)
	ta.open("r", "s", "rs")
	first := ta.activate("r", "s", "1", weatherParams)
	if first.status != 200 {
		t.Fatalf("activation 1: %d %s", first.status, first.body)
	}
	again := ta.activate("r", "s", "1", weatherParams)
	if again.status != 200 || again.body != first.body {
		t.Errorf("activation 1 again: %d, same reply %v", again.status, again.body == first.body)
	}
	if n := ta.model.callCount(); n != 2 {
		t.Errorf("the replayed activation called the model: %d calls", n)
	}
	expectCode(t, "activation 3 before 2", ta.activate("r", "s", "3", weatherParams), 409, "activation_out_of_order")
	for _, bad := range []string{"", "0", "-1", "x"} {
		expectCode(t, "activation "+bad, ta.activate("r", "s", bad, weatherParams), 400, "invalid_request")
	}
	if r := ta.activate("r", "s", "2", weatherParams); r.status != 200 {
		t.Errorf("activation 2: %d %s", r.status, r.body)
	}
	expectCode(t, "activation 1 after 2", ta.activate("r", "s", "1", weatherParams), 409, "activation_out_of_order")
	expectCode(t, "unknown session", ta.activate("r", "nope", "1", weatherParams), 404, "unknown_session")
	expectCode(t, "unknown parameter", ta.activate("r", "s", "3", `{"input":"x","bogus":1}`), 422, "invalid_request")
	c := ta.closeSession("", "s")
	if !strings.Contains(c.body, `"activations":2,"steps":4,"model_calls":4,"tool_calls":2`) {
		t.Errorf("observations after two activations: %s", c.body)
	}
	expectCode(t, "activation after close", ta.activate("r", "s", "3", weatherParams), 409, "session_closed")
}

func TestActivation_UpstreamErrorKeepsSessionUsable(t *testing.T) {
	ta := newFixture(t, nil, oneRound()...)
	ta.open("r", "s", "rs")
	ta.model.mu.Lock()
	ta.model.status = http.StatusInternalServerError
	ta.model.mu.Unlock()
	r := ta.activate("r", "s", "1", weatherParams)
	expectCode(t, "model failure", r, 502, "upstream_error")
	if !strings.Contains(r.body, "scripted failure") {
		t.Errorf("upstream error lacks the cause: %s", r.body)
	}
	ta.model.mu.Lock()
	ta.model.status, ta.model.calls = 0, 0
	ta.model.mu.Unlock()
	if r := ta.activate("r", "s", "1", weatherParams); r.status != 200 {
		t.Errorf("retry of activation 1: %d %s", r.status, r.body)
	}
	c := ta.closeSession("r", "s")
	if !strings.Contains(c.body, `"activations":1,"steps":2,"model_calls":2`) {
		t.Errorf("the failed attempt leaked into the observations: %s", c.body)
	}
}

func TestActivation_ResourcesTransportError(t *testing.T) {
	rec := &recorder{}
	model := newModel(t, rec, oneRound()...)
	dead := newH2C(t, http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	ta := startAgent(t, model, &resourcesStandIn{url: deadURL}, rec)
	ta.open("r", "s", "rs")
	expectCode(t, "resources down", ta.activate("r", "s", "1", weatherParams), 502, "upstream_error")
}

func TestSessions_OpenCloseObservationsOnce(t *testing.T) {
	ta := newFixture(t, nil, oneRound()...)
	open := ta.open("r-a2", "s", "rs")
	if open.body != `{"session_id":"s","episode_id":{"rollout_id":"r","attempt":2}}` {
		t.Errorf("open: %s", open.body)
	}
	if again := ta.open("r-a2", "s", "rs"); again.status != 200 || again.body != open.body {
		t.Errorf("open again from the same attempt: %d %s", again.status, again.body)
	}
	expectCode(t, "open from another attempt", ta.open("r-a3", "s", "rs"), 409, "stale_attempt")
	expectCode(t, "open from another rollout", ta.open("q", "s", "rs"), 409, "stale_attempt")
	expectCode(t, "open with another resources session", ta.open("r-a2", "s", "rs-other"), 409, "session_exists")
	expectCode(t, "activation from another attempt", ta.activate("r-a1", "s", "1", weatherParams), 409, "stale_attempt")
	expectCode(t, "close from another attempt", ta.closeSession("r-a1", "s"), 409, "stale_attempt")

	c := ta.closeSession("r-a2", "s")
	if c.status != 200 || c.body != `{"session_id":"s","closed":true,"observations":{"activations":0,"steps":0,"model_calls":0,"tool_calls":0,"usage":null,"resources_session_id":"rs"}}` {
		t.Errorf("first close: %d %s", c.status, c.body)
	}
	c = ta.closeSession("", "s")
	if c.status != 200 || c.body != `{"session_id":"s","closed":false,"observations":null}` {
		t.Errorf("second close: %d %s", c.status, c.body)
	}
	expectCode(t, "close unknown", ta.closeSession("", "never"), 404, "unknown_session")
	for name, body := range map[string]string{
		"no session_id":             `{"resources_session_id":"rs"}`,
		"no resources_session_id":   `{"session_id":"s2"}`,
		"bad session_id":            `{"session_id":"a b","resources_session_id":"rs"}`,
		"not an object":             `[]`,
		"empty":                     ``,
		"session_id not a string":   `{"session_id":1,"resources_session_id":"rs"}`,
		"resources id not a string": `{"session_id":"s2","resources_session_id":{}}`,
	} {
		expectCode(t, "open "+name, ta.post("/ng-rollout/r/v1/agent_sessions", nil, body), 400, "invalid_request")
	}
	expectCode(t, "close without session_id", ta.post("/v1/agent_sessions/close", nil, `{}`), 400, "invalid_request")
}

func TestRolloutIDRequired(t *testing.T) {
	ta := newFixture(t, nil)
	expectCode(t, "open without prefix", ta.post("/v1/agent_sessions", nil, `{"session_id":"s","resources_session_id":"rs"}`), 400, "rollout_id_required")
	expectCode(t, "activation without prefix", ta.post("/v1/responses", map[string]string{agent.SessionHeader: "s", agent.ActivationHeader: "1"}, weatherParams), 400, "rollout_id_required")
	expectCode(t, "run with a bad _rowidx", ta.post("/run", nil, `{"_rowidx":"x","responses_create_params":`+weatherParams+`}`), 400, "invalid_request")
	expectCode(t, "run with a bad id", ta.post("/run", nil, `{"_ng_rollout_id":"a b","responses_create_params":`+weatherParams+`}`), 400, "invalid_request")
	if n := len(ta.rec.all()); n != 0 {
		t.Errorf("refused requests reached the stand-ins: %q", ta.rec.lines())
	}
}

func TestStateless_UsesResourcesSessionHeader(t *testing.T) {
	ta := newFixture(t, nil, oneRound()...)
	r := ta.post("/ng-rollout/r-a1/v1/responses", map[string]string{agent.ResourcesSessionHeader: "rs-9"}, weatherParams)
	if r.status != 200 || r.header.Get(agent.ResourcesSessionHeader) != "rs-9" {
		t.Fatalf("stateless: %d %s (header %q)", r.status, r.body, r.header.Get(agent.ResourcesSessionHeader))
	}
	want := []string{
		"model /ng-rollout/r-a1/v1/responses",
		"resources /ng-rollout/r-a1/get_weather session=rs-9",
		"model /ng-rollout/r-a1/v1/responses",
	}
	if got := ta.rec.lines(); !slices.Equal(got, want) {
		t.Errorf("requests:\n got %q\nwant %q", got, want)
	}
	// A string input becomes one user message.
	ta2 := newFixture(t, nil, resp("resp_1", usage(1, 1, "0"), msg("ok")))
	ta2.post("/ng-rollout/r/v1/responses", nil, `{"input":"What?"}`)
	if got := field(t, ta2.rec.of("model")[0].body, "input"); got != `[{"type":"message","role":"user","content":"What?"}]` {
		t.Errorf("string input sent as %s", got)
	}
}

var generatedSession = regexp.MustCompile(`^resources-session-[0-9a-f]{32}$`)

func TestRun_Sequence(t *testing.T) {
	cases := []struct {
		name, path, ids, key string
		attempt              int
	}{
		{"ids from the row", "/run", `"_ng_task_index":7,"_ng_rollout_index":3`, "7-3", 0},
		{"attempt from the row", "/run", `"_ng_rollout_id":"row-1","_ng_attempt_index":2`, "row-1-a2", 2},
		{"attempt as a string", "/run", `"_ng_rollout_id":"row-1","_ng_attempt_index":"2"`, "row-1-a2", 2},
		{"prefix wins", "/ng-rollout/p-a1/run", `"_ng_rollout_id":"row-1"`, "p-a1", 1},
		// NeMo RL's rows (rollouts.py _prepare_nemo_gym_rows and
		// trajectory_collector.py at 7ea279abfbeb) name no rollout: the id
		// is generated from what they have.
		{"sync NeMo RL row", "/run", `"_rowidx":4`, `row4-g[0-9a-f]{16}`, 0},
		{"async NeMo RL row", "/run", `"_ng_task_index":9,"_rowidx":2`, `t9-row2-g[0-9a-f]{16}`, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ta := newFixture(t, nil, oneRound()...)
			row := `{"responses_create_params":` + weatherParams + `,` + c.ids + `,"agent_ref":{"name":"weather_agent"},"task":"paris"}`
			r := ta.post(c.path, nil, row)
			var rep struct {
				EpisodeID rollout.EpisodeID `json:"episode_id"`
				Reward    float64           `json:"reward"`
				Verified  bool              `json:"verified"`
			}
			if r.status != 200 || json.Unmarshal([]byte(r.body), &rep) != nil || !rep.Verified || rep.Reward != 1.0 {
				t.Fatalf("run: %d %s", r.status, r.body)
			}
			if !regexp.MustCompile("^"+c.key+"$").MatchString(rep.EpisodeID.CaptureKey()) || rep.EpisodeID.Attempt != c.attempt {
				t.Fatalf("episode_id %+v, want capture key %s (attempt %d)", rep.EpisodeID, c.key, c.attempt)
			}
			c.key = rep.EpisodeID.CaptureKey()
			all := ta.rec.all()
			if len(all) != 6 {
				t.Fatalf("requests: %q", ta.rec.lines())
			}
			rsid := all[0].session
			if !generatedSession.MatchString(rsid) {
				t.Errorf("resources session %q is not a fresh resources-session-<hex>", rsid)
			}
			p := "/ng-rollout/" + c.key
			want := []string{
				"resources " + p + "/seed_session session=" + rsid,
				"model " + p + "/v1/responses",
				"resources " + p + "/get_weather session=" + rsid,
				"model " + p + "/v1/responses",
				"resources " + p + "/verify session=" + rsid,
				"resources " + p + "/close_session session=" + rsid,
			}
			if got := ta.rec.lines(); !slices.Equal(got, want) {
				t.Errorf("requests:\n got %q\nwant %q", got, want)
			}
			if all[0].body != row {
				t.Errorf("seed body %s, want the whole row as sent", all[0].body)
			}
			verify := all[4].body
			for _, f := range []string{"responses_create_params", "agent_ref", "task"} {
				if field(t, verify, f) != field(t, row, f) {
					t.Errorf("verify body field %s = %s, want the row's", f, field(t, verify, f))
				}
			}
			toolOut := `{"city":"Paris","weather_description":"The weather in Paris is cold."}`
			if got, want := field(t, field(t, verify, "response"), "output"), compact(t, items(fc("c1", "get_weather", getWeatherParis), fco("c1", toolOut), msg("The weather in Paris is cold."))); got != want {
				t.Errorf("verified output:\n got %s\nwant %s", got, want)
			}
		})
	}
}

func TestRun_ClosesResourcesSessionOnFailure(t *testing.T) {
	cases := []struct {
		name    string
		setup   func(*testAgent)
		wantSeq []string
	}{
		{"verify fails", func(ta *testAgent) { ta.resources.verifyStatus = 500 },
			[]string{"resources seed_session", "model v1/responses", "resources get_weather", "model v1/responses", "resources verify", "resources close_session"}},
		{"seed fails", func(ta *testAgent) { ta.resources.seedStatus = 400 },
			[]string{"resources seed_session", "resources close_session"}},
		{"model fails", func(ta *testAgent) { ta.model.status = 500 },
			[]string{"resources seed_session", "model v1/responses", "resources close_session"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ta := newFixture(t, nil, oneRound()...)
			c.setup(ta)
			r := ta.post("/ng-rollout/r/run", nil, `{"responses_create_params":`+weatherParams+`}`)
			expectCode(t, "run", r, 502, "upstream_error")
			var got []string
			for _, s := range ta.rec.all() {
				got = append(got, s.who+" "+strings.TrimPrefix(s.path, "/ng-rollout/r/"))
			}
			if !slices.Equal(got, c.wantSeq) {
				t.Errorf("requests:\n got %q\nwant %q", got, c.wantSeq)
			}
		})
	}
}

func TestRun_BadRows(t *testing.T) {
	ta := newFixture(t, nil)
	for name, c := range map[string]struct {
		body   string
		status int
	}{
		"not an object":  {`[]`, 400},
		"empty":          {``, 400},
		"no params":      {`{"_ng_rollout_id":"r"}`, 400},
		"params not obj": {`{"_ng_rollout_id":"r","responses_create_params":"x"}`, 422},
		"unknown param":  {`{"_ng_rollout_id":"r","responses_create_params":{"input":"x","bogus":true}}`, 422},
		"bad attempt":    {`{"_ng_rollout_id":"r","_ng_attempt_index":-1,"responses_create_params":{"input":"x"}}`, 400},
	} {
		expectCode(t, name, ta.post("/run", nil, c.body), c.status, "invalid_request")
	}
	if n := len(ta.rec.all()); n != 0 {
		t.Errorf("refused rows reached the stand-ins: %q", ta.rec.lines())
	}
}

func TestStreaming(t *testing.T) {
	for _, emptyCompleted := range []bool{false, true} {
		name := "completed carries the output"
		if emptyCompleted {
			name = "output from output_item.done"
		}
		t.Run(name, func(t *testing.T) {
			rec := &recorder{}
			model := newModel(t, rec, oneRound()...)
			model.streamEmptyCompleted = emptyCompleted
			ta := startAgent(t, model, newResources(t, rec), rec, func(c *agent.Config) { c.Stream = true })
			ta.open("r", "s", "rs")
			r := ta.activate("r", "s", "1", weatherParams)
			if r.status != 200 {
				t.Fatalf("activation: %d %s", r.status, r.body)
			}
			toolOut := `{"city":"Paris","weather_description":"The weather in Paris is cold."}`
			if got, want := field(t, r.body, "output"), compact(t, items(fc("c1", "get_weather", getWeatherParis), fco("c1", toolOut), msg("The weather in Paris is cold."))); got != want {
				t.Errorf("output:\n got %s\nwant %s", got, want)
			}
			if got, want := field(t, r.body, "usage"), compact(t, usage(30, 12, "3")); got != want {
				t.Errorf("usage: got %s want %s", got, want)
			}
			for _, m := range rec.of("model") {
				if field(t, m.body, "stream") != "true" {
					t.Errorf("streaming agent sent %s", m.body)
				}
			}
		})
	}
}

func TestStreaming_Incomplete(t *testing.T) {
	rec := &recorder{}
	incomplete := strings.Replace(resp("resp_1", usage(1, 1, "0"), msg("cut")), `"incomplete_details":null`, `"incomplete_details":{"reason":"max_output_tokens"}`, 1)
	model := newModel(t, rec, incomplete)
	ta := startAgent(t, model, newResources(t, rec), rec, func(c *agent.Config) { c.Stream = true })
	r := ta.post("/ng-rollout/r/v1/responses", nil, weatherParams)
	if r.status != 200 || field(t, r.body, "incomplete_details") != `{"reason":"max_output_tokens"}` {
		t.Errorf("incomplete stream: %d %s", r.status, r.body)
	}
}

func TestActivation_ConcurrentAndCloseWhileRunning(t *testing.T) {
	rec := &recorder{}
	model := newModel(t, rec, oneRound()...)
	model.block, model.entered = make(chan struct{}), make(chan struct{}, 4)
	ta := startAgent(t, model, newResources(t, rec), rec)
	ta.open("r", "s", "rs")
	running := make(chan reply, 1)
	go func() { running <- ta.activate("r", "s", "1", weatherParams) }()
	select {
	case <-model.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the activation never called the model")
	}
	expectCode(t, "same activation concurrently", ta.activate("r", "s", "1", weatherParams), 409, "episode_running")
	expectCode(t, "next activation concurrently", ta.activate("r", "s", "2", weatherParams), 409, "episode_running")
	c := ta.closeSession("r", "s")
	if c.status != 200 || !strings.Contains(c.body, `"closed":true,"observations":{"activations":0`) {
		t.Errorf("close while running: %d %s", c.status, c.body)
	}
	expectCode(t, "the activation closed under it", <-running, 409, "session_closed")
	close(model.block)
}

func TestMetrics(t *testing.T) {
	ta := newFixture(t, nil, oneRound()...)
	ta.open("r", "s", "rs")
	ta.activate("r", "s", "1", weatherParams)
	ta.activate("r", "s", "1", weatherParams)
	ta.activate("r", "s", "5", weatherParams)
	resp, err := http.Get(ta.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"gymfleet_agent_sessions 1",
		`gymfleet_agent_activations_total{outcome="completed"} 1`,
		`gymfleet_agent_activations_total{outcome="replayed"} 1`,
		`gymfleet_agent_activations_total{outcome="refused"} 1`,
		"gymfleet_agent_model_calls_total 2",
		"gymfleet_agent_tool_calls_total 1",
		"gymfleet_rollouts_in_flight 0",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestConfig_Validate(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*agent.Config)
		errHas string
	}{
		{"default", func(*agent.Config) {}, ""},
		{"bad name", func(c *agent.Config) { c.Name = "" }, "name"},
		{"no listen", func(c *agent.Config) { c.Listen = "" }, "listen"},
		{"model url without scheme", func(c *agent.Config) { c.ModelServerURL = "127.0.0.1:1" }, "model_server_url"},
		{"resources url with query", func(c *agent.Config) { c.ResourcesServerURL = "http://h/?x=1" }, "resources_server_url"},
		{"negative max_steps", func(c *agent.Config) { c.MaxSteps = -1 }, "max_steps"},
		{"checkpoint without token", func(c *agent.Config) { c.Checkpoint = ctlplane.Config{Enabled: true, LeaseGraceSeconds: 1} }, "control_auth_token"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := agent.DefaultConfig()
			c.mutate(&cfg)
			err := cfg.Validate()
			if (err == nil) != (c.errHas == "") || (err != nil && !strings.Contains(err.Error(), c.errHas)) {
				t.Errorf("Validate() = %v, want error containing %q", err, c.errHas)
			}
		})
	}
	p := agent.DefaultProcessConfig()
	if err := p.Validate(); err == nil {
		t.Error("a process with no agents validated")
	}
	a, b := agent.DefaultConfig(), agent.DefaultConfig()
	b.Name = "other"
	a.Listen, b.Listen = "127.0.0.1:5", "127.0.0.1:5"
	p.Agents = []agent.Config{a, b}
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "both listen") {
		t.Errorf("duplicate listen: %v", err)
	}
	b.Name = a.Name
	b.Listen = "127.0.0.1:6"
	p.Agents = []agent.Config{a, b}
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate name: %v", err)
	}
}

// The loop result decodes as a Responses object.
func TestActivation_ReplyIsAResponse(t *testing.T) {
	ta := newFixture(t, nil, oneRound()...)
	r := ta.post("/ng-rollout/r/v1/responses", nil, weatherParams)
	var got openai.Response
	if err := json.Unmarshal([]byte(r.body), &got); err != nil || got.Object != "response" || len(got.Output) != 3 || got.Usage.TotalTokens != 42 {
		t.Errorf("reply %s: %v", r.body, err)
	}
}

// TestActivation_TokenFieldsCarriedThrough: the token fields of a model's
// output items go on, as the model wrote them, into the next model call's
// input and into the reply, checkpointing on (where the loop holds them
// only in its boundary record, Item.Compact) as off.
func TestActivation_TokenFieldsCarriedThrough(t *testing.T) {
	const tokens = `,"prompt_token_ids":[1,3,9,7234],"generation_token_ids":[11,3182,2],"generation_log_probs":[-2.3124,-0.5,-1e-7]`
	withTokens := func(item string) string { return strings.TrimSuffix(item, "}") + tokens + "}" }
	script := func() []string {
		return []string{
			resp("resp_1", usage(10, 5, "0"), withTokens(fc("c1", "get_weather", getWeatherParis))),
			resp("resp_2", usage(20, 7, "3"), withTokens(msg("The weather in Paris is cold."))),
		}
	}
	run := func(mutate func(*agent.Config)) (secondInput, output string) {
		ta := newFixture(t, mutate, script()...)
		ta.open("r", "s", "rs")
		r := ta.activate("r", "s", "1", weatherParams)
		if r.status != 200 {
			t.Fatalf("activation: %d %s", r.status, r.body)
		}
		calls := ta.rec.of("model")
		if len(calls) != 2 {
			t.Fatalf("%d model calls, want 2", len(calls))
		}
		return field(t, calls[1].body, "input"), field(t, r.body, "output")
	}
	offInput, offOutput := run(nil)
	onInput, onOutput := run(withCheckpoint)
	if onInput != offInput {
		t.Errorf("second model input, checkpointing on:\n got %s\nwant %s", onInput, offInput)
	}
	if onOutput != offOutput {
		t.Errorf("reply output, checkpointing on:\n got %s\nwant %s", onOutput, offOutput)
	}
	if n := strings.Count(onInput, tokens); n != 1 {
		t.Errorf("second model input carries the first reply's token fields %d times, want once: %s", n, onInput)
	}
	if n := strings.Count(onOutput, tokens); n != 2 {
		t.Errorf("reply output carries token fields %d times, want 2: %s", n, onOutput)
	}
}
