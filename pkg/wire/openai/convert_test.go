package openai_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

// equalJSON compares two JSON texts as values.
func equalJSON(t *testing.T, what string, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("%s: got invalid JSON %s: %v", what, got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("%s: want invalid JSON %s: %v", what, want, err)
	}
	if !reflect.DeepEqual(g, w) {
		var gi, wi bytes.Buffer
		_ = json.Indent(&gi, got, "", "  ")
		_ = json.Indent(&wi, []byte(want), "", "  ")
		t.Errorf("%s:\ngot  %s\nwant %s", what, gi.String(), wi.String())
	}
}

func decodeRequest(t *testing.T, body string) *openai.ResponsesRequest {
	t.Helper()
	var req openai.ResponsesRequest
	if err := codec.UnmarshalStrict([]byte(body), &req); err != nil {
		t.Fatalf("decoding request: %v", err)
	}
	return &req
}

const weatherTool = `{"type":"function","name":"get_weather","description":"Get the weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"strict":true}`

// weatherChatTool is weatherTool as NeMo Gym's vllm_model sends it to
// vLLM: strict dropped (VLLMModel._strip_hosted_only_tool_fields,
// nemo-gym 0.7.0).
const weatherChatTool = `{"type":"function","function":{"name":"get_weather","description":"Get the weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}`

func TestResponsesToChat(t *testing.T) {
	tests := []struct {
		name string
		req  string
		want string
	}{
		{
			name: "string input becomes one user message with a text part",
			req:  `{"input":"What is the weather in Paris?","max_output_tokens":256,"temperature":0.5,"top_p":0.9}`,
			want: `{"model":"policy","messages":[{"role":"user","content":[{"type":"text","text":"What is the weather in Paris?"}]}],
				"max_tokens":256,"temperature":0.5,"top_p":0.9}`,
		},
		{
			name: "weather tool round trip: history with a call and its output",
			req: `{"input":[
				{"role":"user","content":"Call get_weather with {\"city\": \"Paris\"}"},
				{"type":"function_call","id":"call_1","call_id":"call_1","name":"get_weather","arguments":"{\"city\": \"Paris\"}","status":"completed"},
				{"type":"function_call_output","call_id":"call_1","output":"{\"city\":\"Paris\",\"weather_description\":\"sunny, 21C\"}"}
			],"tools":[` + weatherTool + `],"tool_choice":"auto","parallel_tool_calls":false}`,
			want: `{"model":"policy","messages":[
				{"role":"user","content":"Call get_weather with {\"city\": \"Paris\"}"},
				{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
				{"role":"tool","tool_call_id":"call_1","content":"{\"city\":\"Paris\",\"weather_description\":\"sunny, 21C\"}"}
			],"tools":[` + weatherChatTool + `],"tool_choice":"auto","parallel_tool_calls":false}`,
		},
		{
			name: "reasoning, text and calls merge into one assistant message in input order",
			req: `{"input":[
				{"role":"user","content":"hi"},
				{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"think A"},{"type":"summary_text","text":""},{"type":"summary_text","text":"think B"}]},
				{"type":"message","role":"assistant","id":"msg_1","status":"completed","content":[{"type":"output_text","text":"Let me check.","annotations":[]}]},
				{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
				{"type":"function_call","call_id":"c2","name":"get_weather","arguments":"{\"city\":\"Rome\"}"},
				{"type":"function_call_output","call_id":"c1","output":"sunny"},
				{"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"rainy"}]},
				{"role":"assistant","content":"Paris is sunny, Rome is rainy."}
			],"tools":[` + weatherTool + `]}`,
			want: `{"model":"policy","messages":[
				{"role":"user","content":"hi"},
				{"role":"assistant","content":"Let me check.","reasoning_content":"think A","reasoning":"think A","tool_calls":[
					{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
					{"id":"c2","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Rome\"}"}}]},
				{"role":"tool","tool_call_id":"c1","content":"sunny"},
				{"role":"tool","tool_call_id":"c2","content":[{"type":"text","text":"rainy"}]},
				{"role":"assistant","content":"Paris is sunny, Rome is rainy."}
			],"tools":[` + weatherChatTool + `]}`,
		},
		{
			name: "a turn of reasoning and a call alone keeps an empty content beside its reasoning",
			req: `{"input":[
				{"role":"user","content":"hi"},
				{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"plan"}]},
				{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{}"}
			],"tools":[` + weatherTool + `]}`,
			want: `{"model":"policy","messages":[
				{"role":"user","content":"hi"},
				{"role":"assistant","content":"","reasoning_content":"plan","reasoning":"plan","tool_calls":[
					{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]}
			],"tools":[` + weatherChatTool + `]}`,
		},
		{
			name: "instructions fold leading system and developer messages",
			req: `{"instructions":"You are terse.","input":[
				{"role":"system","content":"Use metric units."},
				{"role":"developer","content":[{"type":"input_text","text":"Never guess."}]},
				{"role":"user","content":"weather?"},
				{"role":"system","content":"late system message stays"}
			]}`,
			want: `{"model":"policy","messages":[
				{"role":"system","content":"You are terse.\n\nUse metric units.\n\nNever guess."},
				{"role":"user","content":"weather?"},
				{"role":"system","content":"late system message stays"}
			]}`,
		},
		{
			name: "without instructions system messages keep their place and role",
			req:  `{"input":[{"role":"developer","content":"dev"},{"role":"user","content":"u"}]}`,
			want: `{"model":"policy","messages":[{"role":"developer","content":"dev"},{"role":"user","content":"u"}]}`,
		},
		{
			name: "content parts: text, image with default detail, video",
			req: `{"input":[{"type":"message","role":"user","content":[
				{"type":"input_text","text":"What is in this picture?"},
				{"type":"input_image","image_url":"https://example.com/cat.png"},
				{"type":"input_image","image_url":"https://example.com/dog.png","detail":"low"},
				{"type":"input_video","video_url":"https://example.com/v.mp4"}
			]}]}`,
			want: `{"model":"policy","messages":[{"role":"user","content":[
				{"type":"text","text":"What is in this picture?"},
				{"type":"image_url","image_url":{"url":"https://example.com/cat.png","detail":"auto"}},
				{"type":"image_url","image_url":{"url":"https://example.com/dog.png","detail":"low"}},
				{"type":"video_url","video_url":{"url":"https://example.com/v.mp4"}}
			]}]}`,
		},
		{
			name: "token fields of assistant history ride on the merged message",
			req: `{"input":[
				{"role":"user","content":"Call get_weather with {\"city\": \"Paris\"}"},
				{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{}",
				 "prompt_token_ids":[1,2,3],"generation_token_ids":[7,8],"generation_log_probs":[-0.5,-0.25]},
				{"type":"function_call_output","call_id":"c1","output":"sunny"},
				{"type":"message","role":"assistant","content":[{"type":"output_text","text":"It is sunny."}]}
			],"tools":[` + weatherTool + `]}`,
			want: `{"model":"policy","messages":[
				{"role":"user","content":"Call get_weather with {\"city\": \"Paris\"}"},
				{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{}"}}],
				 "prompt_token_ids":[1,2,3],"generation_token_ids":[7,8],"generation_log_probs":[-0.5,-0.25]},
				{"role":"tool","tool_call_id":"c1","content":"sunny"},
				{"role":"assistant","content":"It is sunny."}
			],"tools":[` + weatherChatTool + `]}`,
		},
		{
			name: "no tools drops tool_choice auto and parallel_tool_calls",
			req:  `{"input":"hi","tool_choice":"auto","parallel_tool_calls":true,"tools":[]}`,
			want: `{"model":"policy","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`,
		},
		{
			name: "reasoning effort, metadata, user, store, top_logprobs pass; text, include, truncation drop",
			req: `{"input":"hi","reasoning":{"effort":"low"},"metadata":{"fake_script":"[]"},"user":"u1","store":false,
				"top_logprobs":2,"service_tier":"auto","text":{"format":{"type":"text"}},"include":["reasoning.encrypted_content"],
				"truncation":"disabled","background":false,"previous_response_id":null,"max_tool_calls":3}`,
			want: `{"model":"policy","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],
				"reasoning_effort":"low","metadata":{"fake_script":"[]"},"user":"u1","store":false,"top_logprobs":2,"service_tier":"auto"}`,
		},
		{
			name: "a named function choice takes Chat's shape",
			req:  `{"input":"hi","tools":[` + weatherTool + `],"tool_choice":{"type":"function","name":"get_weather"}}`,
			want: `{"model":"policy","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],
				"tools":[` + weatherChatTool + `],"tool_choice":{"type":"function","function":{"name":"get_weather"}}}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := openai.ResponsesToChat(decodeRequest(t, tt.req), "policy")
			if err != nil {
				t.Fatalf("ResponsesToChat: %v", err)
			}
			b, err := codec.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			equalJSON(t, "chat request", b, tt.want)
		})
	}
}

func TestResponsesToChat_Errors(t *testing.T) {
	tests := []struct {
		name, req, wantErr string
	}{
		{"required without tools", `{"input":"hi","tool_choice":"required"}`, "requires at least one tool"},
		{"named function without tools", `{"input":"hi","tool_choice":{"type":"function","name":"x"}}`, "requires at least one tool"},
		{"hosted tool", `{"input":"hi","tools":[{"type":"web_search","name":""}]}`, `tool type "web_search" is not supported`},
		{"unknown item type", `{"input":[{"type":"mcp_call","id":"x"}]}`, `input[0]: input item type "mcp_call" is not supported`},
		{"unknown role", `{"input":[{"role":"wizard","content":"x"}]}`, `message role "wizard"`},
		{"unknown part", `{"input":[{"role":"user","content":[{"type":"input_audio","text":""}]}]}`, `part type "input_audio"`},
		{"call without call_id", `{"input":[{"type":"function_call","name":"f","arguments":"{}"}]}`, "needs call_id"},
		{"partial token fields", `{"input":[{"role":"assistant","content":"x","prompt_token_ids":[1]}]}`, "all-or-nothing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := openai.ResponsesToChat(decodeRequest(t, tt.req), "policy")
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func decodeCompletion(t *testing.T, body string) *openai.ChatCompletion {
	t.Helper()
	var c openai.ChatCompletion
	if err := codec.Unmarshal([]byte(body), &c); err != nil {
		t.Fatalf("decoding completion: %v", err)
	}
	return &c
}

func TestChatToResponse(t *testing.T) {
	opts := openai.ResponseOptions{Model: "policy", ID: "resp_1", ReasoningID: "rs_1", MessageID: "msg_1"}
	const echoDefaults = `"parallel_tool_calls":true,"tool_choice":"auto","tools":[],"temperature":null,"top_p":null,
		"error":null,"instructions":null,"metadata":null,"max_output_tokens":null`
	tests := []struct {
		name, req, completion, want string
	}{
		{
			name: "weather tool call with token fields on the last item",
			req:  `{"input":"Call get_weather with {\"city\": \"Paris\"}","tools":[` + weatherTool + `],"temperature":0.7,"metadata":{"k":"v"},"instructions":"Be brief.","max_output_tokens":64}`,
			completion: `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"fake-model",
				"choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","content":null,
					"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}],
					"prompt_token_ids":[1,2],"generation_token_ids":[5,6,7],"generation_log_probs":[-0.1,-0.2,-0.3]}}],
				"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}`,
			want: `{"id":"resp_1","object":"response","created_at":1700000000,"model":"policy","output":[
				{"type":"function_call","id":"chatcmpl-tool-1","call_id":"chatcmpl-tool-1","name":"get_weather","arguments":"{\"city\": \"Paris\"}","status":"completed",
				 "prompt_token_ids":[1,2],"generation_token_ids":[5,6,7],"generation_log_probs":[-0.1,-0.2,-0.3]}],
				"parallel_tool_calls":true,"tool_choice":"auto","tools":[` + weatherTool + `],"temperature":0.7,"top_p":null,
				"status":"completed","incomplete_details":null,
				"usage":{"input_tokens":2,"input_tokens_details":{"cached_tokens":null},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":null},"total_tokens":5},
				"error":null,"instructions":"Be brief.","metadata":{"k":"v"},"max_output_tokens":64}`,
		},
		{
			name: "final answer after the tool result",
			req:  `{"input":"x","tool_choice":"none","parallel_tool_calls":false}`,
			completion: `{"id":"c","object":"chat.completion","created":5,"model":"m","choices":[{"index":0,"finish_reason":"stop",
				"message":{"role":"assistant","content":"The answer is: sunny"}}],
				"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":8},"completion_tokens_details":{"reasoning_tokens":0}}}`,
			want: `{"id":"resp_1","object":"response","created_at":5,"model":"policy","output":[
				{"id":"msg_1","type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"The answer is: sunny","annotations":[],"logprobs":null}]}],
				"parallel_tool_calls":false,"tool_choice":"none","tools":[],"temperature":null,"top_p":null,"status":"completed","incomplete_details":null,
				"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":8},"output_tokens":4,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":13},
				"error":null,"instructions":null,"metadata":null,"max_output_tokens":null}`,
		},
		{
			name: "reasoning_content and think blocks make one reasoning item; text and calls follow",
			req:  `{"input":"x"}`,
			completion: `{"id":"c","object":"chat.completion","created":5,"model":"m","choices":[{"index":0,"finish_reason":"tool_calls",
				"message":{"role":"assistant","reasoning_content":"plan","content":"<think>more</think>Checking both.",
				"tool_calls":[{"id":"t1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
				              {"id":"t2","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Rome\"}"}}]}}]}`,
			want: `{"id":"resp_1","object":"response","created_at":5,"model":"policy","output":[
				{"id":"rs_1","type":"reasoning","summary":[{"type":"summary_text","text":"plan"},{"type":"summary_text","text":"more"}],"encrypted_content":null,"content":null},
				{"id":"msg_1","type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"Checking both.","annotations":[],"logprobs":null}]},
				{"type":"function_call","id":"t1","call_id":"t1","name":"get_weather","arguments":"{\"city\":\"Paris\"}","status":"completed"},
				{"type":"function_call","id":"t2","call_id":"t2","name":"get_weather","arguments":"{\"city\":\"Rome\"}","status":"completed"}],
				"status":"completed","incomplete_details":null,"usage":null,` + echoDefaults + `}`,
		},
		{
			name: "length is incomplete with max_output_tokens, and an empty reply is a message with empty text",
			req:  `{"input":"x","max_output_tokens":4}`,
			completion: `{"id":"chtcmpl-123","object":"chat.completion","created":5,"model":"m","choices":[{"index":0,"finish_reason":"length",
				"message":{"role":"assistant","content":null}}],"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}`,
			want: `{"id":"resp_1","object":"response","created_at":5,"model":"policy","output":[
				{"id":"msg_1","type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"","annotations":[],"logprobs":null}]}],
				"parallel_tool_calls":true,"tool_choice":"auto","tools":[],"temperature":null,"top_p":null,
				"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},
				"usage":{"input_tokens":0,"input_tokens_details":{"cached_tokens":null},"output_tokens":0,"output_tokens_details":{"reasoning_tokens":null},"total_tokens":0},
				"error":null,"instructions":null,"metadata":null,"max_output_tokens":4}`,
		},
		{
			name: "content_filter is incomplete with content_filter; reasoning alone makes no message",
			req:  `{"input":"x"}`,
			completion: `{"id":"c","object":"chat.completion","created":5,"model":"m","choices":[{"index":0,"finish_reason":"content_filter",
				"message":{"role":"assistant","content":"<think>only thoughts</think>"}}]}`,
			want: `{"id":"resp_1","object":"response","created_at":5,"model":"policy","output":[
				{"id":"rs_1","type":"reasoning","summary":[{"type":"summary_text","text":"only thoughts"}],"encrypted_content":null,"content":null}],
				"status":"incomplete","incomplete_details":{"reason":"content_filter"},"usage":null,` + echoDefaults + `}`,
		},
		{
			name: "an unclosed think tag stays text; token fields land on the message",
			req:  `{"input":"x"}`,
			completion: `{"id":"c","object":"chat.completion","created":5,"model":"m","choices":[{"index":0,"finish_reason":"length",
				"message":{"role":"assistant","content":"<think>cut","prompt_token_ids":[1],"generation_token_ids":[2],"generation_log_probs":[-1]}}]}`,
			want: `{"id":"resp_1","object":"response","created_at":5,"model":"policy","output":[
				{"id":"msg_1","type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"<think>cut","annotations":[],"logprobs":null}],
				 "prompt_token_ids":[1],"generation_token_ids":[2],"generation_log_probs":[-1]}],
				"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":null,` + echoDefaults + `}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := openai.ChatToResponse(decodeRequest(t, tt.req), decodeCompletion(t, tt.completion), opts)
			if err != nil {
				t.Fatalf("ChatToResponse: %v", err)
			}
			b, err := codec.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			equalJSON(t, "response", b, tt.want)
		})
	}
}

func TestChatToResponse_FreshIDs(t *testing.T) {
	req := decodeRequest(t, `{"input":"x"}`)
	c := decodeCompletion(t, `{"id":"c","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"<think>r</think>hi"}}]}`)
	r, err := openai.ChatToResponse(req, c, openai.ResponseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		id, pattern string
	}{
		{r.ID, `^resp_[0-9a-f]{32}$`},
		{r.Output[0].ID, `^rs_[0-9a-f]{32}$`},
		{r.Output[1].ID, `^msg_[0-9a-f]{32}$`},
	}
	for _, c := range checks {
		if !regexp.MustCompile(c.pattern).MatchString(c.id) {
			t.Errorf("id %q does not match %s", c.id, c.pattern)
		}
	}
	if r.Model != "m" {
		t.Errorf("model = %q, want the completion's own when no model is configured", r.Model)
	}
}

func TestChatToResponse_NoChoices(t *testing.T) {
	_, err := openai.ChatToResponse(decodeRequest(t, `{"input":"x"}`), decodeCompletion(t, `{"id":"c","choices":[]}`), openai.ResponseOptions{})
	if err == nil {
		t.Fatal("ChatToResponse accepted a completion without choices")
	}
}

// TestRoundTrip feeds a converted response's output back as input, the way an
// agent continues a conversation, and checks the assistant turn comes back
// as the same chat message.
func TestRoundTrip(t *testing.T) {
	req := decodeRequest(t, `{"input":[{"role":"user","content":"q"}],"tools":[`+weatherTool+`]}`)
	c := decodeCompletion(t, `{"id":"c","created":1,"model":"m","choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant",
		"content":"<think>r</think>Checking.","tool_calls":[{"id":"t1","type":"function","function":{"name":"get_weather","arguments":"{}"}}],
		"prompt_token_ids":[1],"generation_token_ids":[2,3],"generation_log_probs":[-1,-2]}}]}`)
	resp, err := openai.ChatToResponse(req, c, openai.ResponseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	next := *req
	next.Input = openai.Input{IsItems: true, Items: append(append([]openai.Item{}, req.Input.Items...), resp.Output...)}
	// Through the wire, as a client would send it.
	b, err := codec.Marshal(&next)
	if err != nil {
		t.Fatal(err)
	}
	chat, err := openai.ResponsesToChat(decodeRequest(t, string(b)), "policy")
	if err != nil {
		t.Fatal(err)
	}
	got, err := codec.Marshal(chat.Messages[1])
	if err != nil {
		t.Fatal(err)
	}
	equalJSON(t, "assistant message", got, `{"role":"assistant","content":"Checking.","reasoning_content":"r","reasoning":"r",
		"tool_calls":[{"id":"t1","type":"function","function":{"name":"get_weather","arguments":"{}"}}],
		"prompt_token_ids":[1],"generation_token_ids":[2,3],"generation_log_probs":[-1,-2]}`)
}

func TestSplitThink(t *testing.T) {
	tests := []struct {
		in         string
		wantBlocks []string
		wantRest   string
	}{
		{"plain", nil, "plain"},
		{"<think>a</think>b", []string{"a"}, "b"},
		{"x<think>a\nb</think>y<think></think>z", []string{"a\nb", ""}, "xyz"},
		{"<think>open", nil, "<think>open"},
	}
	for _, tt := range tests {
		blocks, rest := openai.SplitThink(tt.in)
		if !reflect.DeepEqual(blocks, tt.wantBlocks) || rest != tt.wantRest {
			t.Errorf("SplitThink(%q) = %q, %q; want %q, %q", tt.in, blocks, rest, tt.wantBlocks, tt.wantRest)
		}
	}
}

func TestChatAccumulator(t *testing.T) {
	chunks := []string{
		`{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","prompt_token_ids":[1,2,3],"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":"hm"},"finish_reason":null,"token_ids":[10],"logprobs":{"content":[{"token":"token_id:10","logprob":-0.5,"top_logprobs":[]}]}}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null,"token_ids":[11],"logprobs":{"content":[{"token":"token_id:11","logprob":-0.25,"top_logprobs":[]}]}}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"t1","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]},"finish_reason":null}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]},"finish_reason":"tool_calls","token_ids":[12],"logprobs":{"content":[{"token":"token_id:12","logprob":-1,"top_logprobs":[]}]}}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}}`,
	}
	var acc openai.ChatAccumulator
	for _, s := range chunks {
		var ch openai.ChatChunk
		if err := codec.Unmarshal([]byte(s), &ch); err != nil {
			t.Fatal(err)
		}
		acc.Add(&ch)
	}
	b, err := codec.Marshal(acc.Completion())
	if err != nil {
		t.Fatal(err)
	}
	equalJSON(t, "completion", b, `{"id":"c1","object":"chat.completion","created":7,"model":"m","prompt_token_ids":[1,2,3],
		"choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","content":"Hel","reasoning_content":"hm",
			"tool_calls":[{"id":"t1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
			"token_ids":[10,11,12],"logprobs":{"content":[{"token":"token_id:10","logprob":-0.5,"top_logprobs":[]},{"token":"token_id:11","logprob":-0.25,"top_logprobs":[]},{"token":"token_id:12","logprob":-1,"top_logprobs":[]}]}}],
		"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}}`)
}

// FuzzResponsesToChat converts arbitrary decoded requests: conversion either
// succeeds or errors, never panics, and a converted request always encodes.
func FuzzResponsesToChat(f *testing.F) {
	seeds := []string{
		`{"input":"hi"}`,
		`{"input":[{"role":"user","content":"q"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"}],"tools":[` + weatherTool + `]}`,
		`{"instructions":"i","input":[{"role":"system","content":[{"type":"input_text","text":"s"}]},{"type":"reasoning","summary":[{"type":"summary_text","text":"r"}]}]}`,
		`{"input":[{"role":"user","content":[{"type":"input_image","image_url":{"url":"u"}}]}],"tool_choice":{"type":"function","name":"f"}}`,
		`{"input":[{"role":"assistant","content":"a","prompt_token_ids":[1],"generation_token_ids":[2],"generation_log_probs":[-1]}]}`,
		`{"input":[{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"x"}]}],"tool_choice":"required"}`,
		`{"input":[{}]}`, `{"input":null}`, `[]`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req openai.ResponsesRequest
		if err := codec.UnmarshalStrict(body, &req); err != nil {
			return
		}
		chat, err := openai.ResponsesToChat(&req, "m")
		if err != nil {
			return
		}
		if _, err := codec.Marshal(chat); err != nil {
			t.Fatalf("converted request does not encode: %v", err)
		}
		if len(chat.Messages) == 0 && req.Input.IsItems && len(req.Input.Items) > 0 && req.Instructions == nil {
			// Every input item maps to something, except empty assistant text.
			for _, it := range req.Input.Items {
				if it.Type != openai.ItemMessage || it.Role != "assistant" {
					if it.Type != openai.ItemReasoning {
						t.Fatalf("items %+v produced no messages", req.Input.Items)
					}
				}
			}
		}
		// The reply side must accept any completion shape the conversion implies.
		if len(chat.Messages) == 0 {
			return
		}
		c := &openai.ChatCompletion{Choices: []openai.ChatChoice{{Message: openai.ChatMessage{Role: "assistant", Content: chat.Messages[len(chat.Messages)-1].Content}}}}
		if _, err := openai.ChatToResponse(&req, c, openai.ResponseOptions{}); err != nil {
			t.Fatalf("ChatToResponse: %v", err)
		}
	})
}
