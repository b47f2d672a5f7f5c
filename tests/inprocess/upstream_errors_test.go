package inprocess_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
	"github.com/gymfleet/gymfleet/tests/fleettest"
)

// The model server in front of the real stand-in, for the upstream failures
// a vLLM shows: an error in the middle of a stream (vLLM's chat serving
// yields `data: {"error": ...}` then `data: [DONE]`), a stream that ends
// without a finish_reason, an unknown model (404) and a bad token limit
// (400). The stand-in's and the proxy's own tests check each side alone;
// here they must agree, and nothing failed reaches the ledger as delivered.

// post sends body to url over HTTP/1.1, as an OpenAI SDK does, and returns
// the status and the whole reply.
func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	hc := &http.Client{Timeout: 30 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	rep, err := hc.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer rep.Body.Close()
	b, err := io.ReadAll(rep.Body)
	if err != nil {
		t.Fatalf("POST %s: reading the reply: %v", url, err)
	}
	return rep.StatusCode, string(b)
}

// fakeScript is a metadata entry carrying a stand-in script.
func fakeScript(t *testing.T, script string) string {
	t.Helper()
	b, err := json.Marshal(map[string]string{"fake_script": script})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// delivered is the number of ledger records of key.
func (f *testFleet) delivered(t *testing.T, modelURL, key string) int {
	t.Helper()
	var m modelproxy.Manifest
	if err := json.Unmarshal(f.get(t.Context(), t, modelURL+"/capture/rollouts/"+key+"/manifest"), &m); err != nil {
		t.Fatalf("%s manifest: %v", key, err)
	}
	return len(m.Records)
}

// openAIError reads an OpenAI-shaped error body.
func openAIError(t *testing.T, body string) (message, typ string, code any) {
	t.Helper()
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an OpenAI-shaped error (message and type): %s", body)
	}
	return e.Error.Message, e.Error.Type, e.Error.Code
}

func TestUpstreamFailures_ProxyAndStandInAgree(t *testing.T) {
	f := startFleet(t, false)
	const user = `[{"role":"user","content":"Say something."}]`
	midStream := fakeScript(t, `{"final_text":"one two three four five six","stream_error":{"after_tokens":3,"message":"engine died mid-generation"}}`)
	truncated := fakeScript(t, `{"final_text":"one two three four five six","truncate_stream":{"after_tokens":2}}`)

	t.Run("chat stream error is relayed and not delivered", func(t *testing.T) {
		st, body := post(t, f.modelURL+"/ng-rollout/err-chat/v1/chat/completions",
			`{"model":"any","stream":true,"messages":`+user+`,"metadata":`+midStream+`}`)
		if st != http.StatusOK || !strings.Contains(body, `"error"`) || !strings.Contains(body, "engine died mid-generation") {
			t.Fatalf("status %d; want the stream to relay the upstream's error event:\n%s", st, body)
		}
		if !strings.HasSuffix(strings.TrimSpace(body), "data: [DONE]") {
			t.Errorf("the stream does not end with [DONE]:\n%s", body)
		}
		if strings.Contains(body, `"finish_reason":"stop"`) {
			t.Errorf("a failed stream reports a normal finish:\n%s", body)
		}
		if n := f.delivered(t, f.modelURL, "err-chat"); n != 0 {
			t.Errorf("the ledger has %d delivered records of a failed call", n)
		}
	})

	t.Run("responses stream error ends in response.failed", func(t *testing.T) {
		st, body := post(t, f.modelURL+"/ng-rollout/err-resp/v1/responses",
			`{"model":"any","stream":true,"input":`+user+`,"metadata":`+midStream+`}`)
		if st != http.StatusOK || !strings.Contains(body, "response.failed") || strings.Contains(body, "response.completed") {
			t.Fatalf("status %d; want response.failed and no response.completed:\n%s", st, body)
		}
		if n := f.delivered(t, f.modelURL, "err-resp"); n != 0 {
			t.Errorf("the ledger has %d delivered records of a failed call", n)
		}
	})

	t.Run("a stream without finish_reason is a failure", func(t *testing.T) {
		st, body := post(t, f.modelURL+"/ng-rollout/err-trunc/v1/responses",
			`{"model":"any","stream":true,"input":`+user+`,"metadata":`+truncated+`}`)
		if st != http.StatusOK || !strings.Contains(body, "response.failed") || strings.Contains(body, "response.completed") {
			t.Fatalf("status %d; want response.failed for a stream cut short:\n%s", st, body)
		}
		if n := f.delivered(t, f.modelURL, "err-trunc"); n != 0 {
			t.Errorf("the ledger has %d delivered records of a truncated call", n)
		}
	})

	t.Run("a non-streaming call fails with an error status", func(t *testing.T) {
		st, body := post(t, f.modelURL+"/ng-rollout/err-plain/v1/responses",
			`{"model":"any","input":`+user+`,"metadata":`+midStream+`}`)
		if st < 500 {
			t.Fatalf("status %d, want a 5xx for an upstream failure:\n%s", st, body)
		}
		if msg, _, _ := openAIError(t, body); !strings.Contains(msg, "engine died mid-generation") {
			t.Errorf("message %q does not carry the upstream's", msg)
		}
		if n := f.delivered(t, f.modelURL, "err-plain"); n != 0 {
			t.Errorf("the ledger has %d delivered records of a failed call", n)
		}
	})

	t.Run("a bad token limit is the stand-in's 400 and Gym's empty length reply", func(t *testing.T) {
		// NeMo Gym's vllm_model (responses_api_models/vllm_model/app.py
		// at 07d6b0d07b22, ~670-690) turns any vLLM 400 naming
		// "max_tokens" or "context length" into an empty completion with
		// finish_reason "length": NeMo RL clamps max_tokens to the room
		// left in the context, so "max_tokens must be at least 1" means the
		// context is full. The stand-in must refuse it as vLLM does, and
		// the proxy must answer as Gym does.
		st, body := post(t, f.fakeURL+"/v1/chat/completions", `{"model":"fake-model","messages":`+user+`,"max_tokens":-5}`)
		if st != http.StatusBadRequest {
			t.Fatalf("stand-in: status %d, want vLLM's 400:\n%s", st, body)
		}
		if msg, typ, _ := openAIError(t, body); !strings.Contains(msg, "max_tokens must be at least 1") || typ != "BadRequestError" {
			t.Errorf("stand-in: message %q type %q, want vLLM's", msg, typ)
		}
		st, body = post(t, f.modelURL+"/ng-rollout/err-limit/v1/chat/completions", `{"model":"any","messages":`+user+`,"max_tokens":-5}`)
		if st != http.StatusOK || !strings.Contains(body, `"finish_reason":"length"`) || !strings.Contains(body, `"content":null`) {
			t.Fatalf("chat: status %d, want an empty length completion:\n%s", st, body)
		}
		st, body = post(t, f.modelURL+"/ng-rollout/err-limit/v1/responses", `{"model":"any","input":`+user+`,"max_output_tokens":-5}`)
		if st != http.StatusOK || !strings.Contains(body, `"status":"incomplete"`) || !strings.Contains(body, `"reason":"max_output_tokens"`) {
			t.Fatalf("responses: status %d, want an incomplete response:\n%s", st, body)
		}
		if n := f.delivered(t, f.modelURL, "err-limit"); n != 0 {
			t.Errorf("the ledger has %d delivered records of refused calls", n)
		}
	})

	t.Run("another 400 keeps its status and vLLM's message", func(t *testing.T) {
		st, body := post(t, f.modelURL+"/ng-rollout/err-400/v1/chat/completions", `{"model":"any","messages":`+user+`,"logprobs":true,"top_logprobs":21}`)
		if st != http.StatusBadRequest {
			t.Fatalf("status %d, want 400 (an SDK retries a 5xx):\n%s", st, body)
		}
		if msg, typ, _ := openAIError(t, body); !strings.Contains(msg, "greater than max allowed: 20") || typ != "BadRequestError" {
			t.Errorf("message %q type %q, want vLLM's", msg, typ)
		}
		if n := f.delivered(t, f.modelURL, "err-400"); n != 0 {
			t.Errorf("the ledger has %d delivered records of a refused call", n)
		}
	})

	t.Run("an unknown model stays a 404", func(t *testing.T) {
		// The model server names its configured model on every call, so a
		// 404 comes from a configuration that names one the worker does
		// not serve.
		wrong := fleettest.StartModelServer(t, f.fakeURL+"/v1", "no-such-model", true)
		st, body := post(t, wrong+"/ng-rollout/err-model/v1/chat/completions", `{"model":"any","messages":`+user+`}`)
		if st != http.StatusNotFound {
			t.Fatalf("status %d, want 404:\n%s", st, body)
		}
		if msg, _, _ := openAIError(t, body); !strings.Contains(msg, "no-such-model") || !strings.Contains(msg, "does not exist") {
			t.Errorf("message %q, want vLLM's naming the model", msg)
		}
		if n := f.delivered(t, wrong, "err-model"); n != 0 {
			t.Errorf("the ledger has %d delivered records of a refused call", n)
		}
	})
}
