package httpserver

import (
	"context"
	"errors"
	"net"
	"net/http"

	"github.com/gymfleet/gymfleet/pkg/transport/h2server"
)

// useNetHTTP2 makes srv serve h2c (prior knowledge) next to HTTP/1.1 with
// net/http's own HTTP/2, with the lean stack's limits where net/http has
// the same knob, so the two stacks are compared on equal terms. A TLS
// listener serves HTTP/2 over TLS instead, chosen by ALPN.
func (s *Server) useNetHTTP2(protocols *http.Protocols) {
	if s.cfg.HTTP.TLS.Serving() {
		protocols.SetHTTP2(true)
	} else {
		protocols.SetUnencryptedHTTP2(true)
	}
	s.srv.HTTP2 = &http.HTTP2Config{
		MaxConcurrentStreams:          s.cfg.MaxConcurrentStreams,
		MaxReceiveBufferPerConnection: DefaultConnReceiveWindow,
		MaxReceiveBufferPerStream:     h2server.DefaultStreamReceiveWindow,
		MaxReadFrameSize:              16 << 10,
	}
	// Header lists are bounded as the lean stack bounds them.
	s.srv.MaxHeaderBytes = h2server.DefaultMaxHeaderListSize
}

// serveNetHTTP serves the listener with net/http alone (the nethttp
// stack), until Close; over TLS with the configuration Listen loaded, the
// handshake on each connection's goroutine bounded by ReadHeaderTimeout
// (net/http's own rule).
func (s *Server) serveNetHTTP() error {
	var err error
	if s.tls != nil {
		s.srv.TLSConfig = s.tls
		err = s.srv.ServeTLS(s.listener(), "", "")
	} else {
		err = s.srv.Serve(s.listener())
	}
	// Close closes the listener before net/http learns of the shutdown, so
	// Serve may report the closed listener rather than ErrServerClosed.
	if errors.Is(err, http.ErrServerClosed) || s.isClosed() {
		return nil
	}
	return err
}

// shutdownNetHTTP shuts srv down, its HTTP/2 connections too. Close has
// closed the listener already, which net/http would report.
func (s *Server) shutdownNetHTTP(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
