package modelproxy_test

import (
	"reflect"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

// chatReplies are upstream replies in vLLM's shapes: token ids and
// log-probs, routed experts before and after the message, several choices,
// a null choice, fields the rewrite replaces already on the message,
// spaces between tokens.
var chatReplies = []string{
	`{"id":"c1","object":"chat.completion","model":"m","prompt_token_ids":[1,2,3],"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop","token_ids":[4,5],"logprobs":{"content":[{"token":"hi","logprob":-0.5}]}}],"usage":{"prompt_tokens":3,"completion_tokens":2}}`,
	`{"choices":[{"routed_experts":[[1,2]],"message":{"role":"assistant","content":null,"tool_calls":[{"id":"t","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},"token_ids":[9]},{"message":{"content":"b"},"token_ids":[1],"logprobs":null}],"prompt_token_ids":[7]}`,
	`{"choices":[{"message":{"content":"x","prompt_token_ids":[0],"routed_experts":null},"routed_experts":[[3]]}]}`,
	`{"choices":[null,{"message":{}}]}`,
	`{"choices":[]}`,
	` { "choices" : [ { "message" : { "content" : "s p a c e d" } , "logprobs" : { } } ] , "x" : [ 1 , { "y" : "}" } ] } `,
	`{"choices":[{"message":{"content":"\u00e9\ud83d\ude00 \"q\""},"routed_experts":null}],"system_fingerprint":null}`,
}

var spliceTokens = openai.TokenFields{PromptTokenIDs: []int{1, 2, 3}, GenerationTokenIDs: []int{4, 5}, GenerationLogProbs: []float64{-0.5, -1.25e-7}}

// sameJSON decodes a and b and compares what they hold.
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	if err := codec.Unmarshal(a, &va); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := codec.Unmarshal(b, &vb); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(va, vb)
}

// Ensure the byte-splicing rewrite of a chat reply says what the map form
// says, for every combination of token fields and kept log-probs.
func TestSpliceChatReply_SaysWhatTheMapFormSays(t *testing.T) {
	for _, body := range chatReplies {
		for _, withTokens := range []bool{false, true} {
			for _, keep := range []bool{false, true} {
				got, ok := modelproxy.SpliceChatReply([]byte(body), spliceTokens, withTokens, keep)
				if !ok {
					t.Errorf("splice does not read %s", body)
					continue
				}
				want, err := modelproxy.RewriteChatReplyMaps([]byte(body), spliceTokens, withTokens, keep)
				if err != nil {
					t.Fatalf("map form of %s: %v", body, err)
				}
				if !sameJSON(t, got, want) {
					t.Errorf("tokens %v, logprobs kept %v:\n%s\nspliced to\n%s\nmap form\n%s", withTokens, keep, body, got, want)
				}
			}
		}
	}
}

// Ensure a reply the splice does not read is left to the map form.
func TestSpliceChatReply_LeavesOddRepliesToTheMapForm(t *testing.T) {
	for _, body := range []string{
		`{"choices":{}}`,
		`{"id":"no choices"}`,
		`{"choices":[1]}`,
		`{"ch\u006fices":[]}`,
		`{"choices":[{"routed_experts":[1]}]}`,
		`[]`,
	} {
		if out, ok := modelproxy.SpliceChatReply([]byte(body), spliceTokens, true, false); ok {
			t.Errorf("splice read %s as %s", body, out)
		}
	}
}

// FuzzSpliceChatReply: wherever the splice reads a reply, it says what the
// map form says.
func FuzzSpliceChatReply(f *testing.F) {
	for _, body := range chatReplies {
		f.Add([]byte(body), true, false)
	}
	f.Fuzz(func(t *testing.T, body []byte, withTokens, keep bool) {
		var c openai.ChatCompletion
		if codec.Unmarshal(body, &c) != nil || !codec.Valid(body) {
			return // chatOnce decodes the reply before it is rewritten
		}
		got, ok := modelproxy.SpliceChatReply(body, spliceTokens, withTokens, keep)
		if !ok {
			return
		}
		want, err := modelproxy.RewriteChatReplyMaps(body, spliceTokens, withTokens, keep)
		if err != nil {
			t.Fatalf("the splice read %s, the map form refused it: %v", body, err)
		}
		if !sameJSON(t, got, want) {
			t.Fatalf("%s\nspliced to\n%s\nmap form\n%s", body, got, want)
		}
	})
}
