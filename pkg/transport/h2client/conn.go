// Package h2client is an HTTP/2 client connection, without TLS (prior
// knowledge) or over a TLS connection whose ALPN chose "h2" (the caller
// dials it and hands it to NewConn), for calls between our own servers, built so that a request
// waiting for its reply costs no goroutine of its own.
//
// net/http's HTTP/2 client starts a goroutine for every request
// (clientStream.doRequest), which lives until the reply has arrived: 4 KB of
// stack and its objects for every call in flight. At 100,000 rollouts held
// at a model call that is a goroutine in each of the three servers a rollout
// passes, 1.2 GB of stacks. Here the caller's goroutine writes the request
// and waits for the reply itself; one goroutine per connection reads frames
// and hands each stream what arrives for it.
//
// It speaks the subset of RFC 9113 a client of Go's HTTP/2 server needs:
// requests with bodies (flow-controlled both ways), replies streamed as they
// arrive, cancellation (RST_STREAM), the server's stream limit, GOAWAY, and
// PING and SETTINGS answered (queued for the writer: the read loop never
// waits on the socket, see queueControl). It does not do server push (disabled in our
// SETTINGS), priorities, trailers (read and dropped) or TLS itself. A server that
// answers the preface in HTTP/1.x fails the connection with ErrHTTP1Server.
package h2client

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/gymfleet/gymfleet/pkg/infra/freshstack"
	"github.com/gymfleet/gymfleet/pkg/transport/h2frame"
)

const (
	// streamWindow is the receive window of each stream: the most of one
	// reply buffered before its reader takes it.
	streamWindow = 4 << 20
	// connWindow is the receive window of the connection. Data is credited
	// back to it as it arrives (each stream's own window bounds what waits
	// for a reader), so it only has to exceed what is in the socket.
	connWindow = 1 << 30
	// maxReadFrameSize is the largest frame we accept (SETTINGS_MAX_FRAME_SIZE).
	maxReadFrameSize = 1 << 20
	// maxHeaderListSize bounds a reply's decoded header block.
	maxHeaderListSize = 1 << 20
	// initialPeerStreams is the stream limit assumed before the peer's
	// SETTINGS arrive (net/http's client assumes 100 too).
	initialPeerStreams = 100
	// writeChunk is the most of a request body read for one DATA frame.
	writeChunk = 64 << 10
)

// ErrNotProcessed is wrapped by the error of a request the server did not
// process: one it refused (REFUSED_STREAM), one above a GOAWAY's last
// stream, one on a connection that closed before the request's stream
// opened. Sending it again is safe (RFC 9113 §8.7).
var ErrNotProcessed = errors.New("h2client: request not processed by the server")

// ErrHTTP1Server is wrapped by the error of a connection whose server
// answered our preface with an HTTP/1.x status line: it does not speak h2c
// (uvicorn, and any net/http server without h2c enabled, reply
// "HTTP/1.1 400 Bad Request" or similar). It wraps ErrNotProcessed: an
// HTTP/1 server cannot read an HTTP/2 frame as a request, so nothing sent
// on the connection was processed. Sending again over h2c will fail the
// same way; the request is for an HTTP/1.1 transport.
var ErrHTTP1Server error = notProcessedError("h2client: the server speaks HTTP/1.x, not h2c")

// notProcessedError is a sentinel that is ErrNotProcessed too.
type notProcessedError string

func (e notProcessedError) Error() string { return string(e) }
func (e notProcessedError) Unwrap() error { return ErrNotProcessed }

// errConnClosed is a connection's error once Close has been called.
var errConnClosed = errors.New("h2client: connection closed")

// Conn is one HTTP/2 connection to a server. Its methods are safe for
// concurrent use.
type Conn struct {
	nc net.Conn
	br *bufio.Reader // the read loop's alone

	// wmu orders everything written: frames, the HPACK encoder's state and
	// the assignment of stream ids (streams must open in id order).
	wmu  sync.Mutex
	bw   *bufio.Writer
	fr   *http2.Framer // its read side is the read loop's alone
	henc *hpack.Encoder
	hbuf bytes.Buffer
	// bodyBuffers holds the buffers long request bodies are sent from.
	bodyBuffers sync.Pool
	// ctrl holds the frames the read loop answers with until a writer
	// takes them (queueControl); flushers counts the goroutines started to
	// write them when no writer came.
	ctrl     h2frame.ControlQueue
	flushers sync.WaitGroup

	mu sync.Mutex
	// cond is signalled when a stream slot frees, a send window grows, a
	// stream ends or the connection fails.
	cond     sync.Cond
	streams  map[uint32]*stream
	reserved int // slots promised by Reserve, not yet taken by a request
	opening  int // slots taken by requests whose stream is not registered yet
	// full is set by a Reserve that found every slot taken, and cleared,
	// under mu, by whatever frees a slot, raises the server's limit or
	// fails the connection (clearFullLocked). While it is set, Reserve
	// refuses without taking mu: a pool whose connections are all full
	// tries each of them for every request of a burst, and mu is the lock
	// the read loop takes for every frame it reads.
	full       atomic.Bool
	sendWindow int64
	peer       h2frame.Peer // the server's SETTINGS
	// goAway is set when the peer sent GOAWAY: no new streams.
	goAway   bool
	goAwayID uint32
	err      error // set once: the connection is unusable
	// spoke is set when the server's first bytes arrived and are not
	// HTTP/1's (checkHTTP2); requests wait for it.
	spoke bool
	// nextID is the id of the next stream: assigned under mu and wmu both,
	// so that streams open in id order.
	nextID uint32

	// unackedIn is what the connection received and has not credited back
	// to the server yet; the read loop's alone.
	unackedIn int
	readDone  chan struct{} // closed when the read loop returns
}

// Dial opens a connection to addr with dial and starts its read loop. The
// connection takes requests at once; they go out once the server has spoken
// (NewConn).
func Dial(ctx context.Context, dial func(ctx context.Context, network, addr string) (net.Conn, error), addr string) (*Conn, error) {
	nc, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return NewConn(nc)
}

// NewConn starts HTTP/2 on nc, which it owns from then on. Requests are
// written once the server's first bytes have arrived.
func NewConn(nc net.Conn) (*Conn, error) {
	c := &Conn{
		nc:         nc,
		bw:         bufio.NewWriterSize(nc, 64<<10),
		nextID:     1,
		streams:    map[uint32]*stream{},
		sendWindow: h2frame.InitialWindow,
		peer:       h2frame.NewPeer(initialPeerStreams),
		readDone:   make(chan struct{}),
	}
	c.cond.L = &c.mu
	c.br = bufio.NewReaderSize(nc, 64<<10)
	c.fr = http2.NewFramer(c.bw, c.br)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = maxHeaderListSize
	c.fr.SetMaxReadFrameSize(maxReadFrameSize)
	c.henc = hpack.NewEncoder(&c.hbuf)

	c.wmu.Lock()
	_, err := c.bw.WriteString(http2.ClientPreface)
	if err == nil {
		err = c.fr.WriteSettings(
			http2.Setting{ID: http2.SettingEnablePush, Val: 0},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: streamWindow},
			http2.Setting{ID: http2.SettingMaxFrameSize, Val: maxReadFrameSize},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: maxHeaderListSize},
		)
	}
	if err == nil {
		err = c.fr.WriteWindowUpdate(0, connWindow-h2frame.InitialWindow)
	}
	if err == nil {
		err = c.bw.Flush()
	}
	c.wmu.Unlock()
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("h2client: starting HTTP/2: %w", err)
	}
	go c.readLoop()
	return c, nil
}

// Err is the error that made the connection unusable for new requests
// (closed, failed, or told to go away), or nil.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.usableLocked()
}

func (c *Conn) usableLocked() error {
	switch {
	case c.err != nil:
		return c.err
	case c.goAway:
		return fmt.Errorf("%w: the server sent GOAWAY", ErrNotProcessed)
	case c.nextIDExhaustedLocked():
		return fmt.Errorf("%w: stream ids used up", ErrNotProcessed)
	}
	return nil
}

// nextIDExhaustedLocked reports whether the connection is near the end of
// its stream ids (the margin covers the streams being opened).
func (c *Conn) nextIDExhaustedLocked() bool {
	return c.nextID > math.MaxInt32-2*uint32(max(c.peer.MaxStreams, initialPeerStreams))-2
}

// InFlight is the number of requests open or reserved on the connection.
func (c *Conn) InFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.slotsLocked()
}

// slotsLocked is the number of stream slots taken or promised.
func (c *Conn) slotsLocked() int { return len(c.streams) + c.reserved + c.opening }

// Reserve promises the next RoundTrip a stream slot, or fails when the
// connection has none free or cannot take requests. On success free is
// how many slots are left after this one, of the server's limit: a pool
// opens its next connection before the last one fills.
func (c *Conn) Reserve() (free, limit int, err error) {
	if c.full.Load() {
		return 0, 0, ErrNoStreamFree
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocked(); err != nil {
		return 0, 0, err
	}
	if c.slotsLocked() >= c.peer.MaxStreams {
		c.full.Store(true)
		return 0, 0, ErrNoStreamFree
	}
	c.reserved++
	return c.peer.MaxStreams - c.slotsLocked(), c.peer.MaxStreams, nil
}

// clearFullLocked has the next Reserve look at the connection again: a
// slot may have freed, the server's limit grown, or the connection failed
// (which Reserve must report as such, for a pool to drop it).
func (c *Conn) clearFullLocked() { c.full.Store(false) }

// ErrNoStreamFree is Reserve's refusal of a connection that is usable but
// has every stream slot taken: a pool tries its connections one after
// another, and a busy one must cost no allocation.
var ErrNoStreamFree = errors.New("h2client: no stream free")

// Release gives back a reservation RoundTrip will not use.
func (c *Conn) Release() {
	c.mu.Lock()
	if c.reserved > 0 {
		c.reserved--
		c.clearFullLocked()
	}
	c.cond.Broadcast()
	c.mu.Unlock()
}

// Close closes the connection; requests on it fail.
func (c *Conn) Close() error {
	c.fail(errConnClosed)
	err := c.nc.Close()
	<-c.readDone
	c.flushers.Wait() // the read loop, which starts them, has returned
	return err
}

// fail makes the connection unusable with err (the first error stays) and
// wakes every waiter; the read loop then fails the open streams.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.clearFullLocked()
	c.cond.Broadcast()
	c.mu.Unlock()
}

// writeFrames writes the queued control frames, runs fn (if not nil) with
// the connection's writer and flushes. A write error fails the connection.
func (c *Conn) writeFrames(fn func() error) error {
	c.wmu.Lock()
	err := c.drainControlLocked()
	if err == nil && fn != nil {
		err = fn()
	}
	return c.endWriteLocked(err)
}

// endWriteLocked ends a write begun under wmu: it flushes unless the write
// failed (err), releases wmu, and fails the connection on an error.
func (c *Conn) endWriteLocked(err error) error {
	if err == nil {
		err = c.bw.Flush()
	}
	c.wmu.Unlock()
	if err != nil {
		c.fail(fmt.Errorf("h2client: writing: %w", err))
		c.nc.Close()
	}
	return err
}

// RoundTrip sends req on a new stream and returns the reply once its
// headers arrive; its body streams as the server writes it. The request's
// context bounds the whole exchange, the body's reading included.
func (c *Conn) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	hasBody := req.Body != nil && req.Body != http.NoBody
	// Written on a goroutine of its own: the write path (framer, bufio,
	// the socket) would grow the stack of a caller that then waits here
	// for long, and a grown stack stays grown while it waits (freshstack).
	var st *stream
	var err error
	freshstack.Run(func() { st, err = c.send(req, hasBody, nil) })
	if err != nil {
		return nil, err
	}
	select {
	case <-st.headers:
	case <-ctx.Done():
		st.cancel(context.Cause(ctx))
		return nil, context.Cause(ctx)
	}
	if st.resp == nil {
		return nil, st.err
	}
	st.resp.Request = req
	return st.resp, nil
}

// Start sends req on a new stream and returns once it is written. done is
// then called, once, on a goroutine of its own: with the reply once it has
// arrived whole (its body buffered, at most maxBody bytes, to be read
// without waiting), or with the error that ended the exchange. The
// request's context bounds the whole exchange. Nothing waits for the
// reply meanwhile: a caller that parks (pkg/infra/park) holds no goroutine.
func (c *Conn) Start(req *http.Request, maxBody int64, done func(*http.Response, error)) {
	hasBody := req.Body != nil && req.Body != http.NoBody
	whole := &wholeReply{done: done, maxBody: maxBody}
	if _, err := c.send(req, hasBody, whole); err != nil {
		// A stream that failed while being sent has told done already.
		c.mu.Lock()
		if !whole.fired {
			whole.fired = true
			if whole.stopWatch != nil {
				whole.stopWatch()
			}
			go done(nil, err)
		}
		c.mu.Unlock()
	}
}

// send opens req's stream and writes its headers and body. It closes the
// request body and tells a client trace the request was written. whole is
// where a Start caller's reply goes (nil for RoundTrip).
func (c *Conn) send(req *http.Request, hasBody bool, whole *wholeReply) (*stream, error) {
	trace := httptrace.ContextClientTrace(req.Context())
	st, err := c.openStream(req, hasBody, whole)
	if err != nil {
		closeRequestBody(req)
		wroteRequest(trace, err)
		return nil, err
	}
	if hasBody {
		err = st.sendBody(req)
		closeRequestBody(req)
		if err != nil {
			st.cancel(err)
		}
	}
	wroteRequest(trace, err)
	if err != nil {
		return nil, err
	}
	return st, nil
}

// wroteRequest tells a client trace that the request was written (or failed).
func wroteRequest(trace *httptrace.ClientTrace, err error) {
	if trace != nil && trace.WroteRequest != nil {
		trace.WroteRequest(httptrace.WroteRequestInfo{Err: err})
	}
}

// closeRequestBody closes a request body as the RoundTripper contract asks.
func closeRequestBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// openStream waits for a stream slot (using a reservation if there is one),
// then writes the request's headers.
func (c *Conn) openStream(req *http.Request, hasBody bool, whole *wholeReply) (*stream, error) {
	st := &stream{c: c, ctx: req.Context(), whole: whole}
	if whole == nil {
		st.headers = make(chan struct{})
	}
	st.body.cond.L = &st.body.mu

	c.mu.Lock()
	reserved := c.reserved > 0
	if reserved {
		c.reserved--
	}
	// Nothing follows our preface before the server's first bytes show it
	// speaks HTTP/2: an HTTP/1 server closes the connection after its
	// error reply, and a request written into that close would fail with
	// a write error instead of ErrHTTP1Server.
	wait := func() bool { return !c.spoke || (!reserved && c.slotsLocked() >= c.peer.MaxStreams) }
	if wait() && c.usableLocked() == nil {
		stop := context.AfterFunc(req.Context(), c.wake)
		for wait() && c.usableLocked() == nil && req.Context().Err() == nil {
			c.cond.Wait()
		}
		stop()
	}
	if err := c.usableLocked(); err != nil {
		c.mu.Unlock()
		// Nothing of the request was written.
		if errors.Is(err, ErrNotProcessed) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", ErrNotProcessed, err)
	}
	if err := req.Context().Err(); err != nil {
		if reserved {
			c.clearFullLocked() // the reservation is given back unused
		}
		c.mu.Unlock()
		return nil, context.Cause(req.Context())
	}
	st.sendWindow = c.peer.StreamWindow
	st.sentEnd = !hasBody
	c.opening++
	c.mu.Unlock()

	c.wmu.Lock()
	// Registered before the headers go out: the reply can arrive before
	// this goroutine runs again.
	c.mu.Lock()
	c.opening--
	st.id = c.nextID
	c.nextID += 2
	if c.err != nil {
		c.clearFullLocked()
		c.cond.Broadcast()
		c.mu.Unlock()
		c.wmu.Unlock()
		return nil, fmt.Errorf("%w: %w", ErrNotProcessed, c.err)
	}
	c.streams[st.id] = st
	if whole != nil {
		ctx := req.Context()
		whole.stopWatch = context.AfterFunc(ctx, func() { st.cancel(context.Cause(ctx)) })
	}
	c.mu.Unlock()
	err := c.drainControlLocked()
	if err == nil {
		err = c.writeHeadersLocked(st.id, req, !hasBody)
	}
	if err == nil {
		err = c.bw.Flush()
	}
	if err != nil {
		// A failed write leaves at least its last byte unsent, and the
		// header block ends this write: the server never had the whole
		// block, so it cannot have started the stream. Forgotten before
		// the connection fails, so that it is failed as never processed,
		// not with the connection.
		c.mu.Lock()
		c.removeLocked(st)
		c.mu.Unlock()
		c.endWriteLocked(err)
		return nil, fmt.Errorf("%w: writing request headers: %w", ErrNotProcessed, err)
	}
	c.wmu.Unlock()
	return st, nil
}

// writeHeadersLocked encodes req's header block and writes it as HEADERS
// and, when longer than a frame, CONTINUATION frames. The caller holds wmu.
func (c *Conn) writeHeadersLocked(id uint32, req *http.Request, endStream bool) error {
	c.hbuf.Reset()
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	path := req.URL.RequestURI()
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	c.field(":method", method)
	scheme := "http"
	if req.URL.Scheme == "https" {
		scheme = "https" // the connection is TLS the caller set up (NewConn)
	}
	c.field(":scheme", scheme)
	c.field(":authority", host)
	c.field(":path", path)
	for k, vs := range req.Header {
		lk := strings.ToLower(k)
		switch lk {
		case "host", "content-length", "connection", "proxy-connection", "transfer-encoding", "upgrade", "keep-alive":
			continue
		case "te":
			if len(vs) != 1 || vs[0] != "trailers" {
				continue
			}
		}
		for _, v := range vs {
			c.field(lk, v)
		}
	}
	if !endStream && req.ContentLength > 0 {
		c.field("content-length", strconv.FormatInt(req.ContentLength, 10))
	}
	c.mu.Lock()
	frameSize := c.peer.FrameSize
	c.mu.Unlock()
	return h2frame.WriteHeaderBlock(c.fr, id, c.hbuf.Bytes(), frameSize, endStream)
}

func (c *Conn) field(name, value string) {
	c.henc.WriteField(hpack.HeaderField{Name: name, Value: value})
}

// wake wakes every goroutine waiting on cond, to look at its context.
func (c *Conn) wake() {
	c.mu.Lock()
	c.cond.Broadcast()
	c.mu.Unlock()
}

// removeLocked forgets a stream that has ended and frees its slot.
func (c *Conn) removeLocked(st *stream) {
	if c.streams[st.id] == st {
		delete(c.streams, st.id)
		c.clearFullLocked()
		c.cond.Broadcast()
	}
}

// canonicalHeader turns a reply's lowercase field names into net/http's
// canonical form.
func canonicalHeader(fields []hpack.HeaderField) http.Header {
	h := make(http.Header, len(fields))
	for _, f := range fields {
		k := textproto.CanonicalMIMEHeaderKey(f.Name)
		h[k] = append(h[k], f.Value)
	}
	return h
}

// contentLength is a reply's declared length, -1 when it has none or an
// unreadable one.
func contentLength(h http.Header) int64 {
	v := h.Get("Content-Length")
	if v == "" {
		return -1
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// readBodyChunk reads up to len(buf) bytes of a request body, treating a
// short read followed by EOF as the body's end.
func readBodyChunk(r io.Reader, buf []byte) (int, bool, error) {
	n, err := io.ReadFull(r, buf)
	switch {
	case err == nil:
		return n, false, nil
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return n, true, nil
	}
	return n, false, err
}
