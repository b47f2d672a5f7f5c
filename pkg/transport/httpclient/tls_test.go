package httpclient

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/transport/h2client"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf/tlstest"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
)

// acceptCounter accepts connections on a loopback port, counting them, and
// hands each to handle.
func acceptCounter(t *testing.T, handle func(net.Conn)) (addr string, accepted *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = new(atomic.Int64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			handle(nc)
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String(), accepted
}

// Ensure a TLS connection that fails under its handshake (the server
// closed it) counts as a request never sent: the client tries again, and
// the error says it was not processed.
func TestTLS_HandshakeCutIsNotProcessed(t *testing.T) {
	files := tlstest.New(t)
	addr, accepted := acceptCounter(t, func(nc net.Conn) { nc.Close() })
	c := &http.Client{Transport: resendUnsent{
		next:  NewTransport(Options{H2C: true, HTTP: httpconf.Config{TLS: files.Client()}}),
		pause: func(int) time.Duration { return time.Millisecond },
	}}
	_, err := Do(context.Background(), c, http.MethodPost, "https://"+addr+"/run", nil, []byte(`{}`))
	if !errors.Is(err, h2client.ErrNotProcessed) {
		t.Fatalf("err = %v, want ErrNotProcessed", err)
	}
	if n := accepted.Load(); n < 2 {
		t.Errorf("%d connections, want the request sent again", n)
	}
}

// Ensure a certificate that does not verify is not retried: one
// connection, and an error that says why.
func TestTLS_UnverifiedServerIsNotRetried(t *testing.T) {
	files := tlstest.New(t)
	s := httpserver.New(httpserver.Config{Addr: "127.0.0.1:0", HTTP: httpconf.Config{TLS: files.Server()}}, http.NotFoundHandler())
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	var copies sync.WaitGroup
	t.Cleanup(copies.Wait) // last: the server's close ends the copies
	served := make(chan error, 1)
	go func() { served <- s.Serve() }()
	t.Cleanup(func() {
		s.Close(context.Background())
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	// A proxy in front of the server counts the connections.
	addr, accepted := acceptCounter(t, func(nc net.Conn) {
		up, err := net.Dial("tcp", s.Addr())
		if err != nil {
			nc.Close()
			return
		}
		copies.Go(func() { defer up.Close(); defer nc.Close(); copyConn(up, nc) })
		copies.Go(func() { copyConn(nc, up) })
	})
	c := &http.Client{Transport: resendUnsent{
		next:  NewTransport(Options{H2C: true, HTTP: httpconf.Config{TLS: tlstest.New(t).Client()}}),
		pause: func(int) time.Duration { return time.Millisecond },
	}}
	_, err := Do(context.Background(), c, http.MethodPost, "https://"+addr+"/run", nil, []byte(`{}`))
	if err == nil || !strings.Contains(err.Error(), "unknown authority") || errors.Is(err, h2client.ErrNotProcessed) {
		t.Fatalf("err = %v, want the certificate refused, not as a request to send again", err)
	}
	if n := accepted.Load(); n != 1 {
		t.Errorf("%d connections, want 1", n)
	}
}

// copyConn copies src to dst until either fails.
func copyConn(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
