package modelproxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
	"github.com/gymfleet/gymfleet/pkg/transport/sse"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

// FuzzDecodeResponsesRequest: the strict Responses decoder and the
// conversion never panic; refusals are invalid_request errors.
func FuzzDecodeResponsesRequest(f *testing.F) {
	for _, s := range []string{
		responsesBody,
		`{"input":"hi","stream":true}`,
		`{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"}]}`,
		`{"input":"hi","unknown":1}`,
		`{"input":null}`, `null`, `[]`, `{"input":[{"role":"user","content":[{"type":"input_image","image_url":"u"}]}]}`,
		`{"input":"x","reasoning":{"effort":"high"},"tool_choice":{"type":"function","name":"f"},"tools":[{"type":"function","name":"f"}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := modelproxy.DecodeResponsesRequest(body)
		if err != nil {
			if !apierror.HasCode(err, apierror.InvalidRequest) {
				t.Fatalf("refusal %v is not invalid_request", err)
			}
			return
		}
		chat, err := openai.ResponsesToChat(req, "m")
		if err != nil {
			return
		}
		if _, err := codec.Marshal(chat); err != nil {
			t.Fatalf("converted request does not encode: %v", err)
		}
	})
}

// FuzzDecodeChatRequest: the pass-through decoder never panics, and what it
// accepts re-encodes as valid JSON with the same fields.
func FuzzDecodeChatRequest(f *testing.F) {
	for _, s := range []string{
		chatBody,
		`{"messages":[],"stream":true,"n":1}`,
		`{"messages":[{"role":"user","content":"\u00e9\"\\"}],"x":{"y":[1e400]}}`,
		`{"messages":{}}`, `{"messages":[],"stream":"no"}`, `{"a":1,"a":2,"messages":[]}`, `{}`, `"x"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fields, err := modelproxy.DecodeChatRequest(body)
		if err != nil {
			if !apierror.HasCode(err, apierror.InvalidRequest) {
				t.Fatalf("refusal %v is not invalid_request", err)
			}
			return
		}
		out, err := modelproxy.EncodeObject(fields)
		if err != nil {
			t.Fatalf("EncodeObject: %v", err)
		}
		if !json.Valid(out) {
			t.Fatalf("forwarded body is not valid JSON: %s", out)
		}
		var back map[string]json.RawMessage
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatal(err)
		}
		if len(back) != len(fields) {
			t.Fatalf("forwarded %d fields, decoded %d", len(back), len(fields))
		}
	})
}

// FuzzThinkFilter: splitting streamed content into any pieces gives the
// same visible text and blocks as openai.SplitThink on the whole.
func FuzzThinkFilter(f *testing.F) {
	f.Add("a<think>b</think>c", []byte{1, 3, 9})
	f.Add("<thi<think>x</thi</think>nk>", []byte{2, 2, 2, 2})
	f.Add("<think>unclosed", []byte{0, 4})
	f.Add("</think><think></think><think>", []byte{7})
	f.Fuzz(func(t *testing.T, content string, cuts []byte) {
		var pieces []string
		rest := content
		for _, c := range cuts {
			n := int(c) % (len(rest) + 1)
			pieces = append(pieces, rest[:n])
			rest = rest[n:]
		}
		pieces = append(pieces, rest)
		gotVisible, gotBlocks := modelproxy.SplitThinkStream(pieces)
		wantBlocks, wantVisible := openai.SplitThink(content)
		if gotVisible != wantVisible || !slices.Equal(gotBlocks, wantBlocks) {
			t.Fatalf("pieces %q: streamed %q %q, whole %q %q", pieces, gotVisible, gotBlocks, wantVisible, wantBlocks)
		}
	})
}

// fuzzUpstream serves whatever SSE body the current fuzz input is.
type fuzzUpstream struct {
	mu   sync.Mutex
	body []byte
}

func (u *fuzzUpstream) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	u.mu.Lock()
	b := u.body
	u.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = w.Write(b)
}

// FuzzUpstreamSSE feeds arbitrary upstream SSE bytes through both streaming
// routes: no panic; a 200 stream is well-formed (every Responses event is
// JSON with its type, ending in response.completed or response.failed).
func FuzzUpstreamSSE(f *testing.F) {
	for _, s := range []string{
		"data: " + chunk(`{"content":"hi"}`, "") + "\n\ndata: " + chunk(`{}`, "") + "\n\ndata: [DONE]\n\n",
		"data: " + chunk(`{"tool_calls":[{"index":3,"id":"x","function":{"name":"f","arguments":"{"}}]}`, `,"token_ids":[1]`) + "\n\n",
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"<think>a\"},\"finish_reason\":\"stop\"}]}\n\n",
		"data: not json\n\n", ": comment\n\nevent: x\ndata: [DONE]\n\n", "", "data: {}\n\ndata: [DONE]\n\n",
		"data: {\"prompt_token_ids\":[1],\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"function\":{\"arguments\":\"a\"}}]},\"finish_reason\":\"tool_calls\",\"logprobs\":{\"content\":[{\"token\":\"token_id:5\",\"logprob\":-1}]}}]}\n\ndata: [DONE]\n\n",
	} {
		f.Add([]byte(s))
	}
	up := &fuzzUpstream{}
	upSrv := httptest.NewServer(up)
	defer upSrv.Close()
	cfg := modelproxy.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Upstream.BaseURL = upSrv.URL + "/v1"
	cfg.Upstream.H2C = false
	cfg.Capture.Dir = f.TempDir()
	srv, err := modelproxy.New(cfg, modelproxy.Deps{})
	if err != nil {
		f.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	}()
	f.Fuzz(func(t *testing.T, body []byte) {
		up.mu.Lock()
		up.body = body
		up.mu.Unlock()
		for _, route := range []struct{ path, body string }{
			{"/ng-rollout/fz/v1/chat/completions", `{"messages":[{"role":"user","content":"q"}],"stream":true}`},
			{"/ng-rollout/fz/v1/responses", `{"input":"q","stream":true}`},
		} {
			rec := httptest.NewRecorder()
			srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, route.path, strings.NewReader(route.body)))
			switch rec.Code {
			case http.StatusOK:
			case http.StatusBadGateway:
				continue
			default:
				t.Fatalf("%s answered %d: %s", route.path, rec.Code, rec.Body)
			}
			if strings.Contains(route.path, "responses") {
				checkResponsesEvents(t, rec.Body.Bytes())
			}
		}
	})
}

func checkResponsesEvents(t *testing.T, body []byte) {
	t.Helper()
	rd := sse.NewReader(bytes.NewReader(body))
	var last string
	for {
		ev, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(ev.Data, &v); err != nil || v.Type != ev.Name {
			t.Fatalf("event %q: %s (%v)", ev.Name, ev.Data, err)
		}
		last = v.Type
	}
	if last != openai.EventResponseCompleted && last != openai.EventResponseFailed {
		t.Fatalf("stream ends with %q: %s", last, body)
	}
}

// TestExtractTokens covers the token sources beyond what the HTTP tests hit.
func TestExtractTokens(t *testing.T) {
	tests := []struct {
		name, completion string
		want             openai.TokenFields
		wantErr          string
	}{
		{
			name:       "bundle on the message wins",
			completion: `{"choices":[{"message":{"role":"assistant","prompt_token_ids":[1],"generation_token_ids":[2],"generation_log_probs":[-1]},"logprobs":{"content":[{"token":"token_id:5","logprob":-3}]}}]}`,
			want:       openai.TokenFields{PromptTokenIDs: []int{1}, GenerationTokenIDs: []int{2}, GenerationLogProbs: []float64{-1}},
		},
		{
			name:       "bundle agreeing with the inline ids",
			completion: `{"prompt_token_ids":[1],"choices":[{"message":{"role":"assistant","prompt_token_ids":[1],"generation_token_ids":[2],"generation_log_probs":[-1]},"token_ids":[2]}]}`,
			want:       openai.TokenFields{PromptTokenIDs: []int{1}, GenerationTokenIDs: []int{2}, GenerationLogProbs: []float64{-1}},
		},
		{
			name:       "bundle disagreeing with the inline ids",
			completion: `{"prompt_token_ids":[9],"choices":[{"message":{"role":"assistant","prompt_token_ids":[1],"generation_token_ids":[2],"generation_log_probs":[-1]},"token_ids":[2]}]}`,
			wantErr:    "disagree",
		},
		// nemo-gym 0.7.0's _extract_vllm_response_token_ids: a partially
		// present source is invalid, never a /tokenize.
		{
			name:       "prompt ids without token_ids",
			completion: `{"prompt_token_ids":[1,2],"choices":[{"message":{"role":"assistant"},"logprobs":{"content":[{"token":"token_id:7","logprob":-0.5},{"token":"token_id:8","logprob":-1.5}]}}]}`,
			wantErr:    "partial token ids: no choices[0].token_ids",
		},
		{
			name:       "token_ids without prompt ids",
			completion: `{"choices":[{"message":{"role":"assistant"},"token_ids":[7],"logprobs":{"content":[{"token":"token_id:7","logprob":-0.5}]}}]}`,
			wantErr:    "partial token ids: no prompt_token_ids",
		},
		{
			name:       "no inline ids: the generation from the logprob tokens, the prompt from /tokenize",
			completion: `{"prompt_token_ids":null,"choices":[{"message":{"role":"assistant"},"token_ids":null,"logprobs":{"content":[{"token":"token_id:7","logprob":-0.5},{"token":"token_id:8","logprob":-1.5}]}}]}`,
			want:       openai.TokenFields{GenerationTokenIDs: []int{7, 8}, GenerationLogProbs: []float64{-0.5, -1.5}},
			wantErr:    "no prompt_token_ids",
		},
		{
			name:       "an empty generation",
			completion: `{"prompt_token_ids":[1],"choices":[{"message":{"role":"assistant"},"token_ids":[],"logprobs":{"content":[]}}]}`,
			want:       openai.TokenFields{PromptTokenIDs: []int{1}, GenerationTokenIDs: []int{}, GenerationLogProbs: []float64{}},
		},
		{name: "partial bundle", completion: `{"choices":[{"message":{"role":"assistant","prompt_token_ids":[1]}}]}`, wantErr: "all-or-nothing"},
		{name: "text tokens and no ids", completion: `{"choices":[{"message":{"role":"assistant"},"logprobs":{"content":[{"token":"Hello","logprob":-1}]}}]}`, wantErr: `"Hello"`},
		{name: "length mismatch", completion: `{"prompt_token_ids":[1],"choices":[{"message":{"role":"assistant"},"token_ids":[1,2],"logprobs":{"content":[{"token":"token_id:1","logprob":-1}]}}]}`, wantErr: "2 token_ids but 1 logprobs"},
		{name: "no choices", completion: `{"choices":[]}`, wantErr: "no choices"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c openai.ChatCompletion
			if err := json.Unmarshal([]byte(tt.completion), &c); err != nil {
				t.Fatal(err)
			}
			got, err := modelproxy.ExtractTokens(&c)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				if tt.want.HasTokens() && !reflect.DeepEqual(got, tt.want) {
					t.Fatalf("got %+v, want %+v", got, tt.want)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}
