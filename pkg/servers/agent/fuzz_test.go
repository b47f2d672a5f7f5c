package agent_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/servers/agent"
)

// roundTripFunc is a client transport that never touches the network.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// unreachable fails every upstream call at once.
var unreachable = roundTripFunc(func(r *http.Request) (*http.Response, error) {
	return nil, errors.New("fuzz: no network")
})

// modelReply is the body a scripted transport answers model calls with.
type modelReply struct {
	mu   sync.Mutex
	body []byte
}

func (m *modelReply) set(b []byte) {
	m.mu.Lock()
	m.body = b
	m.mu.Unlock()
}

// scripted answers model calls with the current model reply (of the given
// content type) and every resources call with {}.
func scripted(reply *modelReply, contentType string) roundTripFunc {
	return func(r *http.Request) (*http.Response, error) {
		if r.Body != nil {
			_, _ = io.Copy(io.Discard, r.Body)
			r.Body.Close()
		}
		body, ct := []byte(`{}`), "application/json"
		if r.URL.Host == "model.invalid" {
			reply.mu.Lock()
			body, ct = reply.body, contentType
			reply.mu.Unlock()
		}
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {ct}}, Body: io.NopCloser(bytes.NewReader(body)), Request: r}, nil
	}
}

func fuzzAgent(f testing.TB, rt http.RoundTripper, stream bool) http.Handler {
	cfg := agent.DefaultConfig()
	cfg.ModelServerURL, cfg.ResourcesServerURL = "http://model.invalid", "http://resources.invalid"
	cfg.MaxSteps, cfg.Stream = 3, stream
	srv, err := agent.New(cfg, agent.Deps{Client: &http.Client{Transport: rt}})
	if err != nil {
		f.Fatal(err)
	}
	return srv.Handler()
}

// serve runs one request and fails on a reply that is a 500 or not JSON.
func serve(t *testing.T, h http.Handler, path string, header map[string]string, body []byte) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	for k, v := range header {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code == http.StatusInternalServerError {
		t.Fatalf("POST %s %q: %d %s", path, body, rec.Code, rec.Body)
	}
	if !json.Valid(rec.Body.Bytes()) {
		t.Fatalf("POST %s %q: reply is not JSON: %q", path, body, rec.Body)
	}
	return rec
}

func FuzzOpenAndCloseSession(f *testing.F) {
	h := fuzzAgent(f, unreachable, false)
	for _, s := range []string{``, `{}`, `{"session_id":"s","resources_session_id":"rs"}`, `{"session_id":"s","resources_session_id":"rs","request":{"x":[1]}}`,
		`{"session_id":1}`, `[]`, `{"session_id":"s","resources_session_id":"r s"}`, `null`, `{"session_id":"` + strings.Repeat("a", 200) + `"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := serve(t, h, "/ng-rollout/r/v1/agent_sessions", nil, body)
		if rec.Code == 200 {
			var open agent.OpenReply
			if err := json.Unmarshal(rec.Body.Bytes(), &open); err != nil || open.EpisodeID.RolloutID != "r" {
				t.Fatalf("open reply %s: %v", rec.Body, err)
			}
		}
		serve(t, h, "/v1/agent_sessions/close", nil, body)
	})
}

func FuzzActivationRequest(f *testing.F) {
	h := fuzzAgent(f, unreachable, false)
	for _, s := range []struct{ activation, body string }{
		{"1", weatherParams}, {"0", `{}`}, {"x", `{"input":[{"type":"function_call_output","call_id":"c","output":[]}]}`},
		{"2", `{"input":[{"content":"no role"}]}`}, {"1", `{"input":"x","bogus":1}`}, {"-5", ``}, {"1", `{"input":{"a":1}}`},
	} {
		f.Add(s.activation, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, activation string, body []byte) {
		// No session is open, so a body that decodes gets unknown_session:
		// the decoder runs without any upstream call.
		serve(t, h, "/ng-rollout/r/v1/responses", map[string]string{agent.SessionHeader: "s", agent.ActivationHeader: activation}, body)
	})
}

func FuzzRunRow(f *testing.F) {
	h := fuzzAgent(f, unreachable, false)
	for _, s := range []string{``, `{}`, `{"_ng_rollout_id":"r","responses_create_params":{"input":"x"}}`,
		`{"_ng_task_index":1,"_ng_rollout_index":2,"_ng_attempt_index":3,"responses_create_params":{"input":[]}}`,
		`{"_ng_task_index":1.5,"_ng_rollout_index":2}`, `{"_ng_rollout_id":7}`, `{"_ng_rollout_id":"r-a1"}`, `[{}]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		serve(t, h, "/run", nil, body)
	})
}

func FuzzModelReply(f *testing.F) {
	for _, s := range []string{
		resp("resp_1", usage(1, 1, "0"), msg("hi")),
		resp("resp_1", usage(1, 1, "null"), fc("a", "get_weather", `{"city":"x"}`)),
		resp("resp_1", `null`, fc("a", "../../x", `nope`)),
		`{"output":null}`, `{"output":[{"type":"function_call","name":"","arguments":""}]}`, `{}`, `[]`, `"x"`, ``,
		`{"output":[],"incomplete_details":{"reason":"max_output_tokens"}}`,
	} {
		f.Add([]byte(s))
	}
	reply := &modelReply{}
	h := fuzzAgent(f, scripted(reply, "application/json"), false)
	f.Fuzz(func(t *testing.T, body []byte) {
		reply.set(body)
		serve(t, h, "/ng-rollout/r/v1/responses", nil, []byte(`{"input":"x"}`))
	})
}

func FuzzResponseStream(f *testing.F) {
	done := func(r string) string {
		return "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":1,\"response\":" + r + "}\n\n"
	}
	for _, s := range []string{
		done(resp("resp_1", usage(1, 1, "0"), msg("hi"))),
		"event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"output_index\":3,\"item\":" + msg("x") + "}\n\n" + done(`{"output":[]}`),
		"data: {\"type\":\"error\",\"code\":\"x\",\"message\":\"boom\"}\n\n",
		"data: {\"type\":\"response.failed\",\"response\":{\"error\":{\"message\":\"no\"}}}\n\n",
		"data: [DONE]\n\n", ": comment\n\n", "data: {\n\n", "event: response.completed\ndata: {}\n\n", "",
	} {
		f.Add([]byte(s))
	}
	reply := &modelReply{}
	h := fuzzAgent(f, scripted(reply, "text/event-stream"), true)
	f.Fuzz(func(t *testing.T, body []byte) {
		reply.set(body)
		serve(t, h, "/ng-rollout/r/v1/responses", nil, []byte(`{"input":"x"}`))
	})
}
