package h2server

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"

	"golang.org/x/net/http2"

	"github.com/gymfleet/gymfleet/pkg/transport/h2frame"
)

// readFrames dispatches the client's frames until the connection ends. A
// connection error is sent as GOAWAY before it returns. It never waits on
// the socket to write but for that GOAWAY (and at most goAwayTimeout): what
// it answers with is queued (queueControl).
func (c *conn) readFrames() error {
	for {
		f, err := c.fr.ReadFrame()
		if err == nil {
			err = c.dispatch(f)
		}
		if err == nil {
			continue
		}
		if se, ok := errors.AsType[http2.StreamError](err); ok {
			if err := c.resetStream(se.StreamID, se.Code, fmt.Errorf("h2server: %w", se)); err != nil {
				return err
			}
			continue
		}
		if ce, ok := errors.AsType[http2.ConnectionError](err); ok {
			c.mu.Lock()
			last := c.maxID
			c.mu.Unlock()
			c.s.cfg.Logger.Warn("http2 connection error", "remote", c.remoteAddr, "code", http2.ErrCode(ce))
			c.writeFinal(func() error { return c.fr.WriteGoAway(last, http2.ErrCode(ce), nil) })
		}
		return err
	}
}

func (c *conn) dispatch(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		return c.onHeaders(f)
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.WindowUpdateFrame:
		return c.onWindowUpdate(f)
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		return c.onSettings(f)
	case *http2.PingFrame:
		if f.IsAck() {
			return nil
		}
		return c.queueControl(h2frame.Control{Kind: h2frame.PingAck, Data: f.Data})
	case *http2.RSTStreamFrame:
		return c.onReset(f)
	case *http2.GoAwayFrame:
		// The client opens no more streams; those it has finish.
		return nil
	case *http2.PushPromiseFrame:
		return http2.ConnectionError(http2.ErrCodeProtocol)
	case *http2.PriorityFrame:
		if f.StreamDep == f.StreamID {
			return http2.StreamError{StreamID: f.StreamID, Code: http2.ErrCodeProtocol, Cause: errors.New("stream depends on itself")}
		}
	}
	return nil // priorities and unknown frames are otherwise ignored
}

// onHeaders opens a stream for a request, or takes a request's trailers.
func (c *conn) onHeaders(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	if id%2 == 0 {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	c.mu.Lock()
	if id <= c.maxID {
		st := c.streams[id]
		var err error
		rec := (*resetRecord)(nil)
		if st == nil {
			rec = c.recentResetLocked(id)
		}
		switch {
		case rec != nil:
			// Reset by us and forgotten: as below for st.reset.
			if !f.StreamEnded() {
				err = http2.StreamError{StreamID: id, Code: http2.ErrCodeProtocol}
			}
			rec.id = 0 // the client's side has ended too
		case st.closedByPeer():
			// A closed stream, or a new one numbered below one already
			// opened: as x/net's server, a connection error (RFC 9113
			// §5.1, §5.1.1). Every id up to maxID that is not in streams
			// is closed, so no per-id record is kept.
			err = http2.ConnectionError(http2.ErrCodeProtocol)
		case !f.StreamEnded():
			err = http2.StreamError{StreamID: id, Code: http2.ErrCodeProtocol} // trailers end the stream
		case st.reset:
			// We reset it: the client may have sent these before our
			// RST_STREAM reached it, and they are ignored (RFC 9113 §5.1).
		case st.gotEnd:
			err = http2.StreamError{StreamID: id, Code: http2.ErrCodeStreamClosed} // half-closed (remote)
		default:
			c.mu.Unlock()
			return c.endRequestBody(st) // trailers, dropped
		}
		c.mu.Unlock()
		return err
	}
	c.maxID = id
	if f.HasPriority() && f.Priority.StreamDep == id {
		c.mu.Unlock()
		return http2.StreamError{StreamID: id, Code: http2.ErrCodeProtocol, Cause: errors.New("stream depends on itself")}
	}
	cost := headerCost(f)
	refuse := c.goingAway || c.err != nil ||
		c.open >= int(c.s.cfg.MaxConcurrentStreams) ||
		len(c.streams) >= 2*int(c.s.cfg.MaxConcurrentStreams) || // handlers still returning from resets
		// The connection's header budget: requests left waiting (without
		// their END_STREAM, say) hold their decoded headers.
		(len(c.streams) > 0 && c.headerBytes+int64(cost) > c.s.cfg.MaxConnHeaderBytes) ||
		// A client granting no window: its handlers would wait holding
		// their replies' makings.
		c.stalled >= c.s.cfg.MaxStalledStreams ||
		(c.peer.StreamWindow <= 0 && c.open >= c.s.cfg.MaxStalledStreams)
	c.mu.Unlock()
	if refuse {
		return c.queueControl(h2frame.Control{Kind: h2frame.Reset, StreamID: id, Val: uint32(http2.ErrCodeRefusedStream)})
	}
	if f.Truncated {
		return c.writeStatusOnly(id, http.StatusRequestHeaderFieldsTooLarge)
	}
	req, err := c.newRequest(f)
	if err != nil {
		return http2.StreamError{StreamID: id, Code: http2.ErrCodeProtocol, Cause: err}
	}
	if req.Method == http.MethodOptions && req.RequestURI == "*" {
		// As net/http answers it: a client's check that the server is up.
		return c.writeStatusOnly(id, http.StatusOK)
	}
	st, req := c.newStream(id, req, f.StreamEnded(), cost)
	c.handlers.Add(1)
	go c.runHandler(st, req)
	return nil
}

// writeStatusOnly answers stream id with a bodiless status, without a
// handler.
func (c *conn) writeStatusOnly(id uint32, status int) error {
	return c.queueControl(h2frame.Control{Kind: h2frame.StatusOnly, StreamID: id, Val: uint32(status)})
}

// newRequest builds a handler's request from its header block.
func (c *conn) newRequest(f *http2.MetaHeadersFrame) (*http.Request, error) {
	method := f.PseudoValue("method")
	path := f.PseudoValue("path")
	scheme := f.PseudoValue("scheme")
	authority := f.PseudoValue("authority")
	if f.PseudoValue("protocol") != "" {
		return nil, errors.New("extended CONNECT is not supported")
	}
	if method == "" || path == "" || scheme == "" || !validMethod(method) {
		return nil, fmt.Errorf("missing or invalid pseudo-headers (method %q, path %q, scheme %q)", method, path, scheme)
	}
	var u *url.URL
	if path == "*" {
		if method != http.MethodOptions {
			return nil, errors.New(`path "*" on a method other than OPTIONS`)
		}
		u = &url.URL{Path: "*"}
	} else {
		if path[0] != '/' {
			return nil, fmt.Errorf("path %q is not absolute", path)
		}
		var err error
		if u, err = url.ParseRequestURI(path); err != nil {
			return nil, err
		}
	}
	fields := f.RegularFields()
	header := make(http.Header, len(fields))
	declared := int64(-1)
	for _, hf := range fields {
		switch hf.Name {
		case "connection", "proxy-connection", "keep-alive", "transfer-encoding", "upgrade":
			return nil, fmt.Errorf("connection-specific header %q", hf.Name)
		case "te":
			if hf.Value != "trailers" {
				return nil, fmt.Errorf("te: %q", hf.Value)
			}
		case "content-length":
			n, err := strconv.ParseInt(hf.Value, 10, 64)
			if err != nil || n < 0 || (declared >= 0 && n != declared) {
				return nil, fmt.Errorf("content-length %q", hf.Value)
			}
			declared = n
		case "host":
			if authority == "" {
				authority = hf.Value
			}
		}
		key := textproto.CanonicalMIMEHeaderKey(hf.Name)
		header[key] = append(header[key], hf.Value)
	}
	if strings.ContainsAny(authority, " \t\r\n/") {
		return nil, fmt.Errorf("authority %q", authority)
	}
	if f.StreamEnded() {
		if declared > 0 {
			return nil, fmt.Errorf("content-length %d on a request without a body", declared)
		}
		declared = 0
	}
	return &http.Request{
		Method:        method,
		URL:           u,
		Proto:         "HTTP/2.0",
		ProtoMajor:    2,
		Header:        header,
		ContentLength: declared,
		Host:          authority,
		RemoteAddr:    c.remoteAddr,
		TLS:           c.tlsState,
		RequestURI:    path,
	}, nil
}

// validMethod reports whether m is an HTTP token.
func validMethod(m string) bool {
	for i := 0; i < len(m); i++ {
		b := m[i]
		if b <= ' ' || b >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, b) >= 0 {
			return false
		}
	}
	return true
}

// onData takes request body bytes.
func (c *conn) onData(f *http2.DataFrame) error {
	id := f.StreamID
	n := int64(f.Header().Length) // padding included: it counts against the windows
	c.mu.Lock()
	c.recvWindow -= n
	if c.recvWindow < 0 {
		c.mu.Unlock()
		return http2.ConnectionError(http2.ErrCodeFlowControl)
	}
	st := c.streams[id]
	if st == nil || st.reset || st.gotEnd {
		credit := c.creditLocked(n) // nobody will read these bytes
		var err error
		var rec *resetRecord
		if st == nil {
			rec = c.recentResetLocked(id)
		}
		switch {
		case id > c.maxID:
			err = http2.ConnectionError(http2.ErrCodeProtocol) // DATA on an idle stream
		case rec != nil:
			rec.received += int64(len(f.Data()))
			if wrongLength(rec.declared, rec.received, f.StreamEnded()) {
				err = http2.StreamError{StreamID: id, Code: http2.ErrCodeProtocol, Cause: errors.New("request body length differs from its content-length")}
			}
			if f.StreamEnded() {
				rec.id = 0
			}
		case !st.closedByPeer() && st.reset:
			// Reset by us: sent before the client saw our RST_STREAM, and
			// ignored, but for a body longer than it declared (an error
			// whether or not the client saw the reset).
			st.received += int64(len(f.Data()))
			if wrongLength(st.declared, st.received, f.StreamEnded()) {
				err = http2.StreamError{StreamID: id, Code: http2.ErrCodeProtocol, Cause: errors.New("request body length differs from its content-length")}
			}
		default:
			err = http2.StreamError{StreamID: id, Code: http2.ErrCodeStreamClosed}
		}
		c.mu.Unlock()
		if err := c.sendCredit(0, credit); err != nil {
			return err
		}
		return err
	}
	st.recvWindow -= n
	if st.recvWindow < 0 {
		c.mu.Unlock()
		return http2.StreamError{StreamID: id, Code: http2.ErrCodeFlowControl}
	}
	data := f.Data()
	st.received += int64(len(data))
	if len(data) > 0 && c.s.cfg.BodyReadTimeout > 0 {
		st.lastRecv = c.clock()
	}
	if wrongLength(st.declared, st.received, f.StreamEnded()) {
		c.mu.Unlock()
		return http2.StreamError{StreamID: id, Code: http2.ErrCodeProtocol, Cause: errors.New("request body length differs from its content-length")}
	}
	// Padding is taken at once; the data when the handler reads it (or
	// drops it, having closed the body).
	credit := c.creditLocked(n - int64(len(data)))
	if !st.body.write(data) {
		credit += c.creditLocked(int64(len(data)))
	}
	c.mu.Unlock()
	if err := c.sendCredit(0, credit); err != nil {
		return err
	}
	if f.StreamEnded() {
		return c.endRequestBody(st)
	}
	return nil
}

// wrongLength reports whether a body of which received bytes arrived
// (ended: all of it) contradicts its declared content-length (-1: none).
func wrongLength(declared, received int64, ended bool) bool {
	return declared >= 0 && (received > declared || (ended && received != declared))
}

// endRequestBody takes a request's END_STREAM.
func (c *conn) endRequestBody(st *stream) error {
	c.mu.Lock()
	st.gotEnd = true
	if st.sentEnd {
		st.closeLocked()
	}
	c.mu.Unlock()
	st.body.fail(io.EOF)
	return nil
}

// sendCredit gives the client back credit bytes of window on stream id (0:
// the connection). The update is queued.
func (c *conn) sendCredit(id uint32, credit int64) error {
	if credit <= 0 {
		return nil
	}
	return c.queueControl(h2frame.Control{Kind: h2frame.WindowUpdate, StreamID: id, Val: uint32(credit)})
}

// onWindowUpdate grows a send window.
func (c *conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	inc := int64(f.Increment)
	if f.StreamID == 0 {
		if c.sendWindow+inc > h2frame.MaxWindow {
			return http2.ConnectionError(http2.ErrCodeFlowControl)
		}
		c.sendWindow += inc
	} else if f.StreamID > c.maxID {
		return http2.ConnectionError(http2.ErrCodeProtocol) // an idle stream (RFC 9113 §5.1)
	} else if rec := c.recentResetLocked(f.StreamID); rec != nil && c.streams[f.StreamID] == nil {
		if rec.sendWindow+inc > h2frame.MaxWindow {
			return http2.StreamError{StreamID: f.StreamID, Code: http2.ErrCodeFlowControl}
		}
		rec.sendWindow += inc
	} else if st := c.streams[f.StreamID]; !st.closedByPeer() {
		// A stream we reset is still checked: the client's window
		// arithmetic is wrong whether or not it saw our reset.
		if st.sendWindow+inc > h2frame.MaxWindow {
			return http2.StreamError{StreamID: f.StreamID, Code: http2.ErrCodeFlowControl}
		}
		st.sendWindow += inc
	}
	c.cond.Broadcast()
	return nil
}

// onSettings applies the client's settings and acknowledges them.
func (c *conn) onSettings(f *http2.SettingsFrame) error {
	c.mu.Lock()
	tableSize, tableSizeSet, err := c.peer.Apply(f, func(delta int64) error {
		for _, st := range c.streams {
			if st.sendWindow+delta > h2frame.MaxWindow {
				return http2.ConnectionError(http2.ErrCodeFlowControl)
			}
			st.sendWindow += delta
		}
		for i := range c.resets {
			c.resets[i].sendWindow += delta
		}
		return nil
	})
	c.cond.Broadcast()
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return c.queueControl(h2frame.Control{Kind: h2frame.SettingsAck, Val: tableSize, TableSizeSet: tableSizeSet})
}

// errStreamReset is the cause of a request's context when its client
// reset the stream.
var errStreamReset = errors.New("h2server: stream reset by the client")

// onReset takes the client's RST_STREAM: the handler's context is
// cancelled and its writes fail.
func (c *conn) onReset(f *http2.RSTStreamFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.StreamID > c.maxID {
		return http2.ConnectionError(http2.ErrCodeProtocol) // a stream never opened
	}
	if rec := c.recentResetLocked(f.StreamID); rec != nil && c.streams[f.StreamID] == nil {
		rec.id = 0
	}
	if st := c.streams[f.StreamID]; st != nil {
		st.peerReset = true
		st.resetLocked(fmt.Errorf("%w (%v)", errStreamReset, f.ErrCode))
		c.cond.Broadcast()
	}
	return nil
}
