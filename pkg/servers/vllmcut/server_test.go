package vllmcut_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/servers/vllmcut"
)

// stubVLLM answers the routes the sidecar uses as vLLM 0.32.0 answers them
// (tests/interop/vllm runs the sidecar against the real one): a chat call
// generates until aborted through /inference/v1/abort_requests by its
// "chatcmpl-<X-Request-Id>" id and then answers its tokens so far with
// finish_reason abort; /tokenize renders a fixed prompt; /v1/completions
// continues a token-id prompt.
type stubVLLM struct {
	mu          sync.Mutex
	aborts      map[string]chan struct{}
	completions []map[string]any
}

var stubPrompt = []int{0, 3, 9, 4}

func (v *stubVLLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req map[string]any
	_ = json.Unmarshal(body, &req)
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/v1/chat/completions":
		id := "chatcmpl-" + r.Header.Get("X-Request-Id")
		ch := make(chan struct{})
		v.mu.Lock()
		v.aborts[id] = ch
		v.mu.Unlock()
		tokens, finish := []int{7, 8, 9, 10}, "length"
		select {
		case <-ch:
			tokens, finish = tokens[:3], "abort"
		case <-time.After(5 * time.Second):
		}
		lp := []any{}
		for _, t := range tokens {
			lp = append(lp, map[string]any{"token": string(rune('a' + t)), "logprob": -0.5, "bytes": []int{'a' + t}, "top_logprobs": []any{}})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": id, "object": "chat.completion", "model": "tiny", "prompt_token_ids": stubPrompt,
			"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": "abc"[:len(tokens)]},
				"finish_reason": finish, "token_ids": tokens, "logprobs": map[string]any{"content": lp}}},
			"usage": map[string]any{"prompt_tokens": len(stubPrompt), "completion_tokens": len(tokens), "total_tokens": len(stubPrompt) + len(tokens)},
		})
	case "/inference/v1/abort_requests":
		ids, _ := req["request_ids"].([]any)
		v.mu.Lock()
		for _, id := range ids {
			if ch, ok := v.aborts[id.(string)]; ok {
				close(ch)
				delete(v.aborts, id.(string))
			}
		}
		v.mu.Unlock()
	case "/tokenize":
		tokens := stubPrompt
		if msgs, _ := req["messages"].([]any); hasAssistant(msgs) {
			tokens = stubRender(msgs, req["add_generation_prompt"] != false)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"count": len(tokens), "max_model_len": 1024, "tokens": tokens, "token_strs": nil})
	case "/v1/completions":
		v.mu.Lock()
		v.completions = append(v.completions, req)
		v.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": "cmpl-" + r.Header.Get("X-Request-Id"), "created": 5,
			"choices": []any{map[string]any{"text": "d", "token_ids": []int{11}, "finish_reason": "length", "stop_reason": nil,
				"logprobs": map[string]any{"tokens": []string{"d"}, "token_logprobs": []float64{-0.25}, "top_logprobs": []any{map[string]float64{"d": -0.25}}}}},
		})
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

func hasAssistant(msgs []any) bool {
	for _, m := range msgs {
		if m.(map[string]any)["role"] == "assistant" {
			return true
		}
	}
	return false
}

// stubRender is the stub's chat template for a history: each message is
// 1, 100 + the length of its content, 2 (the terminator); the generation
// prompt is 1.
func stubRender(msgs []any, generationPrompt bool) []int {
	var out []int
	for _, m := range msgs {
		content, _ := m.(map[string]any)["content"].(string)
		out = append(out, 1, 100+len(content), 2)
	}
	if generationPrompt {
		out = append(out, 1)
	}
	return out
}

func startSidecar(t *testing.T) (string, *stubVLLM) {
	t.Helper()
	stub := &stubVLLM{aborts: map[string]chan struct{}{}}
	up := httptest.NewServer(stub)
	t.Cleanup(up.Close)
	cfg := vllmcut.DefaultConfig()
	cfg.Listen, cfg.VLLMURL, cfg.ControlAuthToken = "127.0.0.1:0", up.URL, "tok"
	s, err := vllmcut.New(cfg, vllmcut.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
		<-done
	})
	return s.URL(), stub
}

func post(t *testing.T, url string, h http.Header, body string) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, vs := range h {
		req.Header[k] = vs
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

const chatReq = `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"return_token_ids":true,"logprobs":true,"top_logprobs":1}`

// A cut aborts the named call, stages its tokens and marks its reply; the
// continuation sends prompt + prefix as a token-id prompt and answers the
// whole generation.
func TestCutAndContinue(t *testing.T) {
	url, stub := startSidecar(t)
	type reply struct {
		status int
		header http.Header
		body   []byte
	}
	got := make(chan reply, 1)
	go func() {
		st, h, b := post(t, url+"/v1/chat/completions", http.Header{"X-Ng-Model-Call-Id": {"call-1"}, "X-Ng-Capture-Key": {"r-1"}}, chatReq)
		got <- reply{st, h, b}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		stub.mu.Lock()
		n := len(stub.aborts)
		stub.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the call never reached vLLM")
		}
		<-time.After(5 * time.Millisecond)
	}
	auth := http.Header{"Authorization": {"Bearer tok"}}
	if st, _, _ := post(t, url+gencut.Path, nil, `{"checkpoint_id":"c1","server_name":"m","active":[]}`); st != http.StatusUnauthorized {
		t.Fatalf("a cut without the bearer: %d, want 401", st)
	}
	st, _, b := post(t, url+gencut.Path, auth, `{"checkpoint_id":"c1","server_name":"m","active":[{"model_call_id":"call-1","capture_key":"r-1"},{"model_call_id":"call-2","capture_key":"r-1"}]}`)
	if st != http.StatusOK {
		t.Fatalf("cut: %d %s", st, b)
	}
	rc, err := gencut.DecodeLegacyReceipt(b, 2)
	if err != nil {
		t.Fatal(err)
	}
	key := gencut.StagingKey("r-1", "call-1")
	if p := rc.Prefixes[0]; p.Disposition != gencut.DispositionDurablePrefix || p.StagingKey != key || p.PrefixTokenCount != 3 ||
		p.PrefixDigest != gencut.PrefixDigest([]int{7, 8, 9}) {
		t.Fatalf("the cut call's receipt entry: %+v", p)
	}
	if p := rc.Prefixes[1]; p.Disposition != gencut.DispositionDurableFailure || p.Reason != vllmcut.ReasonUnknownCall {
		t.Fatalf("an unknown call's receipt entry: %+v", p)
	}
	r := <-got
	if r.status != http.StatusOK || r.header.Get(gencut.HeaderGenerationCut) != key || !bytes.Contains(r.body, []byte(`"finish_reason":"abort"`)) {
		t.Fatalf("the cut call's reply: %d %v %s", r.status, r.header, r.body)
	}

	st, _, b = post(t, url+"/v1/chat/completions", http.Header{gencut.HeaderContinueCut: {key}, "X-Ng-Model-Call-Id": {"call-3"}, "X-Ng-Capture-Key": {"r-1-a1"}}, chatReq)
	if st != http.StatusOK {
		t.Fatalf("continuation: %d %s", st, b)
	}
	var c struct {
		PromptTokenIDs []int `json:"prompt_token_ids"`
		Choices        []struct {
			FinishReason string `json:"finish_reason"`
			TokenIDs     []int  `json:"token_ids"`
			Message      struct {
				Content string `json:"content"`
			} `json:"message"`
			Logprobs struct {
				Content []map[string]any `json:"content"`
			} `json:"logprobs"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &c); err != nil || len(c.Choices) != 1 {
		t.Fatalf("continuation reply: %v %s", err, b)
	}
	ch := c.Choices[0]
	if want := []int{7, 8, 9, 11}; !equal(ch.TokenIDs, want) || ch.Message.Content != "abcd" || ch.FinishReason != "length" ||
		len(ch.Logprobs.Content) != 4 || c.Usage.CompletionTokens != 4 || !equal(c.PromptTokenIDs, stubPrompt) {
		t.Fatalf("the continued reply is not prefix + continuation: %s", b)
	}
	stub.mu.Lock()
	defer stub.mu.Unlock()
	if len(stub.completions) != 1 {
		t.Fatalf("%d completions, want 1", len(stub.completions))
	}
	sent := stub.completions[0]
	prompt, _ := json.Marshal(sent["prompt"])
	if string(prompt) != "[0,3,9,4,7,8,9]" || sent["max_tokens"] != 1.0 || sent["logprobs"] != 1.0 {
		t.Fatalf("the continuation asked vLLM for %v, want the prompt + prefix ids, max_tokens 1, logprobs 1", sent)
	}
}

// A continuation of a prefix that is not staged, or staged for another
// prompt, is refused as vLLM refuses a bad request.
func TestContinueRefused(t *testing.T) {
	url, _ := startSidecar(t)
	st, _, b := post(t, url+"/v1/chat/completions", http.Header{gencut.HeaderContinueCut: {"__generation_cut__/r/x"}}, chatReq)
	if st != http.StatusBadRequest || !bytes.Contains(b, []byte(`"type":"BadRequestError"`)) || !bytes.Contains(b, []byte("is not staged")) {
		t.Fatalf("%d %s", st, b)
	}
}

func TestConfigValidate(t *testing.T) {
	cfg := vllmcut.DefaultConfig()
	cfg.VLLMURL = "http://127.0.0.1:8000/v1"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "without /v1") {
		t.Fatalf("a /v1 URL: %v", err)
	}
	cfg.VLLMURL, cfg.MaxStaged = "http://127.0.0.1:8000", 0
	if err := cfg.Validate(); err == nil {
		t.Fatal("max_staged 0 accepted")
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A /tokenize of a history carrying its last turn's token ids is spliced as
// the chat call is (NeMo RL's worker renders both through one renderer):
// the model's tokens up to their terminator, then the template from the
// matching terminator on. Anything else is vLLM's own answer.
func TestTokenizeSplicesHistory(t *testing.T) {
	url, _ := startSidecar(t)
	// Turn 1's prompt (the stub's rendering of the user message) and the
	// model's own generation, which the template would spell otherwise.
	history := `[{"role":"user","content":"hi"},{"role":"assistant","content":"ab","prompt_token_ids":[1,102,2,1],"generation_token_ids":[50,51,2]},{"role":"user","content":"again"}]`
	status, _, b := post(t, url+"/tokenize", nil, `{"model":"tiny","messages":`+history+`}`)
	var got struct {
		Count  int   `json:"count"`
		Tokens []int `json:"tokens"`
	}
	if err := json.Unmarshal(b, &got); status != http.StatusOK || err != nil {
		t.Fatalf("/tokenize = %d %s", status, b)
	}
	want := []int{1, 102, 2, 1, 50, 51, 2, 1, 105, 2, 1}
	if !equal(got.Tokens, want) || got.Count != len(want) {
		t.Fatalf("/tokenize = %s, want tokens %v", b, want)
	}

	// No ids on the history: vLLM's rendering as it is.
	status, _, b = post(t, url+"/tokenize", nil, `{"model":"tiny","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"ab"},{"role":"user","content":"again"}]}`)
	if err := json.Unmarshal(b, &got); status != http.StatusOK || err != nil || !equal(got.Tokens, stubRender([]any{
		map[string]any{"content": "hi"}, map[string]any{"content": "ab"}, map[string]any{"content": "again"}}, true)) {
		t.Fatalf("/tokenize without ids = %d %s", status, b)
	}
	status, _, b = post(t, url+"/tokenize", nil, `{"model":"tiny","prompt":"hi"}`)
	if err := json.Unmarshal(b, &got); status != http.StatusOK || err != nil || !equal(got.Tokens, stubPrompt) {
		t.Fatalf("/tokenize of a prompt = %d %s", status, b)
	}

	status, _, b = post(t, url+"/tokenize", nil, `{"model":"tiny","return_token_strs":true,"messages":`+history+`}`)
	if status != http.StatusBadRequest || !strings.Contains(string(b), "return_token_strs") {
		t.Fatalf("return_token_strs of a spliced history = %d %s", status, b)
	}
}
