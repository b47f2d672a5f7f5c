package h2client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// h2cServer serves h over HTTP/2 without TLS, streams concurrent streams
// per connection (0: net/http's default).
func h2cServer(t *testing.T, streams int, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &p
	srv.Config.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: streams}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// dial opens a Conn to srv, closed when the test ends.
func dial(t *testing.T, srv *httptest.Server) *Conn {
	t.Helper()
	var d net.Dialer
	c, err := Dial(context.Background(), d.DialContext, srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func request(t *testing.T, ctx context.Context, method, url string, body []byte) *http.Request {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// echo answers with the request's method, path, a header and its body.
var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), 500)
		return
	}
	w.Header().Set("X-Method", r.Method)
	w.Header().Set("X-Path", r.URL.RequestURI())
	w.Header().Set("X-Proto", r.Proto)
	w.Header().Set("X-Echo", r.Header.Get("X-Echo"))
	w.Write(b)
})

func TestRoundTrip_RequestsAndReplies(t *testing.T) {
	srv := h2cServer(t, 0, echo)
	c := dial(t, srv)
	big := bytes.Repeat([]byte("0123456789abcdef"), 10<<20/16) // past every window
	for _, tc := range []struct {
		name, method string
		body         []byte
	}{
		{"get", http.MethodGet, nil},
		{"empty post", http.MethodPost, []byte{}},
		{"small post", http.MethodPost, []byte(`{"a":1}`)},
		{"10 MiB post", http.MethodPost, big},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := request(t, context.Background(), tc.method, srv.URL+"/p?q=1", tc.body)
			req.Header.Set("X-Echo", "hi")
			resp, err := c.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 200 || resp.ProtoMajor != 2 || resp.Request != req {
				t.Errorf("status %d proto %d request %p, want 200, 2, %p", resp.StatusCode, resp.ProtoMajor, resp.Request, req)
			}
			for k, want := range map[string]string{"X-Method": tc.method, "X-Path": "/p?q=1", "X-Proto": "HTTP/2.0", "X-Echo": "hi"} {
				if v := resp.Header.Get(k); v != want {
					t.Errorf("%s = %q, want %q", k, v, want)
				}
			}
			if !bytes.Equal(got, tc.body) {
				t.Errorf("echoed %d bytes, want the %d sent", len(got), len(tc.body))
			}
			if resp.ContentLength != int64(len(tc.body)) && resp.ContentLength != -1 {
				t.Errorf("ContentLength %d, want %d or -1", resp.ContentLength, len(tc.body))
			}
		})
	}
	waitFor(t, "every stream to end", func() bool { return c.InFlight() == 0 })
}

func TestRoundTrip_LongReplyReadInSmallPieces(t *testing.T) {
	const size = 40 << 20 // ten times a stream's window: the reader must give it back
	srv := h2cServer(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := bytes.Repeat([]byte{'z'}, 1<<20)
		for range size / len(chunk) {
			w.Write(chunk)
		}
	}))
	c := dial(t, srv)
	resp, err := c.RoundTrip(request(t, context.Background(), http.MethodGet, srv.URL, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	h := sha256.New()
	buf := make([]byte, 3000)
	n, err := io.CopyBuffer(h, struct{ io.Reader }{resp.Body}, buf)
	if err != nil || n != size {
		t.Fatalf("read %d bytes, %v; want %d", n, err, size)
	}
	want := sha256.Sum256(bytes.Repeat([]byte{'z'}, size))
	if !bytes.Equal(h.Sum(nil), want[:]) {
		t.Error("the reply's bytes differ from those written")
	}
}

func TestRoundTrip_ReplyArrivesAsWritten(t *testing.T) {
	next := make(chan struct{})
	srv := h2cServer(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("data: one\n\n"))
		w.(http.Flusher).Flush()
		<-next
		w.Write([]byte("data: two\n\n"))
	}))
	c := dial(t, srv)
	resp, err := c.RoundTrip(request(t, context.Background(), http.MethodGet, srv.URL, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, len("data: one\n\n"))
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "data: one\n\n" {
		t.Fatalf("first event %q, %v", first, err)
	}
	close(next)
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "data: two\n\n" {
		t.Fatalf("rest %q, %v", rest, err)
	}
}

func TestRoundTrip_CancelWhileWaitingResetsTheStream(t *testing.T) {
	handlerCanceled := make(chan struct{})
	arrived := make(chan struct{})
	srv := h2cServer(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-r.Context().Done()
		close(handlerCanceled)
	}))
	c := dial(t, srv)
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("the caller gave up")
	go func() {
		<-arrived
		cancel(cause)
	}()
	_, err := c.RoundTrip(request(t, ctx, http.MethodPost, srv.URL, []byte("x")))
	if !errors.Is(err, cause) {
		t.Fatalf("RoundTrip error %v, want the context's cause", err)
	}
	select {
	case <-handlerCanceled:
	case <-time.After(10 * time.Second):
		t.Fatal("the server's handler was not canceled: no RST_STREAM")
	}
	waitFor(t, "the stream's slot to free", func() bool { return c.InFlight() == 0 })
}

// partialReply writes "partial" and waits for its request to be canceled,
// then closes canceled.
func partialReply(canceled chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("partial"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(canceled)
	})
}

func TestRoundTrip_CancelWhileReadingTheBody(t *testing.T) {
	srv := h2cServer(t, 0, partialReply(make(chan struct{})))
	c := dial(t, srv)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := c.RoundTrip(request(t, ctx, http.MethodGet, srv.URL, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 7)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := resp.Body.Read(buf)
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Read after cancel: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a blocked Read did not return on cancel")
	}
}

func TestRoundTrip_ClosingTheBodyEarlyResetsTheStream(t *testing.T) {
	handlerCanceled := make(chan struct{})
	srv := h2cServer(t, 0, partialReply(handlerCanceled))
	c := dial(t, srv)
	resp, err := c.RoundTrip(request(t, context.Background(), http.MethodGet, srv.URL, nil))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	select {
	case <-handlerCanceled:
	case <-time.After(10 * time.Second):
		t.Fatal("the server's handler was not canceled")
	}
	if _, err := resp.Body.Read(make([]byte, 1)); err == nil {
		t.Error("Read after Close succeeded")
	}
	waitFor(t, "the stream's slot to free", func() bool { return c.InFlight() == 0 })
}

func TestRoundTrip_EarlyReplyStopsTheBody(t *testing.T) {
	srv := h2cServer(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "too large", http.StatusRequestEntityTooLarge)
	}))
	c := dial(t, srv)
	// Past the server's window: without the early reply the send would
	// wait for window forever.
	resp, err := c.RoundTrip(request(t, context.Background(), http.MethodPost, srv.URL, make([]byte, 32<<20)))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "too large") {
		t.Errorf("reply %d %q", resp.StatusCode, b)
	}
	waitFor(t, "the stream's slot to free", func() bool { return c.InFlight() == 0 })
	// The connection still works.
	resp, err = c.RoundTrip(request(t, context.Background(), http.MethodGet, srv.URL, nil))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// The server's stream limit is kept: requests beyond it wait for a stream
// to end rather than being refused.
func TestRoundTrip_WaitsForAStreamUnderTheServersLimit(t *testing.T) {
	const limit, requests = 3, 20
	var inHandler, most atomic.Int64
	release := make(chan struct{})
	srv := h2cServer(t, limit, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			return
		}
		n := inHandler.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		<-release
		inHandler.Add(-1)
		io.Copy(w, r.Body)
	}))
	c := dial(t, srv)
	// Settle the server's SETTINGS first: until they arrive the client
	// assumes RFC 9113's default limit.
	resp, err := c.RoundTrip(request(t, context.Background(), http.MethodGet, srv.URL, nil))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if free, lim, err := c.Reserve(); err != nil || lim != limit || free != limit-1 {
		t.Fatalf("Reserve on an idle connection = %d free of %d, %v; want %d of %d", free, lim, err, limit-1, limit)
	}
	c.Release()

	var wg sync.WaitGroup
	errs := make(chan error, requests)
	for i := range requests {
		wg.Go(func() {
			body := strings.Repeat("b", i)
			resp, err := c.RoundTrip(request(t, context.Background(), http.MethodPost, srv.URL, []byte(body)))
			if err != nil {
				errs <- err
				return
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || string(got) != body {
				errs <- errors.New("wrong reply")
			}
		})
	}
	waitFor(t, "the limit's worth of requests in handlers", func() bool { return inHandler.Load() == limit })
	if _, _, err := c.Reserve(); err == nil {
		t.Error("Reserve succeeded on a connection at the server's limit")
	}
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if m := most.Load(); m > limit {
		t.Errorf("%d requests were in handlers at once, over the server's limit of %d", m, limit)
	}
}

// A connection Reserve found full is refused without its lock until
// something changes: a stream ends (it is offered again) or the
// connection fails (Reserve reports the failure, which is how a pool
// knows to drop it, not that it is full).
func TestReserve_FullConnectionIsRefusedWithoutItsLockUntilASlotFrees(t *testing.T) {
	release := make(chan struct{})
	srv := h2cServer(t, 1, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			<-release
		}
	}))
	c := dial(t, srv)
	// Settle the server's SETTINGS (a limit of one stream) first.
	resp, err := c.RoundTrip(request(t, context.Background(), http.MethodGet, srv.URL, nil))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	waitFor(t, "the first stream's slot to free", func() bool { return c.InFlight() == 0 })

	held := make(chan *http.Response, 1)
	go func() {
		resp, err := c.RoundTrip(request(t, context.Background(), http.MethodPost, srv.URL, []byte("x")))
		if err != nil {
			t.Error(err)
			close(held)
			return
		}
		held <- resp
	}()
	waitFor(t, "the held request to take the only slot", func() bool { return c.InFlight() == 1 })
	if _, _, err := c.Reserve(); !errors.Is(err, ErrNoStreamFree) {
		t.Fatalf("Reserve on a full connection = %v, want ErrNoStreamFree", err)
	}
	// Found full, the connection is refused without its lock.
	c.mu.Lock()
	refused := make(chan error, 1)
	go func() {
		_, _, err := c.Reserve()
		refused <- err
	}()
	select {
	case err := <-refused:
		if !errors.Is(err, ErrNoStreamFree) {
			t.Errorf("Reserve with the connection's lock held = %v, want ErrNoStreamFree", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("Reserve of a connection found full waited for the connection's lock")
	}
	c.mu.Unlock()

	close(release)
	if resp := <-held; resp != nil {
		resp.Body.Close()
	}
	waitFor(t, "the held stream's slot to free", func() bool { return c.InFlight() == 0 })
	if _, _, err := c.Reserve(); err != nil {
		t.Fatalf("Reserve once the stream ended = %v, want a slot", err)
	}
	if _, _, err := c.Reserve(); !errors.Is(err, ErrNoStreamFree) {
		t.Fatalf("a second Reserve = %v, want ErrNoStreamFree (the reservation holds the slot)", err)
	}
	// Full again, then failed: Reserve says so.
	c.Close()
	if _, _, err := c.Reserve(); err == nil || errors.Is(err, ErrNoStreamFree) {
		t.Fatalf("Reserve of a closed connection found full before = %v, want the connection's error", err)
	}
}

func TestGoAway_InFlightFinishesNewRequestsAreNotProcessed(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	srv := h2cServer(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
		w.Write([]byte("done"))
	}))
	c := dial(t, srv)
	type result struct {
		body string
		err  error
	}
	res := make(chan result, 1)
	go func() {
		resp, err := c.RoundTrip(request(t, context.Background(), http.MethodGet, srv.URL, nil))
		if err != nil {
			res <- result{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		res <- result{string(b), err}
	}()
	<-arrived
	shutdown := make(chan error, 1)
	go func() { shutdown <- srv.Config.Shutdown(context.Background()) }()
	waitFor(t, "the GOAWAY", func() bool { return c.Err() != nil })
	if err := c.Err(); !errors.Is(err, ErrNotProcessed) {
		t.Errorf("Err after GOAWAY = %v, want ErrNotProcessed", err)
	}
	_, err := c.RoundTrip(request(t, context.Background(), http.MethodPost, srv.URL, []byte("late")))
	if !errors.Is(err, ErrNotProcessed) {
		t.Errorf("a request after GOAWAY: %v, want ErrNotProcessed", err)
	}
	close(release)
	if r := <-res; r.err != nil || r.body != "done" {
		t.Errorf("the request in flight at GOAWAY: %q, %v; want its reply", r.body, r.err)
	}
	if err := <-shutdown; err != nil {
		t.Error(err)
	}
}

func TestConnectionLost_FailsTheRequestsInFlight(t *testing.T) {
	arrived := make(chan struct{}, 4)
	srv := h2cServer(t, 0, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done()
	}))
	c := dial(t, srv)
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := c.RoundTrip(request(t, context.Background(), http.MethodPost, srv.URL, []byte("x")))
			errs <- err
		}()
	}
	<-arrived
	<-arrived
	srv.CloseClientConnections()
	for range 2 {
		select {
		case err := <-errs:
			if err == nil || errors.Is(err, ErrNotProcessed) {
				t.Errorf("a request the server had taken, its connection lost: %v; want an error that is not ErrNotProcessed", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a request in flight did not fail when its connection was lost")
		}
	}
	if c.Err() == nil {
		t.Error("Err is nil on a lost connection")
	}
	if _, err := c.RoundTrip(request(t, context.Background(), http.MethodGet, srv.URL, nil)); !errors.Is(err, ErrNotProcessed) {
		t.Errorf("a request on a lost connection: %v, want ErrNotProcessed (nothing was sent)", err)
	}
}

// refusingServer answers every request on one connection with
// RST_STREAM(REFUSED_STREAM), as a server over its limit may.
func refusingServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		preface := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(nc, preface); err != nil {
			return
		}
		fr := http2.NewFramer(nc, nc)
		fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		if fr.WriteSettings() != nil {
			return
		}
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					fr.WriteSettingsAck()
				}
			case *http2.MetaHeadersFrame:
				fr.WriteRSTStream(f.StreamID, http2.ErrCodeRefusedStream)
			}
		}
	})
	return ln.Addr().String()
}

func TestRefusedStream_IsNotProcessed(t *testing.T) {
	addr := refusingServer(t)
	var d net.Dialer
	c, err := Dial(context.Background(), d.DialContext, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.RoundTrip(request(t, context.Background(), http.MethodPost, "http://"+addr+"/run", []byte("x")))
	if !errors.Is(err, ErrNotProcessed) {
		t.Fatalf("a refused stream: %v, want ErrNotProcessed", err)
	}
	waitFor(t, "the refused stream's slot to free", func() bool { return c.InFlight() == 0 })
}

// What the package is for: a request waiting for its reply holds no
// goroutine of the client's (net/http's client holds one per request).
func TestWaitingRequestsHoldNoGoroutineOfTheClient(t *testing.T) {
	const requests = 200
	release := make(chan struct{})
	var arrived atomic.Int64
	srv := h2cServer(t, 1000, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Add(1)
		<-release
	}))
	c := dial(t, srv)
	before := runtime.NumGoroutine()
	var wg sync.WaitGroup
	for range requests {
		wg.Go(func() {
			resp, err := c.RoundTrip(request(t, context.Background(), http.MethodPost, srv.URL, []byte("x")))
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	waitFor(t, "every request in a handler", func() bool { return arrived.Load() == requests })
	// Each request: its caller and the server's handler. net/http's
	// client would add a third (clientStream.doRequest).
	extra := runtime.NumGoroutine() - before - 2*requests
	close(release)
	wg.Wait()
	if extra > requests/10 {
		t.Errorf("%d goroutines beyond the callers and the handlers for %d requests waiting", extra, requests)
	}
}

// Ensure a server that speaks only HTTP/1.1 fails the connection with
// ErrHTTP1Server (which is ErrNotProcessed too) and that the request never
// reaches its handler: net/http's server without h2c enabled answers our
// preface with an HTTP/1.1 status line.
func TestHTTP1Server_IsErrHTTP1Server(t *testing.T) {
	var posts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			posts.Add(1)
		}
	}))
	t.Cleanup(srv.Close)
	c := dial(t, srv)
	_, err := c.RoundTrip(request(t, context.Background(), http.MethodPost, srv.URL+"/run", []byte(`{"row":1}`)))
	if !errors.Is(err, ErrHTTP1Server) || !errors.Is(err, ErrNotProcessed) {
		t.Fatalf("RoundTrip to an HTTP/1.1-only server: %v; want ErrHTTP1Server and ErrNotProcessed", err)
	}
	if !strings.Contains(err.Error(), "HTTP/1.1") {
		t.Errorf("error %q does not quote the server's status line", err)
	}
	waitFor(t, "the connection to fail", func() bool { return c.Err() != nil })
	if !errors.Is(c.Err(), ErrHTTP1Server) {
		t.Errorf("Err() = %v, want ErrHTTP1Server", c.Err())
	}
	if _, err := c.RoundTrip(request(t, context.Background(), http.MethodGet, srv.URL, nil)); !errors.Is(err, ErrHTTP1Server) {
		t.Errorf("a later request: %v, want ErrHTTP1Server", err)
	}
	if n := posts.Load(); n != 0 {
		t.Errorf("the handler saw %d POSTs, want none", n)
	}
}

// http1BadRequest is what uvicorn writes to a client whose bytes do not
// parse as HTTP/1.x, our preface included, before it closes the connection
// (send_400_response in uvicorn/protocols/http/h11_impl.py at c1144fd4f130,
// the uvicorn NeMo Gym's pyproject.toml at 07d6b0d07b22 names).
const http1BadRequest = "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n" +
	"connection: close\r\ntransfer-encoding: chunked\r\n\r\n1d\r\nInvalid HTTP request received.\r\n0\r\n\r\n"

// http1RawServer accepts connections and answers each, once it has read the
// HTTP/2 preface, with reply and closes it.
func http1RawServer(t *testing.T, reply string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer nc.Close()
				preface := make([]byte, len(http2.ClientPreface))
				if _, err := io.ReadFull(nc, preface); err != nil {
					return
				}
				io.WriteString(nc, reply)
			})
		}
	})
	return ln.Addr().String()
}

func TestHTTP1Server_RawBadRequest(t *testing.T) {
	addr := http1RawServer(t, http1BadRequest)
	for range 20 { // the server's close races our writes; each order must end the same
		var d net.Dialer
		c, err := Dial(context.Background(), d.DialContext, addr)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.RoundTrip(request(t, context.Background(), http.MethodPost, "http://"+addr+"/run", []byte("x")))
		if !errors.Is(err, ErrHTTP1Server) || !errors.Is(err, ErrNotProcessed) {
			c.Close()
			t.Fatalf("RoundTrip: %v; want ErrHTTP1Server and ErrNotProcessed", err)
		}
		if !strings.Contains(err.Error(), `"HTTP/1.1 400 Bad Request"`) {
			t.Errorf("error %q does not quote the status line", err)
		}
		c.Close()
	}
}
