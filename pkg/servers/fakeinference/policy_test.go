package fakeinference_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

func chatReq(tools []string, msgs ...openai.ChatMessage) *openai.ChatRequest {
	req := &openai.ChatRequest{Model: "m", Messages: msgs}
	for _, n := range tools {
		req.Tools = append(req.Tools, openai.ChatTool{Type: "function", Function: openai.ChatFunction{Name: n}})
	}
	return req
}

func user(text string) openai.ChatMessage {
	return openai.ChatMessage{Role: "user", Content: openai.TextContent(text)}
}

func assistantCall(name, args string) openai.ChatMessage {
	return openai.ChatMessage{Role: "assistant", ToolCalls: []openai.ToolCall{{ID: "c", Type: "function", Function: openai.FunctionCall{Name: name, Arguments: args}}}}
}

func toolResult(content string) openai.ChatMessage {
	return openai.ChatMessage{Role: "tool", ToolCallID: "c", Content: openai.TextContent(content)}
}

func intp(n int) *int { return &n }

func TestDecide(t *testing.T) {
	const weatherOut = `{"city":"Paris","weather_description":"sunny, 21C"}`
	counterTools := []string{"increment", "get_counter_value"}
	gymCounterTools := []string{"increment_counter", "get_counter_value"}
	const gymCounterText = "add 10 then add 11 then get the count"
	tests := []struct {
		name   string
		req    *openai.ChatRequest
		script *fakeinference.Script
		want   fakeinference.Decision
	}{{
		name: "weather first round",
		req:  chatReq([]string{"get_weather"}, user(weatherText)),
		want: fakeinference.Decision{ToolCall: true, ToolName: "get_weather", Arguments: `{"city":"Paris"}`},
	}, {
		name: "weather answer quotes the tool result",
		req:  chatReq([]string{"get_weather"}, user(weatherText), assistantCall("get_weather", `{"city":"Paris"}`), toolResult(weatherOut)),
		want: fakeinference.Decision{Round: 1, FinalText: "The answer is: " + weatherOut},
	}, {
		// NeMo Gym's counter dataset speaks in words
		// (example_session_state_mgmt/data/example.jsonl, Gym 07d6b0d07b22).
		name: "gym counter first add",
		req:  chatReq(gymCounterTools, user(gymCounterText)),
		want: fakeinference.Decision{ToolCall: true, ToolName: "increment_counter", Arguments: `{"count":10}`},
	}, {
		name: "gym counter second add",
		req:  chatReq(gymCounterTools, user(gymCounterText), assistantCall("increment_counter", `{"count":10}`), toolResult(`{"success":true}`)),
		want: fakeinference.Decision{ToolCall: true, ToolName: "increment_counter", Arguments: `{"count":11}`, Round: 1},
	}, {
		name: "gym counter reads the count",
		req: chatReq(gymCounterTools, user(gymCounterText), assistantCall("increment_counter", `{"count":10}`), toolResult(`{"success":true}`),
			assistantCall("increment_counter", `{"count":11}`), toolResult(`{"success":true}`)),
		want: fakeinference.Decision{ToolCall: true, ToolName: "get_counter_value", Arguments: `{}`, Round: 2},
	}, {
		name: "gym counter answers with the count",
		req: chatReq(gymCounterTools, user(gymCounterText), assistantCall("increment_counter", `{"count":10}`), toolResult(`{"success":true}`),
			assistantCall("increment_counter", `{"count":11}`), toolResult(`{"success":true}`), assistantCall("get_counter_value", `{}`), toolResult(`{"count":33}`)),
		want: fakeinference.Decision{Round: 3, FinalText: `The answer is: {"count":33}`},
	}, {
		name: "gym counter text without increment_counter offered",
		req:  chatReq([]string{"get_counter_value"}, user(gymCounterText)),
		want: fakeinference.Decision{ToolCall: true, ToolName: "get_counter_value", Arguments: `{}`},
	}, {
		name: "increment_counter offered, no add phrase",
		req:  chatReq(gymCounterTools, user("what is the count?")),
		want: fakeinference.Decision{ToolCall: true, ToolName: "increment_counter", Arguments: `{}`},
	}, {
		name: "counter round 2 passes the second object",
		req:  chatReq(counterTools, user(counterText), assistantCall("increment", `{"by":1}`), toolResult(`{"count":4}`)),
		want: fakeinference.Decision{ToolCall: true, ToolName: "increment", Arguments: `{"by":2}`, Round: 1},
	}, {
		name: "counter done after two rounds",
		req: chatReq(counterTools, user(counterText), assistantCall("increment", `{"by":1}`), toolResult(`{"count":4}`),
			assistantCall("increment", `{"by":2}`), toolResult(`{"count":6}`)),
		want: fakeinference.Decision{Round: 2, FinalText: `The answer is: {"count":6}`},
	}, {
		name: "the tool named closest before an object is called",
		req:  chatReq([]string{"alpha", "beta"}, user(`Use beta later. First alpha {"x": 1}, then beta {"y": [1, {"z": "}"}]}.`), assistantCall("alpha", `{"x":1}`), toolResult("ok")),
		want: fakeinference.Decision{ToolCall: true, ToolName: "beta", Arguments: `{"y":[1,{"z":"}"}]}`, Round: 1},
	}, {
		name: "a name inside another word does not count",
		req:  chatReq([]string{"get", "get_weather"}, user(`get_weather: {"a": 1}`)),
		want: fakeinference.Decision{ToolCall: true, ToolName: "get_weather", Arguments: `{"a":1}`},
	}, {
		name: "no object: one round with {} calling the tool the text names",
		req:  chatReq(counterTools, user("What is the counter? Call get_counter_value.")),
		want: fakeinference.Decision{ToolCall: true, ToolName: "get_counter_value", Arguments: `{}`},
	}, {
		name: "no object and no name: the first tool",
		req:  chatReq(counterTools, user("Hi")),
		want: fakeinference.Decision{ToolCall: true, ToolName: "increment", Arguments: `{}`},
	}, {
		name: "no tools: greeting",
		req:  chatReq(nil, user(weatherText)),
		want: fakeinference.Decision{FinalText: fakeinference.Greeting},
	}, {
		name: "tool_choice none: no tool call",
		req: func() *openai.ChatRequest {
			r := chatReq([]string{"get_weather"}, user(weatherText))
			r.ToolChoice = codec.RawMessage(`"none"`)
			return r
		}(),
		want: fakeinference.Decision{FinalText: fakeinference.Greeting},
	}, {
		name:   "script tool calls replace the text's rounds",
		req:    chatReq([]string{"get_weather"}, user(weatherText)),
		script: mustScript(t, `{"tool_calls":[{"name":"other","arguments":"{\"q\": 1}"}]}`),
		want:   fakeinference.Decision{ToolCall: true, ToolName: "other", Arguments: `{"q":1}`},
	}, {
		name:   "script rounds past the list repeat its last call",
		req:    chatReq([]string{"get_weather"}, user(weatherText), assistantCall("get_weather", `{"city":"Paris"}`), toolResult("x")),
		script: mustScript(t, `{"tool_rounds": 3}`),
		want:   fakeinference.Decision{ToolCall: true, ToolName: "get_weather", Arguments: `{"city":"Paris"}`, Round: 1},
	}, {
		name:   "script with zero rounds answers at once with its text",
		req:    chatReq([]string{"get_weather"}, user(weatherText)),
		script: mustScript(t, `{"tool_rounds": 0, "final_text": "done"}`),
		want:   fakeinference.Decision{FinalText: "done"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := fakeinference.Decide(tt.req, tt.script); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Decide = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func mustScript(t *testing.T, text string) *fakeinference.Script {
	t.Helper()
	s, err := fakeinference.ParseScript(text)
	if err != nil {
		t.Fatalf("ParseScript(%s): %v", text, err)
	}
	return s
}

func TestParseScript(t *testing.T) {
	s := mustScript(t, `{"tool_rounds":2,"tool_calls":[{"name":"a"},{"name":"b","arguments":{"k": [1, 2]}}],"final_text":"bye"}`)
	want := fakeinference.Script{ToolRounds: intp(2), FinalText: "bye", ToolCalls: []fakeinference.ScriptToolCall{
		{Name: "a", Arguments: codec.RawMessage(`{}`)}, {Name: "b", Arguments: codec.RawMessage(`{"k":[1,2]}`)},
	}}
	if !reflect.DeepEqual(*s, want) {
		t.Errorf("ParseScript = %+v, want %+v", *s, want)
	}
	for _, bad := range []string{
		``, `[]`, `{"tool_round": 1}`, `{"tool_rounds": -1}`, `{"tool_rounds": 100000}`,
		`{"tool_calls":[{"name":""}]}`, `{"tool_calls":[{"name":"a","arguments":[1]}]}`,
		`{"tool_calls":[{"name":"a","arguments":"not json"}]}`, `{} {}`,
	} {
		if _, err := fakeinference.ParseScript(bad); err == nil {
			t.Errorf("ParseScript(%q) succeeded, want an error", bad)
		}
	}
}

func TestJSONObjects(t *testing.T) {
	text := `a {"x": 1} b {not json} {"s": "{}}"} {"n": {"m": 2}} {"open": `
	got := fakeinference.JSONObjects(text, 10)
	var compact []string
	for _, o := range got {
		compact = append(compact, o.Compact)
		if !strings.HasPrefix(text[o.Start:o.End], "{") {
			t.Errorf("span %d:%d does not start with {", o.Start, o.End)
		}
	}
	want := []string{`{"x":1}`, `{"s":"{}}"}`, `{"n":{"m":2}}`}
	if !reflect.DeepEqual(compact, want) {
		t.Errorf("JSONObjects = %q, want %q", compact, want)
	}
	if got := fakeinference.JSONObjects(text, 1); len(got) != 1 {
		t.Errorf("JSONObjects with max 1 found %d", len(got))
	}
}

// A prompt of unbalanced braces must not cost quadratic time.
func TestJSONObjects_Pathological(t *testing.T) {
	text := strings.Repeat("{", 1<<20)
	start := time.Now()
	if got := fakeinference.JSONObjects(text, 64); len(got) != 0 {
		t.Errorf("found %d objects in unbalanced braces", len(got))
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("scanning 1 MiB of braces took %v", d)
	}
}
