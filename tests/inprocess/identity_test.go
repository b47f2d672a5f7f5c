package inprocess_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/servers/environment"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
)

// withFields returns the row as a /run body with fields added (no rollout
// id unless fields names one).
func (r datasetRow) withFields(fields map[string]any) []byte {
	out := make(map[string]any, len(r.fields)+len(fields))
	for k, v := range r.fields {
		out[k] = v
	}
	for k, v := range fields {
		out[k] = v
	}
	b, _ := json.Marshal(out)
	return b
}

// withSampling sets responses_create_params' sampling parameters as NeMo RL
// does (rollouts.py _prepare_nemo_gym_rows, rollout_manager.py _build_inputs
// at NeMo RL 7ea279abfbeb): temperature, top_p and max_output_tokens.
func (r datasetRow) withSampling() datasetRow {
	var params map[string]any
	_ = json.Unmarshal(r.fields["responses_create_params"], &params)
	params["temperature"], params["top_p"], params["max_output_tokens"] = 1.0, 1.0, 4096
	out := datasetRow{fields: map[string]json.RawMessage{}, agent: r.agent, modelCalls: r.modelCalls}
	for k, v := range r.fields {
		out.fields[k] = v
	}
	out.fields["responses_create_params"], _ = json.Marshal(params)
	return out
}

// upstreamCase is one row shaped as an upstream caller sends it, and the
// capture key its reply must name.
type upstreamCase struct {
	name string
	row  datasetRow
	body []byte
	key  *regexp.Regexp
}

// TestUpstreamRowShapes runs rows shaped as NeMo RL's sync path (only
// _rowidx), its async path (_ng_task_index and _rowidx) and NeMo Gym's
// collection (_ng_task_index, _ng_rollout_index, _ng_attempt_index as the
// string "1") through both environment protocols to reward 1.0: each reply
// names its episode, every model call of it is captured under that name,
// and no two rows share one.
func TestUpstreamRowShapes(t *testing.T) {
	weather := loadDataset(t, "weather.jsonl")
	counter := loadDataset(t, "counter.jsonl")
	f := startFleet(t, false)
	for _, protocol := range []string{environment.ProtocolSingleAgentTurn, environment.ProtocolLegacy} {
		t.Run(protocol, func(t *testing.T) {
			var cases []upstreamCase
			// NeMo RL sync: one batch, _rowidx 0..N-1 over every prompt.
			for i, r := range []datasetRow{weather[0], counter[1], weather[2]} {
				r = r.withSampling()
				cases = append(cases, upstreamCase{fmt.Sprintf("sync-%d", i), r, r.withFields(map[string]any{"_rowidx": i}),
					regexp.MustCompile(fmt.Sprintf(`^row%d-g[0-9a-f]{16}$`, i))})
			}
			// NeMo RL async: two prompts (task indices 40, 41), two
			// generations each, _rowidx 0..1 within a prompt.
			for p, r := range []datasetRow{counter[2], weather[1]} {
				r = r.withSampling()
				for g := range 2 {
					cases = append(cases, upstreamCase{fmt.Sprintf("async-%d-%d", p, g), r, r.withFields(map[string]any{"_ng_task_index": 40 + p, "_rowidx": g}),
						regexp.MustCompile(fmt.Sprintf(`^t%d-row%d-g[0-9a-f]{16}$`, 40+p, g))})
				}
			}
			// NeMo Gym collection, re-dispatched as attempt "1".
			task := map[string]int{environment.ProtocolSingleAgentTurn: 7, environment.ProtocolLegacy: 8}[protocol]
			for ri, r := range []datasetRow{weather[3], counter[0]} {
				cases = append(cases, upstreamCase{fmt.Sprintf("gym-%d", ri), r, r.withFields(map[string]any{"_ng_task_index": task, "_ng_rollout_index": ri, "_ng_attempt_index": "1"}),
					regexp.MustCompile(fmt.Sprintf(`^%d-%d-a1$`, task, ri))})
			}

			keys := make([]string, len(cases))
			var wg sync.WaitGroup
			for i, c := range cases {
				wg.Add(1)
				go func() {
					defer wg.Done()
					status, body := f.postRun(t.Context(), t, protocol, c.body)
					var rep runReply
					if status != 200 || json.Unmarshal(body, &rep) != nil {
						t.Errorf("%s: /run = %d %s", c.name, status, body)
						return
					}
					key := rep.EpisodeID.RolloutID
					if rep.EpisodeID.Attempt > 0 {
						key = fmt.Sprintf("%s-a%d", key, rep.EpisodeID.Attempt)
					}
					if rep.Reward != 1.0 || !c.key.MatchString(key) {
						t.Errorf("%s: reward %v, episode %s; want 1.0 and a capture key matching %v: %s", c.name, rep.Reward, key, c.key, body)
					}
					keys[i] = key
				}()
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			calls := f.modelCallsByKey(t)
			seen := map[string]bool{}
			for i, c := range cases {
				if seen[keys[i]] {
					t.Errorf("%s: capture key %s is another row's too", c.name, keys[i])
				}
				seen[keys[i]] = true
				if calls[keys[i]] != c.row.modelCalls {
					t.Errorf("%s: %d model calls under %s, want %d", c.name, calls[keys[i]], keys[i], c.row.modelCalls)
				}
				f.checkLedger(t, keys[i], c.row.modelCalls)
			}
		})
	}
}

// TestGymCollectionFlow is NeMo Gym's rollout collection against the fleet
// (nemo_gym/rollout_collection.py at Gym 07d6b0d07b22): /run for every row
// (tasks 0..2, two rollouts each), then the replies, stripped as
// _call_aggregate_metrics strips them and grouped by agent_ref.name, posted
// to /aggregate_metrics; each reply must carry what Gym reads of it.
func TestGymCollectionFlow(t *testing.T) {
	weather := loadDataset(t, "weather.jsonl")
	counter := loadDataset(t, "counter.jsonl")
	f := startFleet(t, false)
	type job struct {
		agent string
		body  []byte
	}
	var jobs []job
	for task, r := range []datasetRow{weather[0], counter[1], weather[2]} {
		for ri := range 2 {
			jobs = append(jobs, job{r.agent, r.withFields(map[string]any{"_ng_task_index": task, "_ng_rollout_index": ri})})
		}
	}
	// Raw fields: Gym re-sends what it read, so 1.0 stays 1.0.
	results := make([]map[string]json.RawMessage, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, body := f.postRun(t.Context(), t, environment.ProtocolSingleAgentTurn, j.body)
			if status != 200 || json.Unmarshal(body, &results[i]) != nil {
				t.Errorf("row %d: /run = %d %s", i, status, body)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	byAgent := map[string][]map[string]any{}
	for i, r := range results {
		// Gym strips the heavy fields but keeps response.usage.
		entry := map[string]any{}
		for k, v := range r {
			switch k {
			case "response", "responses_create_params", "ng_agent_observations", "ng_model_call_capture", "ng_trajectory":
				continue
			}
			entry[k] = v
		}
		var resp struct {
			Usage json.RawMessage `json:"usage"`
		}
		if json.Unmarshal(r["response"], &resp) == nil && resp.Usage != nil {
			entry["response"] = map[string]any{"usage": resp.Usage}
		}
		byAgent[jobs[i].agent] = append(byAgent[jobs[i].agent], entry)
	}
	wantTasks := map[string][]float64{"weather_agent": {0, 2}, "counter_agent": {1}}
	for agentName, entries := range byAgent {
		body, _ := json.Marshal(map[string]any{"verify_responses": entries})
		// Gym posts to the agent server; ours answer on the environment
		// and on the agent (which asks its resources server) alike.
		var replies []string
		for _, url := range []string{f.envURLs[environment.ProtocolSingleAgentTurn], f.agentURLs[agentName]} {
			rep, err := httpclient.Do(t.Context(), f.client, http.MethodPost, url+"/aggregate_metrics", nil, body)
			if err != nil || rep.Status != 200 {
				t.Fatalf("%s /aggregate_metrics at %s: %v %v", agentName, url, err, rep)
			}
			replies = append(replies, strings.TrimSpace(string(rep.Body)))
			var m struct {
				AgentMetrics      map[string]any   `json:"agent_metrics"`
				KeyMetrics        map[string]any   `json:"key_metrics"`
				GroupLevelMetrics []map[string]any `json:"group_level_metrics"`
			}
			if err := json.Unmarshal(rep.Body, &m); err != nil {
				t.Fatal(err)
			}
			if m.KeyMetrics["mean/reward"] != 1.0 || m.AgentMetrics["mean/reward"] != 1.0 || m.AgentMetrics["std/reward"] != 0.0 || !strings.Contains(string(rep.Body), `"max/reward":1.0`) {
				t.Errorf("%s: key_metrics %v agent_metrics %v, want mean/reward 1.0 and std 0", agentName, m.KeyMetrics, m.AgentMetrics)
			}
			if _, ok := m.AgentMetrics["mean/output_tokens"]; !ok {
				t.Errorf("%s: agent_metrics %v lack the usage's mean/output_tokens", agentName, m.AgentMetrics)
			}
			if len(m.GroupLevelMetrics) != len(wantTasks[agentName]) {
				t.Fatalf("%s: %d groups, want %d: %s", agentName, len(m.GroupLevelMetrics), len(wantTasks[agentName]), rep.Body)
			}
			for i, g := range m.GroupLevelMetrics {
				infos, _ := g["rollout_infos"].([]any)
				if g["_ng_task_index"] != wantTasks[agentName][i] || g["num_rollouts"] != 2.0 || len(infos) != 2 || g["mean/reward"] != 1.0 {
					t.Errorf("%s group %d: %v", agentName, i, g)
				}
			}
		}
		if replies[0] != replies[1] {
			t.Errorf("%s: the environment and the agent answer differently:\n%s\n%s", agentName, replies[0], replies[1])
		}
	}
	if len(byAgent) != 2 {
		t.Fatalf("rows went to %d agents, want 2", len(byAgent))
	}
}
