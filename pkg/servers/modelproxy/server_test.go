package modelproxy_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
	"github.com/gymfleet/gymfleet/pkg/transport/sse"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var hex32 = regexp.MustCompile(`^[0-9a-f]{32}$`)

const chatBody = `{"model":"whatever","messages":[{"role":"user","content":"Call get_weather with {\"city\": \"Paris\"}"}],` +
	`"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],` +
	`"temperature":0.25,"guided_decoding_backend":{"custom":[1,2.50,"x"]}}`

func TestChat_PassThroughCaptured(t *testing.T) {
	up := newStub(t)
	up.script(replyJSON(200, completion(weatherCall, "tool_calls", []int{1, 2, 3}, []int{7, 8})))
	p := newProxy(t, up, nil)

	status, body := p.post(t, "/ng-rollout/weather-1/v1/chat/completions", chatBody)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	// Transport fields gone, token fields on the message, everything else as vLLM sent it.
	equalJSON(t, "reply", body, `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"fake-model",
		"choices":[{"index":0,"finish_reason":"tool_calls","stop_reason":null,"message":{"role":"assistant","content":null,
			"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}],
			"prompt_token_ids":[1,2,3],"generation_token_ids":[7,8],"generation_log_probs":[-0.025,-0.125]}}],
		"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5},"kv_transfer_params":null}`)

	req := up.last(t)
	if req.Path != "/v1/chat/completions" {
		t.Errorf("upstream path %s", req.Path)
	}
	if req.Header.Get(modelproxy.HeaderCaptureKey) != "weather-1" {
		t.Errorf("X-Ng-Capture-Key = %q", req.Header.Get(modelproxy.HeaderCaptureKey))
	}
	callID := req.Header.Get(modelproxy.HeaderModelCallID)
	if !hex32.MatchString(callID) {
		t.Errorf("X-Ng-Model-Call-Id = %q, want 32 hex digits", callID)
	}
	b, _ := json.Marshal(req.Body)
	equalJSON(t, "upstream body", b, `{"model":"fake-model","messages":[{"role":"user","content":"Call get_weather with {\"city\": \"Paris\"}"}],
		"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],
		"temperature":0.25,"guided_decoding_backend":{"custom":[1,2.50,"x"]},
		"logprobs":true,"top_logprobs":0,"return_tokens_as_token_ids":true,"return_token_ids":true}`)

	m := p.manifest(t, "weather-1")
	if len(m.Records) != 1 || len(m.Failures) != 0 || m.RolloutID != "weather-1" {
		t.Fatalf("manifest = %+v", m)
	}
	row := m.Records[0]
	// The digest is over the canonical messages and tools, so a client that
	// re-sends the conversation with other spacing or key order matches.
	canonical := `{"messages":[{"content":"Call get_weather with {\"city\": \"Paris\"}","role":"user"}],"tools":[{"function":{"name":"get_weather","parameters":{"properties":{"city":{"type":"string"}},"type":"object"}},"type":"function"}]}`
	sum := sha256.Sum256([]byte(canonical))
	if row.CallID != callID || row.CaptureKey != "weather-1" || row.Seq != 1 || row.ParentCallID != "" ||
		row.Model != "fake-model" || row.FinishReason != "tool_calls" || row.RequestDigest != hex.EncodeToString(sum[:]) ||
		!slices.Equal(row.PromptTokenIDs, []int{1, 2, 3}) || !slices.Equal(row.GenerationTokenIDs, []int{7, 8}) ||
		!slices.Equal(row.GenerationLogProbs, []float64{-0.025, -0.125}) || row.CreatedAt == 0 {
		t.Fatalf("row = %+v", row)
	}

	// The next call of the attempt is linked to the first.
	up.script(replyJSON(200, completion(`{"role":"assistant","content":"The answer is: sunny"}`, "stop", []int{1, 2, 3, 7, 8, 9}, []int{10})))
	if status, body := p.post(t, "/ng-rollout/weather-1/v1/chat/completions", chatBody); status != http.StatusOK {
		t.Fatalf("second call: %d %s", status, body)
	}
	m = p.manifest(t, "weather-1")
	if len(m.Records) != 2 || m.Records[1].ParentCallID != callID || m.Records[1].Seq != 2 || m.Records[1].RequestDigest != row.RequestDigest {
		t.Fatalf("second row = %+v", m.Records)
	}
	if got := metricValue(t, p.reg, "gymfleet_model_calls_total", map[string]string{"route": "chat", "outcome": "ok"}); got != 2 {
		t.Errorf("calls metric = %v", got)
	}
	if got := metricValue(t, p.reg, "gymfleet_model_tokens_total", map[string]string{"kind": "prompt"}); got != 9 {
		t.Errorf("prompt tokens metric = %v", got)
	}
	if got := metricValue(t, p.reg, "gymfleet_model_calls_in_flight", nil); got != 0 {
		t.Errorf("in flight = %v", got)
	}
}

func TestChat_UncapturedStillGetsTokens(t *testing.T) {
	up := newStub(t)
	up.script(replyJSON(200, completion(`{"role":"assistant","content":"hi"}`, "stop", []int{5}, []int{6})))
	p := newProxy(t, up, nil)
	status, body := p.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
	msg := decode(t, body)["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	if fmt.Sprint(msg["generation_token_ids"]) != "[6]" || fmt.Sprint(msg["prompt_token_ids"]) != "[5]" {
		t.Fatalf("message = %v", msg)
	}
	req := up.last(t)
	if req.Header.Get(modelproxy.HeaderCaptureKey) != "" || req.Header.Get(modelproxy.HeaderModelCallID) != "" {
		t.Fatalf("uncaptured call sent capture headers: %v", req.Header)
	}
	if keys := p.srv.Ledger().Keys(); len(keys) != 0 {
		t.Fatalf("uncaptured call wrote the ledger: %v", keys)
	}
}

// TestChat_DropsToolStrict: strict leaves every function tool's definition
// before vLLM, as NeMo Gym's vllm_model drops it
// (VLLMModel._strip_hosted_only_tool_fields, nemo-gym 0.7.0); the rest of
// the tools goes on as sent.
func TestChat_DropsToolStrict(t *testing.T) {
	up := newStub(t)
	up.script(replyJSON(200, completion(`{"role":"assistant","content":"hi"}`, "stop", []int{5}, []int{6})))
	p := newProxy(t, up, nil)
	status, body := p.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"tools":[`+
		`{"type":"function","function":{"name":"a","description":"<a>","parameters":{"type":"object"},"strict":true}},`+
		`{"type":"function","function":{"name":"b","strict":false}},`+
		`{"type":"function","function":{"name":"c"}},`+
		`{"type":"custom","custom":{"name":"d","strict":true}}]}`)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
	tools, _ := json.Marshal(up.last(t).Body["tools"])
	equalJSON(t, "upstream tools", tools, `[
		{"type":"function","function":{"name":"a","description":"<a>","parameters":{"type":"object"}}},
		{"type":"function","function":{"name":"b"}},
		{"type":"function","function":{"name":"c"}},
		{"type":"custom","custom":{"name":"d","strict":true}}]`)
}

// TestChat_ReasoningFromThinkInHistory: an assistant message of the
// history goes to vLLM with its <think> blocks taken out of the content and
// the first as its reasoning, as NeMo Gym's vllm_model sends it with the
// reasoning parser on (_preprocess_chat_completion_create_params,
// nemo-gym 0.7.0); user messages and a reply's own fields are left alone.
func TestChat_ReasoningFromThinkInHistory(t *testing.T) {
	up := newStub(t)
	up.script(replyJSON(200, completion(`{"role":"assistant","content":"hi"}`, "stop", []int{5}, []int{6})))
	p := newProxy(t, up, nil)
	status, body := p.post(t, "/v1/chat/completions", `{"messages":[`+
		`{"role":"user","content":"<think>u</think>q"},`+
		`{"role":"assistant","content":"<think>a</think>x<think>b</think>y","prompt_token_ids":[1],"generation_token_ids":[2],"generation_log_probs":[-1]},`+
		`{"role":"assistant","content":[{"type":"text","text":"\u003cthink\u003ec\u003c/think\u003ez"},{"type":"text","text":"w"}]},`+
		`{"role":"assistant","content":"plain"}]}`)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
	msgs, _ := json.Marshal(up.last(t).Body["messages"])
	equalJSON(t, "upstream messages", msgs, `[
		{"role":"user","content":"<think>u</think>q"},
		{"role":"assistant","content":"xy","reasoning_content":"a","reasoning":"a","prompt_token_ids":[1],"generation_token_ids":[2],"generation_log_probs":[-1]},
		{"role":"assistant","content":[{"type":"text","text":"z"},{"type":"text","text":"w"}],"reasoning_content":"c","reasoning":"c"},
		{"role":"assistant","content":"plain"}]`)
}

func TestChat_ReturnTokenIDsOff(t *testing.T) {
	up := newStub(t)
	raw := completion(`{"role":"assistant","content":"hi"}`, "stop", []int{5}, []int{6})
	up.script(replyJSON(200, raw))
	p := newProxy(t, up, func(c *modelproxy.Config) { c.ReturnTokenIDs = false })
	status, body := p.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"logprobs":false}`)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
	equalJSON(t, "reply passes through unchanged", body, raw)
	req := up.last(t)
	if req.Body["logprobs"] != false || req.Body["return_token_ids"] != nil {
		t.Fatalf("token parameters were forced: %v", req.Body)
	}
}

func TestChat_CaptureFailuresNeverFailTheCall(t *testing.T) {
	mismatch := strings.Replace(completion(`{"role":"assistant","content":"x"}`, "stop", []int{1}, []int{7, 8}), `"token_ids":[7,8]`, `"token_ids":[7,9]`, 1)
	tests := []struct {
		name, reply, wantReason string
	}{
		{"token ids disagree with logprobs", mismatch, "token_ids says 9"},
		{"partial inline ids", `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"stop","token_ids":[],"logprobs":{"content":[]}}]}`, "no prompt_token_ids"},
		{"no logprobs", `{"id":"c","object":"chat.completion","created":1,"model":"m","prompt_token_ids":[1],"choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"stop","token_ids":[3]}]}`, "no logprobs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newStub(t)
			up.script(replyJSON(200, tt.reply))
			p := newProxy(t, up, nil)
			status, body := p.post(t, "/ng-rollout/r/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`)
			if status != http.StatusOK {
				t.Fatalf("%d %s", status, body)
			}
			msg := decode(t, body)["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
			if _, ok := msg["generation_token_ids"]; ok {
				t.Fatalf("unusable tokens reached the reply: %v", msg)
			}
			m := p.manifest(t, "r")
			if len(m.Records) != 0 || len(m.Failures) != 1 || !strings.Contains(m.Failures[0].Reason, tt.wantReason) {
				t.Fatalf("manifest = %+v", m)
			}
			if m.Failures[0].CallID != up.lastChat(t).Header.Get(modelproxy.HeaderModelCallID) {
				t.Fatalf("failure names call %s", m.Failures[0].CallID)
			}
			if got := metricValue(t, p.reg, "gymfleet_model_capture_failures_total", nil); got != 1 {
				t.Fatalf("capture failures metric = %v", got)
			}
		})
	}
}

func TestChat_ContextOverflow(t *testing.T) {
	up := newStub(t)
	up.script(replyJSON(400, `{"object":"error","message":"This model's maximum context length is 32768 tokens. However, you requested 40000 tokens.","type":"BadRequestError","param":null,"code":400}`))
	p := newProxy(t, up, nil)
	status, body := p.post(t, "/ng-rollout/r/v1/chat/completions", `{"messages":[{"role":"user","content":"long"}]}`)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
	v := decode(t, body)
	choice := v["choices"].([]any)[0].(map[string]any)
	if v["id"] != "chtcmpl-123" || choice["finish_reason"] != "length" || choice["message"].(map[string]any)["content"] != nil {
		t.Fatalf("synthetic completion = %s", body)
	}
	if m := p.manifest(t, "r"); len(m.Records) != 0 || len(m.Failures) != 1 || !strings.Contains(m.Failures[0].Reason, "context length") {
		t.Fatalf("manifest = %+v", m)
	}
	if got := metricValue(t, p.reg, "gymfleet_model_calls_total", map[string]string{"route": "chat", "outcome": "context_overflow"}); got != 1 {
		t.Errorf("calls metric = %v", got)
	}

	// A streaming call overflows into a one-chunk stream.
	status, body = p.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"long"}],"stream":true}`)
	evs := events(t, body)
	if status != http.StatusOK || len(evs) != 2 || string(evs[1].Data) != "[DONE]" || !strings.Contains(string(evs[0].Data), `"finish_reason":"length"`) {
		t.Fatalf("overflowed stream: %d %s", status, body)
	}
}

func TestChat_Errors(t *testing.T) {
	up := newStub(t)
	up.script(replyJSON(500, `{"detail":"engine boom"}`))
	p := newProxy(t, up, nil)
	tests := []struct {
		name, body string
		status     int
		code       string
		detail     string
	}{
		{"upstream error", `{"messages":[{"role":"user","content":"x"}]}`, 502, "upstream_error", "engine boom"},
		{"not JSON", `{"messages":`, 400, "invalid_request", "not valid JSON"},
		{"not an object", `[1]`, 400, "invalid_request", "JSON object"},
		{"no messages", `{"model":"x"}`, 400, "invalid_request", "messages"},
		{"stream not a boolean", `{"messages":[],"stream":"yes"}`, 400, "invalid_request", "stream"},
		{"n above 1", `{"messages":[],"n":2}`, 400, "invalid_request", "n must be 1"},
		{"empty", ``, 400, "invalid_request", "empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := p.post(t, "/ng-rollout/r/v1/chat/completions", tt.body)
			v := decode(t, body)
			e, _ := v["error"].(map[string]any)
			if status != tt.status || e["code"] != tt.code || !strings.Contains(fmt.Sprint(e["detail"]), tt.detail) {
				t.Fatalf("got %d %s, want %d %s containing %q", status, body, tt.status, tt.code, tt.detail)
			}
		})
	}
	// Failed calls write no rows.
	if m := p.manifest(t, "r"); len(m.Records) != 0 || len(m.Failures) != 0 {
		t.Fatalf("manifest after failed calls = %+v", m)
	}
}

// TestChat_StreamRelaysChunksAsTheyArrive holds the upstream mid-stream and
// checks the client already has the first chunk; the ledger row exists by
// the time [DONE] arrives.
func TestChat_StreamRelaysChunksAsTheyArrive(t *testing.T) {
	up := newStub(t)
	release := make(chan struct{})
	first := `{"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","prompt_token_ids":[1,2],"choices":[{"index":0,"delta":{"role":"assistant","content":"The "},"logprobs":{"content":[{"token":"token_id:11","logprob":-0.5,"top_logprobs":[]}]},"token_ids":[11],"finish_reason":null}]}`
	second := `{"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{"content":"answer"},"logprobs":{"content":[{"token":"token_id:12","logprob":-0.25,"top_logprobs":[]}]},"token_ids":[12],"finish_reason":"stop"}]}`
	up.script(func(w http.ResponseWriter, r *http.Request, _ map[string]any) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: %s\n\n", first)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", second)
	})
	p := newProxy(t, up, nil)
	// The client asks for log-probs, so the chunks pass byte for byte (the
	// server's own are taken out of them).
	resp, err := http.Post(p.url+"/ng-rollout/s1/v1/chat/completions", "application/json",
		strings.NewReader(`{"messages":[{"role":"user","content":"q"}],"stream":true,"logprobs":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	buf := make([]byte, 4096)
	n, err := resp.Body.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(buf[:n]); got != "data: "+first+"\n\n" {
		t.Fatalf("first bytes = %q", got)
	}
	if m := p.manifest(t, "s1"); len(m.Records) != 0 {
		t.Fatalf("row staged before the stream finished: %+v", m)
	}
	close(release)
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(rest); got != "data: "+second+"\n\ndata: [DONE]\n\n" {
		t.Fatalf("rest = %q", got)
	}
	m := p.manifest(t, "s1")
	if len(m.Records) != 1 || !slices.Equal(m.Records[0].PromptTokenIDs, []int{1, 2}) || !slices.Equal(m.Records[0].GenerationTokenIDs, []int{11, 12}) ||
		!slices.Equal(m.Records[0].GenerationLogProbs, []float64{-0.5, -0.25}) || m.Records[0].FinishReason != "stop" {
		t.Fatalf("manifest = %+v", m)
	}
}

func TestChat_StreamBrokenUpstream(t *testing.T) {
	up := newStub(t)
	up.script(func(w http.ResponseWriter, r *http.Request, _ map[string]any) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"par"},"finish_reason":null}]}`+"\n\n")
		// The engine dies mid-generation: the stream ends with no finish.
	})
	p := newProxy(t, up, nil)
	status, body := p.post(t, "/ng-rollout/b/v1/chat/completions", `{"messages":[{"role":"user","content":"q"}],"stream":true}`)
	evs := events(t, body)
	if status != http.StatusOK || len(evs) != 3 || !strings.Contains(string(evs[1].Data), `"code":"upstream_error"`) || string(evs[2].Data) != "[DONE]" {
		t.Fatalf("broken stream relayed as %d %q", status, body)
	}
	if m := p.manifest(t, "b"); len(m.Records) != 0 || len(m.Failures) != 1 {
		t.Fatalf("manifest = %+v", m)
	}
	if got := metricValue(t, p.reg, "gymfleet_model_calls_total", map[string]string{"route": "chat", "outcome": "stream_error"}); got != 1 {
		t.Errorf("calls metric = %v", got)
	}
}

const responsesBody = `{"input":[{"role":"user","content":"Call get_weather with {\"city\": \"Paris\"}"}],` +
	`"tools":[{"type":"function","name":"get_weather","description":"weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true}],` +
	`"instructions":"Be brief.","temperature":0.5,"max_output_tokens":100,"metadata":{"task":"w"}}`

func TestResponses_ToolCall(t *testing.T) {
	up := newStub(t)
	up.script(replyJSON(200, completion(weatherCall, "tool_calls", []int{1, 2, 3}, []int{7, 8})))
	p := newProxy(t, up, nil)
	status, body := p.post(t, "/ng-rollout/w-a1/v1/responses", responsesBody)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
	v := decode(t, body)
	if !regexp.MustCompile(`^resp_[0-9a-f]{32}$`).MatchString(fmt.Sprint(v["id"])) {
		t.Errorf("id %v", v["id"])
	}
	delete(v, "id")
	b, _ := json.Marshal(v)
	equalJSON(t, "response", b, `{"object":"response","created_at":1700000000,"model":"fake-model",
		"output":[{"type":"function_call","id":"chatcmpl-tool-1","call_id":"chatcmpl-tool-1","name":"get_weather","arguments":"{\"city\": \"Paris\"}","status":"completed",
			"prompt_token_ids":[1,2,3],"generation_token_ids":[7,8],"generation_log_probs":[-0.025,-0.125]}],
		"parallel_tool_calls":true,"tool_choice":"auto",
		"tools":[{"type":"function","name":"get_weather","description":"weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true}],
		"temperature":0.5,"top_p":null,"status":"completed","incomplete_details":null,
		"usage":{"input_tokens":3,"input_tokens_details":{"cached_tokens":null},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":null},"total_tokens":5},
		"error":null,"instructions":"Be brief.","metadata":{"task":"w"},"max_output_tokens":100}`)

	ub, _ := json.Marshal(up.last(t).Body)
	equalJSON(t, "upstream chat request", ub, `{"model":"fake-model","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Call get_weather with {\"city\": \"Paris\"}"}],
		"tools":[{"type":"function","function":{"name":"get_weather","description":"weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],
		"temperature":0.5,"max_tokens":100,"metadata":{"task":"w"},
		"logprobs":true,"top_logprobs":0,"return_tokens_as_token_ids":true,"return_token_ids":true}`)

	// Continue the episode with the tool result: the assistant history's
	// tokens go upstream on the merged assistant message.
	out, _ := json.Marshal(v["output"])
	next := fmt.Sprintf(`{"input":[{"role":"user","content":"Call get_weather with {\"city\": \"Paris\"}"},%s,{"type":"function_call_output","call_id":"chatcmpl-tool-1","output":"sunny"}],"tools":[{"type":"function","name":"get_weather"}]}`,
		strings.Trim(string(out), "[]"))
	up.script(replyJSON(200, completion(`{"role":"assistant","content":"The answer is: sunny"}`, "stop", []int{1, 2, 3, 7, 8, 4}, []int{9})))
	status, body = p.post(t, "/ng-rollout/w-a1/v1/responses", next)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
	msgs := up.last(t).Body["messages"].([]any)
	assistant := msgs[1].(map[string]any)
	if fmt.Sprint(assistant["generation_token_ids"]) != "[7 8]" || assistant["content"] != nil {
		t.Fatalf("assistant history upstream = %v", assistant)
	}
	final := decode(t, body)["output"].([]any)
	msg := final[0].(map[string]any)
	if len(final) != 1 || msg["type"] != "message" || fmt.Sprint(msg["generation_token_ids"]) != "[9]" {
		t.Fatalf("final output = %v", final)
	}
	m := p.manifest(t, "w-a1")
	if len(m.Records) != 2 || m.Records[1].ParentCallID != m.Records[0].CallID || m.Records[0].CaptureKey != "w-a1" {
		t.Fatalf("manifest = %+v", m)
	}
}

func TestResponses_RequestErrors(t *testing.T) {
	up := newStub(t)
	p := newProxy(t, up, nil)
	tests := []struct {
		name, body string
		status     int
		detail     string
	}{
		{"unknown top-level field", `{"input":"hi","frobnicate":1,"another":2}`, 422, "unknown request fields: another, frobnicate"},
		{"missing input", `{"model":"x"}`, 422, "input is required"},
		{"wrong type", `{"input":"hi","temperature":"hot"}`, 422, ""},
		{"tool_choice required without tools", `{"input":"hi","tool_choice":"required"}`, 400, "requires at least one tool"},
		{"not JSON", `{`, 400, "not valid JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := p.post(t, "/v1/responses", tt.body)
			e, _ := decode(t, body)["error"].(map[string]any)
			if status != tt.status || e["code"] != "invalid_request" || !strings.Contains(fmt.Sprint(e["detail"]), tt.detail) {
				t.Fatalf("got %d %s, want %d containing %q", status, body, tt.status, tt.detail)
			}
		})
	}
	if n := len(up.requests()); n != 0 {
		t.Fatalf("refused requests reached the upstream %d times", n)
	}
}

func TestResponses_Incomplete(t *testing.T) {
	up := newStub(t)
	p := newProxy(t, up, nil)
	up.script(replyJSON(200, completion(`{"role":"assistant","content":"<think>plan</think>partial ans"}`, "length", []int{1}, []int{2, 3})))
	_, body := p.post(t, "/v1/responses", `{"input":"q","max_output_tokens":2}`)
	v := decode(t, body)
	out := v["output"].([]any)
	if v["status"] != "incomplete" || fmt.Sprint(v["incomplete_details"]) != "map[reason:max_output_tokens]" || len(out) != 2 ||
		out[0].(map[string]any)["type"] != "reasoning" || out[1].(map[string]any)["generation_token_ids"] == nil {
		t.Fatalf("response = %s", body)
	}

	up.script(replyJSON(400, `{"object":"error","message":"'max_tokens' is too large: 99999","type":"BadRequestError","param":null,"code":400}`))
	status, body := p.post(t, "/ng-rollout/o/v1/responses", `{"input":"q"}`)
	v = decode(t, body)
	// usage null, as NeMo Gym's vllm_model's empty completion has none
	// (_create_empty_chat_completion, nemo-gym 0.7.0).
	if u, ok := v["usage"]; status != 200 || v["status"] != "incomplete" || len(v["output"].([]any)) != 1 || !ok || u != nil {
		t.Fatalf("overflow = %d %s", status, body)
	}
	if m := p.manifest(t, "o"); len(m.Failures) != 1 {
		t.Fatalf("manifest = %+v", m)
	}

	// Streamed, the overflow is a whole stream of one empty, incomplete message.
	status, body = p.post(t, "/ng-rollout/o/v1/responses", `{"input":"q","stream":true}`)
	evs := events(t, body)
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Name)
	}
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"}
	if status != 200 || !slices.Equal(types, want) {
		t.Fatalf("streamed overflow: %d %v", status, types)
	}
	if done := decode(t, evs[len(evs)-1].Data)["response"].(map[string]any); done["status"] != "incomplete" {
		t.Fatalf("completed response = %v", done)
	}
	if m := p.manifest(t, "o"); len(m.Failures) != 2 || len(m.Records) != 0 {
		t.Fatalf("manifest = %+v", m)
	}
}

// responsesStream scripts the upstream with chunks and returns the events
// the client got.
func responsesStream(t *testing.T, chunks ...string) ([]sse.Event, *proxy) {
	t.Helper()
	up := newStub(t)
	up.script(replySSE(append(chunks, "[DONE]")...))
	p := newProxy(t, up, nil)
	status, body := p.post(t, "/ng-rollout/st/v1/responses", `{"input":"q","stream":true,"tools":[{"type":"function","name":"get_weather"}]}`)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
	req := up.last(t)
	if req.Body["stream"] != true || fmt.Sprint(req.Body["stream_options"]) != "map[include_usage:true]" {
		t.Fatalf("upstream request = %v", req.Body)
	}
	return events(t, body), p
}

func chunk(delta string, extra string) string {
	return `{"id":"c","object":"chat.completion.chunk","created":1700000001,"model":"fake-model","choices":[{"index":0,"delta":` + delta + `,"finish_reason":null` + extra + `}]}`
}

func TestResponses_Stream(t *testing.T) {
	evs, p := responsesStream(t,
		`{"id":"c","object":"chat.completion.chunk","created":1700000001,"model":"fake-model","prompt_token_ids":[1,2],"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
		chunk(`{"reasoning_content":"think "}`, `,"token_ids":[3],"logprobs":{"content":[{"token":"token_id:3","logprob":-1}]}`),
		chunk(`{"content":"Hello <thi"}`, `,"token_ids":[4],"logprobs":{"content":[{"token":"token_id:4","logprob":-2}]}`),
		chunk(`{"content":"nk>inner</think> world"}`, `,"token_ids":[5],"logprobs":{"content":[{"token":"token_id:5","logprob":-3}]}`),
		chunk(`{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"get_weather","arguments":""}}]}`, ``),
		chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}`, `,"token_ids":[6],"logprobs":{"content":[{"token":"token_id:6","logprob":-4}]}`),
		chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}`, `,"token_ids":[7],"logprobs":{"content":[{"token":"token_id:7","logprob":-5}]}`),
		`{"id":"c","object":"chat.completion.chunk","created":1700000001,"model":"fake-model","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1700000001,"model":"fake-model","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":5,"total_tokens":7}}`,
	)
	var types []string
	var text strings.Builder
	var args strings.Builder
	for i, ev := range evs {
		v := decode(t, ev.Data)
		if ev.Name != v["type"] {
			t.Fatalf("event %d named %q carries type %v", i, ev.Name, v["type"])
		}
		if v["sequence_number"] != float64(i) {
			t.Fatalf("event %d has sequence_number %v", i, v["sequence_number"])
		}
		types = append(types, ev.Name)
		switch ev.Name {
		case "response.output_text.delta":
			text.WriteString(v["delta"].(string))
		case "response.function_call_arguments.delta":
			args.WriteString(v["delta"].(string))
		}
	}
	want := []string{
		"response.created", "response.in_progress",
		"response.output_item.added", // reasoning
		"response.output_item.done",
		"response.output_item.added", "response.content_part.added", // message
		"response.output_text.delta", "response.output_text.delta", // "Hello ", " world"
		"response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.output_item.added", // call
		"response.function_call_arguments.delta", "response.function_call_arguments.delta",
		"response.function_call_arguments.done", "response.output_item.done",
		"response.completed",
	}
	if !slices.Equal(types, want) {
		t.Fatalf("event types:\n got  %v\n want %v", types, want)
	}
	if text.String() != "Hello  world" || args.String() != `{"city":"Paris"}` {
		t.Fatalf("streamed text %q, arguments %q", text.String(), args.String())
	}
	done := decode(t, evs[len(evs)-1].Data)["response"].(map[string]any)
	out := done["output"].([]any)
	if len(out) != 3 || done["status"] != "completed" || fmt.Sprint(done["usage"].(map[string]any)["total_tokens"]) != "7" {
		t.Fatalf("completed response = %v", done)
	}
	rs := out[0].(map[string]any)
	if fmt.Sprint(rs["summary"]) != "[map[text:think  type:summary_text] map[text:inner type:summary_text]]" {
		t.Fatalf("reasoning = %v", rs)
	}
	// Ids announced while streaming are the ids of the final items.
	added := decode(t, evs[4].Data)["item"].(map[string]any)
	if added["id"] != out[1].(map[string]any)["id"] || decode(t, evs[2].Data)["item"].(map[string]any)["id"] != rs["id"] {
		t.Fatalf("streamed ids differ from the final ones")
	}
	call := out[2].(map[string]any)
	if call["call_id"] != "call_a" || call["arguments"] != `{"city":"Paris"}` || fmt.Sprint(call["generation_token_ids"]) != "[3 4 5 6 7]" {
		t.Fatalf("call = %v", call)
	}
	// The call's output_item.done carries the token fields too.
	if fmt.Sprint(decode(t, evs[len(evs)-2].Data)["item"].(map[string]any)["prompt_token_ids"]) != "[1 2]" {
		t.Fatalf("last output_item.done = %s", evs[len(evs)-2].Data)
	}
	if m := p.manifest(t, "st"); len(m.Records) != 1 || !slices.Equal(m.Records[0].GenerationTokenIDs, []int{3, 4, 5, 6, 7}) {
		t.Fatalf("manifest = %+v", m)
	}
}

func TestResponses_StreamEmptyReply(t *testing.T) {
	evs, _ := responsesStream(t, chunk(`{"role":"assistant","content":""}`, ``),
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`)
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Name)
	}
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"}
	if !slices.Equal(types, want) {
		t.Fatalf("event types %v, want %v", types, want)
	}
	done := decode(t, evs[len(evs)-1].Data)["response"].(map[string]any)
	if done["status"] != "incomplete" {
		t.Fatalf("completed response = %v", done)
	}
}

func TestResponses_StreamBroken(t *testing.T) {
	up := newStub(t)
	up.script(func(w http.ResponseWriter, r *http.Request, _ map[string]any) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: "+chunk(`{"content":"par"}`, "")+"\n\n")
	})
	p := newProxy(t, up, nil)
	status, body := p.post(t, "/ng-rollout/bb/v1/responses", `{"input":"q","stream":true}`)
	evs := events(t, body)
	last := decode(t, evs[len(evs)-1].Data)
	if status != 200 || last["type"] != "response.failed" || !strings.Contains(fmt.Sprint(last["response"]), "upstream_error") {
		t.Fatalf("broken stream: %d %s", status, body)
	}
	if m := p.manifest(t, "bb"); len(m.Failures) != 1 || len(m.Records) != 0 {
		t.Fatalf("manifest = %+v", m)
	}

	// An upstream that fails before streaming is an HTTP error, not a stream.
	up.script(replyJSON(503, "overloaded"))
	status, body = p.post(t, "/v1/responses", `{"input":"q","stream":true}`)
	if status != http.StatusBadGateway || !strings.Contains(string(body), "overloaded") {
		t.Fatalf("pre-stream failure: %d %s", status, body)
	}
}

func TestModels(t *testing.T) {
	up := newStub(t)
	p := newProxy(t, up, func(c *modelproxy.Config) { c.Upstream.APIKey = "sk-test" })
	status, body := p.get(t, "/v1/models")
	if status != 200 || !strings.Contains(string(body), `"id":"fake-model"`) {
		t.Fatalf("%d %s", status, body)
	}
	if got := up.last(t).Header.Get("Authorization"); got != "Bearer sk-test" {
		t.Fatalf("Authorization upstream = %q", got)
	}
}

func TestManifestRoutes(t *testing.T) {
	up := newStub(t)
	up.script(replyJSON(200, completion(`{"role":"assistant","content":"x"}`, "stop", []int{1}, []int{2})))
	p := newProxy(t, up, func(c *modelproxy.Config) { c.Capture.ControlAuthToken = "s3cret" })
	auth := []string{"Authorization", "Bearer s3cret"}
	for _, key := range []string{"r1", "r2", "r3"} {
		if status, body := p.post(t, "/ng-rollout/"+key+"/v1/chat/completions", `{"messages":[{"role":"user","content":"q"}]}`); status != 200 {
			t.Fatalf("%d %s", status, body)
		}
	}
	tests := []struct {
		name, method, path, body string
		header                   []string
		status                   int
		want                     string
	}{
		{"no token", "GET", "/capture/rollouts/r1/manifest", "", nil, 401, `"code":"unauthorized"`},
		{"wrong token", "GET", "/capture/rollouts/r1/manifest", "", []string{"Authorization", "Bearer nope"}, 401, `"code":"unauthorized"`},
		{"scheme in any case", "GET", "/capture/rollouts/r0/manifest", "", []string{"Authorization", "bEaReR " + auth[1][len("Bearer "):]}, 200, `"rollout_id":"r0"`},
		{"invalid key", "GET", "/capture/rollouts/-bad/manifest", "", auth, 400, `"code":"invalid_request"`},
		{"unknown key is empty", "GET", "/capture/rollouts/nobody/manifest", "", auth, 200, `{"rollout_id":"nobody","records":[],"failures":[]}`},
		{"retire", "POST", "/capture/rollouts/retire", `{"rollout_ids":["r1","zz","r1"]}`, auth, 200, `{"removed":["r1"],"absent":["zz"]}`},
		{"retired is gone", "GET", "/capture/rollouts/r1/manifest", "", auth, 410, `"code":"gone"`},
		{"delete", "POST", "/capture/rollouts/delete", `{"rollout_ids":["r2","r1"]}`, auth, 200, `{"removed":["r2","r1"],"absent":[]}`},
		{"deleted is empty", "GET", "/capture/rollouts/r1/manifest", "", auth, 200, `"records":[]`},
		{"empty list", "POST", "/capture/rollouts/retire", `{"rollout_ids":[]}`, auth, 422, `"code":"invalid_request"`},
		{"unknown field", "POST", "/capture/rollouts/delete", `{"rollout_ids":["a"],"force":true}`, auth, 422, `"code":"invalid_request"`},
		{"bare string", "POST", "/capture/rollouts/delete", `{"rollout_ids":"abc"}`, auth, 422, `"code":"invalid_request"`},
		{"invalid id changes nothing", "POST", "/capture/rollouts/retire", `{"rollout_ids":["r3","a/b"]}`, auth, 400, `nothing was removed`},
		{"r3 untouched", "GET", "/capture/rollouts/r3/manifest", "", auth, 200, `"rollout_id":"r3"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var status int
			var body []byte
			if tt.method == "GET" {
				status, body = p.get(t, tt.path, tt.header...)
			} else {
				status, body = p.post(t, tt.path, tt.body, tt.header...)
			}
			if status != tt.status || !strings.Contains(string(body), tt.want) {
				t.Fatalf("got %d %s, want %d containing %s", status, body, tt.status, tt.want)
			}
		})
	}
	// A retired attempt's later call is answered, and counted as a capture failure.
	if status, _ := p.post(t, "/ng-rollout/zz/v1/chat/completions", `{"messages":[{"role":"user","content":"q"}]}`); status != 200 {
		t.Fatalf("call of a retired attempt: %d", status)
	}
	if got := metricValue(t, p.reg, "gymfleet_model_capture_failures_total", nil); got != 1 {
		t.Fatalf("capture failures = %v", got)
	}
}

func TestConcurrentCapturedCalls(t *testing.T) {
	up := newStub(t)
	up.script(replyJSON(200, completion(`{"role":"assistant","content":"x"}`, "stop", []int{1, 2}, []int{3})))
	p := newProxy(t, up, nil)
	const keys, callsPerKey = 16, 5
	var wg sync.WaitGroup
	for k := 0; k < keys; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < callsPerKey; i++ {
				status, body := p.post(t, fmt.Sprintf("/ng-rollout/c%d/v1/responses", k), `{"input":"q"}`)
				if status != 200 {
					t.Errorf("%d %s", status, body)
					return
				}
			}
		}()
	}
	wg.Wait()
	for k := 0; k < keys; k++ {
		m := p.manifest(t, fmt.Sprintf("c%d", k))
		if len(m.Records) != callsPerKey {
			t.Fatalf("c%d has %d rows", k, len(m.Records))
		}
		for i, r := range m.Records {
			if i > 0 && r.ParentCallID != m.Records[i-1].CallID {
				t.Fatalf("c%d row %d parent %q", k, i, r.ParentCallID)
			}
		}
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*modelproxy.Config)
		want   string
	}{
		{"defaults", func(*modelproxy.Config) {}, ""},
		{"bad url", func(c *modelproxy.Config) { c.Upstream.BaseURL = "localhost:8000" }, "upstream.base_url"},
		{"h2c over https (HTTP/2 by ALPN)", func(c *modelproxy.Config) { c.Upstream.BaseURL, c.Upstream.H2C = "https://x/v1", true }, ""},
		{"protocol h2c over https (HTTP/2 by ALPN)", func(c *modelproxy.Config) { c.Upstream.BaseURL, c.Upstream.Protocol = "https://x/v1", "h2c" }, ""},
		{"auto over https", func(c *modelproxy.Config) { c.Upstream.BaseURL = "https://x/v1" }, ""},
		{"unknown protocol", func(c *modelproxy.Config) { c.Upstream.Protocol = "http3" }, "upstream.protocol"},
		{"h2c and http1", func(c *modelproxy.Config) { c.Upstream.H2C, c.Upstream.Protocol = true, "http1" }, "contradicts"},
		{"no model", func(c *modelproxy.Config) { c.Upstream.Model = " " }, "upstream.model"},
		{"bad name", func(c *modelproxy.Config) { c.Name = "a b" }, "name"},
		{"no capture dir", func(c *modelproxy.Config) { c.Capture.Dir = "" }, "capture.dir"},
		{"checkpoint without token", func(c *modelproxy.Config) { c.Checkpoint.Enabled = true }, "control_auth_token"},
		{"bad level", func(c *modelproxy.Config) { c.LogLevel = "loud" }, "log_level"},
		{"two workers", func(c *modelproxy.Config) { c.Upstream.BaseURLs = []string{"http://a:1/v1", "http://b:1/v1/"} }, ""},
		{"base_url and base_urls", func(c *modelproxy.Config) {
			c.Upstream.BaseURL, c.Upstream.BaseURLs = "http://a:1/v1", []string{"http://b:1/v1"}
		}, "exclusive"},
		{"bad worker url", func(c *modelproxy.Config) { c.Upstream.BaseURLs = []string{"http://a:1/v1", "b:1"} }, "upstream.base_urls[1]"},
		{"worker listed twice", func(c *modelproxy.Config) { c.Upstream.BaseURLs = []string{"http://a:1/v1", "http://a:1/v1/"} }, "listed twice"},
		{"inventories of one call", func(c *modelproxy.Config) { c.GenerationCuts.InventoryCalls = 1 }, ""},
		{"inventories past a worker's bound", func(c *modelproxy.Config) { c.GenerationCuts.InventoryCalls = 100001 }, "generation_cuts.inventory_calls"},
		{"negative inventory bound", func(c *modelproxy.Config) { c.GenerationCuts.InventoryCalls = -1 }, "generation_cuts.inventory_calls"},
		{"too many workers", func(c *modelproxy.Config) {
			for i := range 65 {
				c.Upstream.BaseURLs = append(c.Upstream.BaseURLs, fmt.Sprintf("http://w%d:1/v1", i))
			}
		}, "more than 64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := modelproxy.DefaultConfig()
			tt.mutate(&c)
			err := c.Validate()
			if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("Validate = %v, want %q", err, tt.want)
			}
		})
	}
}
