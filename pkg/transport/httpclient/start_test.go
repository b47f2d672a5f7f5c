package httpclient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

// startResult is what one Start's done got.
type startResult struct {
	rep *Reply
	err error
}

// Start answers as Do does on every transport: on the lean stack's h2c no
// goroutine waits for the reply, and elsewhere the request is made on the
// caller's goroutine.
func TestStart_EveryTransport(t *testing.T) {
	for _, c := range []struct {
		name   string
		stack  httpconf.Stack
		proto  Protocol
		waitsN bool // done runs before Start returns
	}{
		{"lean h2c", httpconf.StackLean, ProtocolH2C, false},
		{"lean auto", httpconf.StackLean, ProtocolAuto, false},
		{"lean http1", httpconf.StackLean, ProtocolHTTP1, true},
		{"nethttp h2c", httpconf.StackNetHTTP, ProtocolH2C, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := &heldHandler{release: make(chan struct{})}
			url := startServer(t, httpconf.StackLean, h)
			cl := poolClient(t, Options{Protocol: c.proto, HTTP: httpconf.Config{Stack: c.stack}})
			if !c.waitsN {
				const n = 100
				out := make(chan startResult, n)
				before := runtime.NumGoroutine()
				for i := range n {
					Start(context.Background(), cl, http.MethodPost, url+"/x", nil, map[string]int{"i": i}, func(rep *Reply, err error) { out <- startResult{rep, err} })
				}
				waitFor(t, func() bool { return h.arrived.Load() == n }, "every request at the server")
				// The server's handlers, and nothing of the client's.
				if extra := runtime.NumGoroutine() - before - n; extra > n/10 {
					t.Errorf("%d goroutines beyond the server's handlers for %d requests waiting", extra, n)
				}
				close(h.release)
				for range n {
					r := <-out
					if r.err != nil || r.rep.Status != 200 || !strings.HasPrefix(string(r.rep.Body), `{"i":`) {
						t.Fatalf("Start got %+v", r)
					}
				}
				return
			}
			close(h.release)
			var got *startResult
			Start(context.Background(), cl, http.MethodPost, url+"/x", nil, map[string]int{"i": 1}, func(rep *Reply, err error) { got = &startResult{rep, err} })
			if got == nil {
				t.Fatal("done was not called before Start returned on a transport that waits")
			}
			if got.err != nil || got.rep.Status != 200 || string(got.rep.Body) != `{"i":1}` {
				t.Fatalf("Start got %+v", got)
			}
		})
	}
}

// A request a server refused is sent again, as by RoundTrip.
func TestStart_ResendsWhatTheServerNeverProcessed(t *testing.T) {
	next := &scriptedTransport{errs: []error{unsentErr(), unsentErr()}}
	cl := &http.Client{Transport: resendUnsent{next: next, pause: func(int) time.Duration { return 0 }}}
	var got *startResult
	Start(context.Background(), cl, http.MethodPost, "http://example.invalid/run", nil, map[string]int{"row": 1}, func(rep *Reply, err error) { got = &startResult{rep, err} })
	if got == nil || got.err != nil || got.rep.Status != 200 || len(next.bodies) != 3 || next.bodies[2] != `{"row":1}` {
		t.Fatalf("Start got %+v after bodies %q, want 200 on the third send", got, next.bodies)
	}
}

// A context that ends while the reply is awaited fails it with the
// context's cause, as a *url.Error.
func TestStart_ContextEnds(t *testing.T) {
	h := &heldHandler{release: make(chan struct{})}
	defer close(h.release)
	url := startServer(t, httpconf.StackLean, h)
	cl := poolClient(t, Options{H2C: true})
	ctx, cancel := context.WithCancelCause(context.Background())
	why := errors.New("gone")
	out := make(chan startResult, 1)
	Start(ctx, cl, http.MethodPost, url+"/x", nil, []byte(`{}`), func(rep *Reply, err error) { out <- startResult{rep, err} })
	waitFor(t, func() bool { return h.arrived.Load() == 1 }, "the request at the server")
	cancel(why)
	r := <-out
	if !errors.Is(r.err, why) || !strings.Contains(fmt.Sprint(r.err), "Post") {
		t.Fatalf("Start got %v, want a *url.Error wrapping the cause", r.err)
	}
}

// StartJSON decodes a 2xx reply and hands on an error reply's envelope.
func TestStartJSON(t *testing.T) {
	var mu sync.Mutex
	status := 200
	url := startServer(t, httpconf.StackLean, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.WriteHeader(status)
		if status == 200 {
			w.Write([]byte(`{"answer":42}`))
			return
		}
		w.Write([]byte(`{"error":{"code":"invalid_request","detail":"no"}}`))
	}))
	cl := poolClient(t, Options{H2C: true})
	out := make(chan error, 1)
	var v struct{ Answer int }
	StartJSON(context.Background(), cl, url+"/q", nil, map[string]int{}, &v, func(_ *Reply, err error) { out <- err })
	if err := <-out; err != nil || v.Answer != 42 {
		t.Fatalf("StartJSON = %v, decoded %+v", err, v)
	}
	mu.Lock()
	status = 400
	mu.Unlock()
	StartJSON(context.Background(), cl, url+"/q", nil, map[string]int{}, &v, func(_ *Reply, err error) { out <- err })
	if err := <-out; err == nil || !strings.Contains(err.Error(), "no") {
		t.Fatalf("StartJSON of a 400 = %v, want its envelope's error", err)
	}
}
