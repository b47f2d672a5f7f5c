package httpserver_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf/tlstest"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
)

// startConfig listens with cfg (on 127.0.0.1:0) and serves handler until
// the end of the test.
func startConfig(t testing.TB, cfg httpserver.Config, handler http.Handler) *serving {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	s := &serving{Server: httpserver.New(cfg, handler), done: make(chan struct{})}
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

// protoHandler answers with the request's protocol version and " tls"
// when it came over TLS, and counts the requests it served.
func protoHandler(served *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		fmt.Fprintf(w, "%d.%d", r.ProtoMajor, r.ProtoMinor)
		if r.TLS != nil && r.TLS.HandshakeComplete {
			fmt.Fprint(w, " tls")
		}
	})
}

// tlsServerConfig is the configuration of a server on st serving TLS with
// files' certificate.
func tlsServerConfig(st httpconf.Stack, files tlstest.Files) httpserver.Config {
	return httpserver.Config{HTTP: httpconf.Config{Stack: st, TLS: files.Server()}}
}

// tlsClient is a client on st of protocol verifying files' CA, closed at
// the end of the test.
func tlsClient(t testing.TB, st httpconf.Stack, protocol httpclient.Protocol, files tlstest.Files) *http.Client {
	t.Helper()
	c := httpclient.New(httpclient.Options{Protocol: protocol, HTTP: httpconf.Config{Stack: st, TLS: files.Client()}})
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// Ensure a TLS listener serves HTTP/2 to the clients that offer "h2" by
// ALPN (the lean h2 client, from h2c and auto transports) and HTTP/1.1 to
// those that offer only "http/1.1", on one port; on either stack, to
// clients of either stack.
func TestTLS_ALPNChoosesTheProtocol(t *testing.T) {
	forStacks(t, testALPNChoosesTheProtocol)
}

func testALPNChoosesTheProtocol(t *testing.T, st httpconf.Stack) {
	files := tlstest.New(t)
	var served atomic.Int64
	s := startConfig(t, tlsServerConfig(st, files), protoHandler(&served))
	if !strings.HasPrefix(s.URL(), "https://") {
		t.Fatalf("URL() = %s, want https://", s.URL())
	}
	for _, tc := range []struct {
		name     string
		protocol httpclient.Protocol
		want     string
	}{
		{"h2c transport speaks h2", httpclient.ProtocolH2C, "2.0 tls"},
		{"auto transport speaks h2", httpclient.ProtocolAuto, "2.0 tls"},
		{"HTTP/1.1 transport", httpclient.ProtocolHTTP1, "1.1 tls"},
	} {
		for _, cst := range stacks {
			t.Run(string(cst)+" "+tc.name, func(t *testing.T) {
				c := tlsClient(t, cst, tc.protocol, files)
				for range 3 {
					if code, body := get(t, c, s.URL()+"/"); code != 200 || body != tc.want {
						t.Fatalf("got %d %q, want 200 %q", code, body, tc.want)
					}
				}
			})
		}
	}
	// What the listener offers, seen by a bare TLS client.
	roots, err := files.Client().ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	for _, offer := range [][]string{{"h2", "http/1.1"}, {"http/1.1"}} {
		conf := roots.Clone()
		conf.NextProtos = offer
		tc, err := tls.Dial("tcp", s.Addr(), conf)
		if err != nil {
			t.Fatalf("TLS dial offering %v: %v", offer, err)
		}
		if got := tc.ConnectionState().NegotiatedProtocol; got != offer[0] {
			t.Errorf("offering %v, the server chose %q; want %q", offer, got, offer[0])
		}
		if v := tc.ConnectionState().Version; v < tls.VersionTLS12 {
			t.Errorf("TLS version %x, want at least 1.2", v)
		}
		tc.Close()
	}
}

// Ensure a client verifying another CA refuses the server, saying why, and
// that no request reaches a handler.
func TestTLS_UnknownCAIsRefused(t *testing.T) {
	forStacks(t, testUnknownCAIsRefused)
}

func testUnknownCAIsRefused(t *testing.T, st httpconf.Stack) {
	files := tlstest.New(t)
	var served atomic.Int64
	s := startConfig(t, tlsServerConfig(st, files), protoHandler(&served))
	other := tlstest.New(t)
	for _, protocol := range []httpclient.Protocol{httpclient.ProtocolH2C, httpclient.ProtocolAuto, httpclient.ProtocolHTTP1} {
		for _, cst := range stacks {
			c := tlsClient(t, cst, protocol, other)
			_, err := httpclient.Do(context.Background(), c, http.MethodGet, s.URL()+"/", nil, nil)
			if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
				t.Errorf("%s client, protocol %d: err = %v, want the certificate refused as signed by an unknown authority", cst, protocol, err)
			}
		}
	}
	if n := served.Load(); n != 0 {
		t.Errorf("%d requests served, want none", n)
	}
}

// Ensure a TLS listener serves nothing in the clear: an HTTP/1 request is
// answered 400 (as net/http's TLS server answers it) and an h2c client
// fails, and neither reaches a handler.
func TestTLS_PlaintextIsRefused(t *testing.T) {
	forStacks(t, testPlaintextIsRefused)
}

func testPlaintextIsRefused(t *testing.T, st httpconf.Stack) {
	files := tlstest.New(t)
	var served atomic.Int64
	s := startConfig(t, tlsServerConfig(st, files), protoHandler(&served))
	plain := "http://" + s.Addr() + "/"
	code, body := get(t, newClient(t, false), plain)
	if code != http.StatusBadRequest || !strings.Contains(body, "HTTPS server") {
		t.Errorf("HTTP/1 in the clear: %d %q, want 400 naming the HTTPS server", code, body)
	}
	if _, err := httpclient.Do(context.Background(), newClient(t, true), http.MethodGet, plain, nil, nil); err == nil {
		t.Error("h2c in the clear succeeded, want an error")
	}
	if n := served.Load(); n != 0 {
		t.Errorf("%d requests served, want none", n)
	}
}

// Ensure a client that never completes its handshake is dropped after
// ReadHeaderTimeout, and that while it waits the listener goes on serving
// others: the handshake runs on the connection's goroutine, not the accept
// loop's.
func TestTLS_HandshakeTimeout(t *testing.T) {
	forStacks(t, testHandshakeTimeout)
}

func testHandshakeTimeout(t *testing.T, st httpconf.Stack) {
	files := tlstest.New(t)
	var served atomic.Int64
	cfg := tlsServerConfig(st, files)
	cfg.ReadHeaderTimeout = 200 * time.Millisecond
	quick := startConfig(t, cfg, protoHandler(&served))
	silent, err := net.Dial("tcp", quick.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	silent.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := silent.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		t.Errorf("a silent connection read %v, want the server to close it", err)
	}

	cfg.ReadHeaderTimeout = time.Hour
	patient := startConfig(t, cfg, protoHandler(&served))
	for range 4 {
		nc, err := net.Dial("tcp", patient.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := httpclient.Do(ctx, tlsClient(t, st, httpclient.ProtocolH2C, files), http.MethodGet, patient.URL()+"/", nil, nil)
	if err != nil || rep.Status != 200 {
		t.Fatalf("request beside silent handshakes: %+v, %v", rep, err)
	}
}

// isReset reports a connection reset by the peer.
func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

// Ensure Listen fails on a certificate it cannot load, naming the key.
func TestTLS_ListenErrorNamesTheKey(t *testing.T) {
	forStacks(t, func(t *testing.T, st httpconf.Stack) {
		files := tlstest.New(t)
		missing := files.Server()
		missing.CertFile += ".missing"
		s := httpserver.New(httpserver.Config{Addr: "127.0.0.1:0", HTTP: httpconf.Config{Stack: st, TLS: missing}}, http.NotFoundHandler())
		err := s.Listen()
		if err == nil || !strings.Contains(err.Error(), "http.tls.cert_file") || !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("Listen = %v, want a missing http.tls.cert_file", err)
		}
		_ = s.CloseNow()
	})
}

// Ensure an HTTP/1.1 client over TLS keeps its connection across requests
// on either stack.
func TestTLS_HTTP1KeepsTheConnection(t *testing.T) {
	forStacks(t, testHTTP1KeepsTheConnection)
}

func testHTTP1KeepsTheConnection(t *testing.T, st httpconf.Stack) {
	files := tlstest.New(t)
	var served atomic.Int64
	s := startConfig(t, tlsServerConfig(st, files), protoHandler(&served))
	roots, err := files.Client().ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	roots.NextProtos = []string{"http/1.1"}
	tc, err := tls.Dial("tcp", s.Addr(), roots)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	br := bufio.NewReader(tc)
	for i := range 2 {
		fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", s.Addr())
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "1.1 tls" {
			t.Fatalf("request %d: %d %q, want 200 \"1.1 tls\"", i, resp.StatusCode, b)
		}
	}
}
