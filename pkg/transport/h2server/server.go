// Package h2server serves HTTP/2 without TLS (prior knowledge) for the
// calls between our own servers, built so that a request waiting in its
// handler holds its handler's goroutine and the request, and little else.
//
// net/http's HTTP/2 server gives every running handler a 4 KiB response
// buffer (http2responseWriterState's bufio.Writer) for as long as it runs,
// and per-stream state around it, in each of the environment, agent and
// model servers for every rollout held at a model call. Here a
// reply is buffered only from the handler's first write, in a buffer sized
// to what it writes, and the stream's state is a few hundred bytes.
//
// It speaks the subset of RFC 9113 a server for Go's HTTP/2 clients (ours,
// pkg/transport/h2client, and net/http's) needs: request and reply bodies
// flow-controlled both ways, replies streamed with Flush, cancellation
// (RST_STREAM) reaching the handler's context, a stream limit, graceful
// GOAWAY, PING and SETTINGS answered, and an idle timeout. It does not do
// server push, priorities, trailers (a request's are read and dropped; a
// reply has none), HTTP/1.1 or TLS itself: pkg/transport/httpserver hands it the
// connections that open with the HTTP/2 preface, or the TLS connections
// whose ALPN chose "h2" (their requests carry the TLS state), and the rest
// to net/http.
//
// A client's cost is bounded as x/net's server bounds it, or tighter (see
// guard.go): per connection, the decoded headers its streams hold, the
// reply bytes held back, and the streams waiting for a window it does not
// grant; a write deadline, a request body read timeout, and a limit on
// control frames queued for a client that does not read them.
//
// Frames are judged against stream states as x/net's server judges them,
// which h2spec checks against every server kind (tests/e2e): a stream id
// at most the highest one opened that is not in the connection's streams
// is closed, so a closed stream costs no record.
package h2server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/gymfleet/gymfleet/pkg/transport/h2frame"
)

// Defaults for Config.
const (
	DefaultMaxConcurrentStreams = 1000
	DefaultStreamReceiveWindow  = 1 << 20
	DefaultConnReceiveWindow    = 4<<20 - 1
	DefaultMaxReadFrameSize     = 16 << 10
	DefaultMaxHeaderListSize    = 1 << 20
	DefaultPrefaceTimeout       = 10 * time.Second
	// DefaultMaxBufferedReply is how much of a reply is kept back before its
	// headers are sent: a reply its handler writes whole within it goes out
	// with its Content-Length, which lets the client size its buffer.
	DefaultMaxBufferedReply = 64 << 10
	// DefaultMaxConnHeaderBytes is the header budget of a connection: room
	// for every stream of a connection at DefaultMaxConcurrentStreams with
	// a few KiB of headers each, and for any one request at
	// DefaultMaxHeaderListSize.
	DefaultMaxConnHeaderBytes = 4 << 20
	// DefaultMaxConnBufferedReply is the budget of reply bytes a connection
	// holds back (see MaxBufferedReply) for its streams together.
	DefaultMaxConnBufferedReply = 4 << 20
	// DefaultMaxStalledStreams: see Config.MaxStalledStreams.
	DefaultMaxStalledStreams = 100
	// DefaultWriteTimeout and DefaultBodyReadTimeout: see Config.
	DefaultWriteTimeout    = 30 * time.Second
	DefaultBodyReadTimeout = 30 * time.Second
)

// Config configures a Server. Zero values take the defaults.
type Config struct {
	Handler http.Handler
	// BaseContext is the parent of every request's context; nil means
	// context.Background().
	BaseContext context.Context
	// Logger receives handler panics, connections ended by a write that
	// stalled for the write timeout, and connections ended by a protocol
	// error.
	Logger *slog.Logger
	// MaxConcurrentStreams is the streams one connection may have open
	// (SETTINGS_MAX_CONCURRENT_STREAMS).
	MaxConcurrentStreams uint32
	// StreamReceiveWindow and ConnReceiveWindow bound the request bytes a
	// client may send ahead of the handlers reading them, per stream and
	// per connection.
	StreamReceiveWindow int32
	ConnReceiveWindow   int32
	// MaxReadFrameSize is the largest frame a client may send.
	MaxReadFrameSize uint32
	// MaxHeaderListSize bounds a request's decoded header block; a larger
	// one gets 431.
	MaxHeaderListSize uint32
	// PrefaceTimeout bounds the wait for a client's connection preface.
	PrefaceTimeout time.Duration
	// IdleTimeout closes a connection with no open stream for this long;
	// 0 never does.
	IdleTimeout time.Duration
	// MaxBufferedReply: see DefaultMaxBufferedReply.
	MaxBufferedReply int
	// MaxConnHeaderBytes bounds the decoded headers, counted as
	// MaxHeaderListSize counts them (32 bytes more per field), of the
	// requests a connection's streams hold until their handlers return: a
	// stream beyond it is refused (RST_STREAM REFUSED_STREAM), but for a
	// connection's only stream.
	MaxConnHeaderBytes int64
	// MaxConnBufferedReply bounds the reply bytes a connection's handlers
	// hold back together: past it a reply is sent as it is written, its
	// handler waiting for the client's window.
	MaxConnBufferedReply int
	// MaxStalledStreams bounds the streams of a connection whose client
	// grants no window: while that many wait for window, or the client's
	// initial stream window is 0 and that many are open, new streams are
	// refused (REFUSED_STREAM). A handler waiting for window holds what it
	// built its reply from, so this bounds what a client that never grants
	// window costs, below what MaxConcurrentStreams allows.
	MaxStalledStreams int
	// WriteTimeout bounds the time a write to the socket goes without a
	// byte taken by the client, and a stream's wait for the client to
	// grant window: the connection fails, or the stream is reset.
	// Negative: none.
	WriteTimeout time.Duration
	// BodyReadTimeout fails a handler's reads of a request body of which
	// nothing arrived for this long while the client could send. Negative:
	// none.
	BodyReadTimeout time.Duration
}

func (c *Config) withDefaults() {
	if c.Handler == nil {
		c.Handler = http.NotFoundHandler()
	}
	if c.BaseContext == nil {
		c.BaseContext = context.Background()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxConcurrentStreams == 0 {
		c.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if c.StreamReceiveWindow <= 0 {
		c.StreamReceiveWindow = DefaultStreamReceiveWindow
	}
	if c.ConnReceiveWindow < h2frame.InitialWindow {
		c.ConnReceiveWindow = DefaultConnReceiveWindow
	}
	if c.MaxReadFrameSize < minMaxFrameSize || c.MaxReadFrameSize > maxMaxFrameSize {
		c.MaxReadFrameSize = DefaultMaxReadFrameSize
	}
	if c.MaxHeaderListSize == 0 {
		c.MaxHeaderListSize = DefaultMaxHeaderListSize
	}
	if c.PrefaceTimeout == 0 {
		c.PrefaceTimeout = DefaultPrefaceTimeout
	}
	if c.MaxBufferedReply <= 0 {
		c.MaxBufferedReply = DefaultMaxBufferedReply
	}
	if c.MaxConnHeaderBytes <= 0 {
		c.MaxConnHeaderBytes = DefaultMaxConnHeaderBytes
	}
	if c.MaxConnBufferedReply <= 0 {
		c.MaxConnBufferedReply = DefaultMaxConnBufferedReply
	}
	if c.MaxStalledStreams <= 0 {
		c.MaxStalledStreams = DefaultMaxStalledStreams
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.BodyReadTimeout == 0 {
		c.BodyReadTimeout = DefaultBodyReadTimeout
	}
}

// watchPeriod is how often a connection's watchdog looks at its streams
// (see watchFired): a stream is reset or its body failed between one and
// one and a half of its timeout.
func (c *Config) watchPeriod() time.Duration {
	p := time.Duration(0)
	for _, t := range []time.Duration{c.WriteTimeout, c.BodyReadTimeout} {
		if t > 0 && (p == 0 || t/2 < p) {
			p = t / 2
		}
	}
	return p
}

// The range RFC 9113 allows SETTINGS_MAX_FRAME_SIZE.
const (
	minMaxFrameSize = 1 << 14
	maxMaxFrameSize = 1<<24 - 1
)

// Server serves HTTP/2 connections. Its methods are safe for concurrent use.
type Server struct {
	cfg  Config
	bufs buffers

	mu       sync.Mutex
	conns    map[*conn]struct{}
	shutdown bool
	// drained is closed once shutdown is set and no connection is left.
	drained chan struct{}
}

// New returns a server for cfg.
func New(cfg Config) *Server {
	cfg.withDefaults()
	return &Server{cfg: cfg, conns: map[*conn]struct{}{}, drained: make(chan struct{})}
}

// ServeConn serves HTTP/2 on nc, which it owns, until the connection ends
// and every handler it started has returned. nc's first bytes must be the
// client's connection preface.
func (s *Server) ServeConn(nc net.Conn) {
	c := newConn(s, nc)
	s.mu.Lock()
	if s.shutdown {
		s.mu.Unlock()
		nc.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	defer s.forget(c)
	c.serve()
}

func (s *Server) forget(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
	s.closeDrainedLocked()
}

func (s *Server) closeDrainedLocked() {
	if s.shutdown && len(s.conns) == 0 {
		select {
		case <-s.drained:
		default:
			close(s.drained)
		}
	}
}

// Shutdown stops the server gracefully: every connection is sent GOAWAY,
// finishes the streams it has, and closes. It returns when every
// connection has closed, or with ctx's error first (Close then ends them).
func (s *Server) Shutdown(ctx context.Context) error {
	for _, c := range s.stop() {
		c.goAway()
	}
	select {
	case <-s.drained:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close closes every connection at once: their handlers' contexts are
// cancelled, and ServeConn returns as they do.
func (s *Server) Close() {
	for _, c := range s.stop() {
		c.abort(errServerClosed)
	}
}

// stop refuses new connections and returns those being served.
func (s *Server) stop() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shutdown = true
	s.closeDrainedLocked()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	return conns
}

var errServerClosed = errors.New("h2server: server closed")
