package httpclient

import (
	"context"
	"io"
	"net/http"
	"testing"
)

// BenchmarkRoundTripKnownH2CHost measures a request to a host the pool
// already holds an h2c connection to: the hot path between our servers,
// which ProtocolAuto must not make dearer than h2c only.
func BenchmarkRoundTripKnownH2CHost(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts Options
	}{
		{"h2c", Options{H2C: true}},
		{"auto", Options{Protocol: ProtocolAuto}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			url, _ := h2cServer(b, nil, 100, answering())
			tr := NewTransport(bc.opts)
			defer tr.CloseIdleConnections()
			req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url+"/x", nil)
			if err != nil {
				b.Fatal(err)
			}
			roundTrip := func() {
				resp, err := tr.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			roundTrip() // opens the connection
			b.ReportAllocs()
			for b.Loop() {
				roundTrip()
			}
		})
	}
}
