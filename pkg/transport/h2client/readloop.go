package h2client

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"golang.org/x/net/http2"

	"github.com/gymfleet/gymfleet/pkg/transport/h2frame"
)

// readLoop reads the connection's frames until it fails, then fails every
// stream still open on it.
func (c *Conn) readLoop() {
	defer close(c.readDone)
	err := c.readFrames()
	c.mu.Lock()
	switch {
	case errors.Is(err, ErrHTTP1Server):
		// Said over any other error (a write that failed as the server
		// closed): it is what the caller needs to know to fall back.
		c.err = err
	case c.err == nil:
		// Before the socket closes: a writer it fails then (a flusher of
		// our answers, say) would say only that.
		c.err = fmt.Errorf("h2client: connection lost: %w", err)
	}
	c.clearFullLocked()
	c.mu.Unlock()
	c.nc.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, st := range c.streams {
		if c.goAway && id > c.goAwayID {
			st.failLocked(fmt.Errorf("%w: above the server's GOAWAY (%w)", ErrNotProcessed, c.err))
			continue
		}
		st.failLocked(c.err)
	}
	c.cond.Broadcast()
}

// readFrames dispatches frames until the connection fails.
func (c *Conn) readFrames() error {
	if err := c.checkHTTP2(); err != nil {
		return err
	}
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			if se, ok := errors.AsType[http2.StreamError](err); ok {
				if err := c.resetStream(se.StreamID, se.Code, fmt.Errorf("h2client: %w", se)); err != nil {
					return err
				}
				continue
			}
			return err
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if err := c.onHeaders(f); err != nil {
				return err
			}
		case *http2.DataFrame:
			if err := c.onData(f); err != nil {
				return err
			}
		case *http2.WindowUpdateFrame:
			c.onWindowUpdate(f)
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			if err := c.onSettings(f); err != nil {
				return err
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				if err := c.queueControl(h2frame.Control{Kind: h2frame.PingAck, Data: f.Data}); err != nil {
					return err
				}
			}
		case *http2.RSTStreamFrame:
			c.onReset(f)
		case *http2.GoAwayFrame:
			c.onGoAway(f)
		case *http2.PushPromiseFrame:
			return http2.ConnectionError(http2.ErrCodeProtocol)
		}
	}
}

// http1Prefix begins the status line of an HTTP/1.x reply. A server's
// first HTTP/2 frame is SETTINGS, whose 9-byte header starts with its
// length and type 4, never these bytes.
const http1Prefix = "HTTP/1."

// checkHTTP2 waits for the server's first bytes and fails with
// ErrHTTP1Server when they are an HTTP/1.x status line: read as a frame
// header they would be "frame too large", which says nothing of the cause.
func (c *Conn) checkHTTP2() error {
	first, err := c.br.Peek(len(http1Prefix) + 1)
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(first, []byte(http1Prefix)) {
		c.mu.Lock()
		c.spoke = true
		c.cond.Broadcast()
		c.mu.Unlock()
		return nil
	}
	line, _ := c.br.Peek(c.br.Buffered())
	line, _, _ = bytes.Cut(line, []byte("\n"))
	line = bytes.TrimRight(line[:min(len(line), 80)], "\r")
	return fmt.Errorf("%w (its reply to our preface began %q)", ErrHTTP1Server, line)
}

// lookup is the open stream with id (nil when there is none) and whether
// its reply's headers arrived (headersIn) or it failed before they did.
func (c *Conn) lookup(id uint32) (st *stream, headersIn, failed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st = c.streams[id]
	if st == nil {
		return nil, false, false
	}
	return st, st.headersIn, st.headersIn && st.resp == nil
}

// resetStream fails stream id with err and tells the server. The slot
// is freed once the RST_STREAM is queued: a stream opened after it drains
// the queue before its headers (openStream), so the server never sees both
// at once over its stream limit. Its error is the connection's.
func (c *Conn) resetStream(id uint32, code http2.ErrCode, err error) error {
	c.mu.Lock()
	st := c.streams[id]
	if st != nil {
		st.endLocked(err)
	}
	c.mu.Unlock()
	if st == nil {
		return nil
	}
	qerr := c.queueControl(h2frame.Control{Kind: h2frame.Reset, StreamID: id, Val: uint32(code)})
	c.mu.Lock()
	c.removeLocked(st)
	c.mu.Unlock()
	return qerr
}

// onHeaders takes a reply's headers (or trailers, which are dropped).
func (c *Conn) onHeaders(f *http2.MetaHeadersFrame) error {
	st, headersIn, _ := c.lookup(f.StreamID)
	if st == nil {
		return nil // a stream we reset
	}
	if headersIn { // trailers
		if f.StreamEnded() {
			c.endReply(st)
		}
		return nil
	}
	status := f.PseudoValue("status")
	code, err := strconv.Atoi(status)
	if err != nil || code < 100 || code > 999 {
		return c.resetStream(f.StreamID, http2.ErrCodeProtocol, fmt.Errorf("h2client: reply with status %q", status))
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		if f.StreamEnded() {
			return c.resetStream(f.StreamID, http2.ErrCodeProtocol, fmt.Errorf("h2client: stream ended by a %d reply", code))
		}
		return nil // an interim reply: the final one follows
	}
	header := canonicalHeader(f.RegularFields())
	resp := &http.Response{
		Status:        status + " " + http.StatusText(code),
		StatusCode:    code,
		Proto:         "HTTP/2.0",
		ProtoMajor:    2,
		Header:        header,
		ContentLength: contentLength(header),
		Body:          replyBody{st},
	}
	if w := st.whole; w != nil && resp.ContentLength > 0 && resp.ContentLength <= w.maxBody {
		// Read whole: one buffer of its size, but a length declared is
		// not bytes sent, so a peer gets no more than presizeMax for it.
		st.body.presize(int(min(resp.ContentLength, presizeMax)))
	}
	c.mu.Lock()
	if st.headersIn { // failed meanwhile
		c.mu.Unlock()
		return nil
	}
	st.headersIn = true
	st.resp = resp
	if st.headers != nil {
		close(st.headers)
	}
	c.mu.Unlock()
	if f.StreamEnded() {
		if resp.ContentLength < 0 {
			resp.ContentLength = 0
		}
		c.endReply(st)
	}
	return nil
}

// endReply takes the reply's END_STREAM.
func (c *Conn) endReply(st *stream) {
	st.body.fail(io.EOF)
	c.mu.Lock()
	st.gotEnd = true
	st.fireLocked(st.resp, nil)
	if st.doneLocked() {
		c.removeLocked(st)
	}
	c.cond.Broadcast() // a body still being sent stops
	c.mu.Unlock()
}

// onData takes reply bytes. The connection window is credited at once (each
// stream's window bounds what waits for its reader); the stream's is
// credited as the reader takes them, and padding at once.
func (c *Conn) onData(f *http2.DataFrame) error {
	n := int(f.Header().Length)
	if n > 0 {
		c.unackedIn += n // the read loop's alone
		if c.unackedIn >= connWindow/8 {
			credit := c.unackedIn
			c.unackedIn = 0
			if err := c.queueControl(h2frame.Control{Kind: h2frame.WindowUpdate, Val: uint32(credit)}); err != nil {
				return err
			}
		}
	}
	st, headersIn, failed := c.lookup(f.StreamID)
	if st == nil {
		return nil // a stream we reset
	}
	if !headersIn || failed {
		return c.resetStream(f.StreamID, http2.ErrCodeProtocol, errors.New("h2client: reply data before its headers"))
	}
	data := f.Data()
	if w := st.whole; w != nil {
		// Nobody reads a whole reply until it has arrived: its window is
		// given back as it comes, up to its bound.
		w.received += int64(len(data))
		if w.received > w.maxBody {
			return c.resetStream(f.StreamID, http2.ErrCodeCancel, fmt.Errorf("h2client: the reply is longer than %d bytes", w.maxBody))
		}
		if !st.body.write(data, 0) {
			return nil
		}
		if refund := st.body.taken(n); refund > 0 {
			if err := c.queueControl(h2frame.Control{Kind: h2frame.WindowUpdate, StreamID: f.StreamID, Val: uint32(refund)}); err != nil {
				return err
			}
		}
	} else {
		if st.body.buffered()+len(data) > 2*streamWindow {
			return c.resetStream(f.StreamID, http2.ErrCodeFlowControl, errors.New("h2client: the server sent past the stream's window"))
		}
		if !st.body.write(data, n-len(data)) {
			return nil // the reader failed or closed it; the reset follows
		}
	}
	if f.StreamEnded() {
		c.endReply(st)
	}
	return nil
}

// onWindowUpdate grows a send window.
func (c *Conn) onWindowUpdate(f *http2.WindowUpdateFrame) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.StreamID == 0 {
		c.sendWindow += int64(f.Increment)
	} else if st := c.streams[f.StreamID]; st != nil {
		st.sendWindow += int64(f.Increment)
	}
	c.cond.Broadcast()
}

// onSettings applies the server's settings and acknowledges them.
func (c *Conn) onSettings(f *http2.SettingsFrame) error {
	c.mu.Lock()
	tableSize, tableSizeSet, err := c.peer.Apply(f, func(delta int64) error {
		for _, st := range c.streams {
			if st.sendWindow+delta > h2frame.MaxWindow {
				return http2.ConnectionError(http2.ErrCodeFlowControl)
			}
			st.sendWindow += delta
		}
		return nil
	})
	c.clearFullLocked() // the stream limit may have grown
	c.cond.Broadcast()
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return c.queueControl(h2frame.Control{Kind: h2frame.SettingsAck, Val: tableSize, TableSizeSet: tableSizeSet})
}

// onReset takes the server's RST_STREAM.
func (c *Conn) onReset(f *http2.RSTStreamFrame) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.streams[f.StreamID]
	if st == nil {
		return
	}
	if st.gotEnd { // the reply is whole; the server only stops our body
		st.reset = true
		c.removeLocked(st)
		c.cond.Broadcast()
		return
	}
	if f.ErrCode == http2.ErrCodeRefusedStream {
		st.failLocked(fmt.Errorf("%w: stream refused (REFUSED_STREAM)", ErrNotProcessed))
	} else {
		st.failLocked(fmt.Errorf("h2client: stream reset by the server: %v", f.ErrCode))
	}
	c.cond.Broadcast()
}

// onGoAway stops new streams and fails those the server will not process.
func (c *Conn) onGoAway(f *http2.GoAwayFrame) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.goAway = true
	c.goAwayID = f.LastStreamID
	c.clearFullLocked()
	for id, st := range c.streams {
		if id > f.LastStreamID {
			st.failLocked(fmt.Errorf("%w: above the server's GOAWAY last stream %d (%v)", ErrNotProcessed, f.LastStreamID, f.ErrCode))
		}
	}
	c.cond.Broadcast()
}
