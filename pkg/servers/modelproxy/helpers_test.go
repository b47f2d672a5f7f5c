package modelproxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
	"github.com/gymfleet/gymfleet/pkg/transport/sse"
)

// stub is a vLLM-shaped upstream whose replies each test scripts.
type stub struct {
	srv *httptest.Server

	mu    sync.Mutex
	reqs  []stubRequest
	reply func(w http.ResponseWriter, r *http.Request, body map[string]any)
}

type stubRequest struct {
	Path   string
	Header http.Header
	Body   map[string]any
}

func newStub(t *testing.T) *stub {
	t.Helper()
	s := &stub{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if r.Method == http.MethodPost {
			b, _ := io.ReadAll(r.Body)
			if err := json.Unmarshal(b, &body); err != nil {
				http.Error(w, "stub: bad JSON: "+err.Error(), http.StatusBadRequest)
				return
			}
		}
		s.mu.Lock()
		s.reqs = append(s.reqs, stubRequest{Path: r.URL.Path, Header: r.Header.Clone(), Body: body})
		reply := s.reply
		s.mu.Unlock()
		if r.URL.Path == "/v1/models" {
			io.WriteString(w, `{"object":"list","data":[{"id":"fake-model","object":"model","created":1,"owned_by":"stub"}]}`)
			return
		}
		if reply == nil {
			http.Error(w, "stub: no reply scripted", http.StatusInternalServerError)
			return
		}
		reply(w, r, body)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *stub) script(f func(w http.ResponseWriter, r *http.Request, body map[string]any)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reply = f
}

func (s *stub) requests() []stubRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]stubRequest(nil), s.reqs...)
}

func (s *stub) last(t *testing.T) stubRequest {
	t.Helper()
	r := s.requests()
	if len(r) == 0 {
		t.Fatal("the upstream got no request")
	}
	return r[len(r)-1]
}

// lastChat is the last model call the upstream got (not a probe or a
// /tokenize).
func (s *stub) lastChat(t *testing.T) stubRequest {
	t.Helper()
	r := s.requests()
	for i := len(r) - 1; i >= 0; i-- {
		if r[i].Path == "/v1/chat/completions" {
			return r[i]
		}
	}
	t.Fatal("the upstream got no model call")
	return stubRequest{}
}

// replyJSON answers with a fixed JSON body.
func replyJSON(status int, body string) func(http.ResponseWriter, *http.Request, map[string]any) {
	return func(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

// replySSE answers with events, one per element, flushing each.
func replySSE(events ...string) func(http.ResponseWriter, *http.Request, map[string]any) {
	return func(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for _, ev := range events {
			fmt.Fprintf(w, "data: %s\n\n", ev)
			w.(http.Flusher).Flush()
		}
	}
}

// completion builds a vLLM reply with return_token_ids and logprobs as
// token_id:N.
func completion(message string, finish string, prompt, gen []int) string {
	lp := make([]string, len(gen))
	for i, id := range gen {
		lp[i] = fmt.Sprintf(`{"token":"token_id:%d","logprob":%s,"top_logprobs":[]}`, id, logprob(i))
	}
	return fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"fake-model",`+
		`"choices":[{"index":0,"message":%s,"finish_reason":%q,"logprobs":{"content":[%s]},"token_ids":%s,"stop_reason":null}],`+
		`"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d},"prompt_token_ids":%s,"kv_transfer_params":null}`,
		message, finish, strings.Join(lp, ","), ints(gen), len(prompt), len(gen), len(prompt)+len(gen), ints(prompt))
}

func logprob(i int) string { return fmt.Sprintf("-0.%d25", i%10) }

func ints(v []int) string {
	b, _ := json.Marshal(v)
	return string(b)
}

const weatherCall = `{"role":"assistant","content":null,"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]}`

type proxy struct {
	srv *modelproxy.Server
	url string
	reg *prometheus.Registry
}

func newProxy(t *testing.T, up *stub, mutate func(*modelproxy.Config)) *proxy {
	t.Helper()
	cfg := modelproxy.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Upstream.BaseURL = up.srv.URL + "/v1"
	cfg.Upstream.H2C = false // httptest speaks HTTP/1.1
	cfg.Capture.Dir = t.TempDir()
	if mutate != nil {
		mutate(&cfg)
	}
	reg := prometheus.NewRegistry()
	srv, err := modelproxy.New(cfg, modelproxy.Deps{Registry: reg})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &proxy{srv: srv, url: srv.URL(), reg: reg}
}

// post sends body and returns the status and the reply body.
func (p *proxy) post(t *testing.T, path, body string, header ...string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, p.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

func (p *proxy) get(t *testing.T, path string, header ...string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, p.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// events reads an SSE body.
func events(t *testing.T, body []byte) []sse.Event {
	t.Helper()
	var out []sse.Event
	rd := sse.NewReader(bytes.NewReader(body))
	for {
		ev, err := rd.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("reading SSE: %v", err)
		}
		out = append(out, ev)
	}
}

func (p *proxy) manifest(t *testing.T, key string) modelproxy.Manifest {
	t.Helper()
	status, b := p.get(t, "/capture/rollouts/"+key+"/manifest")
	if status != http.StatusOK {
		t.Fatalf("manifest of %s: %d %s", key, status, b)
	}
	var m modelproxy.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return v
}

// equalJSON compares two JSON values.
func equalJSON(t *testing.T, what string, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("%s: got invalid JSON %s: %v", what, got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("%s: want invalid JSON: %v", what, err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("%s:\ngot  %s\nwant %s", what, got, want)
	}
}

// counter reads a counter or gauge from the registry.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			if m.Counter != nil {
				return m.Counter.GetValue()
			}
			if m.Gauge != nil {
				return m.Gauge.GetValue()
			}
			if m.Histogram != nil {
				return float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return 0
}
