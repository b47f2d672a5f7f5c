package httpserver

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"golang.org/x/net/http2"
)

// maxSniffedLine bounds the bytes read to find an HTTP/1 request line; a
// longer line is left to net/http to judge.
const maxSniffedLine = 8 << 10

// errNotHTTP is sniff's error for a connection that opens with neither the
// HTTP/2 preface nor an HTTP/1 request line.
var errNotHTTP = errors.New("httpserver: the connection opened with neither HTTP/2's preface nor an HTTP/1 request line")

// sniff reads the first bytes of nc, as many as tell whether it opens with
// the HTTP/2 client preface (h2) or with an HTTP/1 request line, and
// returns a connection whose reads return those bytes again. A connection
// that opens with neither is refused (errNotHTTP) without a reply, as an
// HTTP/2 server closes one with a bad preface (RFC 9113 §3.4): net/http
// would answer it with an HTTP/1 400 that a client speaking HTTP/2 would
// read as a frame.
func sniff(nc net.Conn, timeout time.Duration) (conn net.Conn, h2 bool, err error) {
	nc.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 0, 512)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, make([]byte, len(buf))...)[:len(buf)]
		}
		n, err := nc.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if decided, h2, ok := judge(buf); decided {
			if !ok {
				return nil, false, errNotHTTP
			}
			nc.SetReadDeadline(time.Time{})
			return &sniffedConn{Conn: nc, r: io.MultiReader(bytes.NewReader(buf), nc)}, h2, nil
		}
		if err != nil {
			return nil, false, err
		}
	}
}

// judge tells from a connection's first bytes whether it is HTTP/2 or
// HTTP/1 (ok) or neither, once they are enough to tell (decided).
func judge(b []byte) (decided, h2, ok bool) {
	same := 0
	for same < len(b) && same < len(http2.ClientPreface) && b[same] == http2.ClientPreface[same] {
		same++
	}
	if same == len(http2.ClientPreface) {
		return true, true, true
	}
	if same == len(b) {
		return false, false, false // a prefix of the preface: more is needed
	}
	end := bytes.IndexByte(b, '\n')
	if end < 0 {
		// A request line not ended yet: net/http judges one too long.
		return len(b) >= maxSniffedLine, false, true
	}
	line := bytes.TrimSuffix(b[:end], []byte("\r"))
	version := line[bytes.LastIndexByte(line, ' ')+1:]
	return true, false, bytes.Count(line, []byte(" ")) >= 2 && bytes.HasPrefix(version, []byte("HTTP/"))
}

// sniffedConn is a connection whose first bytes were read to tell its
// protocol: reads return them first.
type sniffedConn struct {
	net.Conn
	r io.Reader
}

func (c *sniffedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite shuts the connection for writing, when it can: the HTTP/2
// server lingers that way before closing (pkg/transport/h2server).
func (c *sniffedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// connQueue is the listener net/http serves HTTP/1 connections from: the
// ones the accept loop hands it.
type connQueue struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newConnQueue() *connQueue {
	return &connQueue{conns: make(chan net.Conn), done: make(chan struct{})}
}

// push hands c to net/http; false once the queue is closed.
func (q *connQueue) push(c net.Conn) bool {
	select {
	case q.conns <- c:
		return true
	case <-q.done:
		return false
	}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.conns:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) Close() error {
	q.once.Do(func() { close(q.done) })
	return nil
}

func (q *connQueue) Addr() net.Addr { return queueAddr{} }

// queueAddr is connQueue's address: it listens on nothing itself.
type queueAddr struct{}

func (queueAddr) Network() string { return "queue" }
func (queueAddr) String() string  { return "queue" }
