package agent_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/servers/agent"
	"github.com/gymfleet/gymfleet/pkg/servers/resources"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

func TestLoopState_SnapshotPinsLengths(t *testing.T) {
	var call, out openai.Item
	if err := json.Unmarshal([]byte(fc("a", "get_weather", `{}`)), &call); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(fco("a", "x")), &out); err != nil {
		t.Fatal(err)
	}
	cached := 1
	st := &agent.LoopState{
		Step: 1, PendingTools: true, NewOutputs: []openai.Item{call},
		Usage:       &openai.ResponseUsage{InputTokens: 3, TotalTokens: 3, InputTokensDetails: openai.InputTokensDetails{CachedTokens: &cached}},
		Turns:       []agent.Turn{{Step: 1, ResponseID: "resp_1"}},
		ToolRecords: []agent.ToolRecord{}, ModelCalls: 1,
	}
	snap := st.Snapshot()
	before, _ := json.Marshal(snap())

	// The loop moves on: appends (with spare capacity, so into the same
	// backing arrays), accumulates usage in place, advances the step.
	st.NewOutputs = slices.Grow(st.NewOutputs, 8)
	st.NewOutputs = append(st.NewOutputs, out, call)
	st.Turns = append(st.Turns, agent.Turn{Step: 2})
	st.ToolRecords = append(st.ToolRecords, agent.ToolRecord{CallID: "a"})
	st.Usage.Add(&openai.ResponseUsage{InputTokens: 5, TotalTokens: 5})
	st.Step, st.PendingTools, st.ModelCalls = 2, false, 2

	after, _ := json.Marshal(snap())
	if string(before) != string(after) {
		t.Errorf("snapshot changed as the loop moved on:\nbefore %s\nafter  %s", before, after)
	}
	got := snap()
	if got.Step != 1 || !got.PendingTools || len(got.NewOutputs) != 1 || len(got.Turns) != 1 || len(got.ToolRecords) != 0 ||
		got.Usage.InputTokens != 3 || got.Usage.InputTokensDetails.CachedTokens == nil {
		t.Errorf("snapshot = %+v", got)
	}
}

// pendingState is the JSON of a loop at its pending-tools boundary: the first
// model response asked for get_weather, which has not run yet.
func pendingState(t *testing.T) string {
	first := resp("resp_1", usage(10, 5, "0"), fc("c1", "get_weather", getWeatherParis))
	var r openai.Response
	if err := json.Unmarshal([]byte(first), &r); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return `{"step":1,"pending_tools":true,"new_outputs":` + items(fc("c1", "get_weather", getWeatherParis)) +
		`,"usage":` + usage(10, 5, "0") + `,"last_model_response":` + string(b) +
		`,"turns":[{"step":1,"response_id":"resp_1","status":"completed","output_items":1,"function_calls":1}],"tool_records":[],"model_calls":1}`
}

func TestRunLoop_ContinuesFromPendingTools(t *testing.T) {
	stateJSON := pendingState(t)
	var st agent.LoopState
	if err := json.Unmarshal([]byte(stateJSON), &st); err != nil {
		t.Fatalf("state does not decode: %v", err)
	}
	// The state round-trips through JSON unchanged.
	if b, _ := json.Marshal(&st); compact(t, string(b)) != compact(t, stateJSON) {
		t.Errorf("round trip:\n got %s\nwant %s", b, compact(t, stateJSON))
	}

	ta := newFixture(t, nil, resp("resp_2", usage(20, 7, "3"), msg("The weather in Paris is cold.")))
	var params openai.ResponsesRequest
	if err := json.Unmarshal([]byte(weatherParams), &params); err != nil {
		t.Fatal(err)
	}
	out, err := ta.srv.RunLoop(context.Background(), rollout.EpisodeID{RolloutID: "r", Attempt: 1}, "rs", &params, &st)
	if err != nil {
		t.Fatalf("RunLoop: %v", err)
	}
	// The pending tool runs first, then the next model call: no repeated
	// model call, no skipped tool.
	want := []string{"resources /ng-rollout/r-a1/get_weather session=rs", "model /ng-rollout/r-a1/v1/responses"}
	if got := ta.rec.lines(); !slices.Equal(got, want) {
		t.Errorf("requests:\n got %q\nwant %q", got, want)
	}
	b, _ := json.Marshal(out)
	toolOut := `{"city":"Paris","weather_description":"The weather in Paris is cold."}`
	if got, want := field(t, string(b), "output"), compact(t, items(fc("c1", "get_weather", getWeatherParis), fco("c1", toolOut), msg("The weather in Paris is cold."))); got != want {
		t.Errorf("output:\n got %s\nwant %s", got, want)
	}
	if got, want := field(t, string(b), "usage"), compact(t, usage(30, 12, "3")); got != want {
		t.Errorf("usage: got %s want %s", got, want)
	}
	if st.Step != 2 || st.ModelCalls != 2 || st.PendingTools || len(st.Turns) != 2 || len(st.ToolRecords) != 1 {
		t.Errorf("state after the loop: %+v", st)
	}
}

func TestRunLoop_PendingToolsAtMaxSteps(t *testing.T) {
	var st agent.LoopState
	if err := json.Unmarshal([]byte(pendingState(t)), &st); err != nil {
		t.Fatal(err)
	}
	ta := newFixture(t, func(c *agent.Config) { c.MaxSteps = 1 })
	var params openai.ResponsesRequest
	_ = json.Unmarshal([]byte(weatherParams), &params)
	out, err := ta.srv.RunLoop(context.Background(), rollout.EpisodeID{RolloutID: "r"}, "rs", &params, &st)
	if err != nil {
		t.Fatalf("RunLoop: %v", err)
	}
	if got := ta.rec.lines(); !slices.Equal(got, []string{"resources /ng-rollout/r/get_weather session=rs"}) {
		t.Errorf("requests %q: want the pending tool only", got)
	}
	if len(out.Output) != 2 || out.Output[1].Type != openai.ItemFunctionCallOutput {
		t.Errorf("output %+v", out.Output)
	}
}

func TestRunLoop_PendingWithoutResponseIsRefused(t *testing.T) {
	ta := newFixture(t, nil)
	var params openai.ResponsesRequest
	_ = json.Unmarshal([]byte(weatherParams), &params)
	_, err := ta.srv.RunLoop(context.Background(), rollout.EpisodeID{RolloutID: "r"}, "", &params, &agent.LoopState{PendingTools: true})
	if err == nil || !strings.Contains(err.Error(), "invalid_checkpoint_state") {
		t.Errorf("RunLoop = %v", err)
	}
}

// An agent against the real counter server: the reward needs the tool
// calls to reach the resources session the /run seeded.
func TestRun_AgainstCounterServer(t *testing.T) {
	cfg := resources.DefaultConfig()
	cfg.Name, cfg.Type = "counter", resources.TypeCounter
	rsrv, err := resources.New(cfg, resources.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := rsrv.Listen(); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- rsrv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = rsrv.Close(ctx)
		<-served
	})

	rec := &recorder{}
	model := newModel(t, rec,
		resp("resp_1", usage(1, 1, "0"), fc("a", "increment", `{"by": 1}`)),
		resp("resp_2", usage(1, 1, "0"), fc("b", "increment", `{"by": 2}`)),
		resp("resp_3", usage(1, 1, "0"), msg("The count is 6.")),
	)
	ta := startAgent(t, model, &resourcesStandIn{url: rsrv.URL()}, rec)
	row := `{"_ng_rollout_id":"count-1","initial_count":3,"expected_count":6,"responses_create_params":{"input":"Call increment with {\"by\": 1}, then with {\"by\": 2}"}}`
	r := ta.post("/run", nil, row)
	if r.status != 200 || field(t, r.body, "reward") != "1.0" || field(t, r.body, "expected_count") != "6" || field(t, r.body, "_ng_rollout_id") != `"count-1"` {
		t.Fatalf("run: %d %s", r.status, r.body)
	}
	outs := []string{}
	var resp openai.Response
	_ = json.Unmarshal([]byte(field(t, r.body, "response")), &resp)
	for _, it := range resp.Output {
		if it.Type == openai.ItemFunctionCallOutput {
			outs = append(outs, it.Output.String())
		}
	}
	if want := []string{`{"count":4}`, `{"count":6}`}; !slices.Equal(outs, want) {
		t.Errorf("tool outputs %q, want %q", outs, want)
	}
	// /run closed its resources session.
	mresp, err := http.Get(rsrv.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer mresp.Body.Close()
	b, err := io.ReadAll(mresp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "gymfleet_resources_sessions 0") {
		t.Error("the resources session is still open after /run")
	}
}
