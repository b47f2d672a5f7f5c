package vllm

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
)

// gymTokenizeFields are the chat request's fields NeMo Gym's vllm_model
// sends /tokenize (VLLMModel._TOKENIZE_CHAT_FIELDS, nemo-gym 0.7.0
// responses_api_models/vllm_model/app.py), which the model server's
// tokenizeFields follow.
var gymTokenizeFields = []string{"model", "messages", "tools", "chat_template_kwargs", "mm_processor_kwargs", "required_prefix_token_ids"}

// TestTokenizeFallback: the model server's /tokenize fallback on the real
// vLLM. A relay between the model server and the sidecar gives the model
// server every chat reply as a vLLM not asked for return_token_ids writes
// it (prompt_token_ids and each choice's token_ids null, the generated ids
// in the "token_id:N" log-prob tokens), which is how NeMo Gym's vllm_model
// reads vLLM in NeMo RL's training config, so the model server must ask the
// worker's /tokenize for the prompt's ids. The relay keeps what vLLM gave
// inline for the same generation, and each scenario checks, on chat
// (streamed and not) and Responses (streamed and not):
//   - the /tokenize request is the chat request's Gym fields, nothing else;
//   - vLLM's /tokenize answer is the prompt vLLM generated from, and the
//     ids the model server returned and captured are vLLM's inline ones
//     (log-probs exactly);
//   - the ledger row is complete;
//
// then NeMo RL's contiguity across two turns on this path (the second
// turn's /tokenize carries the first turn's ids, which the sidecar splices
// in as NeMo RL's worker does), and a /tokenize that fails: a failed call,
// nothing delivered in the ledger.
func TestTokenizeFallback(t *testing.T) {
	need(t)
	relay := newStripper(t, env.sidecar.url)
	m := startModelServer(t, func(c *modelproxy.Config) { c.Upstream.BaseURL = relay.url + "/v1" })
	var tool map[string]any
	_ = json.Unmarshal([]byte(weatherToolChat), &tool)

	t.Run("chat", func(t *testing.T) {
		relay.reset()
		// Tools and chat_template_kwargs (from the row's metadata) shape the
		// prompt: /tokenize must be sent both.
		body := chatBody("weather in cairo please", map[string]any{"tools": []any{tool}, "tool_choice": "required", "max_tokens": 60,
			"temperature": 1.0, "metadata": map[string]any{"extra_body": `{"seed": 5}`, "chat_template_kwargs": `{"enable_thinking": true}`}})
		got := call(t, m+"/ng-rollout/tkf-chat/v1/chat/completions", body)
		want := checkFallback(t, relay, m, "tkf-chat", "tools", "chat_template_kwargs")
		msg := path(got, "choices", 0, "message")
		checkReturned(t, msg, want)
	})
	t.Run("chat streamed", func(t *testing.T) {
		relay.reset()
		events := sse(t, m+"/ng-rollout/tkf-chat-s/v1/chat/completions", chatBody("hello world", map[string]any{"stream": true, "max_tokens": 16}))
		want := checkFallback(t, relay, m, "tkf-chat-s")
		finish := ""
		for _, ev := range events {
			if f, ok := path(ev, "choices", 0, "finish_reason").(string); ok {
				finish = f
			}
		}
		if finish != want.finish {
			t.Fatalf("the stream finished %q, vLLM %q", finish, want.finish)
		}
	})
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("responses stream=%v", stream), func(t *testing.T) {
			relay.reset()
			key := fmt.Sprintf("tkf-resp-%v", stream)
			body := responsesBody("say something about numbers", map[string]any{"temperature": 1.0, "metadata": map[string]any{"extra_body": `{"seed": 3}`}})
			var resp map[string]any
			if stream {
				body["stream"] = true
				events := sse(t, m+"/ng-rollout/"+key+"/v1/responses", body)
				resp, _ = events[len(events)-1]["response"].(map[string]any)
			} else {
				resp = call(t, m+"/ng-rollout/"+key+"/v1/responses", body)
			}
			want := checkFallback(t, relay, m, key)
			items, _ := resp["output"].([]any)
			if len(items) == 0 {
				t.Fatalf("no output: %v", resp)
			}
			checkReturned(t, items[len(items)-1], want)
		})
	}

	t.Run("two turns contiguous", func(t *testing.T) {
		relay.reset()
		// A seed whose forced call vLLM parses (TestTokenIDsContiguous).
		user := map[string]any{"role": "user", "content": "what is the weather in rome"}
		first := call(t, m+"/ng-rollout/tkf-two/v1/responses", responsesBody([]any{user}, map[string]any{
			"tools": []any{weatherToolResponses}, "tool_choice": map[string]any{"type": "function", "name": "get_weather"},
			"max_output_tokens": 200, "temperature": 1.0, "metadata": map[string]any{"extra_body": `{"seed": 1}`}}))
		want1 := checkFallback(t, relay, m, "tkf-two")
		input := []any{user}
		var callID string
		for _, it := range first["output"].([]any) {
			input = append(input, it)
			if path(it, "type") == "function_call" {
				callID, _ = path(it, "call_id").(string)
			}
		}
		if callID == "" {
			t.Fatalf("the first turn made no function call: %v", first["output"])
		}
		input = append(input, map[string]any{"type": "function_call_output", "call_id": callID, "output": `{"city": "rome", "weather_description": "sunny"}`})
		relay.reset()
		second := call(t, m+"/ng-rollout/tkf-two/v1/responses", responsesBody(input, map[string]any{"tools": []any{weatherToolResponses}, "max_output_tokens": 8}))
		want2 := checkFallback(t, relay, m, "tkf-two")
		// The /tokenize of turn 2 carried turn 1's ids on its assistant
		// message: what the sidecar splices in.
		tok := relay.on("/tokenize")[0]
		var carried bool
		for _, msg := range asList(tok.request["messages"]) {
			if path(msg, "role") == "assistant" && equalInts(ints(path(msg, "generation_token_ids")), want1.generation) {
				carried = true
			}
		}
		if !carried {
			t.Fatalf("turn 2's /tokenize does not carry turn 1's generation ids on an assistant message: %v", tok.request["messages"])
		}
		turns := outputTokens(t, append(first["output"].([]any), second["output"].([]any)...))
		if len(turns) != 2 {
			t.Fatalf("%d trainable items, want 2", len(turns))
		}
		if !equalInts(turns[1][0], want2.prompt) {
			t.Fatalf("turn 2's returned prompt ids are not vLLM's")
		}
		p1, g1, p2 := turns[0][0], turns[0][1], turns[1][0]
		seen := append(append([]int{}, p1...), g1...)
		if len(p2) < len(seen) || !equalInts(p2[:len(seen)], seen) {
			t.Fatalf("turn 2's prompt_token_ids (%d) do not start with turn 1's prompt (%d) and generation (%d): NeMo RL would reject the rollout", len(p2), len(p1), len(g1))
		}
		rows := ledger(t, m, "tkf-two")
		if len(rows) != 2 || rows[1]["parent_call_id"] != rows[0]["call_id"] {
			t.Fatalf("the ledger does not chain the two turns: %v", rows)
		}
	})

	t.Run("tokenize fails", func(t *testing.T) {
		const refusal = `{"error":{"message":"the tokenizer is unavailable","type":"InternalServerError","param":null,"code":500}}`
		relay.refuseTokenize(&cannedReply{status: http.StatusInternalServerError, body: refusal})
		defer relay.refuseTokenize(nil)
		for _, tt := range []struct {
			name, route string
			body        map[string]any
		}{
			{"chat", "/v1/chat/completions", chatBody("hello world", nil)},
			{"chat streamed", "/v1/chat/completions", chatBody("hello world", map[string]any{"stream": true})},
			{"responses", "/v1/responses", responsesBody("say something about numbers", nil)},
			{"responses streamed", "/v1/responses", responsesBody("say something about numbers", map[string]any{"stream": true})},
		} {
			t.Run(tt.name, func(t *testing.T) {
				relay.reset()
				key := "tkf-fail-" + strings.ReplaceAll(tt.name, " ", "-")
				url := m + "/ng-rollout/" + key + tt.route
				if tt.body["stream"] == true {
					events, done, err := sseEvents(ctxFor(t, 2*time.Minute), url, tt.body, nil)
					if err != nil || len(events) == 0 {
						t.Fatalf("the stream: %d events, %v", len(events), err)
					}
					last := events[len(events)-1]
					if tt.route == "/v1/responses" {
						if last["type"] != "response.failed" || !strings.Contains(jsonText(last), "the tokenizer is unavailable") {
							t.Fatalf("the Responses stream ended with %s, want response.failed naming vLLM's error", jsonText(last))
						}
					} else if last["error"] == nil || !done || !strings.Contains(jsonText(last), "the tokenizer is unavailable") {
						t.Fatalf("the chat stream ended with %s ([DONE] %v), want an error event naming vLLM's error, then [DONE]", jsonText(last), done)
					}
				} else {
					st, b, err := post(ctxFor(t, 2*time.Minute), url, nil, mustJSON(t, tt.body))
					if err != nil || st != http.StatusBadGateway || !strings.Contains(string(b), "the tokenizer is unavailable") {
						t.Fatalf("the model server answered %d %s %v, want 502 naming vLLM's error", st, b, err)
					}
				}
				chats, toks := relay.chats(), relay.on("/tokenize")
				if len(chats) != 1 || chats[0].status != http.StatusOK || len(toks) != 1 {
					t.Fatalf("%d chat calls and %d /tokenize calls reached the relay, want one each", len(chats), len(toks))
				}
				st, man := manifest(t, m, key)
				if st != http.StatusOK {
					t.Fatalf("the ledger of %s answered %d", key, st)
				}
				recs, fails := asList(man["records"]), asList(man["failures"])
				if len(recs) != 0 {
					t.Fatalf("the ledger holds a delivered call: %v", recs)
				}
				callID := chats[0].header.Get(modelproxy.HeaderModelCallID)
				if len(fails) != 1 || path(fails[0], "call_id") != callID || !strings.Contains(toString(path(fails[0], "reason")), "the tokenizer is unavailable") {
					t.Fatalf("the ledger's failures %v, want the call %s failed on /tokenize", fails, callID)
				}
			})
		}
	})
}

// inlineTokens are the token ids and log-probs vLLM gave inline for a
// chat call (its JSON reply or its stream's chunks), and its finish reason.
type inlineTokens struct {
	prompt, generation []int
	logProbs           []any
	finish             string
}

func inlineOf(t *testing.T, e exchange) inlineTokens {
	t.Helper()
	var out inlineTokens
	var chunks []map[string]any
	if e.request["stream"] == true {
		for _, line := range strings.Split(string(e.response), "\n") {
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok || strings.TrimSpace(data) == "[DONE]" {
				continue
			}
			var ch map[string]any
			if err := json.Unmarshal([]byte(data), &ch); err != nil {
				t.Fatalf("vLLM's chunk %q: %v", data, err)
			}
			chunks = append(chunks, ch)
		}
	} else {
		var reply map[string]any
		if err := json.Unmarshal(e.response, &reply); err != nil {
			t.Fatalf("vLLM's reply: %v: %s", err, e.response)
		}
		chunks = []map[string]any{reply}
	}
	for _, ch := range chunks {
		if p := ch["prompt_token_ids"]; p != nil && out.prompt == nil {
			out.prompt = ints(p)
		}
		out.generation = append(out.generation, ints(path(ch, "choices", 0, "token_ids"))...)
		for _, lp := range asList(path(ch, "choices", 0, "logprobs", "content")) {
			out.logProbs = append(out.logProbs, path(lp, "logprob"))
		}
		if f, ok := path(ch, "choices", 0, "finish_reason").(string); ok {
			out.finish = f
		}
	}
	if len(out.prompt) == 0 || len(out.generation) == 0 || len(out.generation) != len(out.logProbs) {
		t.Fatalf("vLLM gave %d prompt ids, %d generated ids and %d log-probs inline", len(out.prompt), len(out.generation), len(out.logProbs))
	}
	return out
}

// checkFallback checks the relay's one chat call and one /tokenize, and
// the key's last ledger row, against what vLLM gave inline; mustCarry are
// fields the chat request must have had (so that /tokenize is shown to get
// them).
func checkFallback(t *testing.T, relay *recorder, modelURL, key string, mustCarry ...string) inlineTokens {
	t.Helper()
	chats, toks := relay.chats(), relay.on("/tokenize")
	if len(chats) != 1 || chats[0].status != http.StatusOK {
		t.Fatalf("%d chat calls reached vLLM, want one answered", len(chats))
	}
	if len(toks) != 1 || toks[0].status != http.StatusOK {
		t.Fatalf("the model server asked /tokenize %d times, want once answered; vLLM's chat reply: %.1000s", len(toks), chats[0].response)
	}
	chat, tok := chats[0], toks[0]
	if chat.request["return_token_ids"] != true || chat.request["return_tokens_as_token_ids"] != true {
		t.Fatalf("the chat call did not ask for token ids: return_token_ids %v, return_tokens_as_token_ids %v", chat.request["return_token_ids"], chat.request["return_tokens_as_token_ids"])
	}
	want := map[string]any{}
	for _, k := range gymTokenizeFields {
		if v, ok := chat.request[k]; ok {
			want[k] = v
		}
	}
	for _, k := range mustCarry {
		if want[k] == nil {
			t.Fatalf("the chat call has no %s to check /tokenize with: %v", k, jsonText(chat.request))
		}
	}
	if !reflect.DeepEqual(tok.request, want) {
		for _, k := range keysOf(tok.request, want) {
			if !reflect.DeepEqual(tok.request[k], want[k]) {
				t.Errorf("/tokenize got %s = %s; the chat call's Gym field is %s", k, jsonText(tok.request[k]), jsonText(want[k]))
			}
		}
		t.FailNow()
	}
	in := inlineOf(t, chat)
	var tokReply map[string]any
	if err := json.Unmarshal(tok.response, &tokReply); err != nil {
		t.Fatal(err)
	}
	if got := ints(tokReply["tokens"]); !equalInts(got, in.prompt) {
		t.Fatalf("vLLM's /tokenize answered %d ids, the chat call was generated from %d; they part at %d", len(got), len(in.prompt), firstDifference(got, in.prompt))
	}
	rows := ledger(t, modelURL, key)
	if len(rows) == 0 {
		t.Fatalf("the ledger of %s has no row", key)
	}
	row := rows[len(rows)-1]
	if row["call_id"] != chat.header.Get(modelproxy.HeaderModelCallID) || row["capture_key"] != key || row["model"] != ServedModel ||
		row["request_digest"] == "" || row["request_digest"] == nil || row["finish_reason"] != in.finish {
		t.Fatalf("the ledger row %s is not the call's (call id %s, finish %s)", jsonText(row), chat.header.Get(modelproxy.HeaderModelCallID), in.finish)
	}
	if !equalInts(ints(row["prompt_token_ids"]), in.prompt) || !equalInts(ints(row["generation_token_ids"]), in.generation) ||
		!reflect.DeepEqual(row["generation_log_probs"], in.logProbs) {
		t.Fatalf("the ledger row has prompt %v, generation %v, log-probs %v; vLLM gave %v, %v, %v inline",
			ints(row["prompt_token_ids"]), ints(row["generation_token_ids"]), row["generation_log_probs"], in.prompt, in.generation, in.logProbs)
	}
	return in
}

// checkReturned: the token fields the model server returned (on a chat
// message or a Responses output item) are vLLM's inline ones.
func checkReturned(t *testing.T, holder any, want inlineTokens) {
	t.Helper()
	if !equalInts(ints(path(holder, "prompt_token_ids")), want.prompt) || !equalInts(ints(path(holder, "generation_token_ids")), want.generation) ||
		!reflect.DeepEqual(path(holder, "generation_log_probs"), want.logProbs) {
		t.Fatalf("the model server returned %s; vLLM gave prompt %v, generation %v, log-probs %v inline", jsonText(holder), want.prompt, want.generation, want.logProbs)
	}
}

// firstDifference is the first index where a and b differ.
func firstDifference(a, b []int) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
