package httpclient_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// seenRequest is what the test server received.
type seenRequest struct {
	Method, Path, ContentType, Custom string
	Body                              string
}

// recorder is a test server that records requests and answers with reply.
type recorder struct {
	mu    sync.Mutex
	seen  []seenRequest
	reply http.HandlerFunc
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	rc.seen = append(rc.seen, seenRequest{r.Method, r.URL.Path, r.Header.Get("Content-Type"), r.Header.Get("X-Custom"), string(b)})
	rc.mu.Unlock()
	rc.reply(w, r)
}

func (rc *recorder) requests() []seenRequest {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]seenRequest(nil), rc.seen...)
}

// newServer starts a recorder and a plain HTTP/1.1 client for it; both are
// closed when the test ends.
func newServer(t *testing.T, reply http.HandlerFunc) (*recorder, *httptest.Server, *http.Client) {
	t.Helper()
	rc := &recorder{reply: reply}
	srv := httptest.NewServer(rc)
	c := httpclient.New(httpclient.Options{})
	t.Cleanup(func() {
		c.CloseIdleConnections()
		srv.Close()
	})
	return rc, srv, c
}

func writeBody(status int, contentType, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		if contentType != "" {
			w.Header().Set("Content-Type", contentType)
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

type pong struct {
	Echo  string `json:"echo"`
	Count int    `json:"count"`
}

func TestPostJSON_Success(t *testing.T) {
	rc, srv, c := newServer(t, writeBody(200, "application/json", `{"echo":"hi","count":2,"extra":true}`))
	var out pong
	h := http.Header{"X-Custom": {"v1"}}
	rep, err := httpclient.PostJSON(context.Background(), c, srv.URL+"/x", h, map[string]any{"q": "<hi>"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.Status != 200 || out != (pong{Echo: "hi", Count: 2}) {
		t.Fatalf("reply %d, out %+v", rep.Status, out)
	}
	want := seenRequest{Method: "POST", Path: "/x", ContentType: "application/json", Custom: "v1", Body: `{"q":"\u003chi\u003e"}`}
	if got := rc.requests(); len(got) != 1 || got[0] != want {
		t.Fatalf("server saw %+v, want %+v", got, want)
	}
}

func TestDo_Bodies(t *testing.T) {
	rc, srv, c := newServer(t, writeBody(204, "", ""))
	ctx := context.Background()
	if _, err := httpclient.Do(ctx, c, http.MethodPost, srv.URL+"/raw", nil, []byte(`{"raw" : 1}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := httpclient.Do(ctx, c, http.MethodPut, srv.URL+"/rawmsg", http.Header{"Content-Type": {"text/plain"}}, codec.RawMessage(`[1, 2]`)); err != nil {
		t.Fatal(err)
	}
	rep, err := httpclient.Do(ctx, c, http.MethodDelete, srv.URL+"/none", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Status != 204 || !rep.OK() || rep.Err("x") != nil {
		t.Fatalf("reply = %+v", rep)
	}
	want := []seenRequest{
		{Method: "POST", Path: "/raw", ContentType: "application/json", Body: `{"raw" : 1}`},
		{Method: "PUT", Path: "/rawmsg", ContentType: "text/plain", Body: `[1, 2]`},
		{Method: "DELETE", Path: "/none"},
	}
	got := rc.requests()
	if len(got) != len(want) {
		t.Fatalf("server saw %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("request %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if _, err := httpclient.Do(ctx, c, http.MethodPost, srv.URL, nil, func() {}); err == nil {
		t.Fatal("an unencodable body was sent")
	}
}

func TestErrors(t *testing.T) {
	long := strings.Repeat("y", 600)
	tests := []struct {
		name       string
		reply      http.HandlerFunc
		wantCode   apierror.Code
		wantStatus int
		wantDetail string // exact, or a prefix when it ends in "..."
	}{
		{
			name:     "envelope",
			reply:    writeBody(409, "application/json", `{"error":{"code":"stale_attempt","detail":"attempt 1 of w is retired"}}`),
			wantCode: apierror.StaleAttempt, wantStatus: 409, wantDetail: "attempt 1 of w is retired",
		},
		{
			name:     "envelope with another status",
			reply:    writeBody(503, "application/json", `{"error":{"code":"internal","detail":"x"}}`),
			wantCode: apierror.Internal, wantStatus: 503, wantDetail: "x",
		},
		{
			name:     "plain text",
			reply:    writeBody(500, "text/plain", "boom\n"),
			wantCode: apierror.UpstreamError, wantStatus: 502, wantDetail: "URL answered 500: boom",
		},
		{
			name:     "vLLM error shape",
			reply:    writeBody(400, "application/json", `{"object":"error","message":"too long","code":400}`),
			wantCode: apierror.UpstreamError, wantStatus: 502, wantDetail: `URL answered 400: {"object":"error","message":"too long","code":400}`,
		},
		{
			name:     "long text is cut",
			reply:    writeBody(502, "text/plain", long),
			wantCode: apierror.UpstreamError, wantStatus: 502, wantDetail: "URL answered 502: " + long[:512] + "...",
		},
		{
			name:     "undecodable success",
			reply:    writeBody(200, "application/json", `{"echo":`),
			wantCode: apierror.UpstreamError, wantStatus: 502, wantDetail: "decoding reply of URL: ",
		},
		{
			name:     "wrong type in success",
			reply:    writeBody(200, "application/json", `{"count":"two"}`),
			wantCode: apierror.UpstreamError, wantStatus: 502, wantDetail: "decoding reply of URL: ",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, srv, c := newServer(t, tt.reply)
			url := srv.URL + "/call"
			calls := map[string]func() (*httpclient.Reply, error){
				"PostJSON": func() (*httpclient.Reply, error) {
					var out pong
					return httpclient.PostJSON(context.Background(), c, url, nil, struct{}{}, &out)
				},
				"GetJSON": func() (*httpclient.Reply, error) {
					var out pong
					return httpclient.GetJSON(context.Background(), c, url, nil, &out)
				},
			}
			for name, call := range calls {
				rep, err := call()
				var e *apierror.Error
				if !errors.As(err, &e) {
					t.Fatalf("%s: err = %v (%T), want *apierror.Error", name, err, err)
				}
				if rep == nil {
					t.Fatalf("%s: no reply returned with the error", name)
				}
				detail := strings.ReplaceAll(tt.wantDetail, "URL", url)
				okDetail := e.Detail == detail
				if strings.HasPrefix(tt.wantDetail, "decoding") {
					okDetail = strings.HasPrefix(e.Detail, detail)
				}
				if e.Code != tt.wantCode || e.HTTPStatus() != tt.wantStatus || !okDetail {
					t.Fatalf("%s: got {%q %d %q}, want {%q %d %q}", name, e.Code, e.HTTPStatus(), e.Detail, tt.wantCode, tt.wantStatus, detail)
				}
			}
		})
	}
}

func TestTransportError(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	c := httpclient.New(httpclient.Options{DialTimeout: time.Second})
	_, err := httpclient.GetJSON(context.Background(), c, url, nil, nil)
	if err == nil {
		t.Fatal("a call to a closed server succeeded")
	}
	var e *apierror.Error
	if errors.As(err, &e) {
		t.Fatalf("a transport error became %v; callers must tell it from a reply", e)
	}
}

func TestIdempotentClient_RetriesGet(t *testing.T) {
	var n atomic.Int32
	rc, srv, base := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			writeBody(503, "application/json", `{"error":{"code":"unavailable","detail":"not ready"}}`)(w, r)
			return
		}
		writeBody(200, "application/json", `{"echo":"ready"}`)(w, r)
	})
	c := httpclient.NewIdempotentClient(base, 3)
	var out pong
	if _, err := httpclient.GetJSON(context.Background(), c, srv.URL+"/_ckpt/status", nil, &out); err != nil {
		t.Fatal(err)
	}
	if out.Echo != "ready" || len(rc.requests()) != 2 {
		t.Fatalf("out %+v after %d requests, want ready after 2", out, len(rc.requests()))
	}
}

// A peer's Retry-After is honoured only up to the client's cap, so a 503
// asking for an hour is retried within the context's much shorter bound
// (idempotentBackoff; retryablehttp's own backoff would wait the hour).
func TestIdempotentClient_CapsRetryAfter(t *testing.T) {
	var n atomic.Int32
	rc, srv, base := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.Header().Set("Retry-After", "3600")
			writeBody(503, "application/json", `{"error":{"code":"unavailable","detail":"come back in an hour"}}`)(w, r)
			return
		}
		writeBody(200, "application/json", `{"echo":"ready"}`)(w, r)
	})
	c := httpclient.NewIdempotentClient(base, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out pong
	if _, err := httpclient.GetJSON(ctx, c, srv.URL+"/_ckpt/status", nil, &out); err != nil {
		t.Fatalf("the retry waited for the peer's Retry-After: %v", err)
	}
	if out.Echo != "ready" || len(rc.requests()) != 2 {
		t.Fatalf("out %+v after %d requests, want ready after 2", out, len(rc.requests()))
	}
}

func TestIdempotentClient_GivesUpWithTheLastReply(t *testing.T) {
	rc, srv, base := newServer(t, writeBody(503, "application/json", `{"error":{"code":"unavailable","detail":"still not ready"}}`))
	c := httpclient.NewIdempotentClient(base, 1)
	_, err := httpclient.GetJSON(context.Background(), c, srv.URL, nil, nil)
	if !apierror.HasCode(err, apierror.Unavailable) || apierror.From(err).HTTPStatus() != 503 {
		t.Fatalf("err = %v, want the server's unavailable envelope", err)
	}
	if got := len(rc.requests()); got != 2 {
		t.Fatalf("server saw %d requests, want 2 (one retry)", got)
	}
}

func TestIdempotentClient_RefusesNonGet(t *testing.T) {
	rc, srv, base := newServer(t, writeBody(200, "application/json", `{}`))
	c := httpclient.NewIdempotentClient(base, 3)
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		_, err := httpclient.Do(context.Background(), c, method, srv.URL+"/run", nil, map[string]string{"a": "b"})
		if !errors.Is(err, httpclient.ErrNotIdempotent) {
			t.Fatalf("%s: err = %v, want ErrNotIdempotent", method, err)
		}
	}
	if _, err := httpclient.PostJSON(context.Background(), c, srv.URL+"/run", nil, struct{}{}, nil); !errors.Is(err, httpclient.ErrNotIdempotent) {
		t.Fatalf("PostJSON: err = %v, want ErrNotIdempotent", err)
	}
	if got := rc.requests(); len(got) != 0 {
		t.Fatalf("the server saw %d requests: %+v", len(got), got)
	}
	if _, err := httpclient.Do(context.Background(), c, http.MethodHead, srv.URL, nil, nil); err != nil {
		t.Fatalf("HEAD: %v", err)
	}
	if got := len(rc.requests()); got != 1 {
		t.Fatalf("HEAD reached the server %d times", got)
	}
}

func TestIdempotentClient_StopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	_, srv, base := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		cancel() // the caller gives up while the first reply is on its way
		writeBody(503, "text/plain", "busy")(w, r)
	})
	c := httpclient.NewIdempotentClient(base, 5)
	_, err := httpclient.GetJSON(ctx, c, srv.URL, nil, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

// A reply is read whole into one buffer of its declared length, and read
// whole without one.
func TestReadReply(t *testing.T) {
	body := strings.Repeat("r", 300_000)
	for _, declared := range []int64{int64(len(body)), -1} {
		resp := &http.Response{Body: io.NopCloser(strings.NewReader(body)), ContentLength: declared}
		got, err := httpclient.ReadReply(resp)
		if err != nil || string(got) != body {
			t.Fatalf("declared %d: read %d bytes, %v; want %d", declared, len(got), err, len(body))
		}
		if declared >= 0 && cap(got) != len(body)+1 {
			t.Errorf("declared %d: a buffer of %d bytes", declared, cap(got))
		}
	}
}
