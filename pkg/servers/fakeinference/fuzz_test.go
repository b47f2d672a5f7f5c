package fakeinference_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
)

// newInProcess is a server driven through its Handler, for fuzzing: no
// listener, instant generation.
func newInProcess(t testing.TB) *fakeinference.Server {
	cfg := fakeinference.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.TokensPerSecond, cfg.MinCallSeconds = 0, 0
	cfg.MaxContextTokens = 4096
	cfg.ControlAuthToken = testToken
	srv, err := fakeinference.New(cfg, fakeinference.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

func serve(srv *fakeinference.Server, path string, body []byte, header map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	for k, v := range header {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, req)
	return rec
}

func FuzzChatRequest(f *testing.F) {
	for _, seed := range []string{
		`{"model":"fake-model","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":-5,"max_completion_tokens":"x"}`,
		`{"messages":[{"role":"user","content":"hi"}],"stream":true,"metadata":{"fake_script":"{\"stream_error\":{\"after_tokens\":2,\"code\":503}}"}}`,
		`{"messages":[{"role":"user","content":"hi"}],"metadata":{"fake_script":"{\"stream_error\":{\"after_tokens\":2,\"code\":503}}"}}`,
		`{"messages":[{"role":"user","content":"hi"}],"stream":true,"metadata":{"fake_script":"{\"truncate_stream\":{\"after_tokens\":1},\"routed_experts\":{\"layers\":2,\"topk\":2,\"experts\":8}}"}}`,
		`{"messages":[{"role":"user","content":"Call get_weather with {\"city\": \"Paris\"}."}],"tools":[{"type":"function","function":{"name":"get_weather"}}],"logprobs":true,"top_logprobs":3,"return_token_ids":true,"return_tokens_as_token_ids":true}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"ok"}],"tools":[{"type":"function","function":{"name":"f"}}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"role":"user","content":"x"}],"max_tokens":2,"n":1,"metadata":{"fake_script":"{\"tool_rounds\":2,\"final_text\":\"y\"}"}}`,
		`{"messages":[{"role":"user","content":"{{{{{{"}],"tools":[{"type":"function","function":{"name":"{"}}],"max_tokens":5000}`,
		`{"messages":[]}`, `{"messages":null}`, `[]`, `null`, `"x"`, `{`, ``, "\xff",
		`{"messages":[{"role":"user","content":"a"}],"n":2}`,
		`{"messages":[{"role":"user","content":"a"}],"top_logprobs":-1,"logprobs":true}`,
	} {
		f.Add([]byte(seed))
	}
	srv := newInProcess(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := serve(srv, "/v1/chat/completions", body, nil)
		switch {
		case rec.Code == http.StatusOK:
			out := rec.Body.Bytes()
			if strings.HasPrefix(rec.Header().Get("Content-Type"), "text/event-stream") {
				if !bytes.HasSuffix(out, []byte("data: [DONE]\n\n")) {
					t.Fatalf("stream does not end with [DONE]: %q", out)
				}
			} else if !json.Valid(out) {
				t.Fatalf("reply is not JSON: %q", out)
			}
		case rec.Code >= 400 && (rec.Code < 500 || scriptedFailure(body)):
			// A script may ask for any error status; nothing else answers 5xx.
			if !isVLLMError(rec.Code, rec.Body.Bytes()) {
				t.Fatalf("%d reply is not vLLM's error shape: %s", rec.Code, rec.Body)
			}
		default:
			t.Fatalf("status %d for %q: %s", rec.Code, body, rec.Body)
		}
		if _, err := fakeinference.ParseChatRequest(body); err != nil {
			var re *fakeinference.RequestError
			if !errors.As(err, &re) || re.Status < 400 || re.Status >= 500 {
				t.Fatalf("ParseChatRequest error %v is not a 4xx RequestError", err)
			}
		}
	})
}

// scriptedFailure reports a chat body whose script asks for an error.
func scriptedFailure(body []byte) bool {
	in, err := fakeinference.ParseChatRequest(body)
	return err == nil && in.Script != nil && in.Script.StreamError != nil
}

// isVLLMError reports a body in vLLM's error shape for status: exactly
// {"error": {"message", "type", "param", "code"}} with code the status.
func isVLLMError(status int, body []byte) bool {
	var outer map[string]json.RawMessage
	if json.Unmarshal(body, &outer) != nil || len(outer) != 1 || outer["error"] == nil {
		return false
	}
	var inner map[string]json.RawMessage
	if json.Unmarshal(outer["error"], &inner) != nil || len(inner) != 4 {
		return false
	}
	var e fakeinference.ErrorResponse
	if json.Unmarshal(body, &e) != nil || e.Error.Message == "" || e.Error.Type == "" || e.Error.Code != status {
		return false
	}
	_, hasParam := inner["param"]
	return hasParam
}

func FuzzCutRequest(f *testing.F) {
	for _, seed := range []string{
		`{"checkpoint_id":"c1","server_name":"policy_model","active":[{"model_call_id":"m1","capture_key":"r1"}]}`,
		`{"checkpoint_id":"c1","server_name":"p","active":[]}`,
		`{"checkpoint_id":"c1","server_name":"p","active":[{"model_call_id":"m1","capture_key":"r1-a2"},{"model_call_id":"m2","capture_key":"r1"}]}`,
		`{"checkpoint_id":"c1","server_name":"p","active":null}`,
		`{"checkpoint_id":"","server_name":"p"}`,
		`{"checkpoint_id":"c1","server_name":"p","active":[{"model_call_id":"m1","capture_key":"r1"}],"x":1}`,
		`{"checkpoint_id":1}`, `[]`, `null`, `{`, ``,
	} {
		f.Add([]byte(seed))
	}
	srv := newInProcess(f)
	auth := map[string]string{"Authorization": "Bearer " + testToken}
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := serve(srv, "/ng-control/v1/generation-cut", body, auth)
		switch {
		case rec.Code == http.StatusOK:
			var rep fakeinference.CutReceipt
			if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil {
				t.Fatalf("receipt: %v", err)
			}
			req, err := fakeinference.ParseCutRequest(body)
			if err != nil || len(rep.Prefixes) != len(req.Active) {
				t.Fatalf("a 200 for a body the parser refuses (%v) or a receipt of %d for %d calls", err, len(rep.Prefixes), len(req.Active))
			}
		case rec.Code >= 400 && rec.Code < 500:
			if e := apierror.Parse(rec.Code, rec.Body.Bytes()); e == nil || e.Code != apierror.InvalidRequest {
				t.Fatalf("%d reply is not an invalid_request envelope: %s", rec.Code, rec.Body)
			}
		default:
			t.Fatalf("status %d for %q: %s", rec.Code, body, rec.Body)
		}
	})
}

func FuzzParseScript(f *testing.F) {
	for _, seed := range []string{`{}`, `{"tool_rounds":1}`, `{"stream_error":{"after_tokens":3,"message":"m","type":"T","param":"p","code":502}}`,
		`{"truncate_stream":{"after_tokens":0}}`, `{"routed_experts":"nrlre1:int16:3x1x2:AAAB","routed_experts_in":"both"}`, `{"routed_experts":[[[0,1]],[[2,3]]]}`, `{"routed_experts":{"layers":1,"topk":2,"experts":4}}`, `{"tool_calls":[{"name":"a","arguments":"{\"b\":1}"}],"final_text":"x"}`, `{"tool_calls":[{"name":"a","arguments":{"b":[1]}}]}`, `x`} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		s, err := fakeinference.ParseScript(text)
		if err != nil {
			return
		}
		for _, tc := range s.ToolCalls {
			if !json.Valid(tc.Arguments) || !bytes.HasPrefix(tc.Arguments, []byte("{")) {
				t.Fatalf("normalised arguments %q are not an object", tc.Arguments)
			}
		}
		// A normalised script round-trips to itself.
		b, _ := json.Marshal(s)
		again, err := fakeinference.ParseScript(string(b))
		if err != nil {
			t.Fatalf("re-parsing %s: %v", b, err)
		}
		b2, _ := json.Marshal(again)
		if !bytes.Equal(b, b2) {
			t.Fatalf("script %s re-parses as %s", b, b2)
		}
	})
}
