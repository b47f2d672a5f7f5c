package modelproxy_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
)

// The metadata texts are what NeMo Gym writes: rollout_collection.py at
// 07d6b0d07b22fcf530b4c211dae2ee23100428e4 (~660) sets
// metadata["extra_body"] = json.dumps({"seed": <rollout index>}) per repeat;
// a row's metadata.chat_template_kwargs is json.dumps of the kwargs, read by
// vllm_model/app.py (~456-535) at the same commit.
const gymMetadata = `{"extra_body":"{\"seed\": 1}","chat_template_kwargs":"{\"enable_thinking\": false}","task":"t1"}`

func TestRequestExtrasMerged(t *testing.T) {
	up := newStub(t)
	up.script(replyJSON(200, completion(`{"role":"assistant","content":"hi"}`, "stop", []int{1}, []int{2})))
	p := newProxy(t, up, func(c *modelproxy.Config) {
		c.Upstream.ExtraBody = `{"top_k": 20, "seed": 99, "temperature": 0.1, "logprobs": false}`
		c.Upstream.ChatTemplateKwargs = `{"enable_thinking": true, "reasoning_effort": "low"}`
	})
	check := func(t *testing.T, sent map[string]any, kwargs string) {
		t.Helper()
		got, _ := json.Marshal(sent["chat_template_kwargs"])
		if sent["top_k"] != 20.0 || sent["seed"] != 1.0 || sent["temperature"] != 0.5 || sent["logprobs"] != true || string(got) != kwargs {
			t.Fatalf("upstream got %v", sent)
		}
		if md, _ := sent["metadata"].(map[string]any); md["task"] != "t1" {
			t.Fatalf("metadata not forwarded: %v", sent["metadata"])
		}
	}
	t.Run("responses", func(t *testing.T) {
		status, b := p.post(t, "/v1/responses", `{"input":"q","temperature":0.5,"metadata":`+gymMetadata+`}`)
		if status != 200 {
			t.Fatalf("%d %s", status, b)
		}
		check(t, up.last(t).Body, `{"enable_thinking":false,"reasoning_effort":"low"}`)
	})
	// The chat request's own chat_template_kwargs are dropped, as NeMo
	// Gym's vllm_model drops them by default (nemo-gym 0.7.0,
	// forward_request_chat_template_kwargs false).
	chat := `{"messages":[{"role":"user","content":"q"}],"temperature":0.5,"metadata":` + gymMetadata + `,"chat_template_kwargs":{"reasoning_effort":"high","enable_thinking":true}}`
	t.Run("chat", func(t *testing.T) {
		status, b := p.post(t, "/v1/chat/completions", chat)
		if status != 200 {
			t.Fatalf("%d %s", status, b)
		}
		check(t, up.last(t).Body, `{"enable_thinking":false,"reasoning_effort":"low"}`)
	})
	// Forwarded, they go between the configured ones and the metadata's.
	t.Run("chat forwarding its own", func(t *testing.T) {
		up := newStub(t)
		up.script(replyJSON(200, completion(`{"role":"assistant","content":"hi"}`, "stop", []int{1}, []int{2})))
		p := newProxy(t, up, func(c *modelproxy.Config) {
			c.Upstream.ExtraBody = `{"top_k": 20, "seed": 99, "temperature": 0.1, "logprobs": false}`
			c.Upstream.ChatTemplateKwargs = `{"enable_thinking": true, "reasoning_effort": "low"}`
			c.Upstream.ForwardRequestChatTemplateKwargs = true
		})
		status, b := p.post(t, "/v1/chat/completions", chat)
		if status != 200 {
			t.Fatalf("%d %s", status, b)
		}
		check(t, up.last(t).Body, `{"enable_thinking":false,"reasoning_effort":"high"}`)
	})
}

func TestRequestExtrasOnlyWhenAsked(t *testing.T) {
	up := newStub(t)
	up.script(replyJSON(200, completion(`{"role":"assistant","content":"hi"}`, "stop", []int{1}, []int{2})))
	p := newProxy(t, up, nil)
	for _, tt := range []struct{ path, body string }{
		{"/v1/responses", `{"input":"q","metadata":{"task":"t1"}}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"q"}]}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"q"}],"chat_template_kwargs":{"enable_thinking":true}}`},
	} {
		if status, b := p.post(t, tt.path, tt.body); status != 200 {
			t.Fatalf("%s: %d %s", tt.path, status, b)
		}
		sent := up.last(t).Body
		if _, ok := sent["chat_template_kwargs"]; ok {
			t.Fatalf("%s: chat_template_kwargs sent unasked: %v", tt.path, sent)
		}
		if _, ok := sent["seed"]; ok {
			t.Fatalf("%s: seed sent unasked: %v", tt.path, sent)
		}
	}
}

func TestRequestExtrasBadMetadata(t *testing.T) {
	up := newStub(t)
	p := newProxy(t, up, nil)
	for _, tt := range []struct{ name, path, body, param string }{
		{"responses extra_body", "/v1/responses", `{"input":"q","metadata":{"extra_body":"{seed: 1}"}}`, "metadata.extra_body"},
		{"responses kwargs not an object", "/v1/responses", `{"input":"q","metadata":{"chat_template_kwargs":"[1]"}}`, "metadata.chat_template_kwargs"},
		{"chat extra_body", "/v1/chat/completions", `{"messages":[],"metadata":{"extra_body":"nope"}}`, "metadata.extra_body"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			status, b := p.post(t, tt.path, tt.body)
			e, _ := decode(t, b)["error"].(map[string]any)
			if status != http.StatusBadRequest || e["code"] != "invalid_request" || e["param"] != tt.param || !strings.Contains(e["message"].(string), tt.param) {
				t.Fatalf("%d %s", status, b)
			}
		})
	}
	if n := chatCalls(up); n != 0 {
		t.Fatalf("refused requests reached the upstream %d times", n)
	}
}

func TestConfigExtrasValidate(t *testing.T) {
	c := modelproxy.DefaultConfig()
	c.Upstream.ExtraBody, c.Upstream.ChatTemplateKwargs = `{"a":`, `[1]`
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "upstream.extra_body") || !strings.Contains(err.Error(), "upstream.chat_template_kwargs") {
		t.Fatalf("Validate = %v", err)
	}
}
