package inprocess_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/servers/agent"
	"github.com/gymfleet/gymfleet/pkg/servers/environment"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/servers/resources"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/tests/fleettest"
	"github.com/gymfleet/gymfleet/tests/gymstandin"
)

// gymCounterCalls is what the fake policy makes of a row of Gym's counter
// dataset: increment_counter twice, get_counter_value, the answer.
const gymCounterCalls = 4

// startCounter starts one of our counter resources servers.
func startCounter(t *testing.T, name string) string {
	t.Helper()
	rcfg := resources.DefaultConfig()
	rcfg.Name, rcfg.Type, rcfg.Listen = name, resources.TypeCounter, "127.0.0.1:0"
	rs, err := resources.New(rcfg, resources.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	return fleettest.Serve(t, name, rs)
}

// startAgent starts one of our agents on the fleet's model server, against
// resourcesURL.
func (f *testFleet) startAgent(t *testing.T, name, resourcesURL string) environment.AgentConfig {
	t.Helper()
	acfg := agent.DefaultConfig()
	acfg.Name, acfg.Listen, acfg.MaxSteps = name, "127.0.0.1:0", 10
	acfg.ModelServerURL, acfg.ResourcesServerURL = f.modelURL, resourcesURL
	as, err := agent.New(acfg, agent.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	return environment.AgentConfig{Name: name, URL: fleettest.Serve(t, name, as), ResourcesURL: resourcesURL}
}

// startEnv starts an environment on agents, running rows without
// agent_ref on the first.
func startEnv(t *testing.T, name, protocol string, agents ...environment.AgentConfig) string {
	t.Helper()
	ecfg := environment.DefaultConfig()
	ecfg.Listen, ecfg.Name, ecfg.Protocol, ecfg.Agents = "127.0.0.1:0", name, protocol, agents
	env, err := environment.New(ecfg, environment.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	return fleettest.Serve(t, name, env)
}

// runGymRows runs every row of data/gym_counter_example.jsonl through
// envURL's /run (the rows name no agent: the environment's first runs
// them) and checks each reaches reward 1.0 with its model calls in
// the capture ledger. The rows carry no ids: the test's copy gives each
// _ng_task_index (its line) and _ng_rollout_index, the data file stays as
// Gym ships it.
func (f *testFleet) runGymRows(t *testing.T, envURL string, rolloutIndex int) {
	t.Helper()
	rows := loadDataset(t, "gym_counter_example.jsonl")
	if len(rows) != 5 {
		t.Fatalf("data/gym_counter_example.jsonl has %d rows, want Gym's 5", len(rows))
	}
	var wg sync.WaitGroup
	for i, row := range rows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fields := map[string]json.RawMessage{}
			for k, v := range row.fields {
				fields[k] = v
			}
			fields["_ng_task_index"] = json.RawMessage(strconv.Itoa(i))
			fields["_ng_rollout_index"] = json.RawMessage(strconv.Itoa(rolloutIndex))
			body, _ := json.Marshal(fields)
			rep, err := httpclient.Do(t.Context(), f.client, http.MethodPost, envURL+"/run", nil, body)
			if err != nil || rep.Status != 200 {
				t.Errorf("row %d: /run = %v %v", i, rep, err)
				return
			}
			var out runReply
			if err := json.Unmarshal(rep.Body, &out); err != nil || out.Reward != 1.0 {
				t.Errorf("row %d: reward %v (%v), want 1.0; reply %s", i, out.Reward, err, rep.Body)
			}
			if want := fmt.Sprintf("%d-%d", i, rolloutIndex); out.EpisodeID.RolloutID != want {
				t.Errorf("row %d: episode %+v, want rollout %s", i, out.EpisodeID, want)
			}
		}()
	}
	wg.Wait()
	for i := range rows {
		f.checkLedger(t, fmt.Sprintf("%d-%d", i, rolloutIndex), gymCounterCalls)
	}
}

// TestGymCounterDataset: NeMo Gym's counter example dataset runs unchanged
// through our environment, agent and counter, on both protocols.
func TestGymCounterDataset(t *testing.T) {
	f := startFleet(t, false)
	a := f.startAgent(t, "gym_counter_agent", startCounter(t, "counter"))
	for i, protocol := range []string{environment.ProtocolSingleAgentTurn, environment.ProtocolLegacy} {
		t.Run(protocol, func(t *testing.T) {
			f.runGymRows(t, startEnv(t, "gym_env_"+protocol, protocol, a), i)
		})
	}
}

// TestOurFleetDrivesGymCounter: our environment and agent, in front of a
// resources server that reads only Gym's cookie and speaks HTTP/1.1 only
// (gymstandin.Counter), run Gym's counter dataset to reward 1.0 on both
// protocols.
func TestOurFleetDrivesGymCounter(t *testing.T) {
	f := startFleet(t, false)
	gym := gymstandin.StartCounter(t, gymstandin.CounterOptions{})
	a := f.startAgent(t, "gym_counter_agent", gym.URL)
	for i, protocol := range []string{environment.ProtocolSingleAgentTurn, environment.ProtocolLegacy} {
		t.Run(protocol, func(t *testing.T) {
			f.runGymRows(t, startEnv(t, "gym_cookie_env_"+protocol, protocol, a), 10+i)
		})
	}
	if started, seeded := gym.Sessions(); started != 10 || seeded != 10 {
		t.Errorf("%d sessions started, %d seeded; want one per row and protocol (10)", started, seeded)
	}
	// Every session is closed once with Gym 0.7.0's body: by the
	// environment (single_agent_turn) or by our agent's legacy /run.
	if taken, refused := gym.Closes(); taken != 10 || refused != 0 {
		t.Errorf("/close_session: %d taken, %d refused; want 10 and 0", taken, refused)
	}
}

// TestTrainingTokenCapturePath: Gym's training-capture segment after the
// capture key routes as the plain prefix on the model server (Responses and
// Chat Completions) and on the agent, and the calls are captured under the
// key (nemo_gym/base_responses_api_agent.py, Gym 07d6b0d07b22).
func TestTrainingTokenCapturePath(t *testing.T) {
	f := startFleet(t, false)
	a := f.startAgent(t, "ttc_agent", startCounter(t, "counter"))
	model := fakeinference.DefaultConfig().Model
	for key, c := range map[string]struct{ url, body string }{
		"ttc-responses": {f.modelURL + "/ng-rollout/ttc-responses/training-token-capture/v1/responses", `{"model":"` + model + `","input":"hello"}`},
		"ttc-chat":      {f.modelURL + "/ng-rollout/ttc-chat/training-token-capture/v1/chat/completions", `{"model":"` + model + `","messages":[{"role":"user","content":"hello"}]}`},
		"ttc-agent":     {a.URL + "/ng-rollout/ttc-agent/training-token-capture/v1/responses", `{"input":"hello"}`},
	} {
		rep, err := httpclient.Do(t.Context(), f.client, http.MethodPost, c.url, nil, json.RawMessage(c.body))
		if err != nil || rep.Status != 200 {
			t.Fatalf("%s: %v %v", key, rep, err)
		}
		if !strings.Contains(string(rep.Body), `"status":"completed"`) && !strings.Contains(string(rep.Body), `"finish_reason":"stop"`) {
			t.Errorf("%s: %s", key, rep.Body)
		}
		f.checkLedger(t, key, 1)
	}
}

// gymPost is one call of NeMo Gym's simple agent: aiohttp over HTTP/1.1
// with no cookie jar, the cookies passed by hand; it returns the reply's
// body and the cookies it set (aiohttp's response.cookies).
func gymPost(t *testing.T, url string, body []byte, cookies []*http.Cookie) ([]byte, []*http.Cookie) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for _, c := range cookies {
		req.AddCookie(c)
	}
	resp, err := (&http.Client{Transport: &http.Transport{}}).Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %d %s", url, resp.StatusCode, b)
	}
	return b, resp.Cookies()
}

// TestGymAgentFlowAroundOurs: NeMo Gym's simple agent /run
// (responses_api_agents/simple_agent/app.py SimpleAgent.run, Gym
// 07d6b0d07b22) with our counter as its resources server and our agent's
// /v1/responses as its own: seed with the whole row, the loop with the
// seed's cookies, verify with the cookies the loop's reply set. Without
// capture the loop's path is /v1/responses; with Gym's training capture it
// is /ng-rollout/<id>/training-token-capture/v1/responses, captured under
// <id>.
func TestGymAgentFlowAroundOurs(t *testing.T) {
	f := startFleet(t, false)
	counterURL := startCounter(t, "counter")
	a := f.startAgent(t, "counter_agent", counterURL)
	rows := loadDataset(t, "gym_counter_example.jsonl")
	for i, path := range []string{"/v1/responses", "/ng-rollout/gym-7/training-token-capture/v1/responses"} {
		row := map[string]json.RawMessage{}
		for k, v := range rows[i].fields {
			row[k] = v
		}
		row["_ng_task_index"], row["_ng_rollout_index"] = json.RawMessage(strconv.Itoa(i)), json.RawMessage("0")
		row["agent_ref"] = json.RawMessage(`{"type":"responses_api_agents","name":"counter_agent"}`)
		body, _ := json.Marshal(row)
		_, cookies := gymPost(t, counterURL+"/seed_session", body, nil)
		if len(cookies) == 0 {
			t.Fatalf("%s: the seed set no cookie", path)
		}
		resp, cookies := gymPost(t, a.URL+path, row["responses_create_params"], cookies)
		row["response"] = resp
		body, _ = json.Marshal(row)
		out, _ := gymPost(t, counterURL+"/verify", body, cookies)
		var v runReply
		if err := json.Unmarshal(out, &v); err != nil || v.Reward != 1.0 {
			t.Errorf("%s: verify %s (%v), want reward 1.0", path, out, err)
		}
	}
	f.checkLedger(t, "gym-7", gymCounterCalls)
}
