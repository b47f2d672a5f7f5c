package modelproxy_test

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
)

// vllmTokenizeReply is vLLM's TokenizeResponse (count, max_model_len,
// tokens, token_strs) of vllm/entrypoints/serve/tokenize/protocol.py, the
// route NeMo Gym's vllm_model falls back to when a reply has no
// prompt_token_ids (responses_api_models/vllm_model/app.py ~778 at
// 07d6b0d07b22fcf530b4c211dae2ee23100428e4; create_tokenize posts to
// <base_url without /v1>/tokenize in nemo_gym/openai_utils.py).
const vllmTokenizeReply = `{"count":4,"max_model_len":32768,"tokens":[151644,872,198,14990],"token_strs":null}`

// noPromptIDs is a reply of a vLLM without return_token_ids: the
// generation in token_id:N logprobs, no prompt_token_ids, no token_ids.
const noPromptIDs = `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"fake-model","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},` +
	`"logprobs":{"content":[{"token":"token_id:9","logprob":-0.5,"top_logprobs":[]},{"token":"token_id:8","logprob":-0.25,"top_logprobs":[]}]},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}`

func TestTokenizeFallback(t *testing.T) {
	up := newStub(t)
	up.script(func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/tokenize" {
			io.WriteString(w, vllmTokenizeReply)
			return
		}
		if body["stream"] == true {
			replySSE(
				`{"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"logprobs":{"content":[{"token":"token_id:9","logprob":-0.5,"top_logprobs":[]}]},"finish_reason":null}]}`,
				`{"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{},"logprobs":{"content":[{"token":"token_id:8","logprob":-0.25,"top_logprobs":[]}]},"finish_reason":"stop"}]}`,
				"[DONE]")(w, r, body)
			return
		}
		io.WriteString(w, noPromptIDs)
	})
	p := newProxy(t, up, func(c *modelproxy.Config) { c.Upstream.ChatTemplateKwargs = `{"enable_thinking": false}` })
	for i, tt := range []struct{ path, body string }{
		{"/ng-rollout/tk%d/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}`},
		{"/ng-rollout/tk%d/v1/responses", `{"input":"hi","tools":[{"type":"function","name":"f","parameters":{"type":"object"}}]}`},
		{"/ng-rollout/tk%d/v1/responses", `{"input":"hi","tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"stream":true}`},
	} {
		key, path := fmt.Sprintf("tk%d", i), fmt.Sprintf(tt.path, i)
		status, b := p.post(t, path, tt.body)
		if status != 200 {
			t.Fatalf("%s: %d %s", path, status, b)
		}
		m := p.manifest(t, key)
		if len(m.Failures) != 0 || len(m.Records) != 1 || !slices.Equal(m.Records[0].PromptTokenIDs, []int{151644, 872, 198, 14990}) ||
			!slices.Equal(m.Records[0].GenerationTokenIDs, []int{9, 8}) {
			t.Fatalf("%s: manifest = %+v", path, m)
		}
		tok := up.last(t)
		if tok.Path != "/tokenize" || tok.Body["model"] != "fake-model" || tok.Body["messages"] == nil || tok.Body["tools"] == nil ||
			fmt.Sprint(tok.Body["chat_template_kwargs"]) != "map[enable_thinking:false]" || tok.Body["logprobs"] != nil {
			t.Fatalf("%s: /tokenize got %s %v", path, tok.Path, tok.Body)
		}
	}
}

// TestTokenizeFallbackFails: a /tokenize that fails fails the call, as it
// fails NeMo Gym's vllm_model's (nemo-gym 0.7.0: create_tokenize raises out
// of chat_completions, answered 500): nothing is delivered to the ledger,
// which records the failed call. A stream that already relayed the
// generation ends with an error event (chat) or response.failed.
func TestTokenizeFallbackFails(t *testing.T) {
	up := newStub(t)
	up.script(func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/tokenize" {
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, `{"error":{"message":"the tokenizer is gone","type":"InternalServerError","param":null,"code":500}}`)
			return
		}
		if body["stream"] == true {
			replySSE(
				`{"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"logprobs":{"content":[{"token":"token_id:9","logprob":-0.5,"top_logprobs":[]}]},"finish_reason":null}],"prompt_token_ids":null}`,
				`{"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{},"logprobs":{"content":[{"token":"token_id:8","logprob":-0.25,"top_logprobs":[]}]},"finish_reason":"stop","token_ids":null}]}`,
				"[DONE]")(w, r, body)
			return
		}
		io.WriteString(w, noPromptIDs)
	})
	p := newProxy(t, up, nil)
	for i, tt := range []struct{ path, body string }{
		{"/ng-rollout/tf%d/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`},
		{"/ng-rollout/tf%d/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true}`},
		{"/ng-rollout/tf%d/v1/responses", `{"input":"hi"}`},
		{"/ng-rollout/tf%d/v1/responses", `{"input":"hi","stream":true}`},
	} {
		key, path := fmt.Sprintf("tf%d", i), fmt.Sprintf(tt.path, i)
		status, b := p.post(t, path, tt.body)
		switch {
		case !strings.Contains(tt.body, `"stream"`):
			if status != http.StatusBadGateway || !strings.Contains(string(b), "/tokenize failed") || !strings.Contains(string(b), "the tokenizer is gone") {
				t.Fatalf("%s: %d %s", path, status, b)
			}
		case strings.Contains(path, "/chat/"):
			evs := events(t, b)
			if status != 200 || len(evs) < 2 || !strings.Contains(string(evs[len(evs)-2].Data), "/tokenize failed") || string(evs[len(evs)-1].Data) != "[DONE]" {
				t.Fatalf("%s: %d %s", path, status, b)
			}
		default:
			evs := events(t, b)
			if status != 200 || len(evs) == 0 || evs[len(evs)-1].Name != "response.failed" || !strings.Contains(string(evs[len(evs)-1].Data), "/tokenize failed") {
				t.Fatalf("%s: %d %s", path, status, b)
			}
		}
		m := p.manifest(t, key)
		if len(m.Records) != 0 || len(m.Failures) != 1 || !strings.Contains(m.Failures[0].Reason, "the tokenizer is gone") {
			t.Fatalf("%s: manifest = %+v", path, m)
		}
	}
}
