package h2server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"runtime/debug"
	"sync"

	"golang.org/x/net/http2"
)

// stream is one request and its reply. Its fields but id, ctx, cancel and
// body are under c.mu. The request itself is its handler's: a stream held
// open for a parked request keeps none of it.
type stream struct {
	c      *conn
	id     uint32
	ctx    context.Context
	cancel context.CancelCauseFunc

	// recvWindow is what the client may still send on the stream; unacked
	// what the handler read and the client has not been given back.
	recvWindow, unacked int64
	// declared is the request's content-length (-1 without one), received
	// what arrived of its body.
	declared, received int64
	sendWindow         int64
	// gotEnd: the request's END_STREAM arrived; sentEnd: the reply's is
	// written or about to be; reset: either side reset the stream (or the
	// connection failed). closed: the stream no longer counts as open.
	// peerReset: the client reset it, so the client knows it is closed.
	// bodyExpired: the body's reads failed for want of it (watchFired).
	gotEnd, sentEnd, reset, closed, peerReset, bodyExpired bool
	// headerCost is what the request counts against MaxConnHeaderBytes.
	headerCost uint32
	// lastRecv is when the body last made progress, stallSince when a
	// write started waiting for window (0: none waits), on c.clock.
	lastRecv, stallSince int64

	body pipe
}

// newStream registers a stream for req and counts it open; it returns the
// request its handler gets, in the stream's context.
func (c *conn) newStream(id uint32, req *http.Request, ended bool, headerCost uint32) (*stream, *http.Request) {
	ctx, cancel := context.WithCancelCause(c.ctx)
	st := &stream{
		c:          c,
		id:         id,
		ctx:        ctx,
		cancel:     cancel,
		recvWindow: int64(c.s.cfg.StreamReceiveWindow),
		declared:   req.ContentLength,
		gotEnd:     ended,
		headerCost: headerCost,
	}
	st.body.cond.L = &st.body.mu
	st.body.bufs = &c.s.bufs
	if ended {
		req.Body = http.NoBody
		st.body.err = io.EOF
	} else {
		req.Body = requestBody{st}
	}
	req = req.WithContext(ctx)
	c.mu.Lock()
	st.sendWindow = c.peer.StreamWindow
	c.streams[id] = st
	c.open++
	c.headerBytes += int64(headerCost)
	if !ended && c.s.cfg.BodyReadTimeout > 0 {
		st.lastRecv = c.clock()
		c.watchLocked()
	}
	c.mu.Unlock()
	return st, req
}

// closedByPeer reports whether the client has no reason to send more
// frames on a stream in streams (or forgotten, st nil): both sides ended it
// or the client reset it. Frames on it are then errors; on a stream only we
// reset, they may have been sent before our RST_STREAM arrived.
func (st *stream) closedByPeer() bool {
	return st == nil || st.peerReset || (st.closed && !st.reset)
}

// closeLocked stops counting the stream as open (once).
func (st *stream) closeLocked() {
	if !st.closed {
		st.closed = true
		st.c.open--
	}
}

// resetLocked ends the stream with err: the handler's context is
// cancelled, its body reads fail after what was buffered, its writes fail.
func (st *stream) resetLocked(err error) {
	st.reset = true
	st.closeLocked()
	st.body.fail(err)
	st.cancel(err)
}

// errHandlerPanicked resets the stream of a handler that panicked.
var errHandlerPanicked = errors.New("h2server: handler panicked")

// runHandler serves the stream's request on the goroutine it is started
// on, then sends what is left of the reply and forgets the stream, unless
// the handler detached the stream (Detach): its end then does.
func (c *conn) runHandler(st *stream, req *http.Request) {
	w := &responseWriter{st: st, head: req.Method == http.MethodHead}
	defer func() {
		if p := recover(); p != nil {
			// A panic ends the stream here, detached or not: a detached
			// stream's end is called only by a handler that returned.
			if p != http.ErrAbortHandler {
				c.s.cfg.Logger.Error("http2 handler panicked", "remote", c.remoteAddr, "method", req.Method, "path", req.URL.Path, "panic", p, "stack", string(debug.Stack()))
			}
			c.endStream(w, true)
			return
		}
		if !w.detached {
			c.endStream(w, false)
		}
	}()
	c.s.cfg.Handler.ServeHTTP(w, req)
}

// endStream sends what is left of the reply (or, abort, resets the
// stream) and forgets the stream.
func (c *conn) endStream(w *responseWriter, abort bool) {
	defer c.handlers.Done()
	if abort {
		w.releaseBuffer()
		c.resetStream(w.st.id, http2.ErrCodeInternal, errHandlerPanicked)
	} else {
		w.finish()
	}
	c.handlerDone(w.st)
}

// Detach keeps the stream open after the handler returns, for a handler
// that waits without its goroutine (pkg/infra/park): the request's context
// and body and the writer stay valid, used by one goroutine at a time,
// until end is called, once, from any goroutine; end sends what is left
// of the reply (abort: resets the stream instead) as the handler's return
// would have. The handler's goroutine must return normally after Detach;
// if it panics instead, the stream ends with it and end must not be
// called.
func (w *responseWriter) Detach() (end func(abort bool)) {
	w.detached = true
	return func(abort bool) { w.st.c.endStream(w, abort) }
}

// errHandlerDone cancels a request's context once its handler returned.
var errHandlerDone = errors.New("h2server: handler returned")

// handlerDone forgets a stream whose handler returned: request bytes it
// left unread are credited back, and after GOAWAY the last stream closes
// the connection.
func (c *conn) handlerDone(st *stream) {
	unread := st.body.close()
	c.mu.Lock()
	if !st.closed && !st.sentEnd { // the reply never ended: the stream cannot stay open
		st.resetLocked(errHandlerDone)
	}
	credit := c.creditLocked(unread)
	closeNow := c.closeStreamLocked(st)
	c.mu.Unlock()
	st.cancel(errHandlerDone)
	c.sendCredit(0, credit)
	if closeNow {
		c.closeGracefully()
	}
}

// endStreamLocked marks the reply's END_STREAM as about to be written, and
// reports whether a RST_STREAM (NO_ERROR) must follow it: a reply that
// comes before the whole request ends the request too (RFC 9113 §8.1).
// The stream stops counting as open before the frame goes out, so that a
// client opening its next stream on seeing it is within the limit.
func (st *stream) endStreamLocked() (resetAfter bool) {
	st.sentEnd = true
	if !st.gotEnd {
		resetAfter = true
		st.reset = true // what the client still sends is dropped
		st.body.fail(errReplied)
	}
	st.closeLocked()
	return resetAfter
}

// errReplied is what a handler reading its request's body after its
// reply ended gets.
var errReplied = errors.New("h2server: request body read after the reply ended")

// requestBody is a request's Body.
type requestBody struct{ st *stream }

// Read returns the body's bytes as they arrive. What it takes is given
// back to the client as window in batches.
func (b requestBody) Read(out []byte) (int, error) {
	st := b.st
	n, err := st.body.read(st.ctx, out)
	if n == 0 {
		return n, err
	}
	c := st.c
	c.mu.Lock()
	var streamCredit int64
	st.unacked += int64(n)
	if !st.gotEnd && !st.reset && st.unacked >= int64(c.s.cfg.StreamReceiveWindow)/4 {
		streamCredit, st.unacked = st.unacked, 0
		st.recvWindow += streamCredit
	}
	connCredit := c.creditLocked(int64(n))
	c.mu.Unlock()
	if streamCredit > 0 || connCredit > 0 {
		// A handler reads its body before it waits: written on a fresh
		// stack, the update does not grow the stack it waits on.
		c.writeFramesFresh(func() error {
			if connCredit > 0 {
				if err := c.fr.WriteWindowUpdate(0, uint32(connCredit)); err != nil {
					return err
				}
			}
			if streamCredit > 0 {
				return c.fr.WriteWindowUpdate(st.id, uint32(streamCredit))
			}
			return nil
		})
	}
	return n, err
}

// Close drops what is left of the body; the handler's later reads fail.
func (b requestBody) Close() error {
	unread := b.st.body.close()
	c := b.st.c
	c.mu.Lock()
	credit := c.creditLocked(unread)
	c.mu.Unlock()
	c.sendCredit(0, credit)
	return nil
}

// errBodyClosed is what a read after Close returns.
var errBodyClosed = errors.New("h2server: read on a closed request body")

// pipe holds request bytes received and not read yet.
type pipe struct {
	mu   sync.Mutex
	cond sync.Cond
	bufs *buffers
	buf  []byte // unread: buf[off:]; from bufs
	off  int
	err  error // what reads return once buf is drained: io.EOF or a failure
	// closed: the handler closed the body (or returned); bytes arriving
	// are dropped.
	closed   bool
	stopWake func() bool
}

// write appends received bytes; false when nobody will read them.
func (p *pipe) write(b []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.err != nil {
		return false
	}
	if p.off == len(p.buf) {
		p.buf, p.off = p.buf[:0], 0
	}
	if cap(p.buf)-len(p.buf) < len(b) {
		// Moved to a buffer twice as large (a body its handler reads
		// slower than it arrives is copied a bounded number of times),
		// without the bytes already read.
		unread := len(p.buf) - p.off
		bigger := append(p.bufs.get(max(unread+len(b), 2*unread)), p.buf[p.off:]...)
		p.bufs.put(p.buf)
		p.buf, p.off = bigger, 0
	}
	p.buf = append(p.buf, b...)
	p.cond.Broadcast()
	return true
}

// release gives the buffer back once nothing is left in it to read.
func (p *pipe) releaseLocked() {
	p.bufs.put(p.buf)
	p.buf, p.off = nil, 0
}

// fail sets what reads return after the buffered bytes (the first stays).
func (p *pipe) fail(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.cond.Broadcast()
	p.mu.Unlock()
}

// read takes buffered bytes, waiting for some while ctx allows.
func (p *pipe) read(ctx context.Context, out []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.off == len(p.buf) && p.err == nil && !p.closed {
		if err := ctx.Err(); err != nil {
			return 0, context.Cause(ctx)
		}
		if p.stopWake == nil {
			p.stopWake = context.AfterFunc(ctx, func() {
				p.mu.Lock()
				p.cond.Broadcast()
				p.mu.Unlock()
			})
		}
		p.cond.Wait()
	}
	if p.closed {
		return 0, errBodyClosed
	}
	if p.off == len(p.buf) {
		p.stopWatchLocked()
		p.releaseLocked() // the handler may wait long after reading its body
		return 0, p.err
	}
	n := copy(out, p.buf[p.off:])
	p.off += n
	if p.off == len(p.buf) && p.err != nil {
		p.releaseLocked()
		p.stopWatchLocked()
		if p.err == io.EOF {
			return n, io.EOF
		}
	}
	return n, nil
}

func (p *pipe) stopWatchLocked() {
	if p.stopWake != nil {
		p.stopWake()
		p.stopWake = nil
	}
}

// close drops the buffered bytes and returns how many there were.
func (p *pipe) close() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	unread := int64(len(p.buf) - p.off)
	p.releaseLocked()
	p.closed = true
	p.stopWatchLocked()
	p.cond.Broadcast()
	return unread
}
