package modelproxy_test

import (
	"net/http"
	"strings"
	"testing"
)

// gymNullParams is the responses_create_params of a NeMo Gym dataset row
// with every parameter its model (NeMoGymResponseCreateParamsNonStreaming)
// has, at its null/default value, as resources_servers/critpt/data/
// example.jsonl at 07d6b0d07b22fcf530b4c211dae2ee23100428e4 carries them
// (input and instructions shortened).
const gymNullParams = `{"background": null, "include": null, "input": "q", "instructions": "Answer.", "max_output_tokens": null, "max_tool_calls": null, "metadata": null, "model": null, "parallel_tool_calls": true, "previous_response_id": null, "prompt": null, "reasoning": null, "service_tier": null, "store": null, "temperature": 0.0, "text": null, "tool_choice": "auto", "tools": [], "top_logprobs": null, "top_p": null, "truncation": null, "user": null, "stream": null}`

func TestResponses_UnsupportedParameters(t *testing.T) {
	up := newStub(t)
	up.script(replyJSON(200, completion(`{"role":"assistant","content":"hi"}`, "stop", []int{1}, []int{2})))
	p := newProxy(t, up, nil)
	for _, tt := range []struct{ name, body, param string }{
		{"previous_response_id", `{"input":"q","previous_response_id":"resp_1"}`, "previous_response_id"},
		{"store", `{"input":"q","store":true}`, "store"},
		{"background", `{"input":"q","background":true,"store":false}`, "background"},
		{"prompt", `{"input":"q","prompt":{"id":"pmpt_1"}}`, "prompt"},
		{"truncation auto", `{"input":"q","truncation":"auto"}`, "truncation"},
		{"json schema", `{"input":"q","text":{"format":{"type":"json_schema","name":"x","schema":{}}}}`, "text.format"},
		{"json object", `{"input":"q","text":{"format":{"type":"json_object"}}}`, "text.format"},
		{"include encrypted reasoning", `{"input":"q","include":["reasoning.encrypted_content"]}`, "include"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			status, b := p.post(t, "/v1/responses", tt.body)
			e, _ := decode(t, b)["error"].(map[string]any)
			if status != http.StatusBadRequest || e["code"] != "invalid_request" || e["type"] != "invalid_request_error" ||
				e["param"] != tt.param || !strings.Contains(e["message"].(string), strings.SplitN(tt.param, ".", 2)[0]) {
				t.Fatalf("%d %s", status, b)
			}
		})
	}
	if n := chatCalls(up); n != 0 {
		t.Fatalf("refused requests reached the upstream %d times", n)
	}

	// What Gym and NeMo RL send passes: nulls, false, defaults.
	for _, body := range []string{
		gymNullParams,
		`{"input":"q","store":false,"background":false,"truncation":"disabled","text":{"format":{"type":"text"},"verbosity":"medium"},"include":[],"temperature":1.0,"top_p":1.0,"max_output_tokens":64}`,
	} {
		if status, b := p.post(t, "/v1/responses", body); status != 200 {
			t.Fatalf("%s: %d %s", body, status, b)
		}
	}
}
