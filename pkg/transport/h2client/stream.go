package h2client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"golang.org/x/net/http2"

	"github.com/gymfleet/gymfleet/pkg/infra/freshstack"
)

// stream is one request and its reply. Its fields but id, ctx, headers and
// body are under c.mu.
type stream struct {
	c   *Conn
	id  uint32 // set before the stream is registered, then read-only
	ctx context.Context

	sendWindow int64
	// sentEnd: our END_STREAM is written; gotEnd: the reply's arrived;
	// reset: a RST_STREAM (either way) or a failure ended the stream. The
	// stream is done, and its slot free, when reset or both ends are.
	sentEnd, gotEnd, reset bool

	// headers is closed when the reply's headers arrived (resp set) or the
	// stream failed before they did (err set); both are read after it. It
	// is nil for a request sent by Start, whose reply goes to whole.
	headers   chan struct{}
	headersIn bool
	resp      *http.Response
	err       error

	body pipe
	// whole takes the reply of a request sent by Start once it has
	// arrived whole, in place of a goroutine waiting for it.
	whole *wholeReply
}

// wholeReply is where the reply of a request sent by Start goes.
type wholeReply struct {
	done    func(*http.Response, error)
	maxBody int64
	// received counts the body's bytes; the read loop's alone.
	received int64
	// stopWatch unregisters the watch on the request's context. It and
	// fired are under c.mu.
	stopWatch func() bool
	fired     bool
}

// fireLocked hands the reply (or err) to a Start caller's done, once, on a
// goroutine of its own.
func (st *stream) fireLocked(resp *http.Response, err error) {
	w := st.whole
	if w == nil || w.fired {
		return
	}
	w.fired = true
	if w.stopWatch != nil {
		w.stopWatch()
	}
	go w.done(resp, err)
}

// doneLocked reports whether the stream has ended both ways.
func (st *stream) doneLocked() bool { return st.reset || (st.sentEnd && st.gotEnd) }

// endLocked ends the stream with err, keeping its slot: a caller waiting
// for the headers gets err, a reader of the body gets it after what was
// buffered.
func (st *stream) endLocked(err error) {
	st.reset = true
	if !st.headersIn {
		st.headersIn = true
		st.err = err
		if st.headers != nil {
			close(st.headers)
		}
	}
	st.body.fail(err)
	st.fireLocked(nil, err)
}

// failLocked ends the stream with err and frees its slot.
func (st *stream) failLocked(err error) {
	st.endLocked(err)
	st.c.removeLocked(st)
}

// cancel ends the stream from our side: a RST_STREAM tells the server,
// unless the stream had already ended. The slot stays taken until the
// RST_STREAM is written, so that no stream opened meanwhile reaches the
// server before it, over its stream limit.
func (st *stream) cancel(err error) {
	c := st.c
	c.mu.Lock()
	done := st.doneLocked()
	st.endLocked(err)
	c.mu.Unlock()
	if !done {
		c.writeFrames(func() error { return c.fr.WriteRSTStream(st.id, http2.ErrCodeCancel) })
	}
	c.mu.Lock()
	c.removeLocked(st)
	c.mu.Unlock()
}

// errBodyNotSent ends a stream whose reply came before its request body
// was all sent.
var errBodyNotSent = errors.New("h2client: the server replied before the request body was sent")

// sendBody writes req's body as DATA frames within the peer's windows. It
// returns nil without sending the rest when the stream ends first (the
// server answered, or refused, before reading it all).
func (st *stream) sendBody(req *http.Request) error {
	c := st.c
	var buf []byte
	if n := req.ContentLength; n > 0 && n < writeChunk {
		buf = make([]byte, n+1) // room to see the end in the same read
	} else {
		pb, _ := c.bodyBuffers.Get().(*[]byte)
		if pb == nil {
			b := make([]byte, writeChunk)
			pb = &b
		}
		defer c.bodyBuffers.Put(pb)
		buf = *pb
	}
	var stopWake func() bool
	defer func() {
		if stopWake != nil {
			stopWake()
		}
	}()
	for {
		n, end, err := readBodyChunk(req.Body, buf)
		if err != nil {
			return fmt.Errorf("h2client: reading the request body: %w", err)
		}
		data := buf[:n]
		for len(data) > 0 || end {
			c.mu.Lock()
			for len(data) > 0 && (st.sendWindow <= 0 || c.sendWindow <= 0) && !st.reset && !st.gotEnd && c.err == nil && st.ctx.Err() == nil {
				if stopWake == nil {
					stopWake = context.AfterFunc(st.ctx, c.wake)
				}
				c.cond.Wait()
			}
			switch {
			case st.reset:
				c.mu.Unlock()
				return nil
			case st.gotEnd:
				c.mu.Unlock()
				st.cancel(errBodyNotSent) // the reply is whole: only our side is left open
				return nil
			case c.err != nil:
				err := c.err
				c.mu.Unlock()
				return err
			case st.ctx.Err() != nil:
				c.mu.Unlock()
				return context.Cause(st.ctx)
			}
			k := min(int64(len(data)), st.sendWindow, c.sendWindow, int64(c.peer.FrameSize))
			st.sendWindow -= k
			c.sendWindow -= k
			last := end && k == int64(len(data))
			st.sentEnd = last
			c.mu.Unlock()
			chunk := data[:k]
			if err := c.writeFrames(func() error { return c.fr.WriteData(st.id, last, chunk) }); err != nil {
				return fmt.Errorf("h2client: writing the request body: %w", err)
			}
			data = data[k:]
			if last {
				c.mu.Lock()
				if st.doneLocked() {
					c.removeLocked(st)
				}
				c.mu.Unlock()
				return nil
			}
		}
	}
}

// pipe is a reply body: bytes the read loop has received and the reader
// has not taken yet.
type pipe struct {
	mu   sync.Mutex
	cond sync.Cond
	buf  bytes.Buffer
	err  error // what a read returns once buf is empty: io.EOF or a failure
	// unrefunded is what the reader took and the server has not been given
	// back as stream window yet.
	unrefunded int
	// stopWake unregisters the context watch a blocked read set up.
	stopWake func() bool
}

// write appends received data, and counts the frame's padding as taken
// (it is credited back with the next refund); false when the body is no
// longer read.
func (p *pipe) write(b []byte, pad int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return false
	}
	p.buf.Write(b)
	p.unrefunded += pad
	p.cond.Broadcast()
	return true
}

// stopWatchLocked unregisters the context watch a blocked read set up.
func (p *pipe) stopWatchLocked() {
	if p.stopWake != nil {
		p.stopWake()
		p.stopWake = nil
	}
}

// fail sets what reads return after the buffered bytes (the first one stays).
func (p *pipe) fail(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.cond.Broadcast()
	p.mu.Unlock()
}

// presizeMax is the most of a reply's declared length allocated before
// its bytes arrive.
const presizeMax = 1 << 20

// presize makes room for n bytes of body before any arrives.
func (p *pipe) presize(n int) {
	p.mu.Lock()
	p.buf.Grow(n)
	p.mu.Unlock()
}

// taken counts n received bytes of a whole reply as read, and returns the
// window to give back for them now (0 until a batch is due).
func (p *pipe) taken(n int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.unrefunded += n
	if p.unrefunded < streamWindow/4 {
		return 0
	}
	refund := p.unrefunded
	p.unrefunded = 0
	return refund
}

// buffered is the number of bytes waiting for the reader.
func (p *pipe) buffered() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.buf.Len()
}

// errBodyClosed is what a reply body returns after Close.
var errBodyClosed = errors.New("h2client: read on a closed reply body")

// replyBody is a reply's Body.
type replyBody struct{ st *stream }

func (b replyBody) Read(out []byte) (int, error) {
	st := b.st
	p := &st.body
	p.mu.Lock()
	for p.buf.Len() == 0 && p.err == nil {
		if p.stopWake == nil {
			p.stopWake = context.AfterFunc(st.ctx, func() { st.cancel(context.Cause(st.ctx)) })
		}
		p.cond.Wait()
	}
	if p.buf.Len() == 0 {
		err := p.err
		p.stopWatchLocked()
		p.mu.Unlock()
		return 0, err
	}
	n, _ := p.buf.Read(out)
	p.unrefunded += n
	refund := 0
	if p.unrefunded >= streamWindow/4 && p.err == nil {
		refund, p.unrefunded = p.unrefunded, 0
	}
	p.mu.Unlock()
	if refund > 0 {
		// On a goroutine of its own, as RoundTrip's writes (freshstack).
		c := st.c
		freshstack.Run(func() {
			c.writeFrames(func() error { return c.fr.WriteWindowUpdate(st.id, uint32(refund)) })
		})
	}
	return n, nil
}

// Close stops the reply: what was not read is dropped, and a stream still
// open is reset.
func (b replyBody) Close() error {
	st := b.st
	p := &st.body
	p.mu.Lock()
	p.stopWatchLocked()
	p.buf = bytes.Buffer{}
	// Set here, not by the cancel below: data the read loop delivers
	// between this unlock and the cancel must not reach a later Read.
	p.err = errBodyClosed
	p.cond.Broadcast()
	p.mu.Unlock()
	st.cancel(errBodyClosed)
	return nil
}
