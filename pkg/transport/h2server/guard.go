package h2server

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/net/http2"

	"github.com/gymfleet/gymfleet/pkg/transport/h2frame"
)

// This file holds what bounds a hostile client's cost, each after x/net's
// HTTP/2 server (golang.org/x/net@v0.62.0, http2/server.go):
//
//   - control frames the read loop answers with (PING and SETTINGS acks,
//     RST_STREAM, WINDOW_UPDATE) are queued and written by another
//     goroutine, so the read loop never waits on the socket; a client that
//     makes more of them wait than h2frame.MaxQueuedControlFrames is not reading
//     them, and the connection ends with ENHANCE_YOUR_CALM (x/net's
//     maxQueuedControlFrames and serverConn.serve);
//   - every socket write has a deadline, renewed whenever bytes go out, so
//     a client that stops reading fails its connection and one that reads
//     slowly does not (x/net's Server.WriteByteTimeout);
//   - a stream waiting that long for the client to grant window is reset
//     (x/net's stream.onWriteTimeout, there after http.Server.WriteTimeout);
//   - a request body that stops arriving fails its handler's reads after
//     BodyReadTimeout (x/net's stream.onReadTimeout);
//   - the decoded headers of the streams a connection holds, and the reply
//     bytes it holds back, have per-connection budgets (x/net bounds them
//     only through its stream limit and per-stream buffers).

// goAwayTimeout bounds the wait to write the last GOAWAY of a connection
// ending on an error: a writer stalled on a client that does not read holds
// the writer until the connection is closed.
const goAwayTimeout = time.Second

var (
	errTooManyControlFrames = http2.ConnectionError(http2.ErrCodeEnhanceYourCalm)
	// errWriteStalled resets a stream whose client granted no window for
	// the write timeout.
	errWriteStalled = fmt.Errorf("h2server: the client granted no window for the write timeout: %w", os.ErrDeadlineExceeded)
	// errBodyTimeout is what a handler reading a request body that stopped
	// arriving gets.
	errBodyTimeout = fmt.Errorf("h2server: no request body bytes arrived for the body read timeout: %w", os.ErrDeadlineExceeded)
)

// queueControl queues a frame for the connection's writer and makes sure a
// goroutine writes it: the caller never waits on the socket. It fails with
// ENHANCE_YOUR_CALM once h2frame.MaxQueuedControlFrames wait.
func (c *conn) queueControl(f h2frame.Control) error {
	start, full := c.ctrl.Push(f, func() { c.writers.Add(1) })
	if full {
		return errTooManyControlFrames
	}
	if start {
		go c.flushControl()
	}
	return nil
}

// flushControl writes queued control frames until none is left. It is
// owned by the connection: serve waits for it (c.writers).
func (c *conn) flushControl() {
	defer c.writers.Done()
	for c.ctrl.More(c.writeFrames(nil)) { // writeFrames drains the queue, then flushes
	}
}

// drainControlLocked writes the queued control frames; the caller holds
// wmu. Every writer drains first, so frames leave in the order queued.
func (c *conn) drainControlLocked() error {
	return c.ctrl.Drain(func(f *h2frame.Control) error { return f.Write(c.fr, c.henc, &c.hbuf) })
}

// socketWriter is the socket as the connection's buffered writer sees
// it, after x/net's WriteByteTimeout (http2/server.go,
// writeWithByteTimeout): every write to the socket gets the write timeout
// anew, and one that the deadline cuts off after some bytes went out goes
// on. A connection fails only when its client took no byte for the whole
// timeout; a client that is slow to read (a process busy on every core,
// or in a long collection) is not one that stopped.
type socketWriter struct{ c *conn }

func (w socketWriter) Write(p []byte) (n int, err error) {
	timeout := w.c.writeTimeout // under wmu, as every write
	if timeout <= 0 {
		return w.c.nc.Write(p)
	}
	for {
		w.c.nc.SetWriteDeadline(time.Now().Add(timeout))
		var m int
		m, err = w.c.nc.Write(p[n:])
		n += m
		if err == nil || m == 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			return n, err
		}
	}
}

// writeFinal writes a connection's last frames (queued ones first) and
// flushes, waiting at most goAwayTimeout: a writer stalled on a client
// that does not read gives the writer up when the connection closes.
func (c *conn) writeFinal(fn func() error) {
	stop := time.AfterFunc(goAwayTimeout, func() { c.nc.Close() })
	defer stop.Stop()
	c.writersWaiting.Add(1)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.writersWaiting.Add(-1)
	c.writeTimeout = goAwayTimeout
	err := c.drainControlLocked()
	if err == nil {
		err = fn()
	}
	if err == nil {
		c.bw.Flush()
	}
}

// headerCost is what a request's header block counts against the
// connection's header budget: the size RFC 9113 §6.5.2 gives a header
// list (each field's name and value and 32 bytes), as x/net's Framer counts
// it against MaxHeaderListSize, so that a field of one byte costs 33.
func headerCost(f *http2.MetaHeadersFrame) uint32 {
	var n uint32
	for _, hf := range f.Fields {
		n += hf.Size() // the Framer kept their sum within MaxHeaderListSize
	}
	return n
}

// watchLocked makes sure the watchdog runs while a stream waits for window
// or for its request body.
func (c *conn) watchLocked() {
	if c.watchPeriod <= 0 || c.watchArmed || c.err != nil {
		return
	}
	c.watchArmed = true
	if c.watch == nil {
		c.watch = time.AfterFunc(c.watchPeriod, c.watchFired)
	} else {
		c.watch.Reset(c.watchPeriod)
	}
}

// watchFired resets the streams whose client granted no window for the
// write timeout, and fails the body reads of those whose body stopped
// arriving for the body read timeout; it runs again while some may.
func (c *conn) watchFired() {
	cfg := &c.s.cfg
	now := c.clock()
	var stalled []uint32
	c.mu.Lock()
	c.watchArmed = false
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	again := false
	for _, st := range c.streams {
		if st.reset {
			continue
		}
		if st.stallSince != 0 && cfg.WriteTimeout > 0 {
			if now-st.stallSince >= int64(cfg.WriteTimeout) {
				st.resetLocked(errWriteStalled)
				stalled = append(stalled, st.id)
				continue
			}
			again = true
		}
		if !st.gotEnd && !st.bodyExpired && cfg.BodyReadTimeout > 0 {
			switch {
			case st.recvWindow <= 0 || c.recvWindow <= 0:
				// We hold the client back: its silence is not idleness.
				st.lastRecv = now
				again = true
			case now-st.lastRecv >= int64(cfg.BodyReadTimeout):
				st.bodyExpired = true
				st.body.fail(errBodyTimeout)
			default:
				again = true
			}
		}
	}
	if len(stalled) > 0 {
		c.cond.Broadcast()
	}
	if again {
		c.watchLocked()
	}
	c.mu.Unlock()
	for _, id := range stalled {
		// As x/net's onWriteTimeout: INTERNAL_ERROR.
		if err := c.queueControl(h2frame.Control{Kind: h2frame.Reset, StreamID: id, Val: uint32(http2.ErrCodeInternal)}); err != nil {
			c.abort(err)
			return
		}
	}
}

// reserveReply counts a reply buffer growing to hold n bytes against the
// connection's budget of held-back reply bytes; false when it has no room.
func (w *responseWriter) reserveReply(n int) bool {
	need := int64(classCap(n)) - w.reserved
	if need <= 0 {
		return true
	}
	c := w.st.c
	if c.replyHeld.Add(need) > int64(c.s.cfg.MaxConnBufferedReply) {
		c.replyHeld.Add(-need)
		return false
	}
	w.reserved += need
	return true
}
