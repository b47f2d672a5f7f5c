package httpclient

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// h2cServer starts an HTTP/2-without-TLS server of h allowing streams
// concurrent streams per connection, counting the connections it accepts.
func h2cServer(t testing.TB, ln net.Listener, streams int, h http.Handler) (url string, conns *atomic.Int64) {
	t.Helper()
	conns = new(atomic.Int64)
	srv := httptest.NewUnstartedServer(h)
	if ln != nil {
		srv.Listener.Close()
		srv.Listener = ln
	}
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &p
	srv.Config.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: streams}
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL, conns
}

// heldHandler answers each request once release is closed, counting the
// requests that reached it and whether each came over HTTP/2.
type heldHandler struct {
	release chan struct{}
	arrived atomic.Int64
	notH2   atomic.Int64
}

// answering returns a handler that answers at once.
func answering() *heldHandler {
	h := &heldHandler{release: make(chan struct{})}
	close(h.release)
	return h
}

// poolClient is New(opts) with its connections closed when the test ends.
func poolClient(t *testing.T, opts Options) *http.Client {
	c := New(opts)
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func (h *heldHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.arrived.Add(1)
	if r.ProtoMajor != 2 {
		h.notH2.Add(1)
	}
	b, _ := io.ReadAll(r.Body)
	<-h.release
	w.Write(b)
}

func TestH2CPool_SpreadsStreamsOverFewConnections(t *testing.T) {
	h := &heldHandler{release: make(chan struct{})}
	url, conns := h2cServer(t, nil, 10, h)
	c := New(Options{H2C: true, MaxConnsPerHost: 3})
	defer c.CloseIdleConnections()

	const requests = 45 // more than 3 connections of 10 streams carry at once
	var wg sync.WaitGroup
	errs := make(chan error, requests)
	for i := range requests {
		wg.Go(func() {
			body := strings.Repeat("x", i)
			rep, err := Do(context.Background(), c, http.MethodPost, url+"/run", nil, []byte(body))
			switch {
			case err != nil:
				errs <- err
			case rep.Status != 200 || string(rep.Body) != body:
				errs <- errors.New("wrong reply " + string(rep.Body))
			}
		})
	}
	waitFor(t, func() bool { return h.arrived.Load() == 30 }, "30 requests held on 3 connections")
	close(h.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := h.arrived.Load(); got != requests {
		t.Errorf("handler saw %d requests, want %d (the handshake must not reach it)", got, requests)
	}
	if h.notH2.Load() != 0 {
		t.Errorf("%d requests were not HTTP/2", h.notH2.Load())
	}
	if got := conns.Load(); got != 3 {
		t.Errorf("the server accepted %d connections, want 3", got)
	}
}

// Once the newest connection is down to its last quarter of free slots,
// the pool opens the next one: the requests after it find it ready, and
// no more connections are opened than they need.
func TestH2CPool_OpensTheNextConnectionBeforeTheLastFills(t *testing.T) {
	h := &heldHandler{release: make(chan struct{})}
	url, conns := h2cServer(t, nil, 8, h)
	c := poolClient(t, Options{H2C: true, MaxConnsPerHost: 4})
	var release sync.Once
	// Run before the server's and the client's cleanups, which wait for
	// the held requests: a failed check must not leave them held.
	t.Cleanup(func() { release.Do(func() { close(h.release) }) })
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	send := func(n int) {
		for range n {
			wg.Go(func() {
				rep, err := Do(context.Background(), c, http.MethodPost, url+"/run", nil, []byte("x"))
				switch {
				case err != nil:
					errs <- err
				case rep.Status != 200:
					errs <- errors.New("status " + http.StatusText(rep.Status))
				}
			})
		}
	}
	send(5)
	waitFor(t, func() bool { return h.arrived.Load() == 5 }, "5 requests held on the first connection")
	if got := conns.Load(); got != 1 {
		t.Fatalf("with 3 of 8 slots free the server accepted %d connections, want 1", got)
	}
	send(1)
	waitFor(t, func() bool { return conns.Load() == 2 }, "the next connection opened when 2 of 8 slots were left")
	send(4)
	waitFor(t, func() bool { return h.arrived.Load() == 10 }, "10 requests held on 2 connections")
	release.Do(func() { close(h.release) })
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := conns.Load(); got != 2 {
		t.Errorf("the server accepted %d connections for 10 requests of 8 streams each, want 2", got)
	}
}

// dropFirst is a listener that closes the first connection it accepts
// after reading the client's preface and SETTINGS, as net/http's server
// does with a connection whose SETTINGS it read too late.
type dropFirst struct {
	net.Listener
	once    sync.Once
	dropped atomic.Bool
}

func (d *dropFirst) Accept() (net.Conn, error) {
	c, err := d.Listener.Accept()
	if err != nil {
		return nil, err
	}
	drop := false
	d.once.Do(func() { drop = true })
	if !drop {
		return c, nil
	}
	go func() {
		buf := make([]byte, 64)
		_, _ = io.ReadAtLeast(c, buf, 24)
		// Marked before the close: the client can see the close, dial
		// again and have its answer before this goroutine runs on.
		d.dropped.Store(true)
		c.Close()
	}()
	return d.Accept()
}

func TestH2CPool_ConnectionDroppedBeforeItsFirstAnswerIsOpenedAgain(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	df := &dropFirst{Listener: ln}
	h := answering()
	url, _ := h2cServer(t, df, 100, h)
	c := poolClient(t, Options{H2C: true})

	rep, err := Do(context.Background(), c, http.MethodPost, url+"/run", nil, []byte(`{"row":1}`))
	if err != nil || rep.Status != 200 || string(rep.Body) != `{"row":1}` {
		t.Fatalf("Do = %+v, %v", rep, err)
	}
	if !df.dropped.Load() {
		t.Fatal("the first connection was not dropped; the test tests nothing")
	}
	if got := h.arrived.Load(); got != 1 {
		t.Errorf("handler ran %d times, want once", got)
	}
}

func TestH2CPool_ClosedConnectionsAreReplaced(t *testing.T) {
	url, conns := h2cServer(t, nil, 100, answering())
	c := poolClient(t, Options{H2C: true})
	for i := range 3 {
		if rep, err := Do(context.Background(), c, http.MethodGet, url+"/x", nil, nil); err != nil || rep.Status != 200 {
			t.Fatalf("request %d: %+v, %v", i, rep, err)
		}
		c.CloseIdleConnections()
	}
	if got := conns.Load(); got != 3 {
		t.Errorf("%d connections for 3 requests with the idle ones closed between them, want 3", got)
	}
}

// Ensure a request whose connection could not be opened (its dial timed
// out, as a starved process's can) goes out once on a connection opened
// again, through New's stack.
func TestH2CPool_RequestIsSentAfterAFailedDial(t *testing.T) {
	h := answering()
	url, conns := h2cServer(t, nil, 100, h)
	c := poolClient(t, Options{H2C: true})
	pool := c.Transport.(resendUnsent).next.(*h2cPool)
	dial := pool.dial
	var dials atomic.Int64
	pool.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if dials.Add(1) == 1 {
			return nil, &net.OpError{Op: "dial", Net: network, Err: os.ErrDeadlineExceeded}
		}
		return dial(ctx, network, addr)
	}
	rep, err := Do(context.Background(), c, http.MethodPost, url+"/run", nil, map[string]int{"row": 1})
	if err != nil || rep.Status != http.StatusOK || string(rep.Body) != `{"row":1}` {
		t.Fatalf("Do = %+v, %v; want the body echoed", rep, err)
	}
	if dials.Load() != 2 || h.arrived.Load() != 1 || conns.Load() != 1 {
		t.Errorf("%d dials, %d requests arrived, %d connections; want 2, 1 and 1", dials.Load(), h.arrived.Load(), conns.Load())
	}
}

// Ensure a dial error reaches the caller once the resends are spent.
func TestH2CPool_DialErrorIsReturned(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := New(Options{H2C: true, DialTimeout: time.Second})
	_, err = Do(context.Background(), c, http.MethodGet, "http://"+addr+"/x", nil, nil)
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("err = %v, want connection refused", err)
	}
}

func TestH2CPool_RefusesOtherSchemes(t *testing.T) {
	c := New(Options{H2C: true})
	if _, err := Do(context.Background(), c, http.MethodGet, "ftp://example.invalid/x", nil, nil); err == nil || !strings.Contains(err.Error(), "only http:// and https://") {
		t.Fatalf("err = %v", err)
	}
}

// waitFor polls cond until it holds or a deadline passes.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestH2CPool_HandshakeIsNotTheRequests(t *testing.T) {
	url, _ := h2cServer(t, nil, 100, answering())
	c := poolClient(t, Options{H2C: true})
	var written atomic.Int64
	ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { written.Add(1) },
	})
	if rep, err := Do(ctx, c, http.MethodPost, url+"/run", nil, []byte(`{}`)); err != nil || rep.Status != 200 {
		t.Fatalf("Do = %+v, %v", rep, err)
	}
	if got := written.Load(); got != 1 {
		t.Errorf("the request's trace saw %d requests written on a new connection, want 1 (its own)", got)
	}
}

// A stream freed on a connection before the one the pool last used is
// found: the pool's search starts at its last connection and wraps.
func TestH2CPool_FindsAFreeStreamBeforeItsLastConnection(t *testing.T) {
	var mu sync.Mutex
	byConn := map[string][]chan struct{}{}
	var order []string
	var arrived atomic.Int64
	url, conns := h2cServer(t, nil, 2, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		release := make(chan struct{})
		mu.Lock()
		if _, seen := byConn[r.RemoteAddr]; !seen {
			order = append(order, r.RemoteAddr)
		}
		byConn[r.RemoteAddr] = append(byConn[r.RemoteAddr], release)
		mu.Unlock()
		arrived.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	pool := newH2C(Options{H2C: true, MaxConnsPerHost: 2}, nil)
	c := &http.Client{Transport: pool}
	t.Cleanup(pool.CloseIdleConnections)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	send := func() {
		wg.Go(func() { _, _ = Do(ctx, c, http.MethodGet, url+"/x", nil, nil) })
	}
	for range 4 {
		send()
	}
	waitFor(t, func() bool { return arrived.Load() == 4 }, "both connections full")
	mu.Lock()
	if len(order) != 2 {
		mu.Unlock()
		t.Fatalf("requests came on %d connections, want 2", len(order))
	}
	for _, release := range byConn[order[0]] {
		close(release)
	}
	byConn[order[0]] = nil
	mu.Unlock()
	waitFor(t, func() bool {
		pool.mu.Lock()
		defer pool.mu.Unlock()
		for _, h := range pool.hosts {
			for _, conn := range h.conns {
				if conn.InFlight() == 0 {
					return true
				}
			}
		}
		return false
	}, "the first connection's streams freed")
	send()
	send()
	waitFor(t, func() bool { return arrived.Load() == 6 }, "two more requests on the first connection")
	mu.Lock()
	defer mu.Unlock()
	if n := len(byConn[order[0]]); n != 2 {
		t.Errorf("%d requests reached the first connection, want 2", n)
	}
	if got := conns.Load(); got != 2 {
		t.Errorf("the server accepted %d connections, want 2", got)
	}
	for _, rs := range byConn {
		for _, release := range rs {
			close(release)
		}
	}
}
