package fakeinference_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const testToken = "secret-token"

// fixture is one server on 127.0.0.1:0 with a client and a Control.
type fixture struct {
	t   *testing.T
	srv *fakeinference.Server
	url string
	hc  *http.Client
	ctl *fakeinference.Control
}

// start serves a server whose generations are instant unless mutate slows
// them down.
func start(t *testing.T, mutate func(*fakeinference.Config)) *fixture {
	t.Helper()
	cfg := fakeinference.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.TokensPerSecond = 0
	cfg.MinCallSeconds = 0
	cfg.ControlAuthToken = testToken
	if mutate != nil {
		mutate(&cfg)
	}
	srv, err := fakeinference.New(cfg, fakeinference.Deps{})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatalf("Listen: %v", err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	hc := httpclient.New(httpclient.Options{})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		hc.CloseIdleConnections()
	})
	return &fixture{t: t, srv: srv, url: srv.URL(), hc: hc, ctl: fakeinference.NewControl(srv.URL(), hc)}
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (f *fixture) post(ctx context.Context, path string, body any, header map[string]string) reply {
	f.t.Helper()
	var b []byte
	switch v := body.(type) {
	case string:
		b = []byte(v)
	case []byte:
		b = v
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			f.t.Fatalf("marshal: %v", err)
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.url+path, bytes.NewReader(b))
	if err != nil {
		f.t.Fatalf("request: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := f.hc.Do(req)
	if err != nil {
		return reply{status: -1, body: []byte(err.Error())}
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{status: -1, body: []byte(err.Error())}
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: rb}
}

func (f *fixture) get(path string) reply {
	f.t.Helper()
	resp, err := f.hc.Get(f.url + path)
	if err != nil {
		f.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

func (f *fixture) chat(body any, header map[string]string) reply {
	f.t.Helper()
	return f.post(context.Background(), "/v1/chat/completions", body, header)
}

// chatAsync sends a chat call in the background; the reply arrives on the
// returned channel. The test waits for every channel it opens.
func (f *fixture) chatAsync(ctx context.Context, body any, header map[string]string) <-chan reply {
	out := make(chan reply, 1)
	go func() { out <- f.post(ctx, "/v1/chat/completions", body, header) }()
	return out
}

func (f *fixture) count() fakeinference.CallCount {
	f.t.Helper()
	c, err := f.ctl.CallCount(context.Background())
	if err != nil {
		f.t.Fatalf("call_count: %v", err)
	}
	return c
}

func (f *fixture) calls() []fakeinference.CallInfo {
	f.t.Helper()
	c, err := f.ctl.Calls(context.Background())
	if err != nil {
		f.t.Fatalf("calls: %v", err)
	}
	return c
}

// waitFor polls cond every few milliseconds until it holds or 10 s pass.
func (f *fixture) waitFor(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

func (f *fixture) waitCount(what string, cond func(fakeinference.CallCount) bool) fakeinference.CallCount {
	f.t.Helper()
	var c fakeinference.CallCount
	f.waitFor(what, func() bool { c = f.count(); return cond(c) })
	return c
}

func recv(t *testing.T, ch <-chan reply) reply {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for a reply")
		return reply{}
	}
}

// Requests the repository's datasets will send.
const (
	weatherText = `What is the weather in Paris? Call get_weather with {"city": "Paris"}.`
	counterText = `The counter starts at 3. Call increment with {"by": 1}, then increment with {"by": 2}, so that it ends at 6.`
)

func tool(name string) map[string]any {
	return map[string]any{"type": "function", "function": map[string]any{
		"name": name, "parameters": map[string]any{"type": "object", "properties": map[string]any{}},
	}}
}

func userMsg(text string) map[string]any { return map[string]any{"role": "user", "content": text} }

func weatherRequest() map[string]any {
	return map[string]any{
		"model":    "fake-model",
		"messages": []any{userMsg(weatherText)},
		"tools":    []any{tool("get_weather")},
	}
}

func with(m map[string]any, kv ...any) map[string]any {
	out := make(map[string]any, len(m)+len(kv)/2)
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

var (
	idField      = regexp.MustCompile(`"id":"chatcmpl-[0-9]+"`)
	createdField = regexp.MustCompile(`"created":[0-9]+`)
)

// normalize blanks the fields that may differ between identical requests.
func normalize(b []byte) []byte {
	b = idField.ReplaceAll(b, []byte(`"id":"chatcmpl-X"`))
	return createdField.ReplaceAll(b, []byte(`"created":0`))
}

// golden compares got with testdata/<name>, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden (run with -update to create it): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file:\n got: %s\nwant: %s", name, got, want)
	}
}

// vllmError checks r is status with vLLM's error body, exactly
// {"error": {"message", "type", "param", "code"}} with code the status, and
// returns it.
func vllmError(t *testing.T, r reply, status int) fakeinference.ErrorInfo {
	t.Helper()
	if r.status != status || !isVLLMError(status, r.body) {
		t.Fatalf("got %d %s, want %d in vLLM's error shape", r.status, r.body, status)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("error Content-Type %q", ct)
	}
	var e fakeinference.ErrorResponse
	mustJSON(t, r.body, &e)
	return e.Error
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func mustJSON(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
}
