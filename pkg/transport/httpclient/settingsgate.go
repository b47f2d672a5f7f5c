package httpclient

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"

	"github.com/gymfleet/gymfleet/pkg/transport/h2client"
)

// net/http's HTTP/2 server drops a connection whose client SETTINGS it has
// not read within a fixed 2 s, and its transport writes requests on a new
// connection right after its own preface: a starved server that missed
// the deadline lost every request already written, which net/http does
// not send again. The lean stack's pool sends a request of its own first
// (h2cPool); net/http's transport gives no such hook, so on the nethttp
// stack its h2c connections are gatedConns: every byte after the client's
// first frames that belongs to a stream (a request) is held back, in
// order, until the server acknowledges the client's SETTINGS. The server
// processes frames in order, so its ACK says it read our SETTINGS (its
// timer is stopped) before any request of ours reaches it; a connection
// that ends before the ACK carried no request, and gateTransport marks the
// requests it failed as never processed, for resendUnsent to send again.

// http2Preface is what a client writes first on an HTTP/2 connection.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

const (
	frameHeaderLen    = 9
	frameTypeSettings = 0x4
	flagSettingsAck   = 0x1
)

// gatedConn is an h2c connection whose stream frames wait for the server's
// SETTINGS ACK. Writes never block: what is held is kept in order and
// written by the reader once the ACK is read, so the transport's reader,
// which writes under the same lock as its requests, is never kept from
// reading the ACK.
type gatedConn struct {
	net.Conn

	mu sync.Mutex
	// open is set once the held bytes are written: writes then go
	// straight through.
	open atomic.Bool
	// held is every byte written since the first stream frame, in order.
	held []byte
	// writeErr is the error the held bytes' write ended with.
	writeErr error
	// out parses the client's bytes until the first stream frame.
	out frameScanner

	// in parses the server's bytes until its SETTINGS ACK; read only by
	// the transport's reader.
	in frameScanner
}

// frameScanner follows frame boundaries in a byte stream.
type frameScanner struct {
	prefaceLeft int
	hdr         [frameHeaderLen]byte
	hdrN        int
	payloadLeft int
}

// scan walks p; at each complete frame header it calls at(start, hdr),
// start being the header's first byte in p (or 0 when it began in an
// earlier call), and at a header p ends inside of, at(start, nil); at
// returning true stops the scan there.
func (s *frameScanner) scan(p []byte, at func(start int, hdr []byte) bool) {
	for i := 0; i < len(p); {
		switch {
		case s.prefaceLeft > 0:
			k := min(s.prefaceLeft, len(p)-i)
			s.prefaceLeft -= k
			i += k
		case s.payloadLeft > 0:
			k := min(s.payloadLeft, len(p)-i)
			s.payloadLeft -= k
			i += k
		default:
			start := max(i-s.hdrN, 0)
			k := min(frameHeaderLen-s.hdrN, len(p)-i)
			copy(s.hdr[s.hdrN:], p[i:i+k])
			s.hdrN += k
			i += k
			if s.hdrN < frameHeaderLen {
				at(start, nil)
				return
			}
			s.hdrN = 0
			s.payloadLeft = int(s.hdr[0])<<16 | int(s.hdr[1])<<8 | int(s.hdr[2])
			if at(start, s.hdr[:]) {
				return
			}
		}
	}
}

func streamOf(hdr []byte) uint32 { return binary.BigEndian.Uint32(hdr[5:9]) & 0x7fffffff }

func newGatedConn(c net.Conn) *gatedConn {
	g := &gatedConn{Conn: c}
	g.out.prefaceLeft = len(http2Preface)
	return g
}

func (g *gatedConn) Write(p []byte) (int, error) {
	if g.open.Load() {
		return g.Conn.Write(p)
	}
	g.mu.Lock()
	if g.open.Load() {
		g.mu.Unlock()
		return g.Conn.Write(p)
	}
	if g.writeErr != nil {
		g.mu.Unlock()
		return 0, g.writeErr
	}
	if g.held != nil {
		g.held = append(g.held, p...)
		g.mu.Unlock()
		return len(p), nil
	}
	hold := -1
	g.out.scan(p, func(start int, hdr []byte) bool {
		// A header cut short is held whole: its stream is not known yet.
		if hdr == nil || streamOf(hdr) != 0 {
			hold = start
			return true
		}
		return false
	})
	if hold < 0 {
		g.mu.Unlock()
		return g.Conn.Write(p)
	}
	// The first stream frame: what precedes it goes now, the rest waits.
	g.held = append(make([]byte, 0, len(p)-hold+4096), p[hold:]...)
	g.mu.Unlock()
	if hold > 0 {
		if n, err := g.Conn.Write(p[:hold]); err != nil {
			return n, err
		}
	}
	return len(p), nil
}

func (g *gatedConn) Read(p []byte) (int, error) {
	n, err := g.Conn.Read(p)
	if n > 0 && !g.open.Load() {
		acked := false
		g.in.scan(p[:n], func(_ int, hdr []byte) bool {
			acked = hdr != nil && hdr[3] == frameTypeSettings && hdr[4]&flagSettingsAck != 0 && streamOf(hdr) == 0
			return acked
		})
		if acked {
			g.release()
		}
	}
	return n, err
}

// release writes what was held, in order, then opens the gate.
func (g *gatedConn) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.held) > 0 {
		if _, err := g.Conn.Write(g.held); err != nil {
			g.writeErr = err
			return
		}
	}
	g.held = nil
	g.open.Store(true)
}

// carriedNoRequest reports whether no byte of any stream has left for the
// server: the gate never opened.
func (g *gatedConn) carriedNoRequest() bool { return !g.open.Load() }

// gatedDial dials with dial and gates the connection.
func gatedDial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return newGatedConn(c), nil
	}
}

// gateTransport is net/http's h2c transport over gatedConns: a request
// that failed on a connection whose gate never opened was never sent, and
// its error says so (h2client.ErrNotProcessed).
type gateTransport struct{ next *http.Transport }

func (t gateTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var conn atomic.Pointer[gatedConn]
	ctx := httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if g, ok := info.Conn.(*gatedConn); ok {
			conn.Store(g)
		}
	}})
	resp, err := t.next.RoundTrip(req.WithContext(ctx))
	if err != nil {
		if g := conn.Load(); g != nil && g.carriedNoRequest() {
			return nil, fmt.Errorf("%w: the connection ended before the server read our SETTINGS: %w", h2client.ErrNotProcessed, err)
		}
	}
	return resp, err
}

func (t gateTransport) CloseIdleConnections() { t.next.CloseIdleConnections() }
