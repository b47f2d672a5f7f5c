// Package h2ctest starts test servers that speak HTTP/1.1 and HTTP/2
// without TLS (h2c) on one port, as the fleet's servers do: stand-ins for
// a peer of the server under test.
package h2ctest

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// Start serves h on a new httptest server speaking HTTP/1.1 and h2c,
// closed when the test ends. configure, if given, adjusts the server's
// http.Server before it starts.
func Start(t testing.TB, h http.Handler, configure ...func(*http.Server)) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &p
	for _, c := range configure {
		c(srv.Config)
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}
