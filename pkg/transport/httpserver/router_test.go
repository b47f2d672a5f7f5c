package httpserver_test

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// serve runs one request through h and returns the recorder.
func serve(h http.Handler, method, target, body string) *httptest.ResponseRecorder {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, target, rd))
	return rec
}

func wantReply(t *testing.T, rec *httptest.ResponseRecorder, status int, body string) {
	t.Helper()
	if rec.Code != status || rec.Body.String() != body+"\n" {
		t.Fatalf("got %d %q, want %d %q", rec.Code, rec.Body.String(), status, body+"\n")
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type = %q", ct)
	}
}

func TestRouter_HealthReadyMetrics(t *testing.T) {
	var ready error
	reg := prometheus.NewRegistry()
	r := httpserver.NewRouter(httpserver.RouterOptions{Registry: reg, Ready: func() error { return ready }})

	wantReply(t, serve(r, "GET", "/healthz", ""), 200, `{"status":"ok"}`)
	wantReply(t, serve(r, "GET", "/", ""), 200, `{"status":"ok"}`)
	wantReply(t, serve(r, "GET", "/readyz", ""), 200, `{"status":"ok"}`)
	ready = errors.New("loading the tokenizer")
	wantReply(t, serve(r, "GET", "/readyz", ""), 503, `{"error":{"code":"unavailable","detail":"not ready: loading the tokenizer"}}`)
	// Liveness does not depend on readiness.
	wantReply(t, serve(r, "GET", "/healthz", ""), 200, `{"status":"ok"}`)

	rec := serve(r, "GET", "/metrics", "")
	if rec.Code != 200 {
		t.Fatalf("/metrics answered %d", rec.Code)
	}
	for _, want := range []string{
		`gymfleet_http_requests_total{code="503",method="GET",route="/readyz"} 1`,
		`gymfleet_http_requests_total{code="200",method="GET",route="/healthz"} 2`,
		"gymfleet_http_requests_in_flight 1", // the /metrics request itself
		"go_goroutines ",
		"process_",
	} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestRouter_NilOptions(t *testing.T) {
	r := httpserver.NewRouter(httpserver.RouterOptions{})
	wantReply(t, serve(r, "GET", "/readyz", ""), 200, `{"status":"ok"}`)
	if rec := serve(r, "GET", "/metrics", ""); rec.Code != 200 {
		t.Fatalf("/metrics answered %d", rec.Code)
	}
}

func TestRouter_NotFoundAndMethodNotAllowed(t *testing.T) {
	r := httpserver.NewRouter(httpserver.RouterOptions{})
	r.Post("/v1/things", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) })
	tests := []struct {
		method, target string
		status         int
		body           string
	}{
		{"GET", "/nope", 404, `{"error":{"code":"not_found","detail":"no route GET /nope"}}`},
		{"GET", "/ng-rollout/w-a1/nope", 404, `{"error":{"code":"not_found","detail":"no route GET /nope"}}`},
		{"GET", "/v1/things", 405, `{"error":{"code":"method_not_allowed","detail":"method GET not allowed on /v1/things"}}`},
		{"POST", "/healthz", 405, `{"error":{"code":"method_not_allowed","detail":"method POST not allowed on /healthz"}}`},
		{"DELETE", "/ng-rollout/w/v1/things", 405, `{"error":{"code":"method_not_allowed","detail":"method DELETE not allowed on /v1/things"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.target, func(t *testing.T) {
			wantReply(t, serve(r, tt.method, tt.target, ""), tt.status, tt.body)
		})
	}
	if rec := serve(r, "POST", "/ng-rollout/w/v1/things", ""); rec.Code != 204 {
		t.Fatalf("the prefixed route answered %d", rec.Code)
	}
}

func TestRouter_RolloutPrefix(t *testing.T) {
	var mwSaw []string
	r := httpserver.NewRouter(httpserver.RouterOptions{Middleware: []func(http.Handler) http.Handler{
		// A caller's middleware (the checkpoint fence) already sees the
		// stripped path and the episode.
		func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
				id, _ := rollout.FromContext(req.Context())
				mwSaw = append(mwSaw, req.URL.Path+" "+id.CaptureKey())
				next.ServeHTTP(w, req)
			})
		},
	}})
	r.Post("/seed_session", httpserver.Handle(nil, func(req *http.Request) (any, error) {
		id, ok := rollout.FromContext(req.Context())
		return map[string]any{"key": id.CaptureKey(), "prefixed": ok, "path": req.URL.Path}, nil
	}))
	wantReply(t, serve(r, "POST", "/ng-rollout/3-0-a2/seed_session", "{}"), 200, `{"key":"3-0-a2","path":"/seed_session","prefixed":true}`)
	wantReply(t, serve(r, "POST", "/seed_session", "{}"), 200, `{"key":"","path":"/seed_session","prefixed":false}`)
	// NeMo Gym's training-capture segment after the key routes the same
	// (nemo_gym/base_responses_api_agent.py, Gym 07d6b0d07b22).
	wantReply(t, serve(r, "POST", "/ng-rollout/3-0/training-token-capture/seed_session", "{}"), 200, `{"key":"3-0","path":"/seed_session","prefixed":true}`)
	wantReply(t, serve(r, "POST", "/ng-rollout/w-a1-a2/seed_session", "{}"), 400,
		`{"error":{"code":"invalid_request","detail":"invalid id: rollout id \"w-a1\" must not end in -a\u003cN\u003e, which names an attempt"}}`)
	if got, want := strings.Join(mwSaw, ","), "/seed_session 3-0-a2,/seed_session ,/seed_session 3-0"; got != want {
		t.Fatalf("middleware saw %q, want %q", got, want)
	}
}

func TestRouter_Recoverer(t *testing.T) {
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	r := httpserver.NewRouter(httpserver.RouterOptions{Registry: reg, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	r.Get("/panic", func(http.ResponseWriter, *http.Request) { panic("bad input") })
	r.Get("/ok", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "fine") })
	s := start(t, r)
	for _, h2c := range []bool{false, true} {
		c := newClient(t, h2c)
		code, body := get(t, c, s.URL()+"/panic")
		if code != 500 || body != `{"error":{"code":"internal","detail":"internal error"}}`+"\n" {
			t.Fatalf("h2c=%v: panic answered %d %q", h2c, code, body)
		}
		// The server is still serving, on the same client.
		if code, body := get(t, c, s.URL()+"/ok"); code != 200 || body != "fine" {
			t.Fatalf("h2c=%v: after a panic: %d %q", h2c, code, body)
		}
	}
	for _, want := range []string{`"msg":"handler panicked"`, `"panic":"bad input"`, `"stack":"goroutine `} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %s: %s", want, logs.String())
		}
	}
	// The metrics count what the client got: a 500, not the 200 an
	// unwritten response defaults to.
	if got := requestCounts(t, reg)[`GET /panic 500`]; got != 2 {
		t.Errorf("requests_total{route=/panic,code=500} = %v, want 2; all: %v", got, requestCounts(t, reg))
	}
}

func TestRouter_AbortHandlerIsNotRecovered(t *testing.T) {
	r := httpserver.NewRouter(httpserver.RouterOptions{})
	r.Get("/abort", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "partial")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	})
	s := start(t, r)
	resp, err := newClient(t, false).Get(s.URL() + "/abort")
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err == nil {
		t.Fatal("an aborted response read back complete")
	}
}

// requestCounts flattens gymfleet_http_requests_total as "METHOD route code".
func requestCounts(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "gymfleet_http_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			out[l["method"]+" "+l["route"]+" "+l["code"]] += m.GetCounter().GetValue()
		}
	}
	return out
}

func TestRouter_MetricsUseRoutePatterns(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := httpserver.NewRouter(httpserver.RouterOptions{Registry: reg})
	r.Route("/v1/agent_sessions", func(r chi.Router) {
		r.Get("/{session_id}", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) })
	})
	r.Get("/capture/rollouts/{capture_key}/manifest", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(200) })
	for _, target := range []string{
		"/v1/agent_sessions/sess-secret-1",
		"/ng-rollout/rollout-xyz-a3/v1/agent_sessions/sess-secret-2",
		"/capture/rollouts/rollout-xyz-a3/manifest",
		"/ng-rollout/rollout-xyz-a3/no/such/path-secret-3",
		"/ng-rollout/bad.key-a1-a2/x",
	} {
		serve(r, "GET", target, "")
	}
	got := requestCounts(t, reg)
	want := map[string]float64{
		"GET /v1/agent_sessions/{session_id} 204":          2,
		"GET /capture/rollouts/{capture_key}/manifest 200": 1,
		"GET unmatched 404":                                1,
		"GET unmatched 400":                                1,
	}
	if !equalCounts(got, want) {
		t.Fatalf("request counts = %v, want %v", got, want)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				for _, leak := range []string{"secret", "xyz", "bad.key", "ng-rollout"} {
					if strings.Contains(l.GetValue(), leak) {
						t.Errorf("metric %s label %s=%q carries a path value", mf.GetName(), l.GetName(), l.GetValue())
					}
				}
			}
		}
	}
}

func equalCounts(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	keys := make([]string, 0, len(a))
	for k := range a {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if a[k] != b[k] {
			return false
		}
	}
	return true
}

type item struct {
	Name  string `json:"name"`
	Count int    `json:"count"`
}

func TestRouter_BodyLimit(t *testing.T) {
	r := httpserver.NewRouter(httpserver.RouterOptions{MaxBodyBytes: 32})
	var v item
	r.Post("/lenient", httpserver.Handle(nil, func(req *http.Request) (any, error) { return v, httpserver.DecodeJSON(req, &v) }))
	r.Post("/strict", httpserver.Handle(nil, func(req *http.Request) (any, error) { return v, httpserver.DecodeJSONStrict(req, &v) }))
	r.Post("/raw", httpserver.Handle(nil, func(req *http.Request) (any, error) {
		b, err := httpserver.ReadBody(req)
		return map[string]int{"n": len(b)}, err
	}))
	big := `{"name":"` + strings.Repeat("x", 40) + `"}`
	for _, path := range []string{"/lenient", "/strict", "/raw"} {
		wantReply(t, serve(r, "POST", path, big), 413, `{"error":{"code":"body_too_large","detail":"request body is larger than 32 bytes"}}`)
	}
	wantReply(t, serve(r, "POST", "/raw", strings.Repeat("y", 32)), 200, `{"n":32}`)
}

// Ensure ReadBody reads a body into one allocation of the length its
// client declared, and allocates at most a megabyte for a length the
// client does not send (pkg/transport/httpbody tests the reading itself).
func TestReadBody_DeclaredLength(t *testing.T) {
	honest := strings.Repeat("b", 600_000)
	req := httptest.NewRequest("POST", "/", strings.NewReader(honest))
	req.ContentLength = int64(len(honest))
	if got, err := httpserver.ReadBody(req); err != nil || string(got) != honest || cap(got) != len(honest)+1 {
		t.Errorf("honest: read %d bytes into %d, %v; want the %d sent into one buffer", len(got), cap(got), err, len(honest))
	}
	req = httptest.NewRequest("POST", "/", strings.NewReader("bbb"))
	req.ContentLength = 1 << 40
	if got, err := httpserver.ReadBody(req); err != nil || string(got) != "bbb" || cap(got) > 1<<20+1 {
		t.Errorf("declared far past what is sent: read %q into %d bytes, %v", got, cap(got), err)
	}
}

func TestDecodeJSON_VersusStrict(t *testing.T) {
	tests := []struct {
		name         string
		body         string
		lenient      int // status of DecodeJSON
		strict       int // status of DecodeJSONStrict
		strictDetail string
	}{
		{"valid", `{"name":"a","count":1}`, 200, 200, ""},
		{"unknown field", `{"name":"a","extra":1}`, 200, 422, `json: unknown field "extra"`},
		{"empty", ``, 400, 400, "request body is empty; expected a JSON object"},
		// A body that is not JSON is a 400 on every route.
		{"malformed", `{"name":`, 400, 400, "empty or truncated JSON body"},
		{"wrong type", `{"count":"1"}`, 400, 422, `field "count": expected int, got JSON string`},
		{"trailing data", `{"name":"a"} {"name":"b"}`, 400, 400, "unexpected data after the JSON value"},
	}
	r := httpserver.NewRouter(httpserver.RouterOptions{})
	r.Post("/lenient", httpserver.Handle(nil, func(req *http.Request) (any, error) {
		var v item
		return v, httpserver.DecodeJSON(req, &v)
	}))
	r.Post("/strict", httpserver.Handle(nil, func(req *http.Request) (any, error) {
		var v item
		return v, httpserver.DecodeJSONStrict(req, &v)
	}))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := serve(r, "POST", "/lenient", tt.body)
			if rec.Code != tt.lenient {
				t.Fatalf("DecodeJSON answered %d %s, want %d", rec.Code, rec.Body, tt.lenient)
			}
			if rec.Code != 200 {
				if e := apierror.Parse(rec.Code, rec.Body.Bytes()); e == nil || e.Code != apierror.InvalidRequest {
					t.Fatalf("DecodeJSON refusal %s is not invalid_request", rec.Body)
				}
			}
			rec = serve(r, "POST", "/strict", tt.body)
			if rec.Code != tt.strict {
				t.Fatalf("DecodeJSONStrict answered %d %s, want %d", rec.Code, rec.Body, tt.strict)
			}
			if rec.Code != 200 {
				e := apierror.Parse(rec.Code, rec.Body.Bytes())
				if e == nil || e.Code != apierror.InvalidRequest || e.Detail != tt.strictDetail {
					t.Fatalf("DecodeJSONStrict refusal %s, want invalid_request %q", rec.Body, tt.strictDetail)
				}
			}
		})
	}
}

func TestHandle(t *testing.T) {
	tests := []struct {
		name   string
		fn     httpserver.HandlerFunc
		status int
		body   string
		header http.Header
	}{
		{
			name: "value", status: 200, body: `{"name":"\u003cb\u003e","count":2}`,
			fn: func(*http.Request) (any, error) { return item{Name: "<b>", Count: 2}, nil },
		},
		{
			name: "raw message", status: 200, body: `{"kept" : "as is"}`,
			fn: func(*http.Request) (any, error) { return codec.RawMessage(`{"kept" : "as is"}`), nil },
		},
		{
			name: "reply with status and header", status: 201, body: `{"name":"n","count":0}`,
			header: http.Header{"X-Ng-Checkpoint-Verify": {"wait"}},
			fn: func(*http.Request) (any, error) {
				return httpserver.Reply{Status: 201, Header: http.Header{"X-Ng-Checkpoint-Verify": {"wait"}}, Body: item{Name: "n"}}, nil
			},
		},
		{
			name: "reply with raw body", status: 202, body: `[1, 2]`,
			fn: func(*http.Request) (any, error) {
				return httpserver.Reply{Status: 202, Body: codec.RawMessage(`[1, 2]`)}, nil
			},
		},
		{
			name: "reply without status", status: 200, body: `null`,
			fn: func(*http.Request) (any, error) { return httpserver.Reply{}, nil },
		},
		{
			name: "api error", status: 409, body: `{"error":{"code":"stale_attempt","detail":"attempt 0 retired"}}`,
			fn: func(*http.Request) (any, error) { return nil, apierror.New(apierror.StaleAttempt, "attempt 0 retired") },
		},
		{
			name: "plain error", status: 500, body: `{"error":{"code":"internal","detail":"boom"}}`,
			fn: func(*http.Request) (any, error) { return nil, errors.New("boom") },
		},
		{
			name: "unencodable value", status: 500, body: `{"error":{"code":"internal","detail":"encoding reply: json: unsupported type: func()"}}`,
			fn: func(*http.Request) (any, error) { return func() {}, nil },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := serve(httpserver.Handle(nil, tt.fn), "POST", "/x", "")
			if rec.Code != tt.status || rec.Body.String() != tt.body+"\n" {
				t.Fatalf("got %d %q, want %d %q", rec.Code, rec.Body, tt.status, tt.body+"\n")
			}
			if cl := rec.Header().Get("Content-Length"); tt.status < 300 && cl != strconv.Itoa(len(tt.body)+1) {
				t.Fatalf("Content-Length = %q for a %d-byte body", cl, len(tt.body)+1)
			}
			for k, v := range tt.header {
				if got := rec.Header().Get(k); got != v[0] {
					t.Fatalf("%s = %q, want %q", k, got, v[0])
				}
			}
		})
	}
}

func TestWriteRawJSON(t *testing.T) {
	rec := httptest.NewRecorder()
	httpserver.WriteRawJSON(rec, 418, []byte(`{"a":1}`))
	if rec.Code != 418 || rec.Body.String() != "{\"a\":1}\n" || rec.Header().Get("Content-Length") != "8" || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("got %d %q %v", rec.Code, rec.Body, rec.Header())
	}
}

func TestRouter_Pprof(t *testing.T) {
	off := httpserver.NewRouter(httpserver.RouterOptions{})
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/profile?seconds=1"} {
		if rec := serve(off, http.MethodGet, path, ""); rec.Code != http.StatusNotFound {
			t.Errorf("pprof off: GET %s answered %d, want 404", path, rec.Code)
		}
	}

	on := httpserver.NewRouter(httpserver.RouterOptions{Pprof: true})
	tests := []struct {
		path, want string
	}{
		{"/debug/pprof/", "goroutine"},
		{"/debug/pprof/heap?debug=1", "heap profile:"},
		{"/debug/pprof/goroutine?debug=1", "goroutine profile:"},
		{"/debug/pprof/cmdline", ""},
	}
	for _, tc := range tests {
		rec := serve(on, http.MethodGet, tc.path, "")
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), tc.want) {
			t.Errorf("pprof on: GET %s answered %d %.80q, want 200 containing %q", tc.path, rec.Code, rec.Body.String(), tc.want)
		}
	}
	if rec := serve(on, http.MethodGet, "/debug/pprof", ""); rec.Code != http.StatusMovedPermanently || rec.Header().Get("Location") != "/debug/pprof/" {
		t.Errorf("GET /debug/pprof answered %d to %q, want a redirect to /debug/pprof/", rec.Code, rec.Header().Get("Location"))
	}
	// A CPU profile is a gzipped protobuf.
	rec := serve(on, http.MethodGet, "/debug/pprof/profile?seconds=1", "")
	if b := rec.Body.Bytes(); rec.Code != http.StatusOK || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Errorf("CPU profile answered %d with %d bytes, want 200 and gzip data", rec.Code, len(b))
	}
}

// eofReader is a request body that records whether it was read to its end.
type eofReader struct {
	r      io.Reader
	sawEOF bool
}

func (e *eofReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		e.sawEOF = true
	}
	return n, err
}

func (e *eofReader) Close() error { return nil }

// A handler that ignores its body (or refuses the request before reading
// it) still has the body read to its end before the reply is written, so
// over HTTP/2 the reply never completes ahead of the request's END_STREAM.
func TestHandle_DrainsTheBodyBeforeReplying(t *testing.T) {
	for _, fail := range []bool{false, true} {
		body := &eofReader{r: strings.NewReader(`{"ignored":true}`)}
		r := httptest.NewRequest(http.MethodPost, "/close_session", nil)
		r.Body = body
		w := httptest.NewRecorder()
		httpserver.Handle(slog.New(slog.DiscardHandler), func(*http.Request) (any, error) {
			if fail {
				return nil, apierror.New(apierror.InvalidRequest, "refused before reading")
			}
			return map[string]bool{"closed": true}, nil
		})(w, r)
		if !body.sawEOF {
			t.Errorf("fail=%v: the reply (%d) was written with the body unread", fail, w.Code)
		}
	}
}
