package h2server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/gymfleet/gymfleet/pkg/infra/freshstack"
	"github.com/gymfleet/gymfleet/pkg/transport/h2frame"
)

// lingerTimeout bounds how long a connection closing gracefully waits for
// the client to close its side, after ours is shut for writing: closing
// with the client's bytes unread would make the kernel reset the
// connection, and a reset can discard replies the client has not read yet.
const lingerTimeout = time.Second

// conn is one client connection: the goroutine that runs serve reads its
// frames, and handlers write their replies on their own goroutines.
// writeBufferSize is a connection's write buffer: frames written into it
// count as sent until it fills.
const writeBufferSize = 32 << 10

type conn struct {
	s          *Server
	nc         net.Conn
	remoteAddr string
	// tlsState is the TLS connection's state, every request's TLS; nil
	// for h2c.
	tlsState *tls.ConnectionState
	ctx      context.Context // parent of its requests' contexts
	cancel   context.CancelCauseFunc

	// wmu orders everything written: frames and the HPACK encoder's state.
	wmu            sync.Mutex
	writersWaiting atomic.Int32
	bw             *bufio.Writer
	fr             *http2.Framer // its read side is serve's alone
	henc           *hpack.Encoder
	hbuf           bytes.Buffer
	// writeTimeout is the write timeout of the socket writes (socketWriter):
	// the configured one, goAwayTimeout for a connection's last frames.
	writeTimeout time.Duration

	// ctrl holds the control frames the read loop answers with until a
	// writer takes them (queueControl).
	ctrl h2frame.ControlQueue
	// writers counts the flushControl goroutines; serve waits for them.
	writers sync.WaitGroup

	// replyHeld is what the handlers' reply buffers hold, against
	// MaxConnBufferedReply.
	replyHeld atomic.Int64

	mu sync.Mutex
	// cond is signalled when a send window grows, a stream is reset or the
	// connection fails: what writers blocked on flow control wait for.
	cond    sync.Cond
	streams map[uint32]*stream
	open    int    // streams neither side has ended (counted against the limit)
	maxID   uint32 // the highest stream id the client has opened
	// sendWindow is what the client's connection window lets us send.
	sendWindow int64
	peer       h2frame.Peer // the client's SETTINGS
	// recvWindow is what the client may still send on the connection, and
	// unacked what handlers took (or the server dropped) and the client has
	// not been given back yet.
	recvWindow int64
	unacked    int64
	goingAway  bool // GOAWAY sent: no new streams
	// resets remembers the last streams we reset and forgot while the
	// client may still have been sending on them (see resetRecord).
	resets    [8]resetRecord
	nextReset int
	err       error // set once: the connection is ending
	// headerBytes is what the requests of streams counts against
	// MaxConnHeaderBytes.
	headerBytes int64
	// stalled counts the streams waiting for window (MaxStalledStreams).
	stalled int
	// watch runs watchFired while streams wait for window or for their
	// body.
	watch       *time.Timer
	watchArmed  bool
	watchPeriod time.Duration
	epoch       time.Time // of clock

	handlers sync.WaitGroup
	idle     *time.Timer // nil without an idle timeout
}

func newConn(s *Server, nc net.Conn) *conn {
	ctx, cancel := context.WithCancelCause(s.cfg.BaseContext)
	c := &conn{
		s:           s,
		nc:          nc,
		remoteAddr:  nc.RemoteAddr().String(),
		ctx:         ctx,
		cancel:      cancel,
		streams:     map[uint32]*stream{},
		sendWindow:  h2frame.InitialWindow,
		peer:        h2frame.NewPeer(0),
		recvWindow:  int64(s.cfg.ConnReceiveWindow),
		watchPeriod: s.cfg.watchPeriod(),
		epoch:       time.Now(),
	}
	c.cond.L = &c.mu
	if tc, ok := nc.(interface{ ConnectionState() tls.ConnectionState }); ok {
		st := tc.ConnectionState()
		c.tlsState = &st
	}
	c.writeTimeout = s.cfg.WriteTimeout
	c.bw = bufio.NewWriterSize(socketWriter{c}, writeBufferSize)
	c.fr = http2.NewFramer(c.bw, bufio.NewReaderSize(nc, 32<<10))
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = s.cfg.MaxHeaderListSize
	c.fr.SetMaxReadFrameSize(s.cfg.MaxReadFrameSize)
	c.fr.SetReuseFrames()
	c.henc = hpack.NewEncoder(&c.hbuf)
	return c
}

// serve runs the connection: its preface and settings, then its frames
// until it ends; it returns once every handler it started has.
func (c *conn) serve() {
	err := c.start()
	if err == nil {
		if c.s.cfg.IdleTimeout > 0 {
			c.idle = time.AfterFunc(c.s.cfg.IdleTimeout, c.idleFired)
		}
		err = c.readFrames()
	}
	c.end(err)
	c.handlers.Wait()
	c.ctrl.Close()
	c.writers.Wait()
	if c.idle != nil {
		c.idle.Stop()
	}
	c.mu.Lock()
	if c.watch != nil {
		c.watch.Stop()
	}
	c.mu.Unlock()
	c.cancel(errConnClosed)
}

// clock is the monotonic time since the connection started, at least 1:
// what streams note times in, smaller than a time.Time.
func (c *conn) clock() int64 { return int64(time.Since(c.epoch)) + 1 }

var errConnClosed = errors.New("h2server: connection closed")

// start reads the client's preface and sends our settings.
func (c *conn) start() error {
	c.nc.SetReadDeadline(time.Now().Add(c.s.cfg.PrefaceTimeout))
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c.nc, preface); err != nil {
		return fmt.Errorf("h2server: reading the client preface: %w", err)
	}
	if string(preface) != http2.ClientPreface {
		return errors.New("h2server: the connection did not open with the HTTP/2 preface")
	}
	c.nc.SetReadDeadline(time.Time{})
	cfg := &c.s.cfg
	return c.writeFrames(func() error {
		err := c.fr.WriteSettings(
			http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: cfg.MaxConcurrentStreams},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(cfg.StreamReceiveWindow)},
			http2.Setting{ID: http2.SettingMaxFrameSize, Val: cfg.MaxReadFrameSize},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: cfg.MaxHeaderListSize},
		)
		if err == nil && cfg.ConnReceiveWindow > h2frame.InitialWindow {
			err = c.fr.WriteWindowUpdate(0, uint32(cfg.ConnReceiveWindow-h2frame.InitialWindow))
		}
		return err
	})
}

// end fails the connection with err: handlers' contexts are cancelled,
// their request bodies fail, writers stop waiting; then the socket closes.
func (c *conn) end(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	for _, st := range c.streams {
		st.resetLocked(c.err)
	}
	c.cond.Broadcast()
	c.mu.Unlock()
	c.cancel(err)
	c.nc.Close()
}

// abort ends the connection at once (Server.Close).
func (c *conn) abort(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.cond.Broadcast()
	c.mu.Unlock()
	c.nc.Close() // the read loop fails and ends the rest
}

// goAway stops new streams: the client is told the last stream served,
// and the connection closes once the streams it has are done.
func (c *conn) goAway() {
	c.mu.Lock()
	if c.goingAway || c.err != nil {
		c.mu.Unlock()
		return
	}
	c.goingAway = true
	last := c.maxID
	idle := len(c.streams) == 0
	c.mu.Unlock()
	if err := c.writeFrames(func() error { return c.fr.WriteGoAway(last, http2.ErrCodeNo, nil) }); err != nil {
		return
	}
	if idle {
		c.closeGracefully()
	}
}

// closeGracefully shuts our side for writing and lets the read loop end
// when the client closes its own (or after lingerTimeout).
func (c *conn) closeGracefully() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if cw, ok := c.nc.(interface{ CloseWrite() error }); ok {
		if cw.CloseWrite() == nil {
			c.nc.SetReadDeadline(time.Now().Add(lingerTimeout))
			return
		}
	}
	c.nc.Close()
}

// idleFired closes the connection if it still has no stream.
func (c *conn) idleFired() {
	c.mu.Lock()
	idle := len(c.streams) == 0 && c.err == nil
	c.mu.Unlock()
	if idle {
		c.goAway()
	}
}

// writeFrames writes the queued control frames, runs fn (if not nil) with
// the connection's writer and flushes, unless another writer is waiting
// for the writer: that one flushes both. Under load, replies of many
// streams then leave in one write, as net/http's single writer goroutine
// sends them. A write error fails the connection.
func (c *conn) writeFrames(fn func() error) error {
	c.writersWaiting.Add(1)
	c.wmu.Lock()
	c.writersWaiting.Add(-1)
	err := c.drainControlLocked()
	if err == nil && fn != nil {
		err = fn()
	}
	if err == nil && c.writersWaiting.Load() == 0 {
		err = c.bw.Flush()
	}
	c.wmu.Unlock()
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The client read nothing for the write timeout: every stream
			// of the connection is lost with it, so say so.
			c.s.cfg.Logger.Warn("http2 connection closed: the client read nothing for the write timeout",
				"remote", c.remoteAddr, "write_timeout", c.s.cfg.WriteTimeout)
		}
		c.abort(fmt.Errorf("h2server: writing: %w", err))
	}
	return err
}

// writeFramesFresh is writeFrames on a fresh stack, for writes a handler
// makes before it may wait long (see freshstack): the write path would
// grow the stack it then waits on.
func (c *conn) writeFramesFresh(fn func() error) error {
	var err error
	freshstack.Run(func() { err = c.writeFrames(fn) })
	return err
}

// resetStream resets stream id with code and forgets it. The RST_STREAM is
// queued: the read loop calls it.
func (c *conn) resetStream(id uint32, code http2.ErrCode, err error) error {
	c.mu.Lock()
	if st := c.streams[id]; st != nil {
		st.resetLocked(err)
	}
	c.mu.Unlock()
	return c.queueControl(h2frame.Control{Kind: h2frame.Reset, StreamID: id, Val: uint32(code)})
}

// creditLocked notes n received bytes as taken and returns the
// connection-level credit to send back now, if any: updates go out in
// batches of a quarter of the window.
func (c *conn) creditLocked(n int64) int64 {
	c.unacked += n
	if c.unacked < int64(c.s.cfg.ConnReceiveWindow)/4 {
		return 0
	}
	credit := c.unacked
	c.unacked = 0
	c.recvWindow += credit
	return credit
}

// closeStreamLocked forgets a stream whose handler is done; the connection
// goes idle (or closes, after GOAWAY) with its last stream.
func (c *conn) closeStreamLocked(st *stream) (closeNow bool) {
	if c.streams[st.id] == st {
		delete(c.streams, st.id)
		c.headerBytes -= int64(st.headerCost)
		if st.reset && !st.peerReset && !st.gotEnd {
			c.resets[c.nextReset] = resetRecord{id: st.id, declared: st.declared, received: st.received, sendWindow: st.sendWindow}
			c.nextReset = (c.nextReset + 1) % len(c.resets)
		}
	}
	if len(c.streams) > 0 {
		return false
	}
	if c.goingAway {
		return true
	}
	if c.idle != nil {
		c.idle.Reset(c.s.cfg.IdleTimeout)
	}
	return false
}

// resetRecord is what is kept of a stream we reset (after an early reply,
// say) once its handler returned: frames the client sent before our
// RST_STREAM reached it are ignored (RFC 9113 §5.1), but for those wrong in
// any state. A handful are kept, the newest: enough for frames in flight,
// and a bounded cost per connection.
type resetRecord struct {
	id                             uint32 // 0: none
	declared, received, sendWindow int64
}

// recentResetLocked returns the record of stream id, if it is kept.
func (c *conn) recentResetLocked(id uint32) *resetRecord {
	for i := range c.resets {
		if c.resets[i].id == id {
			return &c.resets[i]
		}
	}
	return nil
}
