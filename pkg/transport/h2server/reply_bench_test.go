package h2server

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/transport/h2client"
)

// BenchmarkLargeReply serves one reply written in a single Write, the size
// of a generation-cut receipt for 100,000 calls, to h2client. The bytes
// allocated per reply are the figure to watch: the server's side of it
// copies nothing whole.
func BenchmarkLargeReply(b *testing.B) {
	body := make([]byte, 72<<20)
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	s := start(b, Config{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	})})
	var d net.Dialer
	c, err := h2client.Dial(context.Background(), d.DialContext, s.addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	req, err := http.NewRequest(http.MethodGet, s.url+"/receipt", nil)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		resp, err := c.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != int64(len(body)) {
			b.Fatalf("read %d of %d bytes: %v", n, len(body), err)
		}
	}
}
