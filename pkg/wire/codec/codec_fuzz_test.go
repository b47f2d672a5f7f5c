package codec_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/tokencapture"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// The differential fuzz targets below are the guard the codec package's doc
// promises: for every wire and durable type of ours, goccy/go-json (the data
// path, codec.Unmarshal/codec.Marshal) and encoding/json (the reference) must
// accept the same inputs, decode them to equal values (reflect.DeepEqual), and
// encode those values to the same bytes. Byte equality is required, escaping
// included: both escape <, > and & and U+2028/U+2029 and replace invalid UTF-8
// the same way, so no escaping allowance is needed.
//
// The one known divergence, special-cased as narrowly as possible: when a
// decode FAILS, only failure itself is compared. The error texts may differ,
// and so do the partial values left behind (encoding/json keeps decoding the
// rest of the object after a type mismatch, goccy stops at the first error).
// No caller of ours uses a value whose decode failed.
//
// Observed with goccy/go-json v0.12.0 on Go 1.26.8: no other divergence on
// these types (each target fuzzed for several seconds, plus the seeds). The
// openai types' own MarshalJSON/UnmarshalJSON call codec internally, so under
// encoding/json their outer layers are encoding/json and their inner ones
// goccy; the comparison still covers every struct, tag and RawMessage of ours.

// differential decodes data into a fresh T with both codecs and checks they
// agree, then checks that both encoders produce the same bytes for the value.
func differential[T any](t *testing.T, data []byte) {
	t.Helper()
	var viaGoccy, viaStd T
	errGoccy := codec.Unmarshal(data, &viaGoccy)
	errStd := json.Unmarshal(data, &viaStd)
	if (errGoccy == nil) != (errStd == nil) {
		t.Fatalf("decoders disagree on %q:\n goccy:         %v\n encoding/json: %v", data, errGoccy, errStd)
	}
	if errStd != nil {
		return
	}
	if !reflect.DeepEqual(viaGoccy, viaStd) {
		t.Fatalf("decoded values differ for %q:\n goccy:         %#v\n encoding/json: %#v", data, viaGoccy, viaStd)
	}
	outGoccy, errGoccy := codec.Marshal(viaStd)
	outStd, errStd := json.Marshal(viaStd)
	if (errGoccy == nil) != (errStd == nil) {
		t.Fatalf("encoders disagree on %#v:\n goccy:         %v\n encoding/json: %v", viaStd, errGoccy, errStd)
	}
	if errStd != nil {
		return
	}
	if !bytes.Equal(outGoccy, outStd) {
		t.Fatalf("encodings differ for %#v:\n goccy:         %s\n encoding/json: %s", viaStd, outGoccy, outStd)
	}
}

// addSeeds adds every seed to f, plus the golden files of the fake inference
// server whose names match glob (they are real replies of ours).
func addSeeds(f *testing.F, seeds []string, goldenGlob string) {
	f.Helper()
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	if goldenGlob == "" {
		return
	}
	paths, err := filepath.Glob(filepath.Join("..", "fakeinference", "testdata", goldenGlob))
	if err != nil {
		f.Fatal(err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		if strings.HasSuffix(p, ".txt") {
			// An SSE golden: every data line but [DONE] is one chunk.
			for _, line := range strings.Split(string(b), "\n") {
				if data, ok := strings.CutPrefix(line, "data: "); ok && data != "[DONE]" {
					f.Add([]byte(data))
				}
			}
			continue
		}
		f.Add(b)
	}
}

// weatherTool is pkg/wire/openai's test tool.
const weatherTool = `{"type":"function","name":"get_weather","description":"Get the weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]},"strict":true}`

// Inputs that probe the corners where JSON codecs historically disagree.
var edgeSeeds = []string{
	``, ` `, `null`, `{}`, `[]`, `"x"`, `0`, `{`, `{"a":}`, `{} {}`, `{}x`, ` {} `,
	`{"model":"\u00e9\ud83d\ude00"}`, `{"model":"\ud800"}`, "{\"model\":\"\xff\"}",
	`{"model":"<a href=\"x\">&amp;</a>"}`, `{"model":"\u2028\u2029"}`,
	`{"created":1e400}`, `{"created":-0}`, `{"created":1.5}`, `{"created":9223372036854775808}`,
	`{"MODEL":"upper","Model":"title"}`, `{"model":"a","model":"b"}`,
	`{"tool_choice":"<&>\u2028","stop":[ "\u003c" , 1e2 ],"record":{ "a" : "<>" }}`,
	`{"messages":[{"role":"user","content":"<b>\u2029</b>"}],"input":[{"role":"user","content":"&"}]}`,
	`{"metadata":{"b":"1","a":"2","<":"&"},"chat_template_kwargs":{"z":1,"a":[true,null]}}`,
}

func FuzzChatRequest(f *testing.F) {
	addSeeds(f, append([]string{
		`{"model":"whatever","messages":[{"role":"user","content":"Call get_weather with {\"city\": \"Paris\"}"}],` +
			`"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],` +
			`"temperature":0.25,"guided_decoding_backend":{"custom":[1,2.50,"x"]}}`,
		`{"model":"policy","messages":[{"role":"user","content":[{"type":"text","text":"What is the weather in Paris?"}]}],"max_tokens":256,"temperature":0.5,"top_p":0.9}`,
		`{"messages":[{"role":"developer","content":"dev"},{"role":"user","content":"u"}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},` +
			`{"role":"tool","tool_call_id":"chatcmpl-tool-1","content":"{\"city\":\"Paris\",\"weather_description\":\"sunny, 21C\"}"}],` +
			`"logprobs":true,"top_logprobs":0,"return_token_ids":true,"return_tokens_as_token_ids":true,"metadata":{"fake_script":"[]"}}`,
		`{"messages":[{"role":"user","content":"\u00e9\"\\"}],"x":{"y":[1e400]}}`,
		`{"messages":[],"stream":true,"n":1}`, `{"messages":{}}`, `{"messages":[],"stream":"no"}`, `{"a":1,"a":2,"messages":[]}`,
		`{"messages":[{"role":"assistant","content":"x","prompt_token_ids":[1,2],"generation_token_ids":[3],"generation_log_probs":[-0.5]}],"chat_template_kwargs":{"enable_thinking":false,"n":[1,{"k":null}]}}`,
		`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:x"}}]}],"tool_choice":{"type":"function","function":{"name":"f"}},"stop":["\n"],"seed":-7,"response_format":{"type":"json_object"}}`,
	}, edgeSeeds...), "")
	f.Fuzz(func(t *testing.T, data []byte) { differential[openai.ChatRequest](t, data) })
}

func FuzzChatCompletion(f *testing.F) {
	addSeeds(f, append([]string{
		`{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"fake-model",` +
			`"choices":[{"index":0,"message":{"role":"assistant","content":"The answer is: sunny"},"finish_reason":"stop","logprobs":{"content":[{"token":"token_id:10","logprob":-0.25,"top_logprobs":[]}]},"token_ids":[10],"stop_reason":null}],` +
			`"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5},"prompt_token_ids":[1,2,3],"kv_transfer_params":null}`,
		`{"prompt_token_ids":[9],"choices":[{"message":{"role":"assistant","prompt_token_ids":[1],"generation_token_ids":[2],"generation_log_probs":[-1]}}]}`,
		`{"choices":[{"message":{"role":"assistant","reasoning_content":"think","content":[]}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2,"prompt_tokens_details":{"cached_tokens":null},"completion_tokens_details":{"reasoning_tokens":4}}}`,
	}, edgeSeeds...), "chat_*.golden.json")
	f.Fuzz(func(t *testing.T, data []byte) { differential[openai.ChatCompletion](t, data) })
}

func FuzzChatChunk(f *testing.F) {
	addSeeds(f, append([]string{
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":3,"id":"x","function":{"name":"f","arguments":"{"}}]},"finish_reason":"tool_calls","token_ids":[1]}]}`,
		`{"choices":[],"usage":{"prompt_tokens":6,"completion_tokens":14,"total_tokens":20}}`,
	}, edgeSeeds...), "stream_*.golden.txt")
	f.Fuzz(func(t *testing.T, data []byte) { differential[openai.ChatChunk](t, data) })
}

func FuzzResponsesRequest(f *testing.F) {
	addSeeds(f, append([]string{
		`{"input":[{"role":"user","content":"Call get_weather with {\"city\": \"Paris\"}"}],` +
			`"tools":[{"type":"function","name":"get_weather","description":"weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true}],` +
			`"instructions":"Be brief.","temperature":0.5,"max_output_tokens":100,"metadata":{"task":"w"}}`,
		`{"input":"What is the weather in Paris?","max_output_tokens":256,"temperature":0.5,"top_p":0.9}`,
		`{"input":"hi","stream":true}`,
		`{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"}]}`,
		`{"input":"hi","unknown":1}`, `{"input":null}`,
		`{"input":[{"role":"user","content":[{"type":"input_image","image_url":"u","detail":"low"}]}]}`,
		`{"input":"x","reasoning":{"effort":"high"},"tool_choice":{"type":"function","name":"f"},"tools":[{"type":"function","name":"f"}]}`,
		`{"input":"hi","reasoning":{"effort":"low"},"metadata":{"fake_script":"[]"},"user":"u1","store":false,"include":["reasoning.encrypted_content"],"truncation":"auto","text":{"format":{"type":"text"}}}`,
		`{"input":[{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"s"}],"encrypted_content":null},{"type":"mcp_call","id":"x"},{"content":"no role"}]}`,
		// From pkg/wire/openai's conversion tests.
		`{"input":[
			{"role":"user","content":"Call get_weather with {\"city\": \"Paris\"}"},
			{"type":"function_call","id":"call_1","call_id":"call_1","name":"get_weather","arguments":"{\"city\": \"Paris\"}","status":"completed"},
			{"type":"function_call_output","call_id":"call_1","output":"{\"city\":\"Paris\",\"weather_description\":\"sunny, 21C\"}"}
		],"tools":[` + weatherTool + `],"tool_choice":"auto","parallel_tool_calls":false}`,
		`{"input":[
			{"role":"user","content":"hi"},
			{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"think A"},{"type":"summary_text","text":""},{"type":"summary_text","text":"think B"}]},
			{"type":"message","role":"assistant","id":"msg_1","status":"completed","content":[{"type":"output_text","text":"Let me check.","annotations":[]}]},
			{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
			{"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"rainy"}]},
			{"role":"assistant","content":"Paris is sunny, Rome is rainy."}
		],"tools":[` + weatherTool + `]}`,
		`{"instructions":"You are terse.","input":[
			{"role":"system","content":"Use metric units."},
			{"role":"developer","content":[{"type":"input_text","text":"Never guess."}]},
			{"role":"user","content":"weather?"}
		]}`,
	}, edgeSeeds...), "")
	f.Fuzz(func(t *testing.T, data []byte) { differential[openai.ResponsesRequest](t, data) })
}

func FuzzResponse(f *testing.F) {
	addSeeds(f, append([]string{
		// From pkg/wire/openai's conversion tests.
		`{"id":"resp_1","object":"response","created_at":1700000000,"model":"policy","output":[
			{"type":"function_call","id":"chatcmpl-tool-1","call_id":"chatcmpl-tool-1","name":"get_weather","arguments":"{\"city\": \"Paris\"}","status":"completed",
			 "prompt_token_ids":[1,2],"generation_token_ids":[5,6,7],"generation_log_probs":[-0.1,-0.2,-0.3]}],
			"parallel_tool_calls":true,"tool_choice":"auto","tools":[` + weatherTool + `],"temperature":0.7,"top_p":null,
			"status":"completed","incomplete_details":null,
			"usage":{"input_tokens":2,"input_tokens_details":{"cached_tokens":null},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":null},"total_tokens":5},
			"error":null,"instructions":"Be brief.","metadata":{"k":"v"},"max_output_tokens":64}`,
		`{"id":"resp_1","object":"response","created_at":1700000000,"model":"policy","output":[` +
			`{"id":"msg_1","type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"sunny","annotations":[],"logprobs":null}],` +
			`"prompt_token_ids":[1,2],"generation_token_ids":[3],"generation_log_probs":[-0.5]}],` +
			`"parallel_tool_calls":true,"tool_choice":"auto","tools":[],"temperature":0.7,"top_p":null,"status":"completed","incomplete_details":null,` +
			`"usage":{"input_tokens":3,"input_tokens_details":{"cached_tokens":0},"output_tokens":1,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":4},` +
			`"error":null,"instructions":"Be brief.","metadata":{"k":"v"},"max_output_tokens":64}`,
		`{"id":"resp_2","object":"response","created_at":5,"model":"policy","output":[{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}","status":"completed"}],` +
			`"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":null}`,
	}, edgeSeeds...), "")
	f.Fuzz(func(t *testing.T, data []byte) { differential[openai.Response](t, data) })
}

func FuzzItem(f *testing.F) {
	addSeeds(f, append([]string{
		`{"role":"user","content":"hi"}`,
		`{"type":"message","role":"assistant","id":"msg_1","status":"completed","content":[{"type":"output_text","text":"ok","annotations":[],"logprobs":null}]}`,
		`{"type":"function_call","call_id":"c","name":"f","arguments":"{}","prompt_token_ids":[1],"generation_token_ids":[2],"generation_log_probs":[-1]}`,
		`{"type":"function_call_output","call_id":"c","output":"o"}`,
		`{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"o"}]}`,
		`{"type":"reasoning","id":"rs","summary":[],"encrypted_content":"abc"}`,
		`{"content":"no role"}`, `{"type":"mcp_call"}`,
	}, edgeSeeds...), "")
	f.Fuzz(func(t *testing.T, data []byte) { differential[openai.Item](t, data) })
}

func FuzzCkptstoreRecord(f *testing.F) {
	addSeeds(f, append([]string{
		`{"episode_id":{"rollout_id":"w","attempt":1},"record":{"kind":"episode","steps":[{"n":1,"tool":"get_weather"}]}}`,
		`{"episode_id":{"rollout_id":"3-0","attempt":0},"record":null}`,
		`{"episode_id":{"rollout_id":"x"},"record":"text"}`,
		`{"episode_id":{"rollout_id":"x"},"record":{ "spaced" : [ 1 , 2 ] }}`,
	}, edgeSeeds...), "")
	f.Fuzz(func(t *testing.T, data []byte) { differential[ckptstore.Record](t, data) })
}

func FuzzCommitRequest(f *testing.F) {
	addSeeds(f, append([]string{
		`{"checkpoint_id":"ck-1","deadline_ts":1700000000.25,"checkpoint_dir":"/tmp/ck","episode_ids":[{"rollout_id":"w","attempt":0},{"rollout_id":"c","attempt":2}],"stop":true}`,
		`{"checkpoint_id":"ck-1","deadline_ts":0,"checkpoint_dir":"","episode_ids":[]}`,
		`{"episode_ids":null,"stop":"yes"}`,
	}, edgeSeeds...), "")
	f.Fuzz(func(t *testing.T, data []byte) { differential[ctlplane.CommitRequest](t, data) })
}

func FuzzRestoreRequest(f *testing.F) {
	addSeeds(f, append([]string{
		`{"checkpoint_id":"ck-1","deadline_ts":1700000000.5,"checkpoint_dir":"/tmp/ck","episode_ids":[{"rollout_id":"w","attempt":0}]}`,
		`{"checkpoint_id":"ck-1","episode_ids":[{"rollout_id":"w","attempt":-1}]}`,
	}, edgeSeeds...), "")
	f.Fuzz(func(t *testing.T, data []byte) { differential[ctlplane.RestoreRequest](t, data) })
}

func FuzzTokencaptureRow(f *testing.F) {
	addSeeds(f, append([]string{
		`{"call_id":"call-1","parent_call_id":"","capture_key":"w-a1","seq":1,"created_at":1700000000.123,"model":"fake-model","request_digest":"sha256:ab",` +
			`"prompt_token_ids":[1,2,3],"generation_token_ids":[7,8],"generation_log_probs":[-0.25,-1.5],"finish_reason":"stop"}`,
		`{"call_id":"call-2","parent_call_id":"call-1","capture_key":"w","seq":2,"prompt_token_ids":[],"generation_token_ids":[],"generation_log_probs":[],"continued_from":"cut-1"}`,
		`{"generation_log_probs":[-1e-7,1.7976931348623157e308,5e-324]}`,
	}, edgeSeeds...), "")
	f.Fuzz(func(t *testing.T, data []byte) { differential[tokencapture.Row](t, data) })
}

func FuzzEpisodeID(f *testing.F) {
	addSeeds(f, append([]string{
		`{"rollout_id":"w","attempt":0}`, `{"rollout_id":"3-0","attempt":12}`, `{"rollout_id":7}`, `{"attempt":"1"}`,
	}, edgeSeeds...), "")
	f.Fuzz(func(t *testing.T, data []byte) { differential[rollout.EpisodeID](t, data) })
}
