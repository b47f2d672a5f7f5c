package httpclient

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"
)

// A connection between our servers is judged dead by the kernel (TCP
// keepalive, answered by the peer's kernel), never by an HTTP/2 PING that
// the peer's user space must answer: under load that answer came late and
// cost every stream on the connection.
func TestH2CConnectionsAreCheckedByTheKernelNotByPings(t *testing.T) {
	pool, ok := NewTransport(Options{H2C: true}).(*h2cPool)
	if !ok {
		t.Fatalf("NewTransport(H2C) is %T, want *h2cPool", NewTransport(Options{H2C: true}))
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pool.dial(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if c := <-accepted; c != nil {
		c.Close()
	}

	raw, err := conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name       string
		level, opt int
		value      int
	}{
		{"SO_KEEPALIVE", syscall.SOL_SOCKET, syscall.SO_KEEPALIVE, 1},
		{"TCP_KEEPIDLE", syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE, int(keepAliveIdle / time.Second)},
		{"TCP_KEEPINTVL", syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL, int(keepAliveInterval / time.Second)},
		{"TCP_KEEPCNT", syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT, keepAliveCount},
	}
	for _, w := range want {
		var got int
		var gerr error
		if err := raw.Control(func(fd uintptr) { got, gerr = syscall.GetsockoptInt(int(fd), w.level, w.opt) }); err != nil {
			t.Fatal(err)
		}
		if gerr != nil {
			t.Fatalf("getsockopt %s: %v", w.name, gerr)
		}
		if got != w.value {
			t.Errorf("%s = %d, want %d", w.name, got, w.value)
		}
	}
}
