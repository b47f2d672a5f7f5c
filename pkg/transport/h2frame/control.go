package h2frame

import (
	"bytes"
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// MaxQueuedControlFrames is x/net's limit (http2/server.go,
// maxQueuedControlFrames): a peer that makes more control frames than this
// wait for the socket is not reading them.
const MaxQueuedControlFrames = 10000

// ControlKind is what a Control frame is.
type ControlKind uint8

const (
	PingAck ControlKind = iota
	SettingsAck
	Reset
	WindowUpdate
	// StatusOnly is a server's bodiless reply without a handler (431,
	// OPTIONS *).
	StatusOnly
)

// Control is a frame a read loop answers with, queued (ControlQueue).
type Control struct {
	Kind     ControlKind
	StreamID uint32
	// Val is the error code, the window increment, the status, or (with
	// TableSizeSet) the peer's new header table size.
	Val          uint32
	TableSizeSet bool
	Data         [8]byte // a PING's
}

// Write writes f with fr; a SETTINGS acknowledgement first applies the
// peer's header table size to henc, and a status-only reply encodes its
// header block in hbuf. The caller holds the connection's write lock.
func (f *Control) Write(fr *http2.Framer, henc *hpack.Encoder, hbuf *bytes.Buffer) error {
	switch f.Kind {
	case PingAck:
		return fr.WritePing(true, f.Data)
	case SettingsAck:
		if f.TableSizeSet {
			henc.SetMaxDynamicTableSizeLimit(f.Val)
		}
		return fr.WriteSettingsAck()
	case Reset:
		return fr.WriteRSTStream(f.StreamID, http2.ErrCode(f.Val))
	case WindowUpdate:
		return fr.WriteWindowUpdate(f.StreamID, f.Val)
	case StatusOnly:
		hbuf.Reset()
		henc.WriteField(hpack.HeaderField{Name: ":status", Value: strconv.Itoa(int(f.Val))})
		henc.WriteField(hpack.HeaderField{Name: "content-length", Value: "0"})
		return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: f.StreamID, BlockFragment: hbuf.Bytes(), EndStream: true, EndHeaders: true})
	}
	return nil
}

// ControlQueue holds the frames a connection's read loop answers with
// (PING and SETTINGS acknowledgements, WINDOW_UPDATE, RST_STREAM) until a
// writer of the connection takes them, so that the read loop never waits
// on the socket. A read loop that waited for the writer would stop reading
// whenever a write stalls on a peer that is not reading, and a peer whose
// own writes then stall on us stops reading in turn (golang/go#33425 is
// x/net's client in that state; x/net's server queues as here).
//
// Every writer drains the queue (Drain) under the connection's write lock
// before its own frames, so frames leave in the order they were queued and
// ahead of anything written after them. When no writer comes, a flusher
// does: Push says when the caller must start one, and More when it is done.
type ControlQueue struct {
	mu     sync.Mutex
	frames []Control
	spare  []Control
	// writing is the batch a writer took and has not yet written: it
	// still counts against MaxQueuedControlFrames.
	writing int
	// queued mirrors len(frames), for writers to skip mu.
	queued   atomic.Int32
	flushing bool // a flusher runs
	closed   bool // the connection ended: nothing more is queued
}

// Push queues f. start is true when no flusher runs: the caller starts
// one, after onStart (if not nil), which runs under the queue's lock so
// that its owner counts the flusher before Close returns. full is true,
// and nothing is queued, when MaxQueuedControlFrames already wait. After
// Close nothing is queued, and both are false.
func (q *ControlQueue) Push(f Control, onStart func()) (start, full bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false, false
	}
	if len(q.frames)+q.writing >= MaxQueuedControlFrames {
		return false, true
	}
	q.frames = append(q.frames, f)
	q.queued.Store(int32(len(q.frames)))
	if q.flushing {
		return false, false
	}
	q.flushing = true
	if onStart != nil {
		onStart()
	}
	return true, false
}

// Drain writes the queued frames in order with write, stopping at the
// first error, which it returns. The caller holds the connection's write
// lock.
func (q *ControlQueue) Drain(write func(*Control) error) error {
	if q.queued.Load() == 0 {
		return nil
	}
	q.mu.Lock()
	batch := q.frames
	q.frames = q.spare[:0]
	q.queued.Store(0)
	q.writing = len(batch)
	q.mu.Unlock()
	var err error
	for i := range batch {
		if err = write(&batch[i]); err != nil {
			break
		}
	}
	q.mu.Lock()
	q.spare = batch[:0]
	q.writing = 0
	q.mu.Unlock()
	return err
}

// More is a flusher's question after each of its writes, which ended with
// err: true when frames were queued meanwhile and it should write again.
// Otherwise the flusher ends (the next Push starts another); after an
// error what waits is dropped with the connection.
func (q *ControlQueue) More(err error) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err == nil && len(q.frames) > 0 {
		return true
	}
	if err != nil {
		q.frames = q.frames[:0]
		q.queued.Store(0)
	}
	q.flushing = false
	return false
}

// Close stops Push from queuing or starting flushers.
func (q *ControlQueue) Close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
}
