package modelproxy_test

import (
	"encoding/json"
	"strings"
	"testing"
)

// routed_experts reaches NeMo RL's router replay on the output item that
// carries the token ids (nemo_rl/environments/nemo_gym.py ~852 at
// 7ea279abfbeb698b092856d0dab61e7cf39bc909 pops it from each output item).
// Its value is opaque: nested ints [tokens][layers][topk] or NeMo RL's
// string envelope (RoutedExperts in nemo_gym/openai_utils.py at
// 07d6b0d07b22fcf530b4c211dae2ee23100428e4). A vLLM run with routed-expert
// return puts it on the choice beside token_ids; NeMo Gym's vllm_model reads
// it from the message's token bundle (responses_api_models/vllm_model/
// app.py ~790 at the same Gym commit). Both are read.
const (
	routedNested = `[[[3,7]],[[1,5]]]`
	routedString = `"nrlre1:int8:2x1x2:AwcBBQ=="`
)

func routedReply(choiceExtra, messageExtra string) string {
	return `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"fake-model","choices":[{"index":0,` +
		`"message":{"role":"assistant","content":"hi"` + messageExtra + `},"logprobs":{"content":[{"token":"token_id:9","logprob":-0.5,"top_logprobs":[]},{"token":"token_id:8","logprob":-0.25,"top_logprobs":[]}]},` +
		`"finish_reason":"stop","token_ids":[9,8]` + choiceExtra + `}],"usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4},"prompt_token_ids":[1,2]}`
}

func TestRoutedExpertsCarried(t *testing.T) {
	up := newStub(t)
	p := newProxy(t, up, nil)
	lastItem := func(t *testing.T, resp map[string]any) map[string]any {
		t.Helper()
		out := resp["output"].([]any)
		return out[len(out)-1].(map[string]any)
	}
	asJSON := func(v any) string { b, _ := json.Marshal(v); return string(b) }

	t.Run("chat: choice-level moves onto the message", func(t *testing.T) {
		up.script(replyJSON(200, routedReply(`,"routed_experts":`+routedNested, "")))
		status, b := p.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"q"}]}`)
		choice := decode(t, b)["choices"].([]any)[0].(map[string]any)
		msg := choice["message"].(map[string]any)
		if status != 200 || asJSON(msg["routed_experts"]) != routedNested || choice["routed_experts"] != nil || msg["generation_token_ids"] == nil {
			t.Fatalf("%d %s", status, b)
		}
	})
	t.Run("responses: onto the item with the token ids", func(t *testing.T) {
		up.script(replyJSON(200, routedReply("", `,"routed_experts":`+routedString)))
		status, b := p.post(t, "/v1/responses", `{"input":"q"}`)
		item := lastItem(t, decode(t, b))
		if status != 200 || asJSON(item["routed_experts"]) != routedString || item["generation_token_ids"] == nil {
			t.Fatalf("%d %s", status, b)
		}
	})
	t.Run("responses stream", func(t *testing.T) {
		up.script(replySSE(
			`{"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"logprobs":{"content":[{"token":"token_id:9","logprob":-0.5,"top_logprobs":[]}]},"finish_reason":null,"token_ids":[9]}],"prompt_token_ids":[1,2]}`,
			`{"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{},"logprobs":{"content":[{"token":"token_id:8","logprob":-0.25,"top_logprobs":[]}]},"finish_reason":"stop","token_ids":[8],"routed_experts":`+routedNested+`}]}`,
			"[DONE]"))
		status, b := p.post(t, "/v1/responses", `{"input":"q","stream":true}`)
		evs := events(t, b)
		final := decode(t, evs[len(evs)-1].Data)["response"].(map[string]any)
		if item := lastItem(t, final); status != 200 || asJSON(item["routed_experts"]) != routedNested {
			t.Fatalf("%d %s", status, b)
		}
	})
	t.Run("absent: no field", func(t *testing.T) {
		up.script(replyJSON(200, routedReply("", "")))
		_, b := p.post(t, "/v1/responses", `{"input":"q"}`)
		if strings.Contains(string(b), "routed_experts") {
			t.Fatalf("routed_experts invented: %s", b)
		}
	})
}
