package environment_test

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

	"github.com/gymfleet/gymfleet/pkg/servers/environment"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver/h2ctest"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// call is one request a stand-in saw.
type call struct {
	Server  string // "agent" or "resources"
	Path    string
	Headers map[string]string
	Body    string
}

// recorder orders the requests of every stand-in of one test.
type recorder struct {
	mu    sync.Mutex
	calls []call
	// seen receives each path as it arrives (buffered generously).
	seen chan string
}

func newRecorder() *recorder { return &recorder{seen: make(chan string, 64)} }

func (r *recorder) add(c call) {
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
	r.seen <- c.Server + " " + c.Path
}

func (r *recorder) snapshot() []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]call(nil), r.calls...)
}

func (r *recorder) paths() []string {
	var out []string
	for _, c := range r.snapshot() {
		out = append(out, c.Server+" "+c.Path)
	}
	return out
}

// waitFor blocks until the stand-ins saw want (server + " " + path).
func (r *recorder) waitFor(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case got := <-r.seen:
			if got == want {
				return
			}
		case <-deadline:
			t.Fatalf("timed out waiting for %q; saw %v", want, r.paths())
		}
	}
}

// standInHeaders are the headers the tests assert on.
var standInHeaders = []string{environment.HeaderSessionID, environment.HeaderAgentSession, environment.HeaderActivation, "Cookie"}

// route answers one path of a stand-in.
type route func(w http.ResponseWriter, r *http.Request, body []byte)

// newStandIn starts an h2c-capable server that records every request and
// answers it with routes[path], path without its /ng-rollout/<key> prefix
// (404 when missing).
func newStandIn(t *testing.T, name string, rec *recorder, routes map[string]route) *httptest.Server {
	t.Helper()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		c := call{Server: name, Path: r.URL.Path, Headers: map[string]string{}, Body: string(body)}
		for _, k := range standInHeaders {
			if v := r.Header.Get(k); v != "" {
				c.Headers[k] = v
			}
		}
		rec.add(c)
		_, rest, _ := rollout.SplitPath(r.URL.Path)
		if fn, ok := routes[rest]; ok {
			fn(w, r, body)
			return
		}
		http.Error(w, `{"error":{"code":"not_found","detail":"no stand-in route"}}`, http.StatusNotFound)
	})
	return h2ctest.Start(t, h)
}

func jsonReply(status int, body string) route {
	return func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

// startEnv starts an environment server on 127.0.0.1:0.
func startEnv(t *testing.T, cfg environment.Config) (*environment.Server, string) {
	t.Helper()
	return startEnvWith(t, cfg, environment.Deps{})
}

// startEnvWith starts an environment server on 127.0.0.1:0 with deps; the
// test's cleanup closes it (Close may be called before: it is idempotent).
func startEnvWith(t *testing.T, cfg environment.Config, deps environment.Deps) (*environment.Server, string) {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	s, err := environment.New(cfg, deps)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := s.Listen(); err != nil {
		t.Fatalf("Listen: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, s.URL()
}

// postRun posts body to /run and returns the status and the reply body.
func postRun(ctx context.Context, t *testing.T, url, body string) (int, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/run", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// canonical re-encodes JSON text with sorted keys, for exact comparisons.
func canonical(t *testing.T, s string) string {
	t.Helper()
	var v any
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, s)
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(b.String())
}

func assertJSON(t *testing.T, what, got, want string) {
	t.Helper()
	if g, w := canonical(t, got), canonical(t, want); g != w {
		t.Errorf("%s:\n got  %s\n want %s", what, g, w)
	}
}

// waitUntil polls cond until it holds or the deadline passes.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		<-tick.C
	}
}
