package httpserver_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

// rawExchange sends parts, each in its own write, on a fresh connection to
// s and returns all the server sent until it closed.
func rawExchange(t *testing.T, s *serving, parts ...string) string {
	t.Helper()
	nc, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for _, p := range parts {
		if _, err := nc.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(nc)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the server neither replied in full nor closed within 10s; got %q", got)
	}
	return string(got)
}

// A connection opening with neither the HTTP/2 preface nor an HTTP/1
// request line is closed without a byte of reply (RFC 9113 §3.4) on the
// lean stack; net/http (the nethttp stack) answers it with an HTTP/1 400,
// its own behaviour, which a client speaking HTTP/2 reads as a broken
// frame and drops. HTTP/1 requests, whole or in pieces, are served as
// before on both.
func TestServer_ConnectionsThatAreNotHTTP(t *testing.T) {
	forStacks(t, func(t *testing.T, st httpconf.Stack) {
		s := startOn(t, st, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Connection", "close")
			io.WriteString(w, r.Proto)
		}))
		got := rawExchange(t, s, "INVALID CONNECTION PREFACE\r\n\r\n")
		switch {
		case st == httpconf.StackLean && got != "":
			t.Errorf("an invalid preface got %q, want the connection closed without a reply", got)
		case st == httpconf.StackNetHTTP && !strings.HasPrefix(got, "HTTP/1.1 400 "):
			t.Errorf("an invalid preface got %q, want net/http's 400", got)
		}
		if got := rawExchange(t, s, "PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n"); got != "" && !strings.HasPrefix(got, "HTTP/1.1 ") {
			t.Errorf("a preface gone wrong late got %q, want an HTTP/1 reply or none", got)
		}
		for name, parts := range map[string][]string{
			"whole":     {"GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
			"in pieces": {"G", "ET / HT", "TP/1.1\r", "\nHost: x\r\n\r\n"},
			"long line": {"GET /" + strings.Repeat("a", 20<<10) + " HTTP/1.1\r\nHost: x\r\n\r\n"},
		} {
			got := rawExchange(t, s, parts...)
			resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(got)), nil)
			if err != nil {
				t.Errorf("%s: reading the reply %q: %v", name, got, err)
				continue
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || string(body) != "HTTP/1.1" {
				t.Errorf("%s: %d %q, want 200 HTTP/1.1", name, resp.StatusCode, body)
			}
		}
	})
}
