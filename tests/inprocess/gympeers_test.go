package inprocess_test

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"sync"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/servers/agent"
	"github.com/gymfleet/gymfleet/pkg/servers/environment"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/tests/fleettest"
	"github.com/gymfleet/gymfleet/tests/gymstandin"
)

// This file puts our servers next to NeMo Gym's, which uvicorn serves over
// HTTP/1.1 only: our environment and agents call their peers h2c first and
// must fall back to HTTP/1.1 for them (httpclient.ProtocolAuto).

// gymPeer is a minimal stand-in for one of NeMo Gym's servers at the HTTP
// layer: served as uvicorn serves it (gymstandin.StartUvicorn: HTTP/1.1
// only, the h2c preface answered as uvicorn answers it), FastAPI's 404 for a
// route it does not have. It records what reaches its routes.
type gymPeer struct {
	*gymstandin.Uvicorn
	mu   sync.Mutex
	seen []gymCall
}

// gymCall is one request that reached a route.
type gymCall struct {
	path  string
	proto string
	body  string
}

func startGymPeer(t *testing.T, routes map[string]func(body map[string]json.RawMessage) any, stripRollout bool) *gymPeer {
	t.Helper()
	p := &gymPeer{}
	p.Uvicorn = gymstandin.StartUvicorn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path := r.URL.Path
		if stripRollout {
			if m := rolloutPrefix.FindStringSubmatch(path); m != nil {
				path = m[1]
			}
		}
		b, _ := io.ReadAll(r.Body)
		p.mu.Lock()
		p.seen = append(p.seen, gymCall{path: path, proto: r.Proto, body: string(b)})
		p.mu.Unlock()
		route, ok := routes[path]
		if !ok || r.Method != http.MethodPost {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"detail":"Not Found"}`)
			return
		}
		var in map[string]json.RawMessage
		if err := json.Unmarshal(b, &in); err != nil {
			http.Error(w, `{"detail":"body is not a JSON object"}`, http.StatusUnprocessableEntity)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(route(in))
	}))
	return p
}

// rolloutPrefix is the capture prefix NeMo Gym's resources servers strip
// before routing (RolloutContextMiddleware, nemo_gym/rollout_correlation.py
// 93-115 at 07d6b0d07b22).
var rolloutPrefix = regexp.MustCompile(`^/ng-rollout/[^/]+(/.*)$`)

// calls is what reached path.
func (p *gymPeer) calls(path string) []gymCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []gymCall
	for _, c := range p.seen {
		if c.path == path {
			out = append(out, c)
		}
	}
	return out
}

// h2cClient is the client the tests post /run with: h2c, as our servers
// call each other.
func h2cClient(t *testing.T) *http.Client {
	c := httpclient.New(httpclient.Options{H2C: true})
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// gymRunReply is what NeMo Gym's simple agent's /run returns, a
// BaseVerifyResponse (responses_api_agents/simple_agent/app.py 277-365 at
// 07d6b0d07b22): the row's responses_create_params, the agent's response
// and the reward.
func gymRunReply(row map[string]json.RawMessage) any {
	return map[string]any{
		"responses_create_params": row["responses_create_params"],
		"response": map[string]any{
			"id": "resp_gym", "object": "response", "status": "completed",
			"output": []any{map[string]any{
				"type": "message", "role": "assistant", "id": "msg_gym", "status": "completed",
				"content": []any{map[string]any{"type": "output_text", "text": "The weather in Paris is cold.", "annotations": []any{}}},
			}},
		},
		"reward": 1.0,
	}
}

// Ensure our environment server (legacy protocol: it relays /run to the
// agent) drives a NeMo Gym agent, which speaks HTTP/1.1 only, and returns
// its reply.
func TestMixedFleet_EnvironmentDrivesAGymAgent(t *testing.T) {
	// NeMo Gym's agents route /run only (nemo_gym/base_responses_api_agent.py
	// 68-90 at 07d6b0d07b22); our environment posts it under the
	// /ng-rollout/<capture_key> prefix, so this stand-in strips the prefix
	// as Gym's resources servers do. That path is not what this test is
	// about: it checks the protocol our environment speaks to the agent.
	agent := startGymPeer(t, map[string]func(map[string]json.RawMessage) any{"/run": gymRunReply}, true)

	ecfg := environment.DefaultConfig()
	ecfg.Listen, ecfg.Name, ecfg.Protocol = "127.0.0.1:0", "env_gym_agent", environment.ProtocolLegacy
	ecfg.Agents = []environment.AgentConfig{{Name: "gym_simple_agent", URL: agent.URL}}
	env, err := environment.New(ecfg, environment.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	envURL := fleettest.Serve(t, "env_gym_agent", env)

	f := &testFleet{envURLs: map[string]string{environment.ProtocolLegacy: envURL}, client: h2cClient(t)}
	for i, id := range []string{"gym-agent-0", "gym-agent-1"} {
		row := []byte(`{"_ng_rollout_id":"` + id + `","responses_create_params":{"input":[{"role":"user","content":"What is the weather in Paris?"}]},"agent_ref":{"name":"gym_simple_agent"}}`)
		status, body := f.postRun(t.Context(), t, environment.ProtocolLegacy, row)
		if status != http.StatusOK {
			t.Fatalf("/run %d = %d %s", i, status, body)
		}
		var rep runReply
		if err := json.Unmarshal(body, &rep); err != nil {
			t.Fatalf("/run %d reply: %v", i, err)
		}
		if rep.Reward != 1.0 || rep.EpisodeID.RolloutID != id || len(rep.Response.Output) != 1 {
			t.Errorf("/run %d reply %s: want the agent's reward 1.0 and response, episode %s", i, body, id)
		}
	}
	runs := agent.calls("/run")
	if len(runs) != 2 {
		t.Fatalf("the Gym agent saw %d /run, want 2 (each once)", len(runs))
	}
	for _, c := range runs {
		if c.proto != "HTTP/1.1" {
			t.Errorf("/run came over %s, want HTTP/1.1", c.proto)
		}
	}
	if n := agent.Probes(); n != 1 {
		t.Errorf("the Gym agent was sent %d h2c prefaces, want 1 (the environment remembers the host)", n)
	}
}

// Ensure our agents (and our single_agent_turn environment, which seeds and
// verifies) drive a NeMo Gym resources server, which speaks HTTP/1.1 only,
// to reward 1.0 with the tool call going over HTTP/1.1.
func TestMixedFleet_AgentCallsAGymResourcesServer(t *testing.T) {
	// NeMo Gym's example_single_tool_call weather server
	// (resources_servers/example_single_tool_call/app.py 30-53 at
	// 07d6b0d07b22) behind Gym's RolloutContextMiddleware.
	weather := startGymPeer(t, map[string]func(map[string]json.RawMessage) any{
		"/seed_session": func(map[string]json.RawMessage) any { return map[string]any{} },
		"/get_weather": func(in map[string]json.RawMessage) any {
			var city string
			_ = json.Unmarshal(in["city"], &city)
			return map[string]any{"city": city, "weather_description": "The weather in " + city + " is cold."}
		},
		// BaseVerifyResponse(**body.model_dump(), reward=1.0).
		"/verify": func(in map[string]json.RawMessage) any {
			return map[string]any{"responses_create_params": in["responses_create_params"], "response": in["response"], "reward": 1.0}
		},
	}, true)

	// Our weather agent and environments, configured with nothing but the
	// Gym server's URL: the protocol is found out, not configured.
	fcfg := fakeinference.DefaultConfig()
	fcfg.Listen, fcfg.TokensPerSecond, fcfg.MinCallSeconds = "127.0.0.1:0", 0, 0
	fake, err := fakeinference.New(fcfg, fakeinference.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	modelURL := fleettest.StartModelServer(t, fleettest.Serve(t, "fakeinference", fake)+"/v1", fcfg.Model, true)
	acfg := agent.DefaultConfig()
	acfg.Name, acfg.Listen = fleettest.WeatherAgent, "127.0.0.1:0"
	acfg.ModelServerURL, acfg.ResourcesServerURL, acfg.MaxSteps = modelURL, weather.URL, 10
	as, err := agent.New(acfg, agent.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	agentURL := fleettest.Serve(t, acfg.Name, as)
	f := &testFleet{envURLs: map[string]string{}, client: h2cClient(t)}
	for _, protocol := range []string{environment.ProtocolSingleAgentTurn, environment.ProtocolLegacy} {
		ecfg := environment.DefaultConfig()
		ecfg.Listen, ecfg.Name, ecfg.Protocol = "127.0.0.1:0", "env_"+protocol, protocol
		ecfg.Agents = []environment.AgentConfig{{Name: acfg.Name, URL: agentURL, ResourcesURL: weather.URL}}
		env, err := environment.New(ecfg, environment.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		f.envURLs[protocol] = fleettest.Serve(t, ecfg.Name, env)
	}
	row := loadDataset(t, "weather.jsonl")[0] // asks for get_weather {"city": "Paris"}
	protocols := []string{environment.ProtocolLegacy, environment.ProtocolSingleAgentTurn}
	for _, protocol := range protocols {
		id := "gym-resources-" + protocol
		status, body := f.postRun(t.Context(), t, protocol, row.withID(id))
		if status != http.StatusOK {
			t.Fatalf("%s /run = %d %s", protocol, status, body)
		}
		var rep runReply
		if err := json.Unmarshal(body, &rep); err != nil {
			t.Fatalf("%s reply: %v", protocol, err)
		}
		if rep.Reward != 1.0 || rep.EpisodeID.RolloutID != id {
			t.Errorf("%s reply %s: want reward 1.0 for %s", protocol, body, id)
		}
	}
	tools := weather.calls("/get_weather")
	if len(tools) != len(protocols) {
		t.Fatalf("the Gym resources server saw %d get_weather calls, want %d (one per run)", len(tools), len(protocols))
	}
	for _, c := range tools {
		if c.proto != "HTTP/1.1" || c.body != `{"city":"Paris"}` {
			t.Errorf("get_weather over %s with %s, want HTTP/1.1 with {\"city\":\"Paris\"}", c.proto, c.body)
		}
	}
	if v := weather.calls("/verify"); len(v) != len(protocols) {
		t.Errorf("the Gym resources server saw %d /verify, want %d", len(v), len(protocols))
	}
	// The weather agent and the single_agent_turn environment (which seeds
	// and verifies itself) each probe it once and then remember it; the
	// legacy environment leaves the resources server to the agent.
	if n := weather.Probes(); n != 2 {
		t.Errorf("the Gym resources server was sent %d h2c prefaces, want 2", n)
	}
}
