package modelproxy_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// vllmLogprobsReply is a vLLM chat completion for logprobs: true,
// top_logprobs: 2, return_token_ids: true and no return_tokens_as_token_ids:
// tokens are strings, with their bytes and alternatives
// (ChatCompletionLogProbs / ChatCompletionLogProbsContent /
// ChatCompletionLogProb in vllm/entrypoints/openai/chat_completion/
// protocol.py at 002032ee2b18e1f7bd924ec47b62504ba3866063), the generated
// ids in the choice's token_ids and the prompt's at the top level.
const vllmLogprobsReply = `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"fake-model","choices":[{"index":0,"message":{"role":"assistant","content":"Hi!","refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning_content":null},"logprobs":{"content":[` +
	`{"token":"Hi","logprob":-0.25,"bytes":[72,105],"top_logprobs":[{"token":"Hi","logprob":-0.25,"bytes":[72,105]},{"token":"Hello","logprob":-1.5,"bytes":[72,101,108,108,111]}]},` +
	`{"token":"!","logprob":-0.5,"bytes":[33],"top_logprobs":[{"token":"!","logprob":-0.5,"bytes":[33]},{"token":".","logprob":-1.0,"bytes":[46]}]}]},` +
	`"finish_reason":"stop","stop_reason":null,"token_ids":[13347,0]}],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,"prompt_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":[1,2,3],"kv_transfer_params":null}`

func vllmLogprobsStream() []string {
	return []string{
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"fake-model","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[1,2,3]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"fake-model","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":-0.25,"bytes":[72,105],"top_logprobs":[{"token":"Hi","logprob":-0.25,"bytes":[72,105]},{"token":"Hello","logprob":-1.5,"bytes":[72,101,108,108,111]}]}]},"finish_reason":null,"token_ids":[13347]}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"fake-model","choices":[{"index":0,"delta":{"content":"!"},"logprobs":{"content":[{"token":"!","logprob":-0.5,"bytes":[33],"top_logprobs":[{"token":"!","logprob":-0.5,"bytes":[33]},{"token":".","logprob":-1.0,"bytes":[46]}]}]},"finish_reason":"stop","token_ids":[0]}]}`,
		"[DONE]",
	}
}

func TestClientLogprobsHonoured(t *testing.T) {
	up := newStub(t)
	p := newProxy(t, up, nil)
	sentAsVLLMWould := func(t *testing.T, top float64) {
		t.Helper()
		sent := up.last(t).Body
		if sent["logprobs"] != true || sent["top_logprobs"] != top || sent["return_token_ids"] != true {
			t.Fatalf("upstream got %v", sent)
		}
		if _, ok := sent["return_tokens_as_token_ids"]; ok {
			t.Fatalf("return_tokens_as_token_ids sent with client logprobs: %v", sent)
		}
	}
	ledgerHasIDs := func(t *testing.T, key string) {
		t.Helper()
		m := p.manifest(t, key)
		if len(m.Records) != 1 || fmt.Sprint(m.Records[0].GenerationTokenIDs) != "[13347 0]" || fmt.Sprint(m.Records[0].PromptTokenIDs) != "[1 2 3]" ||
			fmt.Sprint(m.Records[0].GenerationLogProbs) != "[-0.25 -0.5]" {
			t.Fatalf("manifest = %+v", m)
		}
	}

	t.Run("chat", func(t *testing.T) {
		up.script(replyJSON(200, vllmLogprobsReply))
		status, b := p.post(t, "/ng-rollout/c1/v1/chat/completions", `{"messages":[{"role":"user","content":"q"}],"logprobs":true,"top_logprobs":2}`)
		if status != 200 {
			t.Fatalf("%d %s", status, b)
		}
		sentAsVLLMWould(t, 2)
		var reply struct {
			Choices []struct {
				Logprobs json.RawMessage `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(b, &reply); err != nil {
			t.Fatal(err)
		}
		equalJSON(t, "choices[0].logprobs", reply.Choices[0].Logprobs, `{"content":[`+
			`{"token":"Hi","logprob":-0.25,"bytes":[72,105],"top_logprobs":[{"token":"Hi","logprob":-0.25,"bytes":[72,105]},{"token":"Hello","logprob":-1.5,"bytes":[72,101,108,108,111]}]},`+
			`{"token":"!","logprob":-0.5,"bytes":[33],"top_logprobs":[{"token":"!","logprob":-0.5,"bytes":[33]},{"token":".","logprob":-1.0,"bytes":[46]}]}]}`)
		ledgerHasIDs(t, "c1")
	})
	t.Run("chat stream", func(t *testing.T) {
		up.script(replySSE(vllmLogprobsStream()...))
		status, b := p.post(t, "/ng-rollout/c2/v1/chat/completions", `{"messages":[{"role":"user","content":"q"}],"logprobs":true,"stream":true}`)
		if status != 200 || !strings.Contains(string(b), `"token":"Hello"`) || strings.Contains(string(b), "token_id:") {
			t.Fatalf("%d %s", status, b)
		}
		sentAsVLLMWould(t, 0)
		ledgerHasIDs(t, "c2")
	})
	t.Run("responses", func(t *testing.T) {
		up.script(replyJSON(200, vllmLogprobsReply))
		status, b := p.post(t, "/ng-rollout/r1/v1/responses", `{"input":"q","top_logprobs":2,"include":["message.output_text.logprobs"]}`)
		if status != 200 {
			t.Fatalf("%d %s", status, b)
		}
		sentAsVLLMWould(t, 2)
		out := decode(t, b)["output"].([]any)
		part := out[0].(map[string]any)["content"].([]any)[0].(map[string]any)
		lp, _ := json.Marshal(part["logprobs"])
		equalJSON(t, "output_text logprobs", lp, `[`+
			`{"token":"Hi","bytes":[72,105],"logprob":-0.25,"top_logprobs":[{"token":"Hi","bytes":[72,105],"logprob":-0.25},{"token":"Hello","bytes":[72,101,108,108,111],"logprob":-1.5}]},`+
			`{"token":"!","bytes":[33],"logprob":-0.5,"top_logprobs":[{"token":"!","bytes":[33],"logprob":-0.5},{"token":".","bytes":[46],"logprob":-1.0}]}]`)
		ledgerHasIDs(t, "r1")
	})
	t.Run("responses stream", func(t *testing.T) {
		up.script(replySSE(vllmLogprobsStream()...))
		status, b := p.post(t, "/ng-rollout/r2/v1/responses", `{"input":"q","top_logprobs":2,"include":["message.output_text.logprobs"],"stream":true}`)
		if status != 200 {
			t.Fatalf("%d %s", status, b)
		}
		sentAsVLLMWould(t, 2)
		evs := events(t, b)
		var deltaLogprobs int
		for _, ev := range evs {
			if ev.Name == "response.output_text.delta" {
				lps, _ := decode(t, ev.Data)["logprobs"].([]any)
				deltaLogprobs += len(lps)
			}
		}
		final := decode(t, evs[len(evs)-1].Data)["response"].(map[string]any)
		part := final["output"].([]any)[0].(map[string]any)["content"].([]any)[0].(map[string]any)
		if lps, _ := part["logprobs"].([]any); len(lps) != 2 || deltaLogprobs != 2 {
			t.Fatalf("final logprobs %v, %d on deltas: %s", part["logprobs"], deltaLogprobs, b)
		}
		ledgerHasIDs(t, "r2")
	})
	t.Run("not asked: as before", func(t *testing.T) {
		up.script(replyJSON(200, completion(`{"role":"assistant","content":"hi"}`, "stop", []int{1}, []int{2})))
		status, b := p.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"q"}],"top_logprobs":3}`)
		if status != 200 || strings.Contains(string(b), `"logprobs"`) {
			t.Fatalf("%d %s", status, b)
		}
		sent := up.last(t).Body
		if sent["logprobs"] != true || sent["top_logprobs"] != 0.0 || sent["return_tokens_as_token_ids"] != true {
			t.Fatalf("upstream got %v", sent)
		}
		status, b = p.post(t, "/v1/responses", `{"input":"q","top_logprobs":3}`)
		if status != 200 || strings.Contains(string(b), `"logprobs":[`) {
			t.Fatalf("%d %s", status, b)
		}
		if sent := up.last(t).Body; sent["top_logprobs"] != 0.0 || sent["return_tokens_as_token_ids"] != true {
			t.Fatalf("upstream got %v", sent)
		}
	})
}
