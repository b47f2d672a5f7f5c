package environment_test

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/servers/environment"
)

const (
	row          = `{"responses_create_params":{"input":"What is the weather in Paris?","tools":[]},"city":"Paris","_ng_task_index":7,"_ng_rollout_index":0,"agent_ref":{"type":"responses_api_agents","name":"weather_agent"}}`
	agentReply   = `{"id":"resp_1","object":"response","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"sunny"}]}]}`
	observations = `{"session_id":"x","closed":true,"observations":{"model_calls":2,"tool_calls":1}}`
	verifyReply  = `{"responses_create_params":{"input":"What is the weather in Paris?","tools":[]},"response":{"id":"resp_1"},"reward":1.0,"city":"Paris"}`
)

var (
	resourcesSession = regexp.MustCompile(`^resources-session-[0-9a-f]{32}$`)
	agentSession     = regexp.MustCompile(`^agent-session-[0-9a-f]{32}$`)
)

// fixture is an environment server in front of one agent and one resources
// stand-in; routes default to a successful episode.
type fixture struct {
	rec    *recorder
	env    *environment.Server
	url    string
	agents map[string]route
	res    map[string]route
}

func defaultAgentRoutes() map[string]route {
	return map[string]route{
		"/v1/agent_sessions":       jsonReply(200, `{"session_id":"x"}`),
		"/v1/responses":            jsonReply(200, agentReply),
		"/v1/agent_sessions/close": jsonReply(200, observations),
		"/run":                     jsonReply(200, verifyReply),
	}
}

func defaultResourcesRoutes() map[string]route {
	return map[string]route{
		"/seed_session":  jsonReply(200, `{}`),
		"/verify":        jsonReply(200, verifyReply),
		"/close_session": jsonReply(200, `{}`),
	}
}

func newFixture(t *testing.T, protocol string, edit func(agent, res map[string]route)) *fixture {
	t.Helper()
	f := &fixture{rec: newRecorder(), agents: defaultAgentRoutes(), res: defaultResourcesRoutes()}
	if edit != nil {
		edit(f.agents, f.res)
	}
	agent := newStandIn(t, "agent", f.rec, f.agents)
	res := newStandIn(t, "resources", f.rec, f.res)
	cfg := environment.DefaultConfig()
	cfg.Protocol = protocol
	cfg.CleanupTimeout = 5 * time.Second
	cfg.Agents = []environment.AgentConfig{{Name: "weather_agent", URL: agent.URL, ResourcesURL: res.URL}}
	f.env, f.url = startEnv(t, cfg)
	return f
}

func TestRun_SingleAgentTurnSequence(t *testing.T) {
	f := newFixture(t, environment.ProtocolSingleAgentTurn, nil)
	status, body, err := postRun(t.Context(), t, f.url, row)
	if err != nil || status != 200 {
		t.Fatalf("/run = %d %s, %v", status, body, err)
	}
	assertJSON(t, "reply", body, `{"responses_create_params":{"input":"What is the weather in Paris?","tools":[]},"response":{"id":"resp_1"},"reward":1.0,"city":"Paris","episode_id":{"rollout_id":"7-0","attempt":0},"observations":{"model_calls":2,"tool_calls":1}}`)

	calls := f.rec.snapshot()
	wantPaths := []string{
		"resources /ng-rollout/7-0/seed_session",
		"agent /ng-rollout/7-0/v1/agent_sessions",
		"agent /ng-rollout/7-0/v1/responses",
		"agent /ng-rollout/7-0/v1/agent_sessions/close",
		"resources /ng-rollout/7-0/verify",
		"resources /ng-rollout/7-0/close_session",
	}
	if got := f.rec.paths(); strings.Join(got, "\n") != strings.Join(wantPaths, "\n") {
		t.Fatalf("requests:\n got  %q\n want %q", got, wantPaths)
	}
	rs := calls[0].Headers[environment.HeaderSessionID]
	as := calls[2].Headers[environment.HeaderAgentSession]
	if !resourcesSession.MatchString(rs) || !agentSession.MatchString(as) {
		t.Fatalf("session ids %q, %q do not have the resources-session-<hex> / agent-session-<hex> shape", rs, as)
	}

	// Seed: the whole row, under the resources session.
	assertJSON(t, "seed body", calls[0].Body, row)
	// Agent session: bound to the resources session, carrying the row.
	assertJSON(t, "agent session body", calls[1].Body, `{"session_id":"`+as+`","resources_session_id":"`+rs+`","request":`+row+`}`)
	// Activation 1 on the row's responses_create_params.
	if calls[2].Headers[environment.HeaderActivation] != "1" {
		t.Errorf("activation header = %q, want 1", calls[2].Headers[environment.HeaderActivation])
	}
	assertJSON(t, "responses body", calls[2].Body, `{"input":"What is the weather in Paris?","tools":[]}`)
	assertJSON(t, "close body", calls[3].Body, `{"session_id":"`+as+`"}`)
	// Verify: the row plus the agent's response.
	wantVerify := strings.TrimSuffix(row, "}") + `,"response":` + agentReply + `}`
	assertJSON(t, "verify body", calls[4].Body, wantVerify)
	for _, i := range []int{0, 4, 5} {
		if got := calls[i].Headers[environment.HeaderSessionID]; got != rs {
			t.Errorf("%s: %s = %q, want %q", calls[i].Path, environment.HeaderSessionID, got, rs)
		}
	}
	if len(f.env.Live()) != 0 {
		t.Errorf("episode still live after its reply: %+v", f.env.Live())
	}
}

func TestRun_Legacy(t *testing.T) {
	f := newFixture(t, environment.ProtocolLegacy, nil)
	legacyRow := strings.Replace(row, `"_ng_task_index":7,"_ng_rollout_index":0`, `"_ng_rollout_id":"r1","_ng_attempt_index":2`, 1)
	status, body, err := postRun(t.Context(), t, f.url, legacyRow)
	if err != nil || status != 200 {
		t.Fatalf("/run = %d %s, %v", status, body, err)
	}
	assertJSON(t, "reply", body, strings.TrimSuffix(verifyReply, "}")+`,"episode_id":{"rollout_id":"r1","attempt":2}}`)
	calls := f.rec.snapshot()
	if len(calls) != 1 || calls[0].Server != "agent" || calls[0].Path != "/ng-rollout/r1-a2/run" {
		t.Fatalf("requests = %v, want one agent /ng-rollout/r1-a2/run", f.rec.paths())
	}
	assertJSON(t, "run body", calls[0].Body, legacyRow)
}

func TestRun_AgentProtocolOverride(t *testing.T) {
	rec := newRecorder()
	agent := newStandIn(t, "agent", rec, defaultAgentRoutes())
	cfg := environment.DefaultConfig()
	cfg.Agents = []environment.AgentConfig{{Name: "weather_agent", URL: agent.URL, Protocol: environment.ProtocolLegacy}}
	_, url := startEnv(t, cfg)
	status, body, err := postRun(t.Context(), t, url, row)
	if err != nil || status != 200 {
		t.Fatalf("/run = %d %s, %v", status, body, err)
	}
	if got := rec.paths(); len(got) != 1 || got[0] != "agent /ng-rollout/7-0/run" {
		t.Fatalf("requests = %v, want the legacy relay", got)
	}
}

func TestRun_CleanupOnFailures(t *testing.T) {
	fail := jsonReply(500, `{"error":{"code":"internal","detail":"boom"}}`)
	tests := []struct {
		name  string
		edit  func(agent, res map[string]route)
		paths []string
	}{
		{
			name: "seed fails",
			edit: func(_, res map[string]route) { res["/seed_session"] = fail },
			paths: []string{
				"resources /ng-rollout/7-0/seed_session",
				"resources /ng-rollout/7-0/close_session",
			},
		},
		{
			name: "agent session open fails",
			edit: func(agent, _ map[string]route) { agent["/v1/agent_sessions"] = fail },
			paths: []string{
				"resources /ng-rollout/7-0/seed_session",
				"agent /ng-rollout/7-0/v1/agent_sessions",
				"agent /ng-rollout/7-0/v1/agent_sessions/close",
				"resources /ng-rollout/7-0/close_session",
			},
		},
		{
			name: "agent activation fails",
			edit: func(agent, _ map[string]route) { agent["/v1/responses"] = fail },
			paths: []string{
				"resources /ng-rollout/7-0/seed_session",
				"agent /ng-rollout/7-0/v1/agent_sessions",
				"agent /ng-rollout/7-0/v1/responses",
				"agent /ng-rollout/7-0/v1/agent_sessions/close",
				"resources /ng-rollout/7-0/close_session",
			},
		},
		{
			name: "agent answers a non-object",
			edit: func(agent, _ map[string]route) { agent["/v1/responses"] = jsonReply(200, `[]`) },
			paths: []string{
				"resources /ng-rollout/7-0/seed_session",
				"agent /ng-rollout/7-0/v1/agent_sessions",
				"agent /ng-rollout/7-0/v1/responses",
				"agent /ng-rollout/7-0/v1/agent_sessions/close",
				"resources /ng-rollout/7-0/close_session",
			},
		},
		{
			name: "verify fails",
			edit: func(_, res map[string]route) { res["/verify"] = fail },
			paths: []string{
				"resources /ng-rollout/7-0/seed_session",
				"agent /ng-rollout/7-0/v1/agent_sessions",
				"agent /ng-rollout/7-0/v1/responses",
				"agent /ng-rollout/7-0/v1/agent_sessions/close",
				"resources /ng-rollout/7-0/verify",
				// The agent session is closed already: cleanup does not close it twice.
				"resources /ng-rollout/7-0/close_session",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, environment.ProtocolSingleAgentTurn, tc.edit)
			status, body, err := postRun(t.Context(), t, f.url, row)
			if err != nil {
				t.Fatal(err)
			}
			if status != http.StatusBadGateway || !strings.Contains(body, `"code":"upstream_error"`) {
				t.Errorf("/run = %d %s, want 502 upstream_error", status, body)
			}
			if got := f.rec.paths(); strings.Join(got, "\n") != strings.Join(tc.paths, "\n") {
				t.Errorf("requests:\n got  %q\n want %q", got, tc.paths)
			}
		})
	}
}

func TestRun_UpstreamUnreachable(t *testing.T) {
	cfg := environment.DefaultConfig()
	// A port nothing listens on: the listener is closed before the run.
	dead := newStandIn(t, "dead", newRecorder(), nil)
	dead.Close()
	cfg.Agents = []environment.AgentConfig{{Name: "a", URL: dead.URL, ResourcesURL: dead.URL}}
	_, url := startEnv(t, cfg)
	status, body, err := postRun(t.Context(), t, url, row[:len(row)-len(`,"agent_ref":{"type":"responses_api_agents","name":"weather_agent"}}`)]+"}")
	if err != nil {
		t.Fatal(err)
	}
	if status != http.StatusBadGateway || !strings.Contains(body, "stage seed") {
		t.Errorf("/run = %d %s, want 502 naming stage seed", status, body)
	}
}

func TestRun_ClientDisconnectStillCleansUp(t *testing.T) {
	release := make(chan struct{})
	f := newFixture(t, environment.ProtocolSingleAgentTurn, func(agent, _ map[string]route) {
		agent["/v1/responses"] = func(w http.ResponseWriter, r *http.Request, _ []byte) {
			// Blocks until the environment abandons the call.
			select {
			case <-r.Context().Done():
			case <-release:
			}
		}
	})
	defer close(release)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, _, err := postRun(ctx, t, f.url, row)
		errc <- err
	}()
	f.rec.waitFor(t, "agent /ng-rollout/7-0/v1/responses")
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the cancelled /run returned without an error")
	}
	f.rec.waitFor(t, "agent /ng-rollout/7-0/v1/agent_sessions/close")
	f.rec.waitFor(t, "resources /ng-rollout/7-0/close_session")
	waitUntil(t, "the episode leaves the live map", func() bool { return len(f.env.Live()) == 0 })
}

func TestRun_EpisodeTimeout(t *testing.T) {
	rec := newRecorder()
	agentRoutes := defaultAgentRoutes()
	agentRoutes["/v1/responses"] = func(_ http.ResponseWriter, r *http.Request, _ []byte) { <-r.Context().Done() }
	agent := newStandIn(t, "agent", rec, agentRoutes)
	res := newStandIn(t, "resources", rec, defaultResourcesRoutes())
	cfg := environment.DefaultConfig()
	cfg.EpisodeTimeout = 200 * time.Millisecond
	cfg.Agents = []environment.AgentConfig{{Name: "weather_agent", URL: agent.URL, ResourcesURL: res.URL}}
	_, url := startEnv(t, cfg)
	status, body, err := postRun(t.Context(), t, url, row)
	if err != nil {
		t.Fatal(err)
	}
	if status != http.StatusGatewayTimeout || !strings.Contains(body, `"code":"upstream_timeout"`) {
		t.Errorf("/run = %d %s, want 504 upstream_timeout", status, body)
	}
	got := rec.paths()
	if n := len(got); n < 2 || got[n-2] != "agent /ng-rollout/7-0/v1/agent_sessions/close" || got[n-1] != "resources /ng-rollout/7-0/close_session" {
		t.Errorf("requests %q do not end with the final cleanup", got)
	}
}

func TestRun_DuplicateIsRefusedAndLiveOneUndisturbed(t *testing.T) {
	release := make(chan struct{})
	f := newFixture(t, environment.ProtocolSingleAgentTurn, func(agent, _ map[string]route) {
		agent["/v1/responses"] = func(w http.ResponseWriter, r *http.Request, _ []byte) {
			<-release
			jsonReply(200, agentReply)(w, r, nil)
		}
	})
	type result struct {
		status int
		body   string
		err    error
	}
	first := make(chan result, 1)
	go func() {
		s, b, err := postRun(t.Context(), t, f.url, row)
		first <- result{s, b, err}
	}()
	f.rec.waitFor(t, "agent /ng-rollout/7-0/v1/responses")

	status, body, err := postRun(t.Context(), t, f.url, row)
	if err != nil {
		t.Fatal(err)
	}
	if status != http.StatusConflict || !strings.Contains(body, `"code":"episode_running"`) {
		t.Errorf("duplicate /run = %d %s, want 409 episode_running", status, body)
	}
	close(release)
	r := <-first
	if r.err != nil || r.status != 200 {
		t.Fatalf("first /run = %d %s, %v", r.status, r.body, r.err)
	}
	if got := f.rec.paths(); len(got) != 6 {
		t.Errorf("the duplicate reached an upstream: %q", got)
	}
	// The attempt is free again once the first finished.
	if status, body, _ := postRun(t.Context(), t, f.url, row); status != 200 {
		t.Errorf("rerun after the first finished = %d %s", status, body)
	}
}

func TestRun_VerifyModeFromSeedReply(t *testing.T) {
	for _, tc := range []struct {
		header string
		want   environment.Mode
	}{
		{"replay", environment.ModeReplay},
		{"wait", environment.ModeWait},
		{"", environment.ModeWait},
		{"bogus", environment.ModeWait},
	} {
		t.Run("header="+tc.header, func(t *testing.T) {
			release := make(chan struct{})
			f := newFixture(t, environment.ProtocolSingleAgentTurn, func(agent, res map[string]route) {
				res["/seed_session"] = func(w http.ResponseWriter, r *http.Request, _ []byte) {
					if tc.header != "" {
						w.Header().Set(environment.HeaderCheckpointVerify, tc.header)
					}
					jsonReply(200, `{}`)(w, r, nil)
				}
				agent["/v1/responses"] = func(w http.ResponseWriter, r *http.Request, _ []byte) {
					<-release
					jsonReply(200, agentReply)(w, r, nil)
				}
			})
			done := make(chan int, 1)
			go func() {
				s, _, _ := postRun(t.Context(), t, f.url, row)
				done <- s
			}()
			f.rec.waitFor(t, "agent /ng-rollout/7-0/v1/responses")
			live := f.env.Live()
			close(release)
			if len(live) != 1 {
				t.Fatalf("live = %+v, want one episode", live)
			}
			b := live[0].Boundary
			if b.Next != environment.StageInvokeAgent || b.Handles.ResourcesVerify != tc.want {
				t.Errorf("boundary = %+v, want next invoke_agent with resources_verify %q", b, tc.want)
			}
			if live[0].Episode.CaptureKey() != "7-0" || live[0].Protocol != environment.ProtocolSingleAgentTurn {
				t.Errorf("live episode = %+v", live[0])
			}
			if s := <-done; s != 200 {
				t.Errorf("/run = %d", s)
			}
		})
	}
}

func TestRun_BadRequests(t *testing.T) {
	f := newFixture(t, environment.ProtocolSingleAgentTurn, nil)
	tests := []struct {
		name, body string
		status     int
		code       string
	}{
		{"bad _rowidx", `{"responses_create_params":{"input":"x"},"_rowidx":-1}`, 400, "invalid_request"},
		{"bad attempt string", `{"responses_create_params":{"input":"x"},"_ng_rollout_id":"r","_ng_attempt_index":"one"}`, 400, "invalid_request"},
		{"rollout id past the bound", `{"responses_create_params":{"input":"x"},"_ng_rollout_id":"` + strings.Repeat("r", 225) + `"}`, 400, "bound of 224 bytes"},
		{"no responses_create_params", `{"_ng_rollout_id":"r"}`, 400, "invalid_request"},
		{"null responses_create_params", `{"_ng_rollout_id":"r","responses_create_params":null}`, 400, "invalid_request"},
		{"not an object", `[1,2]`, 400, "invalid_request"},
		{"malformed", `{"responses_create_params":`, 400, "invalid_request"},
		{"empty", ``, 400, "invalid_request"},
		{"bad rollout id", `{"responses_create_params":{},"_ng_rollout_id":"bad id"}`, 400, "invalid_request"},
		{"negative attempt", `{"responses_create_params":{},"_ng_rollout_id":"r","_ng_attempt_index":-1}`, 400, "invalid_request"},
		{"unknown agent", `{"responses_create_params":{},"_ng_rollout_id":"r","agent_ref":{"name":"nope"}}`, 400, "invalid_request"},
		{"agent_ref without name", `{"responses_create_params":{},"_ng_rollout_id":"r","agent_ref":{"type":"x"}}`, 400, "invalid_request"},
		{"agent_ref a string", `{"responses_create_params":{},"_ng_rollout_id":"r","agent_ref":"weather_agent"}`, 400, "invalid_request"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body, err := postRun(t.Context(), t, f.url, tc.body)
			if err != nil {
				t.Fatal(err)
			}
			if status != tc.status || !(strings.Contains(body, `"code":"`+tc.code+`"`) || strings.Contains(body, tc.code)) {
				t.Errorf("/run = %d %s, want %d %s", status, body, tc.status, tc.code)
			}
		})
	}
	if got := f.rec.paths(); len(got) != 0 {
		t.Errorf("refused rows reached upstreams: %q", got)
	}
}

func TestRun_AgentRefSelectsAgent(t *testing.T) {
	rec := newRecorder()
	a1 := newStandIn(t, "first", rec, defaultAgentRoutes())
	a2 := newStandIn(t, "second", rec, defaultAgentRoutes())
	res := newStandIn(t, "resources", rec, defaultResourcesRoutes())
	cfg := environment.DefaultConfig()
	cfg.Protocol = environment.ProtocolLegacy
	cfg.DefaultAgent = "counter_agent"
	cfg.Agents = []environment.AgentConfig{
		{Name: "weather_agent", URL: a1.URL, ResourcesURL: res.URL},
		{Name: "counter_agent", URL: a2.URL, ResourcesURL: res.URL},
	}
	_, url := startEnv(t, cfg)
	if s, b, _ := postRun(t.Context(), t, url, row); s != 200 {
		t.Fatalf("/run = %d %s", s, b)
	}
	if s, b, _ := postRun(t.Context(), t, url, `{"responses_create_params":{},"_ng_rollout_id":"r2"}`); s != 200 {
		t.Fatalf("/run = %d %s", s, b)
	}
	want := []string{"first /ng-rollout/7-0/run", "second /ng-rollout/r2/run"}
	if got := rec.paths(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("requests = %q, want %q", got, want)
	}
}

func TestRun_PrefixedPath(t *testing.T) {
	f := newFixture(t, environment.ProtocolLegacy, nil)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, f.url+"/ng-rollout/pre-a1/run", strings.NewReader(`{"responses_create_params":{}}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("prefixed /run = %d", resp.StatusCode)
	}
	if got := f.rec.paths(); len(got) != 1 || got[0] != "agent /ng-rollout/pre-a1/run" {
		t.Errorf("requests = %q", got)
	}
	// A prefix that disagrees with the row is refused.
	req, _ = http.NewRequestWithContext(t.Context(), http.MethodPost, f.url+"/ng-rollout/pre/run", strings.NewReader(`{"responses_create_params":{},"_ng_rollout_id":"other"}`))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("mismatched prefix /run = %d, want 400", resp.StatusCode)
	}
}

func TestRun_Metrics(t *testing.T) {
	f := newFixture(t, environment.ProtocolSingleAgentTurn, nil)
	if s, b, _ := postRun(t.Context(), t, f.url, row); s != 200 {
		t.Fatalf("/run = %d %s", s, b)
	}
	resp, err := http.Get(f.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	_, _ = io.Copy(&sb, resp.Body)
	text := sb.String()
	for _, want := range []string{
		`gymfleet_env_episodes_total{outcome="ok",protocol="single_agent_turn"} 1`,
		`gymfleet_rollouts_in_flight 0`,
		`gymfleet_env_stage_seconds_count{stage="verify"} 1`,
		`gymfleet_env_stage_seconds_count{stage="seed"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}
