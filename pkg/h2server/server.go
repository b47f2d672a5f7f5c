// Package h2server serves HTTP/2 without TLS (prior knowledge) for the
// calls between our own servers, built so that a request waiting in its
// handler holds its handler's goroutine and the request, and little else.
//
// net/http's HTTP/2 server gives every running handler a 4 KiB response
// buffer (http2responseWriterState's bufio.Writer) for as long as it runs,
// and per-stream state around it. With 16,000 rollouts held at a model
// call that was 4.6-5.6 KB per held request in each of the environment,
// agent and model servers, a quarter to a third of each one's heap. Here a
// reply is buffered only from the handler's first write, in a buffer sized
// to what it writes, and the stream's state is a few hundred bytes.
//
// It speaks the subset of RFC 9113 a server for Go's HTTP/2 clients (ours,
// pkg/h2client, and net/http's) needs: request and reply bodies
// flow-controlled both ways, replies streamed with Flush, cancellation
// (RST_STREAM) reaching the handler's context, a stream limit, graceful
// GOAWAY, PING and SETTINGS answered, and an idle timeout. It does not do
// server push, priorities, trailers (a request's are read and dropped; a
// reply has none), HTTP/1.1 or TLS itself: pkg/httpserver hands it the
// connections that open with the HTTP/2 preface, or the TLS connections
// whose ALPN chose "h2" (their requests carry the TLS state), and the rest
// to net/http.
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

	"github.com/gymfleet/gymfleet/pkg/h2frame"
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
)

// Config configures a Server. Zero values take the defaults.
type Config struct {
	Handler http.Handler
	// BaseContext is the parent of every request's context; nil means
	// context.Background().
	BaseContext context.Context
	// Logger receives handler panics and connections ended by a protocol
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
