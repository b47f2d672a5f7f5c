package gym

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/gymfleet/gymfleet/tests/interop/interoptest"
)

// gymInstance is a Gym server's instance block.
func gymInstance(kind, impl string, port int, fields map[string]any) map[string]any {
	inner := map[string]any{"entrypoint": "app.py", "host": "127.0.0.1", "port": port}
	for k, v := range fields {
		inner[k] = v
	}
	return map[string]any{kind: map[string]any{impl: inner}}
}

func gymRef(kind, name string) map[string]any { return map[string]any{"type": kind, "name": name} }

// rollout is what py/rollouts.py prints for a row of a `gym eval run`.
type rollout struct {
	Task              int     `json:"task"`
	Rollout           int     `json:"rollout"`
	Agent             string  `json:"agent"`
	EnvironmentServer string  `json:"environment_server"`
	Reward            float64 `json:"reward"`
	CaptureKey        string  `json:"capture_key"`
	Calls             []struct {
		PromptTokenIDs     []int `json:"prompt_token_ids"`
		GenerationTokenIDs []int `json:"generation_token_ids"`
	} `json:"calls"`
}

// TestGymAgentsOnOurModel: Gym's simple agent, with Gym's weather and
// counter resources servers behind Gym's legacy_agent environment servers
// (which join the suite's Ray head), uses our model server on its
// training-token-capture path (token_id_capture on, the agent's flag set):
// Gym's servers start from the document our head serves (their
// NEMO_GYM_CONFIG_DICT, with Gym's instances merged in from gym.config_paths)
// and reach our model server by its name. `gym eval run --no-serve`
// collects Gym's weather and counter datasets through them, and the counter
// dataset once more through our environment relaying to Gym's agent (a route
// marked gym: true). Every row earns Gym's reward, reads as NeMo RL reads it,
// and our model server's capture ledger holds each rollout's model calls
// under Gym's capture key, token for token what the rollout returned.
func TestGymAgentsOnOurModel(t *testing.T) {
	p := takePorts(t, 6)
	weather, counter, weatherAgent, counterAgent, weatherEnv, counterEnv := p[0], p[1], p[2], p[3], p[4], p[5]
	dir := t.TempDir()
	gymConfig := writeYAML(t, dir, "gym.yaml", map[string]any{
		"ray_head_node_address": rayAddr,
		// Training capture on, read back by nobody in Gym (our ledger is
		// the store): token_id_capture.rebuild_response false.
		"token_id_capture": map[string]any{"enabled": true, "rebuild_response": false},
		"gym_weather":      gymInstance("resources_servers", "example_single_tool_call", weather, map[string]any{"domain": "agent"}),
		"gym_counter":      gymInstance("resources_servers", "example_session_state_mgmt", counter, map[string]any{"domain": "agent"}),
		"gym_weather_agent": gymInstance("responses_api_agents", "simple_agent", weatherAgent, map[string]any{
			"resources_server": gymRef("resources_servers", "gym_weather"),
			"model_server":     gymRef("responses_api_models", "policy_model"),
			"token_id_capture": true, "max_steps": 8,
		}),
		"gym_counter_agent": gymInstance("responses_api_agents", "simple_agent", counterAgent, map[string]any{
			"resources_server": gymRef("resources_servers", "gym_counter"),
			"model_server":     gymRef("responses_api_models", "policy_model"),
			"token_id_capture": true, "max_steps": 8,
		}),
		"gym_weather_env": gymInstance("environment_servers", "legacy_agent", weatherEnv, map[string]any{"agent_server": gymRef("responses_api_agents", "gym_weather_agent")}),
		"gym_counter_env": gymInstance("environment_servers", "legacy_agent", counterEnv, map[string]any{"agent_server": gymRef("responses_api_agents", "gym_counter_agent")}),
	})
	f := startFleet(t, fleetSpec{
		head:           true,
		gymConfigPaths: []string{gymConfig},
		routes:         []routeSpec{{name: "relay_counter", agent: url(counterAgent), resources: url(counter), protocol: "legacy", gym: true}},
	})
	doc := f.headDocument(t)
	servers := []*interoptest.GymServer{
		startGymServer(t, "gym_weather", "resources_servers/example_single_tool_call", weather, doc),
		startGymServer(t, "gym_counter", "resources_servers/example_session_state_mgmt", counter, doc),
		startGymServer(t, "gym_weather_agent", "responses_api_agents/simple_agent", weatherAgent, doc),
		startGymServer(t, "gym_counter_agent", "responses_api_agents/simple_agent", counterAgent, doc),
		startGymServer(t, "gym_weather_env", "environment_servers/legacy_agent", weatherEnv, doc),
		startGymServer(t, "gym_counter_env", "environment_servers/legacy_agent", counterEnv, doc),
	}
	waitGymServers(t, servers...)

	var rows []map[string]any
	rows = append(rows, withAgent(gymDataset(t, "example_single_tool_call"), "gym_weather_agent")...)
	rows = append(rows, withAgent(gymDataset(t, "example_session_state_mgmt"), "gym_counter_agent")...)
	rows = append(rows, withAgent(gymDataset(t, "example_session_state_mgmt"), "relay_counter")...)
	in := filepath.Join(f.dir, "in.jsonl")
	writeJSONL(t, in, rows)
	out := filepath.Join(f.dir, "out.jsonl")
	runGym(t, f.dir, "eval", "run", "--no-serve", "--input", in, "--output", out,
		"++head_server.host=127.0.0.1", "++head_server.port="+strconv.Itoa(f.head))

	var results []rollout
	if err := json.Unmarshal(runPy(t, f.dir, "rollouts.py", out), &results); err != nil {
		t.Fatal(err)
	}
	if len(results) != len(rows) {
		t.Fatalf("%d rollouts, want %d", len(results), len(rows))
	}
	wantEnv := map[string]string{"gym_weather_agent": "gym_weather_env", "gym_counter_agent": "gym_counter_env", "relay_counter": "env"}
	for _, r := range results {
		key := fmt.Sprintf("%s task %d", r.Agent, r.Task)
		if r.Reward != 1.0 {
			t.Errorf("%s: reward %v, want 1.0", key, r.Reward)
		}
		if r.EnvironmentServer != wantEnv[r.Agent] {
			t.Errorf("%s: ran on %s, want %s", key, r.EnvironmentServer, wantEnv[r.Agent])
		}
		if r.CaptureKey != strconv.Itoa(r.Task)+"-"+strconv.Itoa(r.Rollout) {
			t.Errorf("%s: capture key %q", key, r.CaptureKey)
		}
		var manifest struct {
			RolloutID string `json:"rollout_id"`
			Records   []struct {
				PromptTokenIDs     []int `json:"prompt_token_ids"`
				GenerationTokenIDs []int `json:"generation_token_ids"`
			} `json:"records"`
		}
		if err := json.Unmarshal(httpGet(t, f.model+"/capture/rollouts/"+r.CaptureKey+"/manifest"), &manifest); err != nil {
			t.Fatal(err)
		}
		if len(manifest.Records) != len(r.Calls) {
			t.Errorf("%s: our ledger has %d calls under %s, the rollout returned %d", key, len(manifest.Records), r.CaptureKey, len(r.Calls))
			continue
		}
		for i, c := range r.Calls {
			rec := manifest.Records[i]
			if !slices.Equal(rec.PromptTokenIDs, c.PromptTokenIDs) || !slices.Equal(rec.GenerationTokenIDs, c.GenerationTokenIDs) {
				t.Errorf("%s: call %d of the ledger differs from the rollout's output item", key, i)
			}
		}
	}
	f.noCleanupFailures(t)
}
