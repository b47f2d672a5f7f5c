package httpserver_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serving is a Server started on 127.0.0.1:0 whose Serve result the test
// checks when it closes the server.
type serving struct {
	*httpserver.Server
	done     chan struct{} // closed when Serve returned
	serveErr error
}

// start listens and serves handler; the server is closed at the end of the
// test unless the test closed it.
func start(t testing.TB, handler http.Handler) *serving {
	t.Helper()
	return startOn(t, httpconf.StackLean, handler)
}

// startOn is start on the given HTTP stack.
func startOn(t testing.TB, st httpconf.Stack, handler http.Handler) *serving {
	t.Helper()
	s := &serving{Server: httpserver.New(httpserver.Config{Addr: "127.0.0.1:0", HTTP: httpconf.Config{Stack: st}}, handler), done: make(chan struct{})}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(s.done)
		s.serveErr = s.Serve()
	}()
	t.Cleanup(func() { s.close(t) })
	return s
}

// served waits for Serve to return and checks it returned nil.
func (s *serving) served(t testing.TB) {
	t.Helper()
	<-s.done
	if s.serveErr != nil {
		t.Errorf("Serve: %v", s.serveErr)
	}
}

// close closes the server (a no-op if it was closed) and checks Serve.
func (s *serving) close(t testing.TB) {
	t.Helper()
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("Close: %v", err)
	}
	s.served(t)
}

// newClient returns a client closed at the end of the test.
func newClient(t testing.TB, h2c bool) *http.Client {
	t.Helper()
	return newClientOn(t, httpconf.StackLean, h2c)
}

// newClientOn is newClient on the given HTTP stack.
func newClientOn(t testing.TB, st httpconf.Stack, h2c bool) *http.Client {
	t.Helper()
	c := httpclient.New(httpclient.Options{H2C: h2c, HTTP: httpconf.Config{Stack: st}})
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// stacks are the HTTP stacks every server test runs on.
var stacks = []httpconf.Stack{httpconf.StackLean, httpconf.StackNetHTTP}

// forStacks runs test once per HTTP stack, server and client alike.
func forStacks(t *testing.T, test func(t *testing.T, st httpconf.Stack)) {
	for _, st := range stacks {
		t.Run(string(st), func(t *testing.T) { test(t, st) })
	}
}

func get(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// Both protocols are served on one port, by either stack, to clients of
// either stack.
func TestServer_HTTP1AndH2COnOnePort(t *testing.T) {
	forStacks(t, func(t *testing.T, st httpconf.Stack) {
		s := startOn(t, st, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%d.%d", r.ProtoMajor, r.ProtoMinor)
		}))
		tests := []struct {
			name string
			h2c  bool
			want string
		}{
			{"h2c client", true, "2.0"},
			{"plain client", false, "1.1"},
		}
		for _, cst := range stacks {
			for _, tt := range tests {
				t.Run(string(cst)+" "+tt.name, func(t *testing.T) {
					c := newClientOn(t, cst, tt.h2c)
					for range 3 { // the same connection serves several requests
						if code, body := get(t, c, s.URL()+"/"); code != 200 || body != tt.want {
							t.Fatalf("got %d %q, want 200 %q", code, body, tt.want)
						}
					}
				})
			}
		}
	})
}

func TestServer_AddrURLContext(t *testing.T) {
	forStacks(t, func(t *testing.T, st httpconf.Stack) {
		s := httpserver.New(httpserver.Config{Addr: "127.0.0.1:0", HTTP: httpconf.Config{Stack: st}}, http.NotFoundHandler())
		if s.Addr() != "127.0.0.1:0" {
			t.Fatalf("Addr before Listen = %q", s.Addr())
		}
		if err := s.Listen(); err != nil {
			t.Fatal(err)
		}
		host, port, err := net.SplitHostPort(s.Addr())
		if err != nil || host != "127.0.0.1" || port == "0" {
			t.Fatalf("Addr after Listen = %q", s.Addr())
		}
		if s.URL() != "http://"+s.Addr() {
			t.Fatalf("URL = %q", s.URL())
		}
		served := make(chan error, 1)
		go func() { served <- s.Serve() }()
		if code, _ := get(t, newClientOn(t, st, false), s.URL()+"/"); code != http.StatusNotFound {
			t.Fatalf("status %d", code)
		}
		if s.Context().Err() != nil {
			t.Fatal("the server's context ended before Close")
		}
		if err := s.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := <-served; err != nil {
			t.Fatalf("Serve after Close = %v, want nil", err)
		}
		if s.Context().Err() == nil {
			t.Fatal("the server's context outlived Close")
		}
		if err := s.Close(context.Background()); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	})
}

// waitFor polls cond until it holds or five seconds pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		<-tick.C
	}
}

func TestServer_ListenError(t *testing.T) {
	forStacks(t, func(t *testing.T, st httpconf.Stack) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		s := httpserver.New(httpserver.Config{Addr: ln.Addr().String(), HTTP: httpconf.Config{Stack: st}}, http.NotFoundHandler())
		if err := s.Listen(); err == nil {
			t.Fatal("listening on a bound port succeeded")
		}
		if err := s.Serve(); err == nil {
			t.Fatal("Serve on a bound port succeeded")
		}
	})
}

// A server that listened but never served frees its port on Close.
func TestServer_CloseWithoutServeReleasesThePort(t *testing.T) {
	forStacks(t, func(t *testing.T, st httpconf.Stack) {
		s := httpserver.New(httpserver.Config{Addr: "127.0.0.1:0", HTTP: httpconf.Config{Stack: st}}, http.NotFoundHandler())
		if err := s.Listen(); err != nil {
			t.Fatal(err)
		}
		addr := s.Addr()
		if err := s.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("the port is still bound after Close: %v", err)
		}
		ln.Close()
		if err := s.Serve(); err != nil {
			t.Fatalf("Serve after Close = %v, want nil", err)
		}
	})
}

func TestServer_CloseWaitsForInFlightRequest(t *testing.T) {
	forStacks(t, func(t *testing.T, st httpconf.Stack) {
		for _, h2c := range []bool{false, true} {
			t.Run(fmt.Sprintf("h2c=%v", h2c), func(t *testing.T) { testCloseWaits(t, st, h2c) })
		}
	})
}

func testCloseWaits(t *testing.T, st httpconf.Stack, h2c bool) {
	entered, release := make(chan struct{}), make(chan struct{})
	s := startOn(t, st, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		if r.Context().Err() != nil {
			http.Error(w, "cancelled", 500)
			return
		}
		io.WriteString(w, "finished")
	}))
	c := newClientOn(t, st, h2c)
	type result struct {
		code int
		body string
		err  error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := c.Get(s.URL() + "/slow")
		if err != nil {
			got <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		got <- result{resp.StatusCode, string(b), err}
	}()
	<-entered

	closed := make(chan error, 1)
	go func() { closed <- s.Close(context.Background()) }()
	// Close has begun once the listener refuses new connections.
	waitFor(t, "the listener refuses connections", func() bool {
		conn, err := net.Dial("tcp", s.Addr())
		if err != nil {
			return true
		}
		conn.Close()
		return false
	})
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a request was in flight", err)
	default:
	}
	close(release)
	if r := <-got; r.err != nil || r.code != 200 || r.body != "finished" {
		t.Fatalf("in-flight request got %d %q %v, want 200 finished", r.code, r.body, r.err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	s.served(t)
}

// A request that outlives Close's deadline is cancelled, and Close still
// returns nil: cutting it off is the documented behaviour.
func TestServer_CloseDeadlineCancelsStragglers(t *testing.T) {
	forStacks(t, func(t *testing.T, st httpconf.Stack) {
		entered := make(chan struct{})
		cancelled := make(chan error, 1)
		s := startOn(t, st, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			<-r.Context().Done()
			cancelled <- context.Cause(r.Context())
		}))
		c := newClientOn(t, st, false)
		reqDone := make(chan struct{})
		go func() {
			defer close(reqDone)
			if resp, err := c.Get(s.URL() + "/forever"); err == nil {
				resp.Body.Close()
			}
		}()
		<-entered
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Fatalf("Close = %v, want nil", err)
		}
		if err := <-cancelled; err == nil {
			t.Fatal("the straggler's context was not cancelled")
		}
		<-reqDone
	})
}

// Close of an idle server drops idle HTTP/2 connections at once instead of
// waiting for net/http's GOAWAY grace period (about a second per client).
// The bound checks that mechanism, not speed, so it is generous.
func TestServer_CloseIdleH2CIsPrompt(t *testing.T) {
	forStacks(t, func(t *testing.T, st httpconf.Stack) {
		s := startOn(t, st, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, strconv.Itoa(r.ProtoMajor))
		}))
		c := newClientOn(t, st, true)
		if code, body := get(t, c, s.URL()+"/"); code != 200 || body != "2" {
			t.Fatalf("warm-up got %d %q", code, body)
		}
		begin := time.Now()
		s.close(t)
		if took := time.Since(begin); took > 500*time.Millisecond {
			t.Fatalf("Close of an idle server with a connected h2c client took %v", took)
		}
	})
}

func TestServer_CloseNow(t *testing.T) {
	forStacks(t, func(t *testing.T, st httpconf.Stack) {
		entered, release := make(chan struct{}), make(chan struct{})
		s := startOn(t, st, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			<-release // not the context: CloseNow must cut the connection itself
		}))
		defer close(release)
		c := newClientOn(t, st, true)
		errc := make(chan error, 1)
		go func() {
			resp, err := c.Get(s.URL() + "/")
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			errc <- err
		}()
		<-entered
		if err := s.CloseNow(); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err == nil {
			t.Fatal("a request cut off by CloseNow succeeded")
		}
		if s.Context().Err() == nil {
			t.Fatal("CloseNow left the server context alive")
		}
		if err := s.Close(context.Background()); err != nil {
			t.Fatalf("Close after CloseNow: %v", err)
		}
		s.served(t)
	})
}
