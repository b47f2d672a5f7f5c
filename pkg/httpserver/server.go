// Package httpserver is what every fleet server is built on: a Server with
// Listen/Serve/Close that speaks HTTP/1.1 and HTTP/2 without TLS on one port,
// a router with the fleet's middleware (recovery, metrics by route pattern,
// body limits, the /ng-rollout prefix), health and metrics routes, and the
// JSON request/reply helpers that map every error through apierror.
package httpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
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
	// MaxConcurrentStreams is the HTTP/2 streams one connection may carry.
	// Thousands of rollouts in flight share a few connections only when it is
	// large, but net/http's HTTP/2 write scheduler scans every open stream of
	// a connection for each frame it writes, so very large values make every
	// write slow once most streams sit idle (held calls). 2,000 per
	// connection keeps that scan short; clients open more connections, up to
	// their own bound (pkg/httpclient), instead of one per request.
	MaxConcurrentStreams int
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

// Server is one listening HTTP server.
type Server struct {
	cfg    Config
	srv    *http.Server
	ln     net.Listener
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu     sync.Mutex
	closed bool

	// active counts requests being served; idle is signalled when it drops
	// to zero while closing.
	active  atomic.Int64
	closing atomic.Bool
	idle    chan struct{}
}

// New returns a server for handler; call Listen, then Serve.
func New(cfg Config, handler http.Handler) *Server {
	cfg.withDefaults()
	ctx, cancel := context.WithCancelCause(context.Background())
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	s := &Server{cfg: cfg, ctx: ctx, cancel: cancel, idle: make(chan struct{}, 1)}
	s.srv = &http.Server{
		Handler:           s.track(handler),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		Protocols:         &protocols,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          cfg.MaxConcurrentStreams,
			MaxReceiveBufferPerConnection: DefaultConnReceiveWindow,
			// The protocol's least frame size, rather than net/http's 1 MiB:
			// a peer then sends a large body (a commit's or restore's, naming
			// every episode) in 16 KiB frames read through a 16 KiB buffer,
			// where its 512 KiB frames grew the connection's read buffer to
			// match, fresh memory for a process that has just started.
			MaxReadFrameSize: 16 << 10,
			// A protocol error a peer caused: most close a stream, some the
			// whole connection (and every stream on it).
			CountError: func(errType string) { cfg.Logger.Warn("http2 protocol error", "type", errType) },
		},
		// Handlers derive from the server's context, so Close cancels every
		// request still running.
		BaseContext: func(net.Listener) context.Context { return ctx },
		// What net/http reports here is a connection it closed or could not
		// serve (an HTTP/2 handshake timeout, a flood limit): warnings an
		// operator must see, since every stream on it failed.
		ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
	}
	return s
}

// Listen binds the address. After it returns, Addr and URL are known.
func (s *Server) Listen() error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.cfg.Addr, err)
	}
	s.mu.Lock()
	s.ln = ln
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

// URL is http://host:port of the bound address.
func (s *Server) URL() string { return "http://" + s.Addr() }

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
	err := s.srv.Serve(s.listener())
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
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
	defer s.closeListener()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultShutdownTimeout)
		defer cancel()
	}
	s.closing.Store(true)
	done := make(chan error, 1)
	go func() { done <- s.srv.Shutdown(ctx) }()
	var err error
	select {
	case err = <-done:
	case <-s.idleOrDone():
		// Nothing is in flight. The last replies may still be on their way
		// out of the connection buffers, so give them a moment, then drop
		// the idle connections rather than wait out HTTP/2's one-second
		// GOAWAY grace per client.
		select {
		case err = <-done:
		case <-time.After(idleCloseGrace):
			_ = s.srv.Close()
			err = <-done
			if errors.Is(err, http.ErrServerClosed) {
				err = nil
			}
		}
	}
	s.cancel(errors.New("server closed"))
	if err != nil {
		// Requests that outlived the grace period are cut off.
		_ = s.srv.Close()
		if errors.Is(err, context.DeadlineExceeded) {
			return nil
		}
	}
	return err
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

// track counts requests in flight, for Close.
func (s *Server) track(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.active.Add(1)
		defer func() {
			if s.active.Add(-1) == 0 && s.closing.Load() {
				select {
				case s.idle <- struct{}{}:
				default:
				}
			}
		}()
		h.ServeHTTP(w, r)
	})
}

// CloseNow cancels every request and closes every connection at once.
func (s *Server) CloseNow() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	defer s.closeListener()
	s.cancel(errors.New("server closed"))
	return s.srv.Close()
}
