package modelproxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// The upstream bytes of these tests are vLLM's own:
//   - vllmGenerationError is what chat_completion_stream_generator yields when
//     a generation fails (GenerationError "Internal server error", status
//     500) through create_streaming_error_response: json.dumps of
//     ErrorResponse(error=ErrorInfo(message, type, param, code)).model_dump()
//     — vllm/entrypoints/openai/chat_completion/serving.py at
//     006c49d485f9ca479bf4989cbb694d0ac02f44b5, vllm/entrypoints/openai/
//     engine/serving.py at 00bd1493b3e82d6c13c68ee8a0e1c5a96707e190,
//     ErrorInfo in vllm/entrypoints/openai/engine/protocol.py at
//     040a2cc2a6295ea9c313d86526ff90a103eacb3e; then data: [DONE].
//   - vllmBadTemperature is the 400 a VLLMValidationError answers
//     (create_error_response: type BadRequestError, param = the parameter),
//     raised by SamplingParams._verify_args in vllm/sampling_params.py at
//     00388f6573ccfcffad607b8c9ecdf341a4669ceb, rendered by FastAPI's
//     JSONResponse.
//   - vllmUnknownModel is _check_model's 404 (NotFoundError, "The model `X`
//     does not exist.") in vllm/entrypoints/openai/engine/serving.py at
//     00bd1493b3e82d6c13c68ee8a0e1c5a96707e190.
const (
	vllmGenerationError = `{"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}`
	vllmBadTemperature  = `{"error":{"message":"temperature must be non-negative, got -1.0.","type":"BadRequestError","param":"temperature","code":400}}`
	vllmUnknownModel    = `{"error":{"message":"The model ` + "`fake-model`" + ` does not exist.","type":"NotFoundError","param":null,"code":404}}`
)

// vllmChunk is a chat.completion.chunk as vLLM streams it
// (model_dump_json(exclude_unset=True)).
func vllmChunk(delta, finish string) string {
	f := "null"
	if finish != "" {
		f = fmt.Sprintf("%q", finish)
	}
	return `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"fake-model","choices":[{"index":0,"delta":` + delta + `,"logprobs":null,"finish_reason":` + f + `}]}`
}

func TestChat_StreamUpstreamErrorEvent(t *testing.T) {
	up := newStub(t)
	up.script(replySSE(vllmChunk(`{"role":"assistant","content":""}`, ""), vllmChunk(`{"content":"par"}`, ""), vllmGenerationError, "[DONE]"))
	p := newProxy(t, up, nil)
	status, body := p.post(t, "/ng-rollout/e1/v1/chat/completions", `{"messages":[{"role":"user","content":"q"}],"stream":true}`)
	evs := events(t, body)
	if status != http.StatusOK || len(evs) != 4 {
		t.Fatalf("stream = %d %s", status, body)
	}
	e, _ := decode(t, evs[2].Data)["error"].(map[string]any)
	if e["message"] != "Internal server error" || e["type"] != "InternalServerError" || e["code"] != "upstream_error" || string(evs[3].Data) != "[DONE]" {
		t.Fatalf("error event = %s", evs[2].Data)
	}
	if m := p.manifest(t, "e1"); len(m.Records) != 0 || len(m.Failures) != 1 {
		t.Fatalf("a failed call reached the ledger: %+v", m)
	}
	if got := metricValue(t, p.reg, "gymfleet_model_calls_total", map[string]string{"route": "chat", "outcome": "stream_error"}); got != 1 {
		t.Fatalf("stream_error calls = %v", got)
	}

	// The error as the stream's first event: nothing was relayed, so the
	// call fails with the error's own status.
	up.script(replySSE(vllmGenerationError, "[DONE]"))
	status, body = p.post(t, "/ng-rollout/e2/v1/chat/completions", `{"messages":[{"role":"user","content":"q"}],"stream":true}`)
	if status != http.StatusBadGateway || !strings.Contains(string(body), "Internal server error") {
		t.Fatalf("first-event error = %d %s", status, body)
	}
	if m := p.manifest(t, "e2"); len(m.Records) != 0 {
		t.Fatalf("a failed call reached the ledger: %+v", m)
	}
}

func TestChat_StreamDoneWithoutFinishReason(t *testing.T) {
	up := newStub(t)
	up.script(replySSE(vllmChunk(`{"role":"assistant","content":""}`, ""), vllmChunk(`{"content":"par"}`, ""), "[DONE]"))
	p := newProxy(t, up, nil)
	status, body := p.post(t, "/ng-rollout/d1/v1/chat/completions", `{"messages":[{"role":"user","content":"q"}],"stream":true}`)
	evs := events(t, body)
	if status != http.StatusOK || len(evs) != 4 || !strings.Contains(string(evs[2].Data), "finish_reason") || string(evs[3].Data) != "[DONE]" {
		t.Fatalf("stream = %d %s", status, body)
	}
	if m := p.manifest(t, "d1"); len(m.Records) != 0 || len(m.Failures) != 1 {
		t.Fatalf("a truncated call reached the ledger: %+v", m)
	}
}

func TestResponses_StreamUpstreamErrorEvent(t *testing.T) {
	for _, tt := range []struct {
		name   string
		events []string
		reason string
	}{
		{"error event", []string{vllmChunk(`{"role":"assistant","content":""}`, ""), vllmChunk(`{"content":"par"}`, ""), vllmGenerationError, "[DONE]"}, "Internal server error"},
		{"done without finish", []string{vllmChunk(`{"role":"assistant","content":""}`, ""), vllmChunk(`{"content":"par"}`, ""), "[DONE]"}, "finish_reason"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up := newStub(t)
			up.script(replySSE(tt.events...))
			p := newProxy(t, up, nil)
			status, body := p.post(t, "/ng-rollout/f/v1/responses", `{"input":"q","stream":true}`)
			evs := events(t, body)
			last := decode(t, evs[len(evs)-1].Data)
			resp, _ := last["response"].(map[string]any)
			rerr, _ := resp["error"].(map[string]any)
			if status != http.StatusOK || last["type"] != "response.failed" || resp["status"] != "failed" || !strings.Contains(fmt.Sprint(rerr["message"]), tt.reason) {
				t.Fatalf("stream = %d %s", status, body)
			}
			for _, ev := range evs {
				if ev.Name == "response.completed" {
					t.Fatalf("a failed stream completed: %s", body)
				}
			}
			if m := p.manifest(t, "f"); len(m.Records) != 0 || len(m.Failures) != 1 {
				t.Fatalf("a failed call reached the ledger: %+v", m)
			}
			if got := metricValue(t, p.reg, "gymfleet_model_calls_total", map[string]string{"route": "responses", "outcome": "stream_error"}); got != 1 {
				t.Fatalf("stream_error calls = %v", got)
			}
		})
	}
}

func TestUpstream4xxKeepStatusOpenAIShaped(t *testing.T) {
	up := newStub(t)
	p := newProxy(t, up, nil)
	for _, tt := range []struct {
		name, upstream string
		status         int
		code, typ      string
		param          any
		message        string
	}{
		{"400", vllmBadTemperature, 400, "invalid_request", "BadRequestError", "temperature", "temperature must be non-negative, got -1.0."},
		{"404", vllmUnknownModel, 404, "not_found", "NotFoundError", nil, "The model `fake-model` does not exist."},
		// FastAPI's own shapes (HTTPException, request validation), as a
		// FastAPI server without vLLM's handlers (NeMo Gym's) answers.
		{"422 fastapi", `{"detail":"Field required"}`, 422, "invalid_request", "invalid_request_error", nil, "Field required"},
		{"422 fastapi validation", `{"detail":[{"type":"missing","loc":["body","messages"],"msg":"Field required","input":{}}]}`, 422, "invalid_request", "invalid_request_error", nil, "messages: Field required"},
	} {
		up.script(replyJSON(tt.status, tt.upstream))
		for _, path := range []string{"/v1/chat/completions", "/ng-rollout/k/v1/responses"} {
			for _, stream := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s %s stream=%v", tt.name, path, stream), func(t *testing.T) {
					body := `{"messages":[{"role":"user","content":"q"}],"stream":` + fmt.Sprint(stream) + `}`
					if strings.HasSuffix(path, "responses") {
						body = `{"input":"q","stream":` + fmt.Sprint(stream) + `}`
					}
					status, b := p.post(t, path, body)
					e, _ := decode(t, b)["error"].(map[string]any)
					if status != tt.status || e["code"] != tt.code || e["type"] != tt.typ || e["param"] != tt.param || e["message"] != tt.message || e["detail"] != tt.message {
						t.Fatalf("got %d %s", status, b)
					}
				})
			}
		}
	}
	if m := p.manifest(t, "k"); len(m.Records) != 0 {
		t.Fatalf("a refused call reached the ledger: %+v", m)
	}

	// A 5xx stays a 502: the backend failed, not the request.
	up.script(replyJSON(500, vllmGenerationError))
	status, b := p.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"q"}]}`)
	e, _ := decode(t, b)["error"].(map[string]any)
	if status != http.StatusBadGateway || e["code"] != "upstream_error" || e["type"] != "server_error" || !strings.Contains(fmt.Sprint(e["message"]), "Internal server error") {
		t.Fatalf("5xx: %d %s", status, b)
	}
}

func TestOwnErrorsOpenAIShapedOnV1Only(t *testing.T) {
	up := newStub(t)
	p := newProxy(t, up, nil)
	status, b := p.post(t, "/v1/chat/completions", `{"messages":`)
	e, _ := decode(t, b)["error"].(map[string]any)
	if status != 400 || e["type"] != "invalid_request_error" || e["code"] != "invalid_request" || e["message"] == "" || e["message"] != e["detail"] {
		t.Fatalf("/v1 error = %d %s", status, b)
	}
	status, b = p.get(t, "/v1/embeddings")
	e, _ = decode(t, b)["error"].(map[string]any)
	if status != 404 || e["type"] != "not_found_error" || e["code"] != "not_found" {
		t.Fatalf("/v1 unknown route = %d %s", status, b)
	}
	status, b = p.get(t, "/ng-rollout/k/v1/chat/completions")
	e, _ = decode(t, b)["error"].(map[string]any)
	if status != 405 || e["type"] != "invalid_request_error" || e["code"] != "method_not_allowed" {
		t.Fatalf("/v1 wrong method = %d %s", status, b)
	}
	// The capture routes keep the fleet's envelope.
	status, b = p.post(t, "/capture/rollouts/retire", `{"rollout_ids":[]}`)
	e, _ = decode(t, b)["error"].(map[string]any)
	if status != 422 || len(e) != 2 || e["code"] != "invalid_request" || e["detail"] == "" {
		t.Fatalf("capture route error = %d %s", status, b)
	}
}
