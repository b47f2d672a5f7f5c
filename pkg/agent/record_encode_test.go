package agent

import (
	"bytes"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/codec"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/openai"
	"github.com/gymfleet/gymfleet/pkg/rollout"
)

// TestSessionRecordOutIsSessionRecord: Export encodes a record in one pass
// (sessionRecordOut) with the bytes of sessionRecord holding the loop
// state's encoding, which Install decodes.
func TestSessionRecordOutIsSessionRecord(t *testing.T) {
	var resp openai.Response
	if err := codec.Unmarshal([]byte(`{"id":"resp_1","object":"response","created_at":1767225600,"model":"policy","output":[`+
		`{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"<Paris>\"}","status":"completed",`+
		`"prompt_token_ids":[1,2,3],"generation_token_ids":[4,5],"generation_log_probs":[-0.25,-1e-7]}],`+
		`"parallel_tool_calls":true,"tool_choice":"auto","tools":[],"temperature":1.0,"top_p":null,"status":"completed","incomplete_details":null,`+
		`"usage":{"input_tokens":3,"input_tokens_details":{"cached_tokens":0},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":5},`+
		`"error":null,"instructions":null,"metadata":{},"max_output_tokens":256}`), &resp); err != nil {
		t.Fatal(err)
	}
	st := LoopState{
		Step: 1, NewOutputs: append(resp.Output, openai.Item{Type: openai.ItemFunctionCallOutput, CallID: "call_1", Output: openai.TextContent(`{"city":"<Paris>","weather_description":"sunny & \u2028 mild"}`)}),
		Usage: resp.Usage, LastModelResponse: &resp, ModelCalls: 1,
		Turns:       []Turn{{Step: 1, ResponseID: "resp_1", Status: "completed", OutputItems: 1, FunctionCalls: 1}},
		ToolRecords: []ToolRecord{{Step: 1, CallID: "call_1", Name: "get_weather", Status: 200}},
	}
	usage := openai.ResponseUsage{InputTokens: 7}
	session := sessionState{
		Request: codec.RawMessage(`{"responses_create_params":{"input":"x"}}`), ResourcesSessionID: "rs-1", Activations: 1,
		CompletedReply: jsonNull, Observations: Observations{Usage: &usage, ResourcesSessionID: "rs-1"},
	}
	id := rollout.EpisodeID{RolloutID: "r", Attempt: 2}
	for _, loop := range []*LoopState{&st, nil} {
		boundary := jsonNull
		if loop != nil {
			b, err := codec.Marshal(*loop)
			if err != nil {
				t.Fatal(err)
			}
			boundary = b
		}
		want, err := codec.Marshal(sessionRecord{Type: recordSession, EpisodeID: id, SessionID: "s-1", Session: session, Boundary: boundary})
		if err != nil {
			t.Fatal(err)
		}
		got, err := codec.Marshal(&sessionRecordOut{Type: recordSession, EpisodeID: id, SessionID: "s-1", Session: session, Boundary: loop})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("one-pass encoding\n %s\nsessionRecord's\n %s", got, want)
		}
		if _, err := decodeSessionRecord(ctlplane.Record{EpisodeID: id, Data: got}); err != nil {
			t.Fatalf("Install refuses the record: %v", err)
		}
	}
}
