package fakeinference_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// vLLM makes a "required" or named tool_choice a tool call whatever the
// model would say (structured outputs; vllm/entrypoints/openai/
// chat_completion/serving.py, vLLM commit 002032ee): the stand-in calls a
// tool past its planned rounds, and the named function whatever it read.
func TestDecide_ForcedToolChoice(t *testing.T) {
	tools := []string{"get_weather", "get_time"}
	named := codec.RawMessage(`{"type":"function","function":{"name":"get_time"}}`)
	for _, c := range []struct {
		name   string
		choice codec.RawMessage
		text   string
		want   fakeinference.Decision
	}{
		{"auto, nothing to call", codec.RawMessage(`"auto"`), "hello", fakeinference.Decision{ToolCall: true, ToolName: "get_weather", Arguments: "{}"}},
		{"required, nothing planned", codec.RawMessage(`"required"`), "hello", fakeinference.Decision{ToolCall: true, ToolName: "get_weather", Arguments: "{}"}},
		{"named over the text's tool", named, weatherText, fakeinference.Decision{ToolCall: true, ToolName: "get_time", Arguments: "{}"}},
		{"named, the text's own", codec.RawMessage(`{"type":"function","function":{"name":"get_weather"}}`), weatherText,
			fakeinference.Decision{ToolCall: true, ToolName: "get_weather", Arguments: `{"city":"Paris"}`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := chatReq(tools, user(c.text))
			req.ToolChoice = c.choice
			if got := fakeinference.Decide(req, nil); !reflect.DeepEqual(got, c.want) {
				t.Fatalf("Decide = %+v, want %+v", got, c.want)
			}
		})
	}
	// After the planned round, auto answers; required and named still call.
	done := func(choice codec.RawMessage) fakeinference.Decision {
		req := chatReq(tools, user(weatherText), assistantCall("get_weather", `{"city":"Paris"}`), toolResult("sunny"))
		req.ToolChoice = choice
		return fakeinference.Decide(req, nil)
	}
	if d := done(codec.RawMessage(`"auto"`)); d.ToolCall {
		t.Errorf("auto after the planned round: %+v", d)
	}
	if d := done(codec.RawMessage(`"required"`)); !d.ToolCall || d.ToolName != "get_weather" {
		t.Errorf("required after the planned round: %+v", d)
	}
	if d := done(named); !d.ToolCall || d.ToolName != "get_time" {
		t.Errorf("named after the planned round: %+v", d)
	}
	req := chatReq(tools, user(weatherText))
	req.ToolChoice = codec.RawMessage(`"none"`)
	if d := fakeinference.Decide(req, nil); d.ToolCall {
		t.Errorf("none: %+v", d)
	}
}

func TestCalls_RecordTheRequest(t *testing.T) {
	f := start(t, nil)
	body := with(weatherRequest(), "tools", []any{tool("get_weather"), tool("get_time")},
		"tool_choice", map[string]any{"type": "function", "function": map[string]any{"name": "get_time"}},
		"max_completion_tokens", 50, "temperature", 0.25, "logprobs", true, "top_logprobs", 3,
		"return_token_ids", true, "stream", true, "stream_options", map[string]any{"include_usage": true})
	if r := f.chat(body, capture("rec")); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	calls := f.calls()
	if len(calls) != 1 {
		t.Fatalf("%d calls", len(calls))
	}
	mt, temp, top := 50, 0.25, 3
	want := fakeinference.CallRequest{Model: "fake-model", Tools: []string{"get_weather", "get_time"}, ToolChoice: "function:get_time",
		MaxTokens: &mt, Temperature: &temp, Logprobs: true, TopLogprobs: &top, ReturnTokenIDs: true, IncludeUsage: true}
	if got := calls[0].Request; !reflect.DeepEqual(got, want) {
		t.Fatalf("request = %+v, want %+v", got, want)
	}
	if r := f.chat(hiRequest(), nil); r.status != 200 {
		t.Fatal(r.status)
	}
	if got := f.calls()[1].Request; got.ToolChoice != "" || len(got.Tools) != 0 || got.MaxTokens != nil || got.Logprobs {
		t.Fatalf("a bare request recorded %+v", got)
	}
}

// A script's tokens_per_second paces its call alone.
func TestScript_TokensPerSecond(t *testing.T) {
	f := start(t, nil) // the server's pace: instant
	script := `{"tokens_per_second": 20}`
	start := time.Now()
	if r := f.chat(with(hiRequest(), "metadata", map[string]any{"fake_script": script}), nil); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	n := f.calls()[0].CompletionTokens
	if min := time.Duration(n) * time.Second / 20; time.Since(start) < min {
		t.Fatalf("%d tokens in %v, want at least %v at 20 a second", n, time.Since(start), min)
	}
	for _, bad := range []string{`{"tokens_per_second": -1}`, `{"tokens_per_second": 0.01}`} {
		if _, err := fakeinference.ParseScript(bad); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}
