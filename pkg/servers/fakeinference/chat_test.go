package fakeinference_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/transport/sse"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

// tokenRequest asks for every token field, as the model server does.
func tokenRequest(base map[string]any) map[string]any {
	return with(base, "logprobs", true, "top_logprobs", 0, "return_tokens_as_token_ids", true, "return_token_ids", true)
}

func TestModels(t *testing.T) {
	f := start(t, nil)
	r := f.get("/v1/models")
	var got openai.ModelList
	mustJSON(t, r.body, &got)
	if r.status != 200 || len(got.Data) != 1 || got.Object != "list" {
		t.Fatalf("GET /v1/models = %d %s", r.status, r.body)
	}
	want := openai.Model{ID: "fake-model", Object: "model", Created: got.Data[0].Created, OwnedBy: "gymfleet"}
	if got.Data[0] != want || want.Created == 0 {
		t.Errorf("model = %+v, want %+v", got.Data[0], want)
	}
}

func TestChat_NonStreamingGolden(t *testing.T) {
	f := start(t, nil)
	tests := []struct {
		name string
		body map[string]any
	}{
		{"chat_tool_call.golden.json", tokenRequest(weatherRequest())},
		{"chat_final_top_logprobs.golden.json", with(weatherRequest(),
			"messages", []any{userMsg(weatherText),
				map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "call_1", "type": "function", "function": map[string]any{"name": "get_weather", "arguments": `{"city":"Paris"}`}}}},
				map[string]any{"role": "tool", "tool_call_id": "call_1", "content": "sunny"}},
			"logprobs", true, "top_logprobs", 2)},
		{"chat_plain.golden.json", map[string]any{"model": "fake-model", "messages": []any{userMsg("hi")}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := f.chat(tt.body, nil)
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if ct := r.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			golden(t, tt.name, normalize(r.body))
		})
	}
}

func TestChat_StreamingGolden(t *testing.T) {
	f := start(t, nil)
	tests := []struct {
		name string
		body map[string]any
	}{
		{"stream_tool_call.golden.txt", with(tokenRequest(weatherRequest()), "stream", true, "stream_options", map[string]any{"include_usage": true})},
		{"stream_plain.golden.txt", map[string]any{"model": "fake-model", "messages": []any{userMsg("hi")}, "stream": true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := f.chat(tt.body, nil)
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if ct := r.header.Get("Content-Type"); ct != "text/event-stream" {
				t.Errorf("Content-Type = %q", ct)
			}
			if !bytes.HasSuffix(r.body, []byte("data: [DONE]\n\n")) {
				t.Errorf("stream does not end with data: [DONE]")
			}
			golden(t, tt.name, normalize(r.body))
		})
	}
}

// The token ids, the logprob tokens, usage, /tokenize and PromptIDs agree.
func TestChat_TokenFieldsAgree(t *testing.T) {
	f := start(t, nil)
	for _, body := range []map[string]any{tokenRequest(weatherRequest()), tokenRequest(map[string]any{"messages": []any{userMsg("hello there")}})} {
		r := f.chat(body, nil)
		var got openai.ChatCompletion
		mustJSON(t, r.body, &got)
		ch := got.Choices[0]
		var fromLogprobs []int
		for _, e := range ch.Logprobs.Content {
			id, err := strconv.Atoi(strings.TrimPrefix(e.Token, "token_id:"))
			if err != nil || !strings.HasPrefix(e.Token, "token_id:") {
				t.Fatalf("logprob token %q is not token_id:<id>", e.Token)
			}
			if e.Logprob >= 0 {
				t.Errorf("logprob %v is not negative", e.Logprob)
			}
			fromLogprobs = append(fromLogprobs, id)
		}
		if !slices.Equal(fromLogprobs, ch.TokenIDs) {
			t.Errorf("logprob ids %v != token_ids %v", fromLogprobs, ch.TokenIDs)
		}
		if got.Usage.CompletionTokens != len(ch.TokenIDs) || got.Usage.PromptTokens != len(got.PromptTokenIDs) ||
			got.Usage.TotalTokens != len(ch.TokenIDs)+len(got.PromptTokenIDs) {
			t.Errorf("usage %+v does not count %d prompt and %d generated ids", got.Usage, len(got.PromptTokenIDs), len(ch.TokenIDs))
		}
		if last := ch.TokenIDs[len(ch.TokenIDs)-1]; last != fakeinference.TokenIMEnd {
			t.Errorf("a finished generation ends with %d, want <|im_end|> (%d)", last, fakeinference.TokenIMEnd)
		}
		var req openai.ChatRequest
		b, _ := json.Marshal(body)
		mustJSON(t, b, &req)
		if want := fakeinference.PromptIDs(&req); !slices.Equal(got.PromptTokenIDs, want) {
			t.Errorf("prompt_token_ids %v != PromptIDs %v", got.PromptTokenIDs, want)
		}
		tr := f.post(context.Background(), "/tokenize", map[string]any{"model": "fake-model", "messages": body["messages"], "tools": body["tools"]}, nil)
		var tok fakeinference.TokenizeReply
		mustJSON(t, tr.body, &tok)
		if !slices.Equal(tok.Tokens, got.PromptTokenIDs) || tok.Count != len(tok.Tokens) || tok.MaxModelLen != fakeinference.DefaultMaxContextTokens {
			t.Errorf("/tokenize = %s, want the prompt ids %v", tr.body, got.PromptTokenIDs)
		}
	}
}

// The next call's prompt extends this call's prompt and generation, so the
// capture ledger's prefix merging finds one chain.
func TestChat_PromptExtendsPreviousCall(t *testing.T) {
	f := start(t, nil)
	body := tokenRequest(weatherRequest())
	var first openai.ChatCompletion
	mustJSON(t, f.chat(body, nil).body, &first)
	msg := first.Choices[0].Message
	next := with(body, "messages", []any{userMsg(weatherText), msg, map[string]any{"role": "tool", "tool_call_id": msg.ToolCalls[0].ID, "content": "sunny"}})
	var second openai.ChatCompletion
	mustJSON(t, f.chat(next, nil).body, &second)
	prefix := append(append([]int{}, first.PromptTokenIDs...), first.Choices[0].TokenIDs...)
	if !slices.Equal(second.PromptTokenIDs[:len(prefix)], prefix) {
		t.Errorf("second prompt %v does not start with first prompt+generation %v", second.PromptTokenIDs, prefix)
	}
	if got, want := second.Choices[0].Message.Content.String(), "The answer is: sunny"; got != want {
		t.Errorf("final answer %q, want %q", got, want)
	}
}

func TestChat_Deterministic(t *testing.T) {
	f := start(t, nil)
	other := start(t, nil)
	for _, body := range []map[string]any{tokenRequest(weatherRequest()), with(tokenRequest(weatherRequest()), "stream", true)} {
		a, b, c := f.chat(body, nil), f.chat(body, nil), other.chat(body, nil)
		if !bytes.Equal(normalize(a.body), normalize(b.body)) || !bytes.Equal(normalize(a.body), normalize(c.body)) {
			t.Errorf("identical requests gave different replies:\n%s\n%s\n%s", a.body, b.body, c.body)
		}
		if bytes.Equal(a.body, b.body) {
			t.Errorf("two calls share an id: %s", a.body)
		}
	}
}

// Accumulating the stream gives the non-streaming reply.
func TestChat_StreamMatchesNonStreaming(t *testing.T) {
	f := start(t, nil)
	for _, body := range []map[string]any{tokenRequest(weatherRequest()), tokenRequest(map[string]any{"messages": []any{userMsg("hi")}})} {
		var whole openai.ChatCompletion
		mustJSON(t, f.chat(body, nil).body, &whole)
		r := f.chat(with(body, "stream", true, "stream_options", map[string]any{"include_usage": true}), nil)
		rd := sse.NewReader(bytes.NewReader(r.body))
		var content string
		var ids, prompt []int
		var calls []openai.ToolCall
		var finish string
		var usage *openai.Usage
		for {
			ev, err := rd.Next()
			if err != nil {
				t.Fatalf("stream ended without [DONE]: %v", err)
			}
			if string(ev.Data) == sse.Done {
				break
			}
			var ch openai.ChatChunk
			mustJSON(t, ev.Data, &ch)
			if ch.PromptTokenIDs != nil {
				prompt = ch.PromptTokenIDs
			}
			if ch.Usage != nil {
				usage = ch.Usage
			}
			for _, c := range ch.Choices {
				if c.Delta.Content != nil {
					content += *c.Delta.Content
				}
				for _, tc := range c.Delta.ToolCalls {
					if tc.ID != "" {
						calls = append(calls, openai.ToolCall{ID: tc.ID, Type: tc.Type, Function: tc.Function})
					} else {
						calls[*tc.Index].Function.Arguments += tc.Function.Arguments
					}
				}
				ids = append(ids, c.TokenIDs...)
				if c.Logprobs != nil && len(c.Logprobs.Content) != len(c.TokenIDs) {
					t.Errorf("chunk has %d logprobs for %d ids", len(c.Logprobs.Content), len(c.TokenIDs))
				}
				if c.FinishReason != nil {
					finish = *c.FinishReason
				}
			}
		}
		wc := whole.Choices[0]
		if content != wc.Message.Content.String() || !slices.Equal(ids, wc.TokenIDs) || !slices.Equal(prompt, whole.PromptTokenIDs) ||
			finish != wc.FinishReason || fmt.Sprint(calls) != fmt.Sprint(wc.Message.ToolCalls) || usage == nil || *usage != *whole.Usage {
			t.Errorf("stream gives content %q ids %v calls %v finish %q usage %+v;\nnon-streaming %s", content, ids, calls, finish, usage, f.chat(body, nil).body)
		}
	}
}

func TestChat_MaxTokens(t *testing.T) {
	f := start(t, nil)
	var got openai.ChatCompletion
	mustJSON(t, f.chat(with(tokenRequest(weatherRequest()), "max_tokens", 3), nil).body, &got)
	ch := got.Choices[0]
	if ch.FinishReason != "length" || len(ch.TokenIDs) != 3 || got.Usage.CompletionTokens != 3 || len(ch.Message.ToolCalls) != 0 {
		t.Errorf("max_tokens 3: finish %q ids %v usage %+v calls %v", ch.FinishReason, ch.TokenIDs, got.Usage, ch.Message.ToolCalls)
	}
	if c := ch.Message.Content.String(); c != `{"` {
		t.Errorf("an unfinished tool call stays in the content: %q", c)
	}
}

// Context overflow as vLLM 0.32.0 answers it: a prompt past the context and
// a max_tokens above the context are refused with its messages (proxies
// match them on "maximum context length" and "max_tokens"); a max_tokens
// past the room the prompt leaves is clamped, and the reply ends "length".
func TestChat_ContextOverflow(t *testing.T) {
	f := start(t, func(c *fakeinference.Config) { c.MaxContextTokens = 32 })
	short := map[string]any{"messages": []any{userMsg("hi")}}
	long := map[string]any{"messages": []any{userMsg(strings.Repeat("word ", 20))}}
	tests := []struct {
		name string
		body map[string]any
		want string
	}{
		{"prompt alone", long, `{"error":{"message":"This model's maximum context length is 32 tokens. However, your prompt contains at least 33 input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=33)","type":"BadRequestError","param":"input_tokens","code":400}}`},
		{"max_tokens above the context", with(short, "max_tokens", 33), `{"error":{"message":"max_tokens=33 cannot be greater than max_model_len=32. Please request fewer output tokens. (parameter=max_tokens, value=33)","type":"BadRequestError","param":"max_tokens","code":400}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := f.chat(tt.body, nil)
			if r.status != 400 || strings.TrimSpace(string(r.body)) != tt.want {
				t.Errorf("got %d %s\nwant 400 %s", r.status, r.body, tt.want)
			}
		})
	}
	huge := f.chat(map[string]any{"messages": []any{userMsg("hi")}, "max_tokens": int64(math.MaxInt64)}, nil)
	if e := vllmError(t, huge, 400); !strings.Contains(e.Message, "max_tokens=9223372036854775807 cannot be greater") {
		t.Errorf("max_tokens MaxInt64: %s", huge.body)
	}
	// A prompt that leaves less room than the reply needs: max_tokens (or
	// max_completion_tokens beside a smaller max_tokens) is clamped to the
	// room, and the reply ends "length" there.
	mid := map[string]any{"messages": []any{userMsg(strings.Repeat("word ", 10))}}
	for _, body := range []map[string]any{with(mid, "max_tokens", 30), with(mid, "max_completion_tokens", 30, "max_tokens", 1)} {
		r := f.chat(body, nil)
		var c struct {
			Choices []struct {
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if r.status != 200 || json.Unmarshal(r.body, &c) != nil || len(c.Choices) != 1 || c.Choices[0].FinishReason != "length" ||
			c.Usage.CompletionTokens != 32-c.Usage.PromptTokens || c.Usage.PromptTokens < 20 {
			t.Errorf("%v: want a reply clamped to the room the prompt leaves, ending length: %d %s", body, r.status, r.body)
		}
	}
	if c := f.count(); c.Received != 2 {
		t.Errorf("refused calls are not calls: %+v", c)
	}
}

func TestChat_BadRequests(t *testing.T) {
	f := start(t, nil)
	msgs := []any{userMsg("hi")}
	tests := []struct {
		name  string
		body  any
		want  string // the message's start
		param string // "" for null
	}{
		{"empty body", "", "request body is empty; expected a JSON object", ""},
		{"malformed", `{"messages": [`, "invalid request body: ", ""},
		{"not an object", `[1]`, "invalid request body: ", ""},
		{"no messages", map[string]any{"messages": []any{}}, "messages must be a non-empty list", "messages"},
		{"n 2", map[string]any{"messages": msgs, "n": 2}, "n must be 1 on this stand-in (it generates one choice), got 2.", "n"},
		{"n 0", map[string]any{"messages": msgs, "n": 0}, "n must be at least 1, got 0.", ""},
		{"max_tokens 0", map[string]any{"messages": msgs, "max_tokens": 0}, "max_tokens must be at least 1, got 0.", "max_tokens"},
		{"max_tokens -5", map[string]any{"messages": msgs, "max_tokens": -5}, "max_tokens must be at least 1, got -5.", "max_tokens"},
		{"max_completion_tokens -1", map[string]any{"messages": msgs, "max_completion_tokens": -1, "max_tokens": 10}, "max_tokens must be at least 1, got -1.", "max_tokens"},
		{"max_tokens 1.5", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1.5}`, "max_tokens: Input should be a valid integer, got 1.5", "max_tokens"},
		{"max_tokens string", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":"ten"}`, `max_tokens: Input should be a valid integer, got "ten"`, "max_tokens"},
		{"max_completion_tokens too big for an int", `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":1e99}`, "max_completion_tokens: Input should be a valid integer, got 1e99", "max_completion_tokens"},
		{"top_logprobs 21", map[string]any{"messages": msgs, "logprobs": true, "top_logprobs": 21}, "Requested sample logprobs of 21, which is greater than max allowed: 20", "logprobs"},
		{"top_logprobs -1 (every token)", map[string]any{"messages": msgs, "logprobs": true, "top_logprobs": -1}, "Requested sample logprobs of 32000, which is greater than max allowed: 20", "logprobs"},
		{"top_logprobs -2", map[string]any{"messages": msgs, "logprobs": true, "top_logprobs": -2}, "`top_logprobs` must be a positive value or -1.", "top_logprobs"},
		{"top_logprobs not an integer", `{"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":"2"}`, "`top_logprobs` must be an integer.", "top_logprobs"},
		{"top_logprobs without logprobs", map[string]any{"messages": msgs, "top_logprobs": 2}, "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"},
		{"stream_options without stream", map[string]any{"messages": msgs, "stream_options": map[string]any{"include_usage": true}}, "Stream options can only be defined when `stream=True`.", "stream_options"},
		{"tools empty", map[string]any{"messages": msgs, "tools": []any{}}, "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.", "tools"},
		{"tool_choice without tools", map[string]any{"messages": msgs, "tool_choice": "auto"}, "When using `tool_choice`, `tools` must be set.", "tool_choice"},
		{"tool_choice any", map[string]any{"messages": msgs, "tools": []any{tool("f")}, "tool_choice": "any"}, `Invalid value for ` + "`tool_choice`" + `: any! Only named tools, "none", "auto" or "required" are supported.`, "tool_choice"},
		{"named tool not offered", map[string]any{"messages": msgs, "tools": []any{tool("f")}, "tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "g"}}}, "The tool specified in `tool_choice` does not match any of the specified `tools`", "tool_choice"},
		{"named tool without a name", map[string]any{"messages": msgs, "tools": []any{tool("f")}, "tool_choice": map[string]any{"type": "function", "function": map[string]any{}}}, "Expected field `name` in `function` in `tool_choice`!", "tool_choice.function.name"},
		{"named tool, Responses shape", map[string]any{"messages": msgs, "tools": []any{tool("f")}, "tool_choice": map[string]any{"type": "function", "name": "f"}}, "Invalid value for `function`: `None` in `tool_choice`!", "tool_choice.function"},
		{"bad fake_script", map[string]any{"messages": msgs, "metadata": map[string]any{"fake_script": `{"x":1}`}}, "metadata.fake_script: ", "metadata"},
		{"bad stream_error", map[string]any{"messages": msgs, "metadata": map[string]any{"fake_script": `{"stream_error":{"after_tokens":-1}}`}}, "metadata.fake_script: stream_error.after_tokens must be >= 0, got -1", "metadata"},
		{"metadata not strings", map[string]any{"messages": msgs, "metadata": map[string]any{"a": 1}}, "invalid request body: ", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := f.chat(tt.body, nil)
			e := vllmError(t, r, 400)
			if !strings.HasPrefix(e.Message, tt.want) || e.Type != "BadRequestError" {
				t.Errorf("%s %q, want BadRequestError %q", e.Type, e.Message, tt.want)
			}
			if got := deref(e.Param); got != tt.param || (tt.param == "") != (e.Param == nil) {
				t.Errorf("param %v, want %q", e.Param, tt.param)
			}
		})
	}
	if c := f.count(); c.Received != 0 {
		t.Errorf("refused calls are not calls: %+v", c)
	}
	for _, ok := range []map[string]any{
		{"messages": msgs, "tool_choice": "none"},
		{"messages": msgs, "tool_choice": nil, "tools": nil},
		{"messages": msgs, "tools": []any{tool("f")}, "tool_choice": "required"},
		{"messages": msgs, "tools": []any{tool("f")}, "tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "f"}}},
	} {
		if r := f.chat(ok, nil); r.status != 200 {
			t.Errorf("%v: %d %s", ok, r.status, r.body)
		}
	}
}

func TestChat_ScriptPrecedence(t *testing.T) {
	f := start(t, func(c *fakeinference.Config) { c.Script = `{"final_text": "from config"}` })
	body := map[string]any{"messages": []any{userMsg("hi")}}
	answer := func(b map[string]any) string {
		var got openai.ChatCompletion
		mustJSON(t, f.chat(b, nil).body, &got)
		return got.Choices[0].Message.Content.String()
	}
	if got := answer(body); got != "from config" {
		t.Errorf("config script: %q", got)
	}
	if _, err := f.ctl.SetScript(context.Background(), &fakeinference.Script{FinalText: "from ctl"}); err != nil {
		t.Fatal(err)
	}
	if got := answer(body); got != "from ctl" {
		t.Errorf("/_ctl/script: %q", got)
	}
	if got := answer(with(body, "metadata", map[string]any{"fake_script": `{"final_text":"from metadata"}`})); got != "from metadata" {
		t.Errorf("metadata.fake_script: %q", got)
	}
	if sc, err := f.ctl.SetScript(context.Background(), nil); err != nil || sc != nil {
		t.Fatalf("clearing the script: %v %v", sc, err)
	}
	if got := answer(body); got != "from config" {
		t.Errorf("after clearing: %q", got)
	}
	// A scripted tool call with the weather request's tools.
	sc := &fakeinference.Script{ToolCalls: []fakeinference.ScriptToolCall{{Name: "lookup", Arguments: json.RawMessage(`{"q": "x"}`)}}}
	r := f.post(context.Background(), "/_ctl/script", sc, nil)
	if r.status != 200 || !strings.Contains(string(r.body), `"arguments":{"q":"x"}`) {
		t.Fatalf("POST /_ctl/script = %d %s", r.status, r.body)
	}
	var got openai.ChatCompletion
	mustJSON(t, f.chat(weatherRequest(), nil).body, &got)
	if tc := got.Choices[0].Message.ToolCalls; len(tc) != 1 || tc[0].Function.Name != "lookup" || tc[0].Function.Arguments != `{"q":"x"}` || got.Choices[0].FinishReason != "tool_calls" {
		t.Errorf("scripted tool call: %+v", got.Choices[0])
	}
	if r := f.post(context.Background(), "/_ctl/script", `{"tool_callz": []}`, nil); r.status != 422 || !strings.Contains(string(r.body), `"code":"invalid_request"`) {
		t.Errorf("unknown script field: %d %s", r.status, r.body)
	}
}

func TestTokenize(t *testing.T) {
	f := start(t, nil)
	r := f.post(context.Background(), "/tokenize", map[string]any{"prompt": "Hello, world!"}, nil)
	if want := `{"tokens":[26063,15347,26803,15875,21692],"count":5,"max_model_len":32768}`; strings.TrimSpace(string(r.body)) != want {
		t.Errorf("tokenize prompt = %s, want %s", r.body, want)
	}
	r = f.post(context.Background(), "/tokenize", map[string]any{"messages": []any{userMsg("hi")}, "add_generation_prompt": false}, nil)
	var got fakeinference.TokenizeReply
	mustJSON(t, r.body, &got)
	if want := append(append([]int{1, 4}, fakeinference.Tokenize("hi")...), 2); !slices.Equal(got.Tokens, want) {
		t.Errorf("tokenize without generation prompt = %v, want %v", got.Tokens, want)
	}
	for _, bad := range []string{``, `{`, `{}`, `{"prompt":"a","messages":[]}`} {
		vllmError(t, f.post(context.Background(), "/tokenize", bad, nil), 400)
	}
}

// Generation takes max(n/tokens_per_second, min_call_seconds).
func TestChat_Pacing(t *testing.T) {
	body := map[string]any{"messages": []any{userMsg("hi")}} // 14 generated tokens
	tests := []struct {
		name    string
		tps     float64
		minCall float64
		atLeast time.Duration
	}{
		{"tokens per second", 140, 0, 100 * time.Millisecond},
		{"min call seconds", 0, 0.1, 100 * time.Millisecond},
		{"the slower of the two", 1400, 0.1, 100 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := start(t, func(c *fakeinference.Config) { c.TokensPerSecond, c.MinCallSeconds = tt.tps, tt.minCall })
			for _, stream := range []bool{false, true} {
				begin := time.Now()
				if r := f.chat(with(body, "stream", stream), nil); r.status != 200 {
					t.Fatalf("status %d", r.status)
				}
				if d := time.Since(begin); d < tt.atLeast {
					t.Errorf("stream=%v took %v, want at least %v", stream, d, tt.atLeast)
				}
			}
		})
	}
}

// A cancelled request stops generating at once and counts as failed.
func TestChat_CancelledGeneration(t *testing.T) {
	f := start(t, func(c *fakeinference.Config) { c.TokensPerSecond = 1 })
	for _, stream := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		done := f.chatAsync(ctx, with(map[string]any{"messages": []any{userMsg("hi")}}, "stream", stream), nil)
		f.waitCount("the call to generate", func(c fakeinference.CallCount) bool { return c.InFlight == 1 })
		cancel()
		recv(t, done)
		f.waitCount("the call to fail", func(c fakeinference.CallCount) bool { return c.InFlight == 0 })
	}
	if c := f.count(); c.Failed != 2 || c.Returned != 0 {
		t.Errorf("call_count = %+v, want 2 failed", c)
	}
}

// Close ends a generation at once instead of waiting out the grace period.
func TestServer_CloseEndsGenerations(t *testing.T) {
	f := start(t, func(c *fakeinference.Config) { c.TokensPerSecond = 0.01 })
	done := f.chatAsync(context.Background(), map[string]any{"messages": []any{userMsg("hi")}}, nil)
	f.waitCount("the call to generate", func(c fakeinference.CallCount) bool { return c.InFlight == 1 })
	begin := time.Now()
	if err := f.srv.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := recv(t, done); r.status != http.StatusServiceUnavailable {
		t.Errorf("a call cut off by Close: %d %s", r.status, r.body)
	}
	if d := time.Since(begin); d > 5*time.Second {
		t.Errorf("Close took %v", d)
	}
}
