package httpserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"time"

	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

// handshakeTLS runs the server side of a TLS handshake on nc, bounded by
// timeout, and reports whether the client chose HTTP/2 by ALPN. A client
// that spoke plain HTTP/1 to the port is told so, as net/http tells it, and
// nothing of its request is served.
func handshakeTLS(ctx context.Context, nc net.Conn, cfg *tls.Config, timeout time.Duration) (net.Conn, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tc := tls.Server(nc, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		var re tls.RecordHeaderError
		if errors.As(err, &re) && re.Conn != nil && looksLikeHTTP(re.RecordHeader[:]) {
			nc.SetWriteDeadline(time.Now().Add(timeout))
			_, _ = re.Conn.Write([]byte("HTTP/1.0 400 Bad Request\r\nConnection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"))
		}
		return nil, false, err
	}
	return tc, tc.ConnectionState().NegotiatedProtocol == httpconf.ALPNHTTP2, nil
}

// looksLikeHTTP reports whether a TLS record header's five bytes are the
// start of a plain HTTP/1 request or of HTTP/2's preface ("PRI *").
func looksLikeHTTP(hdr []byte) bool {
	for _, m := range []string{"GET /", "HEAD ", "POST ", "PUT /", "OPTIO", "DELET", "PATCH", "PRI *"} {
		if bytes.HasPrefix(hdr, []byte(m)) {
			return true
		}
	}
	return false
}
