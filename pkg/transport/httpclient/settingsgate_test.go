package httpclient

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
)

// starvedFirstConn is a listener whose first connection reads the client's
// preface and then nothing more until it is closed, as a server starved of
// CPU does: net/http's HTTP/2 server, not reading the client's SETTINGS
// within its fixed 2 s, drops it. Later connections read normally.
type starvedFirstConn struct {
	net.Listener
	accepted atomic.Int64
}

func (l *starvedFirstConn) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil || l.accepted.Add(1) > 1 {
		return c, err
	}
	return &starvedConn{Conn: c, left: len(http2Preface), closed: make(chan struct{})}, nil
}

type starvedConn struct {
	net.Conn
	left      int
	closed    chan struct{}
	closeOnce sync.Once
}

func (c *starvedConn) Read(p []byte) (int, error) {
	if c.left > 0 {
		n, err := c.Conn.Read(p[:min(len(p), c.left)])
		c.left -= n
		return n, err
	}
	<-c.closed
	return 0, net.ErrClosed
}

func (c *starvedConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// countingServer is net/http's h2c server (the nethttp stack's) on a
// starvedFirstConn listener; it counts the requests its handler ran.
func countingServer(t *testing.T) (url string, ran *atomic.Int64, conns *starvedFirstConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns = &starvedFirstConn{Listener: ln}
	ran = new(atomic.Int64)
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Protocols: &protos,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran.Add(1)
			b, _ := io.ReadAll(r.Body)
			w.Write(b)
		}),
		// It logs the timeout it drops the first connection on.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	go srv.Serve(conns)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String(), ran, conns
}

// postEchoes sends n POSTs, the first alone (it opens the first
// connection, the starved one), the rest at once, and returns the errors of
// those that failed; each reply must echo its body.
func postEchoes(t *testing.T, c *http.Client, url string, n int) []error {
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for i := range n {
		if i == 1 {
			wg.Wait()
		}
		wg.Go(func() {
			body := fmt.Sprintf("rollout-%d", i)
			resp, err := c.Post(url, "text/plain", bytes.NewBufferString(body))
			if err == nil {
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(got) != body {
					err = fmt.Errorf("reply %q to %q", got, body)
				}
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errs
}

// Ensure a nethttp client loses no request to net/http's server dropping a
// new connection whose SETTINGS it had not read: the requests are held until
// the server acknowledges them, so none was on the dropped connection, and
// each is sent again on the next one and handled exactly once.
func TestNetHTTP_RequestsSurviveTheFirstSettingsTimeout(t *testing.T) {
	t.Parallel()
	url, ran, conns := countingServer(t)
	c := New(Options{H2C: true, HTTP: netHTTP})
	defer c.CloseIdleConnections()
	const n = 20
	if errs := postEchoes(t, c, url, n); len(errs) > 0 {
		t.Fatalf("%d of %d requests failed; first: %v", len(errs), n, errs[0])
	}
	if got := ran.Load(); got != n {
		t.Errorf("the handler ran %d times for %d requests, want once each", got, n)
	}
	if got := conns.accepted.Load(); got < 2 {
		t.Errorf("%d connection(s) accepted: the starved first one was not dropped", got)
	}
}

// Ensure the test above sees the failure it guards against: net/http's
// transport without the gate writes the requests on the first connection,
// and the server drops them unread.
func TestNetHTTP_UngatedTransportLosesRequestsToTheSettingsTimeout(t *testing.T) {
	t.Parallel()
	url, ran, _ := countingServer(t)
	tr := newNetH2C(Options{H2C: true, HTTP: netHTTP})
	tr.DialContext = dialer(Options{}).DialContext
	c := &http.Client{Transport: resendUnsent{next: tr, pause: unsentPause}}
	defer c.CloseIdleConnections()
	errs := postEchoes(t, c, url, 5)
	if len(errs) == 0 {
		t.Fatalf("every request succeeded without the gate (handler ran %d times): the server did not drop the first connection", ran.Load())
	}
	if NeverProcessed(errs[0]) {
		t.Errorf("an ungated request's error says it was never processed: %v", errs[0])
	}
}

// Ensure the gate holds stream frames, in order, behind the preface and
// the connection's own frames, and lets them out on the server's ACK.
func TestGatedConn_HoldsStreamFramesUntilTheSettingsAck(t *testing.T) {
	client, server := net.Pipe()
	g := newGatedConn(client)
	frame := func(typ, flags byte, stream uint32, payload string) []byte {
		h := []byte{0, byte(len(payload) >> 8), byte(len(payload)), typ, flags, byte(stream >> 24), byte(stream >> 16), byte(stream >> 8), byte(stream)}
		return append(h, payload...)
	}
	settings := frame(frameTypeSettings, 0, 0, "")
	headers := frame(0x1, 0x4, 1, "hdrs")
	data := frame(0x0, 0x1, 1, "body")
	ack := frame(frameTypeSettings, flagSettingsAck, 0, "")
	var first bytes.Buffer
	read := make(chan []byte)
	go func() {
		buf := make([]byte, 1024)
		for {
			n, err := server.Read(buf)
			if err != nil {
				close(read)
				return
			}
			read <- append([]byte(nil), buf[:n]...)
		}
	}()
	// Preface and SETTINGS in one write, with the first HEADERS cut in
	// two across writes.
	w1 := append(append([]byte(http2Preface), settings...), headers[:4]...)
	go func() {
		g.Write(w1)
		g.Write(headers[4:])
		g.Write(data)
	}()
	for first.Len() < len(http2Preface)+len(settings) {
		first.Write(<-read)
	}
	if want := http2Preface + string(settings); first.String() != want {
		t.Fatalf("before the ACK the server read %q, want the preface and SETTINGS only %q", first.String(), want)
	}
	if !g.carriedNoRequest() {
		t.Fatal("the gate says a request left before the ACK")
	}
	// The server's SETTINGS, then its ACK, read by the client.
	go server.Write(append(frame(frameTypeSettings, 0, 0, ""), ack...))
	buf := make([]byte, 64)
	for got := 0; got < 2*frameHeaderLen; {
		n, err := g.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	var rest bytes.Buffer
	for rest.Len() < len(headers)+len(data) {
		b, ok := <-read
		if !ok {
			t.Fatal("the connection closed before the held frames arrived")
		}
		rest.Write(b)
	}
	if want := string(headers) + string(data); rest.String() != want {
		t.Errorf("after the ACK the server read %q, want the held frames in order %q", rest.String(), want)
	}
	if g.carriedNoRequest() {
		t.Error("the gate still says no request left after the ACK")
	}
	client.Close()
	server.Close()
}
