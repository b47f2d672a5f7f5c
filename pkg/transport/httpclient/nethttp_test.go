package httpclient

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
)

var netHTTP = httpconf.Config{Stack: httpconf.StackNetHTTP}

// Ensure the nethttp stack builds net/http's transports: h2c only, HTTP/1.1,
// and ProtocolAuto's probing pair.
func TestNewTransport_NetHTTP(t *testing.T) {
	for _, tc := range []struct {
		name      string
		opts      Options
		auto, h2c bool
	}{
		{"zero options speak HTTP/1.1", Options{HTTP: netHTTP}, false, false},
		{"H2C speaks h2c only", Options{H2C: true, HTTP: netHTTP}, false, true},
		{"ProtocolAuto probes", Options{Protocol: ProtocolAuto, HTTP: netHTTP}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTransport(tc.opts)
			defer tr.CloseIdleConnections()
			if _, ok := tr.(*netAuto); ok != tc.auto {
				t.Fatalf("transport %T, want netAuto: %v", tr, tc.auto)
			}
			if tc.auto {
				return
			}
			if bs, ok := tr.(bySchemes); ok {
				tr = bs.plain // h2c for http://; bs.secure takes https://
			}
			if g, ok := tr.(gateTransport); ok {
				tr = g.next
			}
			ht, ok := tr.(*http.Transport)
			if !ok {
				t.Fatalf("transport %T, want *http.Transport", tr)
			}
			if got := ht.Protocols.UnencryptedHTTP2(); got != tc.h2c || ht.Protocols.HTTP1() == tc.h2c {
				t.Errorf("protocols %v, want h2c only: %v", ht.Protocols, tc.h2c)
			}
		})
	}
}

// startServer serves h with httpserver on stack st until the test ends.
func startServer(t *testing.T, st httpconf.Stack, h http.Handler) string {
	t.Helper()
	s := httpserver.New(httpserver.Config{Addr: "127.0.0.1:0", HTTP: httpconf.Config{Stack: st}}, h)
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
	return s.URL()
}

// Ensure the nethttp client speaks h2c to our servers on either stack:
// ProtocolAuto's probe finds h2c, and every request goes over HTTP/2.
func TestNetHTTP_OurServersSpeakH2C(t *testing.T) {
	for _, st := range []httpconf.Stack{httpconf.StackLean, httpconf.StackNetHTTP} {
		for _, proto := range []Protocol{ProtocolH2C, ProtocolAuto} {
			t.Run(fmt.Sprintf("server %s protocol %d", st, proto), func(t *testing.T) {
				h := answering()
				url := startServer(t, st, h)
				c := poolClient(t, Options{Protocol: proto, HTTP: netHTTP})
				var wg sync.WaitGroup
				for i := range 8 {
					wg.Go(func() {
						body := fmt.Sprintf(`{"row":%d}`, i)
						rep, err := Do(context.Background(), c, http.MethodPost, url+"/run", nil, []byte(body))
						if err != nil || rep.Status != 200 || string(rep.Body) != body {
							t.Errorf("Do = %+v, %v", rep, err)
						}
					})
				}
				wg.Wait()
				if h.arrived.Load() != 8 || h.notH2.Load() != 0 {
					t.Errorf("%d requests arrived, %d not over HTTP/2; want 8 over HTTP/2", h.arrived.Load(), h.notH2.Load())
				}
			})
		}
	}
}

// Ensure ProtocolAuto on the nethttp stack reaches an HTTP/1.1-only server
// (net/http without h2c, and uvicorn's answer to the preface), probing it
// once for a burst of first requests, and that every POST arrives exactly
// once over HTTP/1.1: the probe carries no request.
func TestNetHTTPAuto_HTTP1OnlyServer(t *testing.T) {
	for _, uvicorn := range []bool{false, true} {
		name := map[bool]string{false: "net/http without h2c", true: "uvicorn's answer to the preface"}[uvicorn]
		t.Run(name, func(t *testing.T) {
			p := startHTTP1Peer(t, uvicorn)
			c := poolClient(t, Options{Protocol: ProtocolAuto, HTTP: netHTTP})
			const requests = 16
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
				t.Errorf("%d h2c prefaces reached the server, want 1 (the host is remembered)", n)
			}
			if p.notH1.Load() != 0 {
				t.Errorf("%d requests not over HTTP/1.1", p.notH1.Load())
			}
		})
	}
}

// Ensure a probe that cannot connect fails the request with a dial error,
// which resendUnsent sends again, and is forgotten: once the server is up
// the host is probed again and served.
func TestNetHTTPAuto_FailedProbeIsRetried(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: the dial is refused
	tr := NewTransport(Options{Protocol: ProtocolAuto, HTTP: netHTTP}).(*netAuto)
	t.Cleanup(tr.CloseIdleConnections)
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
	_, err = tr.RoundTrip(req)
	if err == nil || !neverProcessed(err) {
		t.Fatalf("RoundTrip to a closed port = %v, want a dial error resendUnsent sends again", err)
	}
	tr.mu.Lock()
	remembered := len(tr.hosts)
	tr.mu.Unlock()
	if remembered != 0 {
		t.Errorf("a failed probe is remembered for %d hosts, want none", remembered)
	}

	var arrived atomic.Int64
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening again on %s: %v", addr, err)
	}
	// HTTP/1.1 only: net/http hands the probe's preface line to the
	// handler as a PRI request, which is not counted.
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "PRI" {
			arrived.Add(1)
		}
	})}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); <-done })
	req, _ = http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("RoundTrip once the server is up: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || arrived.Load() != 1 {
		t.Errorf("status %d after %d requests arrived, want 200 after 1", resp.StatusCode, arrived.Load())
	}
}

// Ensure an h2c-only client of the nethttp stack fails against an
// HTTP/1.1-only server without its POST reaching the handler: the server
// reads net/http's preface as a request it refuses, and what follows as
// garbage.
func TestNetHTTPH2COnly_HTTP1ServerFails(t *testing.T) {
	p := startHTTP1Peer(t, true)
	c := poolClient(t, Options{H2C: true, HTTP: netHTTP})
	if _, err := Do(context.Background(), c, http.MethodPost, p.url+"/run", nil, []byte(`{"row":1}`)); err == nil {
		t.Fatal("an h2c-only POST to an HTTP/1.1 server succeeded")
	}
	if n := p.postsOf(`{"row":1}`); n != 0 {
		t.Errorf("the POST arrived %d times, want never", n)
	}
}

// Ensure net/http's h2c transport reports a connection it could not open
// as the dial error resendUnsent sends again, as the lean pool does.
func TestNetHTTPH2C_DialErrorIsResent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: the dial is refused
	tr := NewTransport(Options{H2C: true, HTTP: netHTTP})
	t.Cleanup(tr.CloseIdleConnections)
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/run", nil)
	if _, err := tr.RoundTrip(req); err == nil || !neverProcessed(err) {
		t.Fatalf("RoundTrip to a closed port = %v, want a dial error resendUnsent sends again", err)
	}
}
