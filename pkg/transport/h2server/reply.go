package h2server

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/gymfleet/gymfleet/pkg/transport/h2frame"
)

// errStreamClosed is what a handler's write returns once its stream is
// gone (reset by the client, or the connection failed).
var errStreamClosed = errors.New("h2server: stream closed")

// responseWriter is a handler's http.ResponseWriter. Nothing of the reply
// is held until the handler writes: its first bytes are kept back (up to
// MaxBufferedReply) so that a reply written whole goes out with its
// length, and a Flush or a longer reply sends them.
type responseWriter struct {
	st         *stream
	header     http.Header
	status     int // 0 until WriteHeader
	sentHeader bool
	head       bool // a HEAD request: the body is not sent
	buf        []byte
	// reserved is what buf counts against MaxConnBufferedReply.
	reserved int64
	// detached is set by Detach: the handler's return does not end the
	// stream.
	detached bool
}

func (w *responseWriter) Header() http.Header {
	if w.header == nil {
		w.header = make(http.Header)
	}
	return w.header
}

// WriteHeader sets the reply's status. Interim (1xx) statuses are not
// sent; a second call is ignored, as net/http does.
func (w *responseWriter) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if w.status != 0 || code < 200 {
		return
	}
	w.status = code
}

func (w *responseWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(w.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if w.head {
		return len(b), nil
	}
	if w.sentHeader {
		return w.send(b, false)
	}
	if n := len(w.buf) + len(b); n <= w.st.c.s.cfg.MaxBufferedReply && w.reserveReply(n) {
		w.buf = append(w.st.c.s.bufs.grow(w.buf, len(b)), b...)
		return len(b), nil
	}
	if err := w.flushBuffered(b); err != nil {
		return 0, err
	}
	return w.send(b, false)
}

// Flush sends the headers and what is buffered.
func (w *responseWriter) Flush() { _ = w.FlushError() }

// FlushError is Flush with its error, for http.ResponseController.
func (w *responseWriter) FlushError() error {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return w.flushBuffered(nil)
}

// flushBuffered sends the headers, if not yet sent, and the buffered
// bytes; next is what will follow them (for sniffing a content type).
func (w *responseWriter) flushBuffered(next []byte) error {
	if !w.sentHeader {
		if _, err := w.writeHeaders(-1, false, sniffable(w.buf, next), false); err != nil {
			return err
		}
	}
	if len(w.buf) == 0 {
		return nil
	}
	_, err := w.send(w.buf, false)
	w.releaseBuffer()
	return err
}

// sniffLen is how much of a body http.DetectContentType looks at.
const sniffLen = 512

// sniffable is the start of buffered followed by next, as much of it as
// naming a content type takes: a large first write is not copied whole
// (nor at all when buffered already holds that much).
func sniffable(buffered, next []byte) []byte {
	switch {
	case len(buffered) >= sniffLen || len(next) == 0:
		return buffered
	case len(buffered) == 0:
		return next
	}
	return append(buffered[:len(buffered):len(buffered)], next[:min(len(next), sniffLen-len(buffered))]...)
}

// releaseBuffer gives back the buffer of the reply's first bytes, sent or
// dropped.
func (w *responseWriter) releaseBuffer() {
	w.st.c.s.bufs.put(w.buf)
	w.buf = nil
	if w.reserved > 0 {
		w.st.c.replyHeld.Add(-w.reserved)
		w.reserved = 0
	}
}

// finish ends the reply once the handler returned.
func (w *responseWriter) finish() {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !w.sentHeader {
		length := -1
		if bodyAllowed(w.status) && !w.head {
			length = len(w.buf)
		}
		end := len(w.buf) == 0 || w.head
		sentBody, err := w.writeHeaders(length, end, w.buf, !end)
		if err != nil || end || sentBody {
			w.releaseBuffer()
			return
		}
	}
	w.send(w.buf, true)
	w.releaseBuffer()
}

// writeHeaders sends the reply's HEADERS (and CONTINUATIONs): length is a
// Content-Length to declare (-1: none), end whether the reply ends with
// them, body its first bytes, for a content type when the handler set
// none. With whole set, body is the whole reply: it goes out in the same
// write, ending the stream, when the client's windows have room for it
// (sentBody).
func (w *responseWriter) writeHeaders(length int, end bool, body []byte, whole bool) (sentBody bool, err error) {
	st := w.st
	c := st.c
	h := w.header
	if _, set := h["Content-Type"]; !set && len(body) > 0 && bodyAllowed(w.status) {
		w.Header().Set("Content-Type", http.DetectContentType(body))
		h = w.header
	}
	c.mu.Lock()
	if st.reset || c.err != nil {
		c.mu.Unlock()
		return false, errStreamClosed
	}
	if whole && int64(len(body)) <= min(st.sendWindow, c.sendWindow) {
		sentBody = true
		st.sendWindow -= int64(len(body))
		c.sendWindow -= int64(len(body))
	}
	resetAfter := false
	if end || sentBody {
		resetAfter = st.endStreamLocked()
	}
	frameSize := c.peer.FrameSize
	c.mu.Unlock()
	w.sentHeader = true
	return sentBody, c.writeFrames(func() error {
		c.hbuf.Reset()
		c.field(":status", strconv.Itoa(w.status))
		_, lengthSet := h["Content-Length"]
		for k, vs := range h {
			lk := strings.ToLower(k)
			switch lk {
			case "connection", "proxy-connection", "keep-alive", "transfer-encoding", "upgrade", "trailer":
				continue
			}
			for _, v := range vs {
				c.field(lk, v)
			}
		}
		if length >= 0 && !lengthSet {
			c.field("content-length", strconv.Itoa(length))
		}
		if err := h2frame.WriteHeaderBlock(c.fr, st.id, c.hbuf.Bytes(), frameSize, end); err != nil {
			return err
		}
		for rest := body; sentBody && len(rest) > 0; {
			n := min(len(rest), frameSize)
			if err := c.fr.WriteData(st.id, n == len(rest), rest[:n]); err != nil {
				return err
			}
			rest = rest[n:]
		}
		if resetAfter {
			return c.fr.WriteRSTStream(st.id, http2.ErrCodeNo)
		}
		return nil
	})
}

func (c *conn) field(name, value string) {
	c.henc.WriteField(hpack.HeaderField{Name: name, Value: value})
}

// send writes b as DATA frames within the client's windows, the last one
// ending the stream when end is set (an empty b then sends an empty
// frame). It waits for window as long as the stream lives.
func (w *responseWriter) send(b []byte, end bool) (int, error) {
	st := w.st
	c := st.c
	written := 0
	for len(b) > 0 || end {
		c.mu.Lock()
		if len(b) > 0 && (st.sendWindow <= 0 || c.sendWindow <= 0) && !st.reset && c.err == nil {
			// The watchdog resets the stream if the client grants no
			// window for the write timeout.
			if c.s.cfg.WriteTimeout > 0 {
				st.stallSince = c.clock()
				c.watchLocked()
			}
			c.stalled++
			for len(b) > 0 && (st.sendWindow <= 0 || c.sendWindow <= 0) && !st.reset && c.err == nil {
				c.cond.Wait()
			}
			c.stalled--
			st.stallSince = 0
		}
		if st.reset || c.err != nil {
			c.mu.Unlock()
			return written, errStreamClosed
		}
		k := int(min(int64(len(b)), st.sendWindow, c.sendWindow, int64(c.peer.FrameSize)))
		st.sendWindow -= int64(k)
		c.sendWindow -= int64(k)
		last := end && k == len(b)
		resetAfter := false
		if last {
			resetAfter = st.endStreamLocked()
		}
		c.mu.Unlock()
		chunk := b[:k]
		err := c.writeFrames(func() error {
			if err := c.fr.WriteData(st.id, last, chunk); err != nil {
				return err
			}
			if resetAfter {
				return c.fr.WriteRSTStream(st.id, http2.ErrCodeNo)
			}
			return nil
		})
		if err != nil {
			return written, err
		}
		written += k
		b = b[k:]
		if last {
			return written, nil
		}
	}
	return written, nil
}

// bodyAllowed reports whether a reply with status may have a body.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}
