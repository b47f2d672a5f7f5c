package environment_test

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/servers/environment"
)

// Rows shaped as NeMo RL sends them (nemo_rl/experience/rollouts.py
// _prepare_nemo_gym_rows; rollout_manager.py _build_inputs and
// async_utils/trajectory_collector.py _stamp_nemo_gym_task_indices, at
// 7ea279abfbeb): no rollout id, _rowidx, maybe _ng_task_index, and the
// sampling parameters in responses_create_params.
const (
	syncRow  = `{"responses_create_params":{"input":"What is the weather in Paris?","tools":[],"temperature":1.0,"top_p":1.0,"max_output_tokens":64},"city":"Paris","_rowidx":3,"agent_ref":{"type":"responses_api_agents","name":"weather_agent"}}`
	asyncRow = `{"responses_create_params":{"input":"What is the weather in Paris?","tools":[],"temperature":1.0,"top_p":1.0,"max_output_tokens":64},"city":"Paris","_ng_task_index":12,"_rowidx":1,"agent_ref":{"type":"responses_api_agents","name":"weather_agent"}}`
)

func TestRun_RowsWithoutARolloutID(t *testing.T) {
	for _, tc := range []struct {
		name, row string
		id        *regexp.Regexp
	}{
		{"sync", syncRow, regexp.MustCompile(`^row3-g[0-9a-f]{16}$`)},
		{"async", asyncRow, regexp.MustCompile(`^t12-row1-g[0-9a-f]{16}$`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, environment.ProtocolSingleAgentTurn, nil)
			seen := map[string]bool{}
			// The same row twice (NeMo RL re-dispatches a row after a
			// failure): two rollouts of their own, neither refused.
			for range 2 {
				status, body, err := postRun(t.Context(), t, f.url, tc.row)
				if err != nil || status != 200 {
					t.Fatalf("/run = %d %s, %v", status, body, err)
				}
				var rep struct {
					EpisodeID struct {
						RolloutID string `json:"rollout_id"`
						Attempt   *int   `json:"attempt"`
					} `json:"episode_id"`
					Reward float64 `json:"reward"`
				}
				if err := json.Unmarshal([]byte(body), &rep); err != nil {
					t.Fatal(err)
				}
				if !tc.id.MatchString(rep.EpisodeID.RolloutID) || rep.EpisodeID.Attempt == nil || *rep.EpisodeID.Attempt != 0 || rep.Reward != 1.0 {
					t.Fatalf("reply %s: want episode_id %v attempt 0 and reward 1", body, tc.id)
				}
				seen[rep.EpisodeID.RolloutID] = true
				// Every call of the episode is under the id the reply names.
				for _, p := range f.rec.paths()[len(f.rec.paths())-6:] {
					if !strings.Contains(p, "/ng-rollout/"+rep.EpisodeID.RolloutID+"/") {
						t.Fatalf("call %q is not under the episode's capture key %s", p, rep.EpisodeID.RolloutID)
					}
				}
			}
			if len(seen) != 2 {
				t.Fatalf("two /runs of one id-less row got the ids %v, want two distinct ones", seen)
			}
		})
	}
}

func TestRun_GymRowWithAttemptAsString(t *testing.T) {
	f := newFixture(t, environment.ProtocolSingleAgentTurn, nil)
	gymRow := strings.Replace(row, `"_ng_rollout_index":0`, `"_ng_rollout_index":0,"_ng_attempt_index":"1"`, 1)
	status, body, err := postRun(t.Context(), t, f.url, gymRow)
	if err != nil || status != 200 || !strings.Contains(body, `"episode_id":{"rollout_id":"7-0","attempt":1}`) {
		t.Fatalf("/run = %d %s, %v; want 200 with episode_id 7-0 attempt 1", status, body, err)
	}
	if got := f.rec.paths()[0]; got != "resources /ng-rollout/7-0-a1/seed_session" {
		t.Fatalf("first call %q, want under the capture key 7-0-a1", got)
	}
}

// GET /episodes names the episodes in flight, with the row fields an
// id-less caller knows its rows by.
func TestEpisodes_ListsInFlightWithRowFields(t *testing.T) {
	release := make(chan struct{})
	f := newFixture(t, environment.ProtocolSingleAgentTurn, func(agent, _ map[string]route) {
		agent["/v1/responses"] = func(w http.ResponseWriter, r *http.Request, _ []byte) {
			<-release
			jsonReply(200, agentReply)(w, r, nil)
		}
	})
	done := make(chan string, 1)
	go func() {
		_, body, _ := postRun(t.Context(), t, f.url, asyncRow)
		done <- body
	}()
	waitUntil(t, "the episode is live", func() bool { return len(f.env.Live()) == 1 })
	resp, err := http.Get(f.url + "/episodes")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	close(release)
	var got environment.EpisodesReply
	if err := json.Unmarshal(b, &got); err != nil || len(got.Episodes) != 1 {
		t.Fatalf("/episodes = %d %s, %v; want one episode", resp.StatusCode, b, err)
	}
	e := got.Episodes[0]
	if !e.Generated || string(e.TaskIndex) != "12" || string(e.RowIdx) != "1" || e.RolloutIndex != nil {
		t.Fatalf("listing %s: want generated with _ng_task_index 12 and _rowidx 1", b)
	}
	body := <-done
	if !strings.Contains(body, `"episode_id":{"rollout_id":"`+e.EpisodeID.RolloutID+`","attempt":0}`) {
		t.Fatalf("reply %s does not name the listed episode %v", body, e.EpisodeID)
	}
	resp, err = http.Get(f.url + "/episodes")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.TrimSpace(string(b)) != `{"episodes":[]}` {
		t.Fatalf("/episodes after the reply = %s, want none", b)
	}
}

// The environment answers Gym's /aggregate_metrics itself.
func TestAggregateMetrics(t *testing.T) {
	f := newFixture(t, environment.ProtocolSingleAgentTurn, nil)
	body := `{"verify_responses":[{"_ng_task_index":0,"_ng_rollout_index":0,"reward":1.0,"agent_ref":{"name":"weather_agent"}},{"_ng_task_index":1,"_ng_rollout_index":0,"reward":1.0}]}`
	resp, err := http.Post(f.url+"/aggregate_metrics", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"key_metrics":{"mean/reward":1.0}`) || strings.Count(string(b), `"rollout_infos"`) != 2 {
		t.Fatalf("/aggregate_metrics = %d %s", resp.StatusCode, b)
	}
	resp, err = http.Post(f.url+"/aggregate_metrics", "application/json", strings.NewReader(`{"verify_responses":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(b), "invalid_request") {
		t.Fatalf("bad body: %d %s", resp.StatusCode, b)
	}
	if got := f.rec.paths(); len(got) != 0 {
		t.Fatalf("/aggregate_metrics called upstreams: %q", got)
	}
}
