package modelproxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
)

// What the official OpenAI Python SDK (openai 3.63.0, read from its
// site-packages) expects of the wire, where the model server answered
// otherwise before; tests/interop/sdk drives the SDK itself against the
// servers. Each case names the SDK code it depends on.

// _base_client.py _should_retry retries 408, 409, 429 and every 5xx
// unless x-should-retry says otherwise: only refusals that did no work and
// may pass later say true.
func TestOpenAIErrors_ShouldRetry(t *testing.T) {
	up := newStub(t)
	p := newProxy(t, up, nil)
	for _, c := range []struct {
		name     string
		upstream func(http.ResponseWriter, *http.Request, map[string]any)
		body     string
		status   int
		retry    string
	}{
		{"our 400", nil, `{"model":"m","messages":[{"role":"user","content":"hi"}],"n":2}`, 400, "false"},
		{"upstream 400", replyJSON(400, `{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}`), "", 400, "false"},
		{"upstream 500, after generating", replyJSON(500, `{"error":{"message":"engine died","type":"InternalServerError","param":null,"code":500}}`), "", 502, "false"},
		{"upstream 429", replyJSON(429, `{"error":{"message":"slow down","type":"RateLimitError","param":null,"code":429}}`), "", 429, "true"},
		{"upstream 503", replyJSON(503, `{"error":{"message":"overloaded","type":"ServiceUnavailableError","param":null,"code":503}}`), "", 502, "true"},
	} {
		t.Run(c.name, func(t *testing.T) {
			up.script(c.upstream)
			body := c.body
			if body == "" {
				body = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
			}
			resp := postRaw(t, p.url+"/v1/chat/completions", body)
			if resp.status != c.status || resp.header.Get("X-Should-Retry") != c.retry {
				t.Fatalf("got %d x-should-retry %q (%s), want %d %q", resp.status, resp.header.Get("X-Should-Retry"), resp.body, c.status, c.retry)
			}
			var env struct {
				Error struct{ Message, Code, Detail string } `json:"error"`
			}
			if err := json.Unmarshal(resp.body, &env); err != nil || env.Error.Message == "" || env.Error.Message != env.Error.Detail {
				t.Fatalf("error body %s: want OpenAI's message beside our detail", resp.body)
			}
			if c.status == http.StatusBadGateway && !strings.HasSuffix(env.Error.Message, ": engine died") && !strings.HasSuffix(env.Error.Message, ": overloaded") {
				t.Fatalf("message %q: want vLLM's message, not its body", env.Error.Message)
			}
		})
	}
}

// An upstream nobody answers never saw the call: the client may send it
// again.
func TestOpenAIErrors_UnreachableUpstreamMayRetry(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	up := newStub(t)
	p := newProxy(t, up, func(c *modelproxy.Config) { c.Upstream.BaseURL = "http://" + addr + "/v1" })
	resp := postRaw(t, p.url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	if resp.status != http.StatusBadGateway || resp.header.Get("X-Should-Retry") != "true" {
		t.Fatalf("got %d x-should-retry %q: %s", resp.status, resp.header.Get("X-Should-Retry"), resp.body)
	}
}

// The SDK reads error.param; a refused unknown field names it there too.
func TestResponses_UnknownFieldNamedInParam(t *testing.T) {
	p := newProxy(t, newStub(t), nil)
	resp := postRaw(t, p.url+"/v1/responses", `{"model":"m","input":"hi","safety_identifier":"u","prompt_cache_key":"k"}`)
	var env struct {
		Error struct {
			Message string
			Param   *string
		} `json:"error"`
	}
	if err := json.Unmarshal(resp.body, &env); err != nil {
		t.Fatal(err)
	}
	if resp.status != 422 || env.Error.Param == nil || *env.Error.Param != "prompt_cache_key" ||
		env.Error.Message != "unknown request fields: prompt_cache_key, safety_identifier" {
		t.Fatalf("got %d %s", resp.status, resp.body)
	}
}

// OpenAI sends a chunk's logprobs only to a client that asked for them;
// the ones the server asks for itself (return_token_ids) stay out of the
// stream, as they stay out of a complete reply. vLLM's token_ids stay.
func TestChatStream_LogprobsOnlyWhenAsked(t *testing.T) {
	up := newStub(t)
	p := newProxy(t, up, nil)
	up.script(replySSE(
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"prompt_token_ids":[1,2]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":{"content":[{"token":"token_id:7","logprob":-0.5,"bytes":[72,105],"top_logprobs":[]}]},"finish_reason":null,"token_ids":[7]}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{},"logprobs":{"content":[{"token":"token_id:2","logprob":-0.1,"bytes":[],"top_logprobs":[]}]},"finish_reason":"stop","token_ids":[2]}]}`,
		`[DONE]`))
	for _, c := range []struct {
		name     string
		body     string
		logprobs bool
	}{
		{"not asked", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, false},
		{"asked", `{"model":"m","stream":true,"logprobs":true,"messages":[{"role":"user","content":"hi"}]}`, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			status, body := p.post(t, "/v1/chat/completions", c.body)
			if status != http.StatusOK {
				t.Fatalf("%d %s", status, body)
			}
			evs := events(t, body)
			var withLogprobs, withIDs int
			for _, ev := range evs[:len(evs)-1] {
				var ch struct {
					Choices []map[string]json.RawMessage `json:"choices"`
				}
				if err := json.Unmarshal(ev.Data, &ch); err != nil {
					t.Fatalf("chunk %s: %v", ev.Data, err)
				}
				if _, ok := ch.Choices[0]["logprobs"]; ok {
					withLogprobs++
				}
				if _, ok := ch.Choices[0]["token_ids"]; ok {
					withIDs++
				}
			}
			if want := map[bool]int{false: 0, true: 2}[c.logprobs]; withLogprobs != want || withIDs != 2 {
				t.Fatalf("%d chunks with logprobs (want %d), %d with token_ids (want 2):\n%s", withLogprobs, want, withIDs, body)
			}
		})
	}
}

// OpenAI's text delta and done events always carry logprobs (a list;
// ResponseTextDeltaEvent requires it), and a response that stopped early
// ends with response.incomplete (lib/streaming/responses).
func TestResponsesStream_OpenAIEventShapes(t *testing.T) {
	up := newStub(t)
	p := newProxy(t, up, nil)
	up.script(replySSE(
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"},"finish_reason":null,"token_ids":[5]}],"prompt_token_ids":[1,2]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"length","token_ids":[6]}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"fake-model","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4}}`,
		`[DONE]`))
	status, body := p.post(t, "/v1/responses", `{"model":"m","input":"hi","stream":true,"max_output_tokens":2}`)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
	evs := events(t, body)
	var types []string
	for _, ev := range evs {
		var e map[string]json.RawMessage
		if err := json.Unmarshal(ev.Data, &e); err != nil {
			t.Fatal(err)
		}
		var typ string
		_ = json.Unmarshal(e["type"], &typ)
		types = append(types, typ)
		if typ == "response.output_text.delta" || typ == "response.output_text.done" {
			if string(e["logprobs"]) != "[]" {
				t.Errorf("%s: logprobs %s, want []", typ, e["logprobs"])
			}
		}
	}
	if last := types[len(types)-1]; last != "response.incomplete" {
		t.Fatalf("the stream ends with %s, want response.incomplete: %v", last, types)
	}
	if !bytes.Contains(evs[len(evs)-1].Data, []byte(`"status":"incomplete"`)) {
		t.Fatalf("last event %s", evs[len(evs)-1].Data)
	}
}

// The checkpoint fence's refusals on the OpenAI routes are OpenAI-shaped
// (the SDK builds e.message from error.message) and final; the ledger
// routes keep the fleet's envelope.
func TestFenceRefusals_OpenAIShapeOnV1(t *testing.T) {
	w := startWorker(t, 0)
	m := startModel(t, w.url, t.TempDir(), ctlplanetest.Config(), nil)
	m.mustOp(t, "retire", map[string]any{"checkpoint_id": "ops", "deadline_ts": future(30 * time.Second), "episode_ids": scopeOf("r1")})
	resp := postRaw(t, m.url+"/ng-rollout/r1/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	var env struct {
		Error struct{ Message, Type, Code string } `json:"error"`
	}
	if err := json.Unmarshal(resp.body, &env); err != nil {
		t.Fatal(err)
	}
	if resp.status != http.StatusConflict || env.Error.Code != "stale_attempt" || env.Error.Message != "attempt 0 of rollout r1 was retired" ||
		env.Error.Type != "invalid_request_error" || resp.header.Get("X-Should-Retry") != "false" {
		t.Fatalf("got %d %v %s", resp.status, resp.header, resp.body)
	}
	status, body := m.get(t, "/ng-rollout/r1/nope")
	if status != http.StatusConflict || strings.Contains(string(body), `"message"`) {
		t.Fatalf("a route outside /v1: %d %s", status, body)
	}
}

// An HTTP/1.1 client that gives up while a checkpoint holds its call (an
// SDK's timeout) leaves no call behind to go upstream at the resume.
func TestCheckpointHold_AbandonedHTTP1CallNeverGoesUpstream(t *testing.T) {
	w := startWorker(t, 0)
	m := startModel(t, w.url, t.TempDir(), ctlplanetest.Config(), nil)
	m.mustOp(t, "prepare", ckReq("c1"))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.url+"/ng-rollout/gone/v1/chat/completions",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{}} // HTTP/1.1, as the SDK speaks
	defer hc.CloseIdleConnections()
	if _, err := hc.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the held call answered: %v", err)
	}
	waitFor(t, "the abandoned call to end while the checkpoint is open", func() bool {
		_, b := m.get(t, "/metrics")
		// The scrape itself is the one request in flight.
		return bytes.Contains(b, []byte("\ngymfleet_http_requests_in_flight 1\n"))
	})
	m.mustOp(t, "resume", ckReq("c1"))
	m.mustCall(t, "after", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	if n := len(w.callsOf(t, "gone")); n != 0 {
		t.Fatalf("the abandoned call went upstream %d times", n)
	}
}

type rawReply struct {
	status int
	header http.Header
	body   []byte
}

// postRaw posts over HTTP/1.1 and keeps the reply's headers.
func postRaw(t *testing.T, url, body string) rawReply {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	return rawReply{status: resp.StatusCode, header: resp.Header, body: buf.Bytes()}
}
