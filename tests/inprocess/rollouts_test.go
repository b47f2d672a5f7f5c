package inprocess_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ops/collect"
	"github.com/gymfleet/gymfleet/pkg/servers/environment"
	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
)

// datasetRow is a row of data/*.jsonl with what a test expects of it.
type datasetRow struct {
	fields map[string]json.RawMessage
	agent  string
	// modelCalls is what the fake policy makes: one per JSON object in the
	// user text (a tool round), plus the final answer.
	modelCalls int
}

func loadDataset(t *testing.T, name string) []datasetRow {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "data", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []datasetRow
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		rows = append(rows, parseRow(t, sc.Bytes()))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rows
}

// parseRow reads a dataset (or output) row and what the fake policy does
// with it.
func parseRow(t *testing.T, line []byte) datasetRow {
	t.Helper()
	var r datasetRow
	if err := json.Unmarshal(line, &r.fields); err != nil {
		t.Fatalf("row: %v", err)
	}
	var params struct {
		Input []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"input"`
	}
	var ref struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(r.fields["responses_create_params"], &params); err != nil {
		t.Fatal(err)
	}
	_ = json.Unmarshal(r.fields["agent_ref"], &ref)
	r.agent = ref.Name
	for _, m := range params.Input {
		if m.Role == "user" {
			r.modelCalls = strings.Count(m.Content, "{") + 1
		}
	}
	return r
}

// withID returns the row as a /run body for rollout id.
func (r datasetRow) withID(id string) []byte {
	out := make(map[string]json.RawMessage, len(r.fields)+1)
	for k, v := range r.fields {
		out[k] = v
	}
	out["_ng_rollout_id"], _ = json.Marshal(id)
	b, _ := json.Marshal(out)
	return b
}

// runReply is the part of a /run reply the tests read.
type runReply struct {
	Reward    float64 `json:"reward"`
	EpisodeID struct {
		RolloutID string `json:"rollout_id"`
		Attempt   int    `json:"attempt"`
	} `json:"episode_id"`
	Response struct {
		Output []map[string]json.RawMessage `json:"output"`
	} `json:"response"`
	Observations *struct {
		ModelCalls int `json:"model_calls"`
	} `json:"observations"`
	City          string `json:"city"`
	ExpectedCount *int   `json:"expected_count"`
}

// modelCallsByKey counts the fake inference server's calls per capture key.
func (f *testFleet) modelCallsByKey(t *testing.T) map[string]int {
	t.Helper()
	calls, err := f.ctl.Calls(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, c := range calls {
		if c.CaptureKey != nil {
			out[*c.CaptureKey]++
		}
	}
	return out
}

// checkLedger asserts the capture ledger of key has one record per model
// call, numbered 1..n, each the child of the one before.
func (f *testFleet) checkLedger(t *testing.T, key string, calls int) {
	t.Helper()
	var m modelproxy.Manifest
	if err := json.Unmarshal(f.get(t.Context(), t, f.modelURL+"/capture/rollouts/"+key+"/manifest"), &m); err != nil {
		t.Fatalf("%s manifest: %v", key, err)
	}
	if m.RolloutID != key || len(m.Records) != calls || len(m.Failures) != 0 {
		t.Fatalf("%s manifest: rollout %q, %d records, %d failures; want %d records", key, m.RolloutID, len(m.Records), len(m.Failures), calls)
	}
	for i, rec := range m.Records {
		want := ""
		if i > 0 {
			want = m.Records[i-1].CallID
		}
		if rec.ParentCallID != want || rec.Seq != int64(i+1) || rec.CaptureKey != key {
			t.Errorf("%s record %d: parent %q seq %d key %q; want parent %q seq %d", key, i, rec.ParentCallID, rec.Seq, rec.CaptureKey, want, i+1)
		}
		if len(rec.PromptTokenIDs) == 0 || len(rec.GenerationTokenIDs) == 0 || len(rec.GenerationTokenIDs) != len(rec.GenerationLogProbs) {
			t.Errorf("%s record %d has no token ids", key, i)
		}
	}
}

func TestRollouts_EndToEnd(t *testing.T) {
	weather := loadDataset(t, "weather.jsonl")
	counter := loadDataset(t, "counter.jsonl")
	// Three counter rows with 1, 2 and 3 rounds (the dataset cycles them).
	rows := []datasetRow{weather[0], weather[1], counter[0], counter[1], counter[2]}
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			t.Parallel()
			f := startFleet(t, stream)
			for _, protocol := range []string{environment.ProtocolSingleAgentTurn, environment.ProtocolLegacy} {
				t.Run(protocol, func(t *testing.T) {
					var wg sync.WaitGroup
					for i, row := range rows {
						id := fmt.Sprintf("%s-%d", strings.ReplaceAll(protocol, "_", "."), i)
						wg.Add(1)
						go func() {
							defer wg.Done()
							runOne(t, f, protocol, row, id)
						}()
					}
					wg.Wait()
					calls := f.modelCallsByKey(t)
					for i, row := range rows {
						key := fmt.Sprintf("%s-%d", strings.ReplaceAll(protocol, "_", "."), i)
						if calls[key] != row.modelCalls {
							t.Errorf("%s (%s): %d model calls, want %d", key, row.agent, calls[key], row.modelCalls)
						}
						f.checkLedger(t, key, row.modelCalls)
					}
				})
			}
		})
	}
}

// runOne runs one row through /run and checks its reply.
func runOne(t *testing.T, f *testFleet, protocol string, row datasetRow, id string) {
	status, body := f.postRun(t.Context(), t, protocol, row.withID(id))
	if status != 200 {
		t.Errorf("%s: /run = %d %s", id, status, body)
		return
	}
	var rep runReply
	if err := json.Unmarshal(body, &rep); err != nil {
		t.Errorf("%s: reply: %v", id, err)
		return
	}
	if rep.Reward != 1.0 {
		t.Errorf("%s (%s): reward %v, want 1.0; reply %s", id, row.agent, rep.Reward, body)
	}
	if rep.EpisodeID.RolloutID != id || rep.EpisodeID.Attempt != 0 {
		t.Errorf("%s: episode_id %+v", id, rep.EpisodeID)
	}
	// Every model call's last output item carries its token ids.
	withTokens := 0
	for _, item := range rep.Response.Output {
		var gen []int
		if raw, ok := item["generation_token_ids"]; ok && json.Unmarshal(raw, &gen) == nil && len(gen) > 0 {
			if _, ok := item["prompt_token_ids"]; !ok {
				t.Errorf("%s: an item has generation_token_ids without prompt_token_ids", id)
			}
			withTokens++
		}
	}
	if withTokens != row.modelCalls {
		t.Errorf("%s: %d output items carry token ids, want one per model call (%d)", id, withTokens, row.modelCalls)
	}
	if protocol == environment.ProtocolSingleAgentTurn && (rep.Observations == nil || rep.Observations.ModelCalls != row.modelCalls) {
		t.Errorf("%s: observations %+v, want %d model calls", id, rep.Observations, row.modelCalls)
	}
}

func TestRollouts_64ConcurrentThroughCollector(t *testing.T) {
	f := startFleet(t, false)
	demo := loadDataset(t, "demo.jsonl")
	if len(demo) < 64 {
		t.Fatalf("data/demo.jsonl has %d rows, want at least 64", len(demo))
	}
	c, err := collect.New(collect.Options{EnvURL: f.envURLs[environment.ProtocolSingleAgentTurn], Concurrency: 64, Limit: 64})
	if err != nil {
		t.Fatal(err)
	}
	output := filepath.Join(t.TempDir(), "results.jsonl")
	sum, err := c.CollectFile(t.Context(), filepath.Join("..", "..", "data", "demo.jsonl"), output)
	if err != nil {
		t.Fatal(err)
	}
	wantCalls := 0
	for _, r := range demo[:64] {
		wantCalls += r.modelCalls
	}
	if sum.Rows != 64 || sum.Succeeded != 64 || !sum.AllRewardsOne() || sum.ModelCalls != wantCalls {
		t.Fatalf("summary: %+v (want 64 rows at reward 1.0, %d model calls)", sum, wantCalls)
	}
	if _, err := os.Stat(collect.FailuresPath(output)); !os.IsNotExist(err) {
		t.Errorf("a failures file exists: %v", err)
	}

	b, err := os.ReadFile(output)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	calls := f.modelCallsByKey(t)
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var out struct {
			RolloutID string  `json:"_ng_rollout_id"`
			Reward    float64 `json:"reward"`
		}
		if err := json.Unmarshal([]byte(line), &out); err != nil {
			t.Fatal(err)
		}
		if seen[out.RolloutID] {
			t.Errorf("rollout %s written twice", out.RolloutID)
		}
		seen[out.RolloutID] = true
		// The output row carries the input's fields, so it says what the
		// fake policy had to do.
		row := parseRow(t, []byte(line))
		if calls[out.RolloutID] != row.modelCalls || out.Reward != 1 {
			t.Errorf("%s (%s): %d model calls, reward %v; want %d calls, reward 1", out.RolloutID, row.agent, calls[out.RolloutID], out.Reward, row.modelCalls)
		}
	}
	if len(seen) != 64 {
		t.Errorf("%d distinct rows written, want 64", len(seen))
	}
}
