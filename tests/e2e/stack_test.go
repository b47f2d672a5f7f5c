package e2e

import (
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

// TestHTTPStack checks that every server of the fleet runs the pass's HTTP
// stack, by the one answer the two tell apart: a connection opening with
// neither HTTP/2's preface nor an HTTP/1 request line is closed without a
// reply by the lean stack (RFC 9113 §3.4) and answered 400 by net/http.
func TestHTTPStack(t *testing.T) {
	f := startFleet(t, nil)
	for _, e := range f.Cfg.Endpoints("") {
		u, err := url.Parse(e.URL)
		if err != nil {
			t.Fatal(err)
		}
		nc, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(nc, "INVALID CONNECTION PREFACE\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		nc.SetReadDeadline(time.Now().Add(30 * time.Second))
		got, err := io.ReadAll(nc)
		nc.Close()
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("%s neither answered nor closed", e.Name)
		}
		lean := len(got) == 0
		nethttp := strings.HasPrefix(string(got), "HTTP/1.1 400 ")
		switch want := httpConf().EffectiveStack(); {
		case want == httpconf.StackLean && !lean, want == httpconf.StackNetHTTP && !nethttp:
			t.Errorf("%s answered %q: not the %s stack", e.Name, got, want)
		}
	}
}
