// Package httpserver is what every fleet server is built on: a Server with
// Listen/Serve/Close that speaks HTTP/1.1 (net/http) and HTTP/2 (pkg/transport/h2server,
// for the calls between our servers; or net/http's own with http.stack
// nethttp, the baseline it is measured against) on one port, without TLS
// (h2c) on one host or over TLS, HTTP/2 chosen by ALPN, between hosts,
// a router with the fleet's middleware (recovery, metrics by route pattern,
// body limits, the /ng-rollout prefix), health and metrics routes, and the
// JSON request/reply helpers that map every error through apierror.
package httpserver

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gymfleet/gymfleet/pkg/transport/h2server"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

// Defaults for Config.
const (
	DefaultReadHeaderTimeout    = 10 * time.Second
	DefaultIdleTimeout          = 5 * time.Minute
	DefaultShutdownTimeout      = 10 * time.Second
	DefaultMaxConcurrentStreams = 2000
	// DefaultConnReceiveWindow is the HTTP/2 flow-control window of a whole
	// connection. Thousands of small request bodies share it; at the default
	// 1 MiB every window update wakes every stream waiting for room.
	DefaultConnReceiveWindow = 4<<20 - 1
	// idleCloseGrace is how long Close lets finished replies drain before it
	// drops idle connections.
	idleCloseGrace = 100 * time.Millisecond
)

// Config configures a Server.
type Config struct {
	// Addr is host:port; port 0 picks a free one (see Server.Addr).
	Addr string
	// Logger receives the server's own errors.
	Logger *slog.Logger
	// ReadHeaderTimeout bounds reading a request's headers. There is no write
	// timeout: generations and held calls legitimately take long, and each
	// handler bounds its own work with its request's context.
	ReadHeaderTimeout time.Duration
	IdleTimeout       time.Duration
	// MaxConcurrentStreams is the HTTP/2 streams one connection may carry:
	// thousands of rollouts in flight share a few connections (clients open
	// more, up to their own bound in pkg/transport/httpclient, rather than one per
	// request).
	MaxConcurrentStreams int
	// HTTP is the process's http: section: which HTTP stack serves (lean
	// or nethttp) and TLS.
	HTTP httpconf.Config
}

func (c *Config) withDefaults() {
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxConcurrentStreams == 0 {
		c.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Server is one listening HTTP server. On the lean stack it reads the first
// bytes of every connection it accepts: those opening with the HTTP/2
// preface are served by h2, the rest by srv (HTTP/1.1). On the nethttp
// stack srv serves the listener itself, both protocols.
type Server struct {
	cfg    Config
	srv    *http.Server
	h2     *h2server.Server // nil on the nethttp stack
	h1     *connQueue       // srv's listener on the lean stack
	ln     net.Listener
	ctx    context.Context
	cancel context.CancelCauseFunc

	// tls is the listener's TLS configuration, loaded by Listen; nil when
	// it serves h2c and HTTP/1.1 in the clear.
	tls *tls.Config

	mu     sync.Mutex
	closed bool

	// active counts requests being served; idle is signalled when it drops
	// to zero while closing.
	active  atomic.Int64
	closing atomic.Bool
	idle    chan struct{}
	// conns are the goroutines of connections being sniffed or served
	// over HTTP/2.
	conns sync.WaitGroup
}

// New returns a server for handler; call Listen, then Serve.
func New(cfg Config, handler http.Handler) *Server {
	cfg.withDefaults()
	ctx, cancel := context.WithCancelCause(context.Background())
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	s := &Server{cfg: cfg, ctx: ctx, cancel: cancel, idle: make(chan struct{}, 1), h1: newConnQueue()}
	tracked := s.track(handler)
	s.srv = &http.Server{
		Handler:           tracked,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		Protocols:         &protocols,
		// Handlers derive from the server's context, so Close cancels every
		// request still running.
		BaseContext: func(net.Listener) context.Context { return ctx },
		// What net/http reports here is a connection it closed or could not
		// serve: warnings an operator must see.
		ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}
	if cfg.HTTP.EffectiveStack() == httpconf.StackNetHTTP {
		s.h1 = nil
		s.useNetHTTP2(&protocols)
		return s
	}
	s.h2 = h2server.New(h2server.Config{
		Handler:              tracked,
		BaseContext:          ctx,
		Logger:               cfg.Logger,
		MaxConcurrentStreams: uint32(cfg.MaxConcurrentStreams),
		ConnReceiveWindow:    DefaultConnReceiveWindow,
		// The protocol's least frame size: a peer then sends a large body
		// (a commit's or restore's, naming every episode) in 16 KiB frames
		// read through a 32 KiB buffer.
		MaxReadFrameSize: 16 << 10,
		PrefaceTimeout:   cfg.ReadHeaderTimeout,
		IdleTimeout:      cfg.IdleTimeout,
	})
	return s
}

// Listen loads the TLS certificate when the server serves TLS and binds
// the address. After it returns, Addr and URL are known.
func (s *Server) Listen() error {
	var tc *tls.Config
	if s.cfg.HTTP.TLS.Serving() {
		var err error
		if tc, err = s.cfg.HTTP.TLS.ServerConfig(); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.cfg.Addr, err)
	}
	s.mu.Lock()
	s.ln = ln
	s.tls = tc
	s.mu.Unlock()
	return nil
}

// listener is the bound listener, or nil before Listen.
func (s *Server) listener() net.Listener {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ln
}

// closeListener closes the listener: http.Server closes only the listeners
// it serves, so one that was bound but never served would keep its port.
func (s *Server) closeListener() {
	if ln := s.listener(); ln != nil {
		_ = ln.Close() // already closed when Serve ran
	}
}

// Addr is the bound host:port.
func (s *Server) Addr() string {
	ln := s.listener()
	if ln == nil {
		return s.cfg.Addr
	}
	return ln.Addr().String()
}

// URL is http://host:port of the bound address, https:// when the server
// serves TLS.
func (s *Server) URL() string {
	if s.cfg.HTTP.TLS.Serving() {
		return "https://" + s.Addr()
	}
	return "http://" + s.Addr()
}

// Context is cancelled when the server closes. Background work owned by the
// server derives from it.
func (s *Server) Context() context.Context { return s.ctx }

// Serve serves until Close. It returns nil after a Close.
func (s *Server) Serve() error {
	if s.listener() == nil {
		if err := s.Listen(); err != nil {
			return err
		}
	}
	if s.h2 == nil {
		return s.serveNetHTTP()
	}
	var h1 sync.WaitGroup
	h1.Go(func() { s.srv.Serve(s.h1) }) // returns when h1 closes
	err := s.accept(s.listener())
	s.h1.Close()
	h1.Wait()
	return err
}

// accept hands every connection to a goroutine that tells its protocol,
// until the listener closes. Running out of files or memory is waited
// out, as net/http does, rather than ending the server.
func (s *Server) accept(ln net.Listener) error {
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err == nil {
			delay = 0
			s.conns.Go(func() { s.serveConn(nc) })
			continue
		}
		if s.isClosed() {
			return nil
		}
		if !transientAcceptError(err) {
			return fmt.Errorf("accepting on %s: %w", s.Addr(), err)
		}
		delay = min(max(2*delay, 5*time.Millisecond), time.Second)
		s.cfg.Logger.Warn("accept failed; retrying", "err", err, "in", delay)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-s.ctx.Done():
			t.Stop()
			return nil
		}
	}
}

// transientAcceptError reports whether an Accept error passes on its own.
func transientAcceptError(err error) bool {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED} {
		if errors.Is(err, errno) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// serveConn reads the connection's first bytes (or, on TLS, completes the
// handshake and reads ALPN's choice) and serves it over HTTP/2 or hands it
// to net/http. The handshake runs here, not in the accept loop, so a slow
// client delays only its own connection.
func (s *Server) serveConn(nc net.Conn) {
	stop := context.AfterFunc(s.ctx, func() { nc.Close() }) // a sniff outliving Close
	var conn net.Conn
	var h2 bool
	var err error
	if s.tls != nil {
		conn, h2, err = handshakeTLS(s.ctx, nc, s.tls, s.cfg.ReadHeaderTimeout)
	} else {
		conn, h2, err = sniff(nc, s.cfg.ReadHeaderTimeout)
	}
	stop()
	if err != nil {
		nc.Close()
		return
	}
	if h2 {
		s.h2.ServeConn(conn)
		return
	}
	if !s.h1.push(conn) {
		conn.Close()
	}
}

// Close stops accepting, waits up to the context's deadline (or
// DefaultShutdownTimeout) for requests to finish, then cancels the rest.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.closeListener()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultShutdownTimeout)
		defer cancel()
	}
	s.closing.Store(true)
	done := make(chan error, 1)
	go func() { done <- s.shutdown(ctx) }()
	var err error
	select {
	case err = <-done:
	case <-s.idleOrDone():
		// Nothing is in flight. The last replies may still be on their way
		// out of the connection buffers, so give them a moment, then drop
		// the idle connections rather than wait out clients that keep
		// theirs open.
		select {
		case err = <-done:
		case <-time.After(idleCloseGrace):
			s.closeConns()
			err = <-done
			if errors.Is(err, http.ErrServerClosed) {
				err = nil
			}
		}
	}
	s.cancel(errors.New("server closed"))
	if err != nil {
		// Requests that outlived the grace period are cut off.
		s.closeConns()
		if errors.Is(err, context.DeadlineExceeded) {
			return nil
		}
		return err
	}
	// Every connection has closed: their goroutines are ending.
	s.conns.Wait()
	return nil
}

// shutdown closes both protocols' connections as their requests finish.
func (s *Server) shutdown(ctx context.Context) error {
	if s.h2 == nil {
		return s.shutdownNetHTTP(ctx)
	}
	var h2 sync.WaitGroup
	var h2Err error
	h2.Go(func() { h2Err = s.h2.Shutdown(ctx) })
	err := s.srv.Shutdown(ctx)
	h2.Wait()
	return cmp.Or(err, h2Err)
}

// closeConns closes every connection at once.
func (s *Server) closeConns() {
	if s.h2 != nil {
		s.h2.Close()
	}
	_ = s.srv.Close()
}

// idleOrDone returns a channel closed once no request is in flight.
func (s *Server) idleOrDone() <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		for s.active.Load() > 0 {
			select {
			case <-s.idle:
			case <-s.ctx.Done():
				return
			}
		}
	}()
	return ch
}

// track counts requests in flight, for Close, and gives each its
// exchange: a parked request (Park) counts until it has ended.
func (s *Server) track(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.active.Add(1)
		ex := &exchange{ResponseWriter: w}
		returned := false
		defer func() {
			if !returned { // a panic: the stack ends the request
				s.requestDone()
			}
		}()
		h.ServeHTTP(ex, r)
		returned = true
		if ex.afterHandler(func(any) { s.requestDone() }) {
			ex.returned()
			return
		}
		s.requestDone()
	})
}

// requestDone counts a request's end.
func (s *Server) requestDone() {
	if s.active.Add(-1) == 0 && s.closing.Load() {
		select {
		case s.idle <- struct{}{}:
		default:
		}
	}
}

// CloseNow cancels every request and closes every connection at once.
func (s *Server) CloseNow() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.closeListener()
	s.cancel(errors.New("server closed"))
	s.closeConns()
	return nil
}
