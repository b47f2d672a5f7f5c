package httpserver

import (
	"bufio"
	"net"
	"sync"
	"time"

	"golang.org/x/net/http2"
)

// sniff reads the first bytes of nc, as few as tell whether it opens with
// the HTTP/2 client preface (h2), and returns a connection whose reads
// return those bytes again. Every HTTP/1 request differs from the preface
// within its first three bytes, so a short request is never waited on.
func sniff(nc net.Conn, timeout time.Duration) (conn net.Conn, h2 bool, err error) {
	nc.SetReadDeadline(time.Now().Add(timeout))
	br := bufio.NewReaderSize(nc, len(http2.ClientPreface))
	h2 = true
	for i := 1; i <= len(http2.ClientPreface); i++ {
		b, err := br.Peek(i)
		if err != nil {
			return nil, false, err
		}
		if b[i-1] != http2.ClientPreface[i-1] {
			h2 = false
			break
		}
	}
	nc.SetReadDeadline(time.Time{})
	return &sniffedConn{Conn: nc, r: br}, h2, nil
}

// sniffedConn is a connection whose first bytes were read to tell its
// protocol: reads return them first.
type sniffedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *sniffedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite shuts the connection for writing, when it can: the HTTP/2
// server lingers that way before closing (pkg/h2server).
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
