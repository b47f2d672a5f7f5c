package gym

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// rlResult is what py/nemo_rl_path.py prints per result: NeMo RL's reading
// of it (nemorl.postprocess).
type rlResult struct {
	Rowidx    int     `json:"rowidx"`
	TaskIndex *int    `json:"task_index"`
	Agent     string  `json:"agent"`
	Reward    float64 `json:"reward"`
	Turns     []struct {
		PromptTokens     int `json:"prompt_tokens"`
		GenerationTokens int `json:"generation_tokens"`
	} `json:"turns"`
	Tokens    int `json:"tokens"`
	EpisodeID *struct {
		RolloutID string `json:"rollout_id"`
		Attempt   int    `json:"attempt"`
	} `json:"episode_id"`
}

// nemoRLRows makes NeMo RL's rows of a dataset: generations copies of each
// row (rollout_manager.py _build_inputs: the row's extra_env_info with
// temperature, top_p and max_output_tokens set, and _rowidx 0..n-1), with
// _ng_task_index when async (trajectory_collector.py
// _stamp_nemo_gym_task_indices: one index per prompt).
func nemoRLRows(rows []map[string]any, agent string, generations int, async bool, firstTask int) []map[string]any {
	var out []map[string]any
	for i, r := range withAgent(rows, agent) {
		params := r["responses_create_params"].(map[string]any)
		params["temperature"], params["top_p"], params["max_output_tokens"] = 1.0, 1.0, 1024
		for g := range generations {
			c := deepCopy(r)
			c["_rowidx"] = g
			if async {
				c["_ng_task_index"] = firstTask + i
			}
			out = append(out, c)
		}
	}
	return out
}

// TestNeMoRLPath: NeMo RL's call path with Gym's own code (RunHelper.start
// as NemoGym._spinup calls it, then RolloutCollectionHelper.run_examples)
// over a mixed fleet: Gym's weather and counter resources servers, which
// RunHelper starts, and our environment, agents and model server, which Gym
// finds through `gymctl gym-config`'s document in NeMo RL's config_paths.
// NeMo RL's rows (sync: _rowidx only; async: _ng_task_index and _rowidx)
// run through our environment on both of its protocols; every result reads
// as NeMo RL reads it (contiguous token ids, a float reward) and earns the
// reward Gym's own verifiers give: the counter's needs its cookie session
// seeded, incremented and verified through our agent.
func TestNeMoRLPath(t *testing.T) {
	p := takePorts(t, 3)
	gymWeather, gymCounter, headPort := p[0], p[1], p[2]
	f := startFleet(t, fleetSpec{
		agents: []agentSpec{
			{name: "weather_agent", resources: url(gymWeather), maxSteps: 6},
			{name: "counter_agent", resources: url(gymCounter), maxSteps: 8},
		},
		routes: []routeSpec{
			{name: "weather_agent", agent: ourAgent("weather_agent"), resources: url(gymWeather)},
			{name: "counter_agent", agent: ourAgent("counter_agent"), resources: url(gymCounter)},
			{name: "counter_agent_legacy", agent: ourAgent("counter_agent"), resources: url(gymCounter), protocol: "legacy"},
		},
	})
	dir := f.dir
	gymfleet := filepath.Join(dir, "gymfleet.yaml")
	doc := runCmd(t, t.Context(), dir, filepath.Join(binDir, "gymctl"), "gym-config", "--config", f.fleetFile)
	if err := os.WriteFile(gymfleet, doc, 0o644); err != nil {
		t.Fatal(err)
	}
	gymResources := writeYAML(t, dir, "gym_resources.yaml", map[string]any{
		"gym_weather": map[string]any{"resources_servers": map[string]any{"example_single_tool_call": map[string]any{
			"entrypoint": "app.py", "domain": "agent", "host": "127.0.0.1", "port": gymWeather}}},
		"gym_counter": map[string]any{"resources_servers": map[string]any{"example_session_state_mgmt": map[string]any{
			"entrypoint": "app.py", "domain": "agent", "host": "127.0.0.1", "port": gymCounter}}},
	})

	var rows []map[string]any
	weather := gymDataset(t, "example_single_tool_call")[:2]
	counter := gymDataset(t, "example_session_state_mgmt")
	rows = append(rows, nemoRLRows(weather, "weather_agent", 2, false, 0)...)
	rows = append(rows, nemoRLRows(counter, "counter_agent", 2, true, 0)...)
	rows = append(rows, nemoRLRows(counter[:2], "counter_agent_legacy", 1, true, 100)...)
	writeJSONL(t, filepath.Join(dir, "rows.jsonl"), rows)

	spec := map[string]any{
		"config_paths":      []string{gymfleet, gymResources},
		"policy_base_url":   []string{f.fake + "/v1"},
		"policy_model_name": fakeModel,
		"head_port":         headPort,
		"port_range":        runHelperPorts,
		"ray_address":       rayAddr,
		"rows_file":         filepath.Join(dir, "rows.jsonl"),
		"dotenv_dir":        dir,
		"extra_config":      gymVenvConfig(t, dir, "resources_servers/example_single_tool_call", "resources_servers/example_session_state_mgmt"),
		"out_file":          filepath.Join(dir, "nemo_rl_path.json"),
	}
	specFile := filepath.Join(dir, "spec.json")
	specJSON, _ := json.Marshal(spec)
	if err := os.WriteFile(specFile, specJSON, 0o644); err != nil {
		t.Fatal(err)
	}
	var out struct {
		Results       []rlResult `json:"results"`
		HeadInstances []string   `json:"head_instances"`
	}
	runPy(t, dir, "nemo_rl_path.py", specFile)
	b, err := os.ReadFile(filepath.Join(dir, "nemo_rl_path.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"policy_model", "weather_agent", "counter_agent", "counter_agent_legacy", "env", "gym_weather", "gym_counter"} {
		if !slices.Contains(out.HeadInstances, name) {
			t.Errorf("RunHelper's head serves no %s: %v", name, out.HeadInstances)
		}
	}
	if len(out.Results) != len(rows) {
		t.Fatalf("%d results for %d rows", len(out.Results), len(rows))
	}
	// Rows carry no rollout id; the environment names each (episode_id),
	// and no two rows, even two prompts' _rowidx 0, share one.
	ids := map[string]bool{}
	perAgent := map[string]int{}
	for _, r := range out.Results {
		task := -1
		if r.TaskIndex != nil {
			task = *r.TaskIndex
		}
		key := []any{r.Agent, task, r.Rowidx}
		perAgent[r.Agent]++
		if r.EpisodeID == nil || r.EpisodeID.RolloutID == "" {
			t.Errorf("%v: no episode_id naming the rollout id our environment gave the row", key)
		} else if ids[r.EpisodeID.RolloutID] {
			t.Errorf("%v: rollout id %s given twice", key, r.EpisodeID.RolloutID)
		} else {
			ids[r.EpisodeID.RolloutID] = true
		}
		if r.Reward != 1.0 {
			t.Errorf("%v: reward %v, want 1.0 (Gym's verifier)", key, r.Reward)
		}
		if r.Agent != "weather_agent" && len(r.Turns) < 3 {
			t.Errorf("%v: %d turns; a counter row takes its tool rounds and an answer", key, len(r.Turns))
		}
	}
	if want := map[string]int{"weather_agent": 4, "counter_agent": 10, "counter_agent_legacy": 2}; !maps.Equal(perAgent, want) {
		t.Errorf("results per agent %v, want %v", perAgent, want)
	}
	f.noCleanupFailures(t)
}

// gymVenvConfig is the configuration that lets Gym's RunHelper start its
// servers on the gym environment instead of building a uv venv per server
// (no uv, and no Python 3.13, here): skip_venv_if_present with uv_venv_dir
// holding <kind>/<name>/.venv for each server, a link to the environment.
func gymVenvConfig(t *testing.T, dir string, servers ...string) map[string]any {
	t.Helper()
	root := filepath.Join(dir, "venvs")
	for _, s := range servers {
		d := filepath.Join(root, s)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(pyenv, filepath.Join(d, ".venv")); err != nil {
			t.Fatal(err)
		}
	}
	return map[string]any{"skip_venv_if_present": true, "uv_venv_dir": root}
}
