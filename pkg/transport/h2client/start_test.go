package h2client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// started is what one Start's done got.
type started struct {
	resp *http.Response
	body []byte
	err  error
}

// start sends req with Start and returns a channel that gets done's
// arguments (the body read whole).
func start(c *Conn, req *http.Request, maxBody int64) <-chan started {
	out := make(chan started, 1)
	c.Start(req, maxBody, func(resp *http.Response, err error) {
		if err != nil {
			out <- started{err: err}
			return
		}
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		out <- started{resp: resp, body: b, err: rerr}
	})
	return out
}

func TestStart_RepliesArriveWhole(t *testing.T) {
	srv := h2cServer(t, 0, echo)
	c := dial(t, srv)
	big := bytes.Repeat([]byte("0123456789abcdef"), 10<<20/16) // past every window, both ways
	for _, tc := range []struct {
		name, method string
		body         []byte
	}{
		{"get", http.MethodGet, nil},
		{"small post", http.MethodPost, []byte(`{"a":1}`)},
		{"10 MiB post", http.MethodPost, big},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := request(t, context.Background(), tc.method, srv.URL+"/p?q=1", tc.body)
			req.Header.Set("X-Echo", "hi")
			got := <-start(c, req, 64<<20)
			if got.err != nil {
				t.Fatal(got.err)
			}
			if got.resp.StatusCode != 200 || got.resp.Header.Get("X-Echo") != "hi" || got.resp.Header.Get("X-Method") != tc.method {
				t.Errorf("status %d, headers %v", got.resp.StatusCode, got.resp.Header)
			}
			if !bytes.Equal(got.body, tc.body) {
				t.Errorf("echoed %d bytes, want the %d sent", len(got.body), len(tc.body))
			}
		})
	}
	waitFor(t, "every stream to end", func() bool { return c.InFlight() == 0 })
}

func TestStart_ReplyLongerThanItsBoundFails(t *testing.T) {
	srv := h2cServer(t, 0, echo)
	c := dial(t, srv)
	got := <-start(c, request(t, context.Background(), http.MethodPost, srv.URL, bytes.Repeat([]byte("x"), 100<<10)), 10<<10)
	if got.err == nil || !strings.Contains(got.err.Error(), "longer than") {
		t.Fatalf("a reply past its bound: %v, want it refused", got.err)
	}
	waitFor(t, "the stream to end", func() bool { return c.InFlight() == 0 })
}

func TestStart_CancelWhileWaitingResetsTheStream(t *testing.T) {
	canceled := make(chan struct{})
	arrived := make(chan struct{})
	srv := h2cServer(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-r.Context().Done()
		close(canceled)
	}))
	c := dial(t, srv)
	ctx, cancel := context.WithCancelCause(context.Background())
	why := errors.New("the caller went away")
	out := start(c, request(t, ctx, http.MethodPost, srv.URL, []byte("x")), 1<<20)
	<-arrived
	cancel(why)
	if got := <-out; !errors.Is(got.err, why) {
		t.Fatalf("a cancelled Start got %v, want its context's cause", got.err)
	}
	<-canceled // the server saw the reset
	waitFor(t, "the stream to end", func() bool { return c.InFlight() == 0 })
}

func TestStart_ConnectionLostAndRefusedStreams(t *testing.T) {
	arrived := make(chan struct{}, 1)
	srv := h2cServer(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done()
	}))
	c := dial(t, srv)
	out := start(c, request(t, context.Background(), http.MethodPost, srv.URL, []byte("x")), 1<<20)
	<-arrived
	srv.CloseClientConnections()
	if got := <-out; got.err == nil || errors.Is(got.err, ErrNotProcessed) {
		t.Errorf("a request the server had taken, its connection lost: %v; want an error that is not ErrNotProcessed", got.err)
	}
	if got := <-start(c, request(t, context.Background(), http.MethodGet, srv.URL, nil), 1<<20); !errors.Is(got.err, ErrNotProcessed) {
		t.Errorf("Start on a lost connection: %v, want ErrNotProcessed", got.err)
	}

	addr := refusingServer(t)
	var d net.Dialer
	rc, err := Dial(context.Background(), d.DialContext, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if got := <-start(rc, request(t, context.Background(), http.MethodPost, "http://"+addr+"/run", []byte("x")), 1<<20); !errors.Is(got.err, ErrNotProcessed) {
		t.Fatalf("a refused stream: %v, want ErrNotProcessed", got.err)
	}
}

// failingWrites is a connection whose writes fail once fail is set, as a
// socket's do once the peer reset it.
type failingWrites struct {
	net.Conn
	fail atomic.Bool
}

func (f *failingWrites) Write(b []byte) (int, error) {
	if f.fail.Load() {
		return 0, syscall.EPIPE
	}
	return f.Conn.Write(b)
}

// A request whose headers could not be written, the peer gone before its
// read loop said so, is never processed: the server cannot have had the
// whole header block. It fails with ErrNotProcessed, not with the
// connection's error, for RoundTrip and Start alike.
func TestHeadersNotWritten_IsNotProcessed(t *testing.T) {
	var served atomic.Int32
	srv := h2cServer(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1) }))
	for _, viaStart := range []bool{false, true} {
		nc, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fw := &failingWrites{Conn: nc}
		c, err := NewConn(fw)
		if err != nil {
			t.Fatal(err)
		}
		if got := <-start(c, request(t, context.Background(), http.MethodGet, srv.URL, nil), 1<<20); got.err != nil {
			t.Fatalf("first request: %v", got.err)
		}
		before := served.Load()
		fw.fail.Store(true)
		req := request(t, context.Background(), http.MethodPost, srv.URL, []byte("x"))
		if viaStart {
			err = (<-start(c, req, 1<<20)).err
		} else {
			_, err = c.RoundTrip(req)
		}
		if !errors.Is(err, ErrNotProcessed) || !errors.Is(err, syscall.EPIPE) {
			t.Errorf("Start %v: headers not written: %v, want ErrNotProcessed wrapping EPIPE", viaStart, err)
		}
		if served.Load() != before {
			t.Errorf("Start %v: the server served the request whose headers were not written", viaStart)
		}
		c.Close()
	}
}

// What Start is for: nothing of the client's waits for a reply, not even
// the caller's goroutine.
func TestStart_WaitingRequestsHoldNoGoroutine(t *testing.T) {
	const requests = 200
	release := make(chan struct{})
	var arrived atomic.Int64
	srv := h2cServer(t, 1000, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Add(1)
		<-release
		io.WriteString(w, "done")
	}))
	c := dial(t, srv)
	before := runtime.NumGoroutine()
	var wg sync.WaitGroup
	var ok atomic.Int64
	for range requests {
		wg.Add(1)
		c.Start(request(t, context.Background(), http.MethodPost, srv.URL, []byte("x")), 1<<20, func(resp *http.Response, err error) {
			defer wg.Done()
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				if string(b) == "done" {
					ok.Add(1)
				}
			}
		})
	}
	waitFor(t, "every request in a handler", func() bool { return arrived.Load() == requests })
	// Each request: the server's handler, nothing else.
	extra := runtime.NumGoroutine() - before - requests
	close(release)
	wg.Wait()
	if extra > requests/10 {
		t.Errorf("%d goroutines beyond the server's handlers for %d requests waiting", extra, requests)
	}
	if ok.Load() != requests {
		t.Errorf("%d of %d replies arrived whole", ok.Load(), requests)
	}
}
