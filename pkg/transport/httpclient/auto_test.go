package httpclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/transport/h2client"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf/tlstest"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/tests/gymstandin"
)

// http1Peer is an HTTP/1.1-only server that echoes what is POSTed to it,
// counting the POSTs by body, the protocol they came over and the h2c
// prefaces it was sent (probes).
type http1Peer struct {
	url string
	// probes counts the prefaces net/http hands the handler; uvicorn, when
	// set, answered them before any handler.
	probes  atomic.Int64
	uvicorn *gymstandin.Uvicorn
	notH1   atomic.Int64
	mu      sync.Mutex
	posts   map[string]int
}

func (p *http1Peer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == "PRI" {
		// net/http's server hands the preface's first line to the handler
		// as a request, answers it and then fails on the rest.
		p.probes.Add(1)
		return
	}
	if r.ProtoMajor != 1 {
		p.notH1.Add(1)
	}
	b, _ := io.ReadAll(r.Body)
	if r.Method == http.MethodPost {
		p.mu.Lock()
		p.posts[string(b)]++
		p.mu.Unlock()
	}
	w.Write(b)
}

// postsOf is how many times body was POSTed.
func (p *http1Peer) postsOf(body string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.posts[body]
}

// probeCount is how many h2c prefaces the peer was sent.
func (p *http1Peer) probeCount() int64 {
	n := p.probes.Load()
	if p.uvicorn != nil {
		n += p.uvicorn.Probes()
	}
	return n
}

// startHTTP1Peer starts an HTTP/1.1-only peer: net/http's server without
// h2c, or with uvicorn set, one that answers the preface as uvicorn does
// (gymstandin.StartUvicorn).
func startHTTP1Peer(t *testing.T, uvicorn bool) *http1Peer {
	t.Helper()
	p := &http1Peer{posts: map[string]int{}}
	if uvicorn {
		p.uvicorn = gymstandin.StartUvicorn(t, p)
		p.url = p.uvicorn.URL
		return p
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	p.url = srv.URL
	return p
}

// hostState reports whether the client's pool sends addr's requests over
// HTTP/1.1 and how many h2c connections it holds to it.
func hostState(c *http.Client, url string) (http1 bool, conns int) {
	pool := c.Transport.(resendUnsent).next.(*h2cPool)
	pool.mu.Lock()
	defer pool.mu.Unlock()
	h := pool.hosts[url]
	if h == nil {
		return false, 0
	}
	return h.http1, len(h.conns)
}

func TestNewTransport_Protocols(t *testing.T) {
	for _, tc := range []struct {
		name        string
		opts        Options
		pool, http1 bool
	}{
		{"zero options speak HTTP/1.1", Options{}, false, true},
		{"H2C speaks h2c only", Options{H2C: true}, true, false},
		{"ProtocolH2C speaks h2c only", Options{Protocol: ProtocolH2C}, true, false},
		{"ProtocolAuto falls back to HTTP/1.1", Options{Protocol: ProtocolAuto}, true, true},
		{"Protocol wins over H2C", Options{Protocol: ProtocolAuto, H2C: true}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTransport(tc.opts)
			defer tr.CloseIdleConnections()
			pool, isPool := tr.(*h2cPool)
			_, isHTTP1 := tr.(*http.Transport)
			switch {
			case isPool != tc.pool:
				t.Errorf("transport %T, want the h2c pool: %v", tr, tc.pool)
			case isPool && (pool.http1 != nil) != tc.http1:
				t.Errorf("pool with an HTTP/1.1 fallback: %v, want %v", pool.http1 != nil, tc.http1)
			case !isPool && !isHTTP1:
				t.Errorf("transport %T, want *http.Transport", tr)
			}
		})
	}
}

// Ensure auto keeps our own servers, which speak both protocols on one port,
// on h2c: one multiplexed connection, no fallback.
func TestAuto_OurServerStaysH2C(t *testing.T) {
	var notH2, arrived atomic.Int64
	s := httpserver.New(httpserver.Config{Addr: "127.0.0.1:0"}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Add(1)
		if r.ProtoMajor != 2 {
			notH2.Add(1)
		}
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	}))
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve() }()
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	c := poolClient(t, Options{Protocol: ProtocolAuto})

	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			body := fmt.Sprintf(`{"row":%d}`, i)
			rep, err := Do(context.Background(), c, http.MethodPost, s.URL()+"/run", nil, []byte(body))
			if err != nil || rep.Status != 200 || string(rep.Body) != body {
				t.Errorf("Do = %+v, %v", rep, err)
			}
		})
	}
	wg.Wait()
	if arrived.Load() != 8 || notH2.Load() != 0 {
		t.Errorf("%d requests arrived, %d of them not over HTTP/2; want 8 over HTTP/2", arrived.Load(), notH2.Load())
	}
	if http1, conns := hostState(c, s.URL()); http1 || conns != 1 {
		t.Errorf("host marked HTTP/1.1: %v, %d h2c connections; want h2c on 1", http1, conns)
	}
}

// Ensure auto reaches an HTTP/1.1-only server, probing it once, and that a
// POST arrives exactly once: the probe is the pool's own handshake, never
// the request.
func TestAuto_HTTP1OnlyServer(t *testing.T) {
	for _, uvicorn := range []bool{false, true} {
		name := map[bool]string{false: "net/http without h2c", true: "uvicorn's answer to the preface"}[uvicorn]
		t.Run(name, func(t *testing.T) {
			p := startHTTP1Peer(t, uvicorn)
			c := poolClient(t, Options{Protocol: ProtocolAuto})
			for i := range 3 {
				body := fmt.Sprintf(`{"row":%d}`, i)
				rep, err := Do(context.Background(), c, http.MethodPost, p.url+"/run", nil, []byte(body))
				if err != nil || rep.Status != 200 || string(rep.Body) != body {
					t.Fatalf("POST %d: %+v, %v", i, rep, err)
				}
				if n := p.postsOf(body); n != 1 {
					t.Errorf("POST %d arrived %d times, want once", i, n)
				}
			}
			if n := p.probeCount(); n != 1 {
				t.Errorf("%d h2c prefaces reached the server, want 1 (the host is remembered)", n)
			}
			if p.notH1.Load() != 0 {
				t.Errorf("%d requests not over HTTP/1.1", p.notH1.Load())
			}
			if http1, conns := hostState(c, p.url); !http1 || conns != 0 {
				t.Errorf("host marked HTTP/1.1: %v, %d h2c connections; want marked, none", http1, conns)
			}
		})
	}
}

// Ensure a burst of first requests to a new HTTP/1.1 host waits for one
// probe and then all go over HTTP/1.1, each once.
func TestAuto_ConcurrentFirstRequestsProbeOnce(t *testing.T) {
	p := startHTTP1Peer(t, true)
	c := poolClient(t, Options{Protocol: ProtocolAuto})
	const requests = 32
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() {
			body := fmt.Sprintf(`{"row":%d}`, i)
			rep, err := Do(context.Background(), c, http.MethodPost, p.url+"/run", nil, []byte(body))
			if err != nil || rep.Status != 200 || string(rep.Body) != body {
				t.Errorf("POST %d: %+v, %v", i, rep, err)
			}
		})
	}
	wg.Wait()
	for i := range requests {
		if n := p.postsOf(fmt.Sprintf(`{"row":%d}`, i)); n != 1 {
			t.Errorf("POST %d arrived %d times, want once", i, n)
		}
	}
	if n := p.probeCount(); n != 1 {
		t.Errorf("%d h2c prefaces reached the server, want 1", n)
	}
}

// Ensure an h2c-only client fails at once against an HTTP/1.1 server with
// an error that says so: no handshake retries, no resends, nothing sent.
func TestH2COnly_HTTP1ServerFailsAtOnce(t *testing.T) {
	p := startHTTP1Peer(t, true)
	c := poolClient(t, Options{H2C: true})
	_, err := Do(context.Background(), c, http.MethodPost, p.url+"/run", nil, []byte(`{"row":1}`))
	if !errors.Is(err, h2client.ErrHTTP1Server) {
		t.Fatalf("err = %v, want ErrHTTP1Server", err)
	}
	if n := p.probeCount(); n != 1 {
		t.Errorf("%d h2c prefaces reached the server, want 1 (no retry can succeed)", n)
	}
	if n := p.postsOf(`{"row":1}`); n != 0 {
		t.Errorf("the POST arrived %d times, want never", n)
	}
}

// Ensure auto and h2c transports send an https:// address over HTTP/1.1
// with TLS when the server picks HTTP/1.1 by ALPN (net/http's test server
// without HTTP/2), verifying it against the configured CA, and remember
// the host.
func TestHTTPSServerChoosingHTTP1(t *testing.T) {
	for _, protocol := range []Protocol{ProtocolAuto, ProtocolH2C} {
		t.Run(map[Protocol]string{ProtocolAuto: "auto", ProtocolH2C: "h2c"}[protocol], func(t *testing.T) { testHTTPSServerChoosingHTTP1(t, protocol) })
	}
}

func testHTTPSServerChoosingHTTP1(t *testing.T, protocol Protocol) {
	files := tlstest.New(t)
	var posts, notH1 atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			posts.Add(1)
		}
		if r.ProtoMajor != 1 || r.TLS == nil {
			notH1.Add(1)
		}
		io.Copy(w, r.Body)
	}))
	conf, err := files.Server().ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	conf.NextProtos = []string{"http/1.1"}
	srv.TLS = conf
	srv.StartTLS()
	t.Cleanup(srv.Close)
	c := poolClient(t, Options{Protocol: protocol, HTTP: httpconf.Config{TLS: files.Client()}})
	for i := range 3 {
		body := fmt.Sprintf(`{"row":%d}`, i)
		rep, err := Do(context.Background(), c, http.MethodPost, srv.URL+"/run", nil, []byte(body))
		if err != nil || rep.Status != 200 || string(rep.Body) != body {
			t.Fatalf("Do = %+v, %v; want the body echoed", rep, err)
		}
	}
	if posts.Load() != 3 || notH1.Load() != 0 {
		t.Errorf("%d POSTs arrived, %d not over HTTP/1.1 with TLS; want 3, 0", posts.Load(), notH1.Load())
	}
	if http1, conns := hostState(c, srv.URL); !http1 || conns != 0 {
		t.Errorf("host marked HTTP/1.1: %v, %d h2 connections; want marked, none", http1, conns)
	}
}
