package h2server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/gymfleet/gymfleet/pkg/transport/h2frame"
)

// The attacks of issue 33 on a server's memory and its read loop, each made
// with x/net's Framer as a client no well-behaved one would be.

// conns returns the connections srv serves.
func conns(srv *Server) []*conn {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	var cs []*conn
	for c := range srv.conns {
		cs = append(cs, c)
	}
	return cs
}

// served checks that a well-behaved client on a connection of its own is
// served while (or after) the attack runs.
func served(t *testing.T, s *serving) {
	t.Helper()
	c := clients(t)["net/http"](s)
	req, err := http.NewRequest(http.MethodGet, s.url+"/ok", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("a well-behaved client was not served: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a well-behaved client got %s", resp.Status)
	}
}

// bodyReader blocks reading its request's body, as a model server's
// handler does; /ok answers at once.
func bodyReader(readErr chan<- error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ok" {
			return
		}
		_, err := io.ReadAll(r.Body)
		if readErr != nil {
			readErr <- err
		}
		if err != nil {
			w.WriteHeader(http.StatusRequestTimeout)
		}
	})
}

// Requests left without END_STREAM hold their decoded headers: past the
// connection's budget, counted with 32 bytes per field as the header list
// size is, further streams are refused, and a freed budget serves again.
func TestHeaderBudgetRefusesStreams(t *testing.T) {
	const fields = 1000
	const oneRequest = fields * 33 // "a": "" costs 1 + 0 + 32
	s := start(t, Config{Handler: bodyReader(nil), MaxConnHeaderBytes: oneRequest + oneRequest/2})
	c := dialRaw(t, s)
	many := make([]string, 0, 2*fields)
	for range fields {
		many = append(many, "a", "") // one byte on the wire once indexed
	}
	for id := uint32(1); id <= 9; id += 2 {
		c.headers(id, false, http2.PriorityParam{}, many...)
	}
	// The first stream fits; each next one would pass the budget, which
	// it would not without the 32 bytes per field.
	for id := uint32(3); id <= 9; id += 2 {
		c.expectReset(id, http2.ErrCodeRefusedStream)
	}
	cs := conns(s.srv)
	var held int64
	for _, cn := range cs {
		cn.mu.Lock()
		held += cn.headerBytes
		cn.mu.Unlock()
	}
	if held > oneRequest+oneRequest/2 {
		t.Errorf("connections hold %d header bytes, over the budget", held)
	}
	served(t, s)
	// The client resets its first stream: its headers are let go.
	if err := c.fr.WriteRSTStream(1, http2.ErrCodeCancel); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the reset stream to be forgotten", func() bool { return activeStreams(s.srv) == 0 })
	c.headers(11, true, http2.PriorityParam{}, many...)
	c.expectReplyEnd(11)
}

// A client that grants no window makes handlers wait, not the connection
// buffer their replies without bound; when it grants window every reply
// arrives whole.
func TestReplyBudgetWithAZeroWindow(t *testing.T) {
	const streams, replySize, budget = 20, 20 << 10, 64 << 10
	reply := bytes.Repeat([]byte("r"), replySize)
	s := start(t, Config{
		MaxConnBufferedReply: budget,
		WriteTimeout:         time.Hour, // not what ends the wait here
		Handler:              http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(reply) }),
	})
	nc, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fr := http2.NewFramer(nc, nc)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	nc.Write([]byte(http2.ClientPreface))
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for i := range streams {
		hb.Reset()
		for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", "x"}, {":path", "/"}} {
			enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true})
	}
	stalled := func() int {
		n := 0
		for _, cn := range conns(s.srv) {
			cn.mu.Lock()
			for _, st := range cn.streams {
				if st.stallSince != 0 {
					n++
				}
			}
			cn.mu.Unlock()
		}
		return n
	}
	waitFor(t, "every reply to wait for window", func() bool { return stalled() == streams })
	for _, cn := range conns(s.srv) {
		if held := cn.replyHeld.Load(); held > budget {
			t.Errorf("the connection holds %d reply bytes back, over its budget of %d", held, budget)
		}
	}
	served(t, s)
	// Window at last: every reply arrives whole.
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
	fr.WriteWindowUpdate(0, 16<<20)
	got := map[uint32]int{}
	ended := 0
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for ended < streams {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("after %d replies: %v", ended, err)
		}
		switch f := f.(type) {
		case *http2.DataFrame:
			got[f.StreamID] += len(f.Data())
			if f.StreamEnded() {
				ended++
			}
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				t.Fatalf("stream %d ended without a body", f.StreamID)
			}
		case *http2.RSTStreamFrame:
			t.Fatalf("stream %d reset: %v", f.StreamID, f.ErrCode)
		}
	}
	for id, n := range got {
		if n != replySize {
			t.Errorf("stream %d: %d reply bytes, want %d", id, n, replySize)
		}
	}
	waitFor(t, "the reply budget to be given back", func() bool {
		for _, cn := range conns(s.srv) {
			if cn.replyHeld.Load() != 0 {
				return false
			}
		}
		return true
	})
}

// A stream whose client grants no window is reset after the write
// timeout, and its handler's write fails.
func TestStalledStreamIsReset(t *testing.T) {
	writeErr := make(chan error, 1)
	s := start(t, Config{
		WriteTimeout: 100 * time.Millisecond,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.(http.Flusher).Flush()
			_, err := w.Write([]byte("never sent"))
			writeErr <- err
		}),
	})
	c := dialRaw(t, s)
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	c.headers(1, true, http2.PriorityParam{})
	c.expectReset(1, http2.ErrCodeInternal)
	if err := <-writeErr; err == nil {
		t.Error("the handler's write to a stalled stream succeeded")
	}
	waitFor(t, "the stream to be forgotten", func() bool { return activeStreams(s.srv) == 0 })
}

// A client that stops reading has its connection closed after the write
// timeout, and the handler writing to it returns.
func TestClientThatStopsReadingIsDisconnected(t *testing.T) {
	chunk := bytes.Repeat([]byte("x"), 1<<20)
	returned := make(chan struct{})
	s := start(t, Config{
		WriteTimeout: 200 * time.Millisecond,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer close(returned)
			for {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		}),
	})
	c := dialRaw(t, s)
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1})
	c.fr.WriteWindowUpdate(0, 1<<31-1-65535)
	c.headers(1, true, http2.PriorityParam{})
	// and never reads
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler writing to a client that does not read never returned")
	}
	waitFor(t, "the connection to close", func() bool { return len(conns(s.srv)) == 0 })
}

// A client flooding PING or SETTINGS frames without reading the answers
// has its connection closed once h2frame.MaxQueuedControlFrames of them wait; the
// read loop never waits on the socket (the write timeout is off).
func TestControlFrameFloodWithoutReading(t *testing.T) {
	for name, send := range map[string]func(*http2.Framer) error{
		"ping":     func(fr *http2.Framer) error { return fr.WritePing(false, [8]byte{1}) },
		"settings": func(fr *http2.Framer) error { return fr.WriteSettings() },
	} {
		t.Run(name, func(t *testing.T) {
			var log lockedBuffer
			srv := New(Config{WriteTimeout: -1, Logger: slog.New(slog.NewTextHandler(&log, nil))})
			defer srv.Close()
			sc, cc := net.Pipe() // unbuffered: nothing the client does not read is written
			defer cc.Close()
			done := make(chan struct{})
			go func() { defer close(done); srv.ServeConn(sc) }()
			go cc.Write([]byte(http2.ClientPreface))
			fr := http2.NewFramer(cc, cc)
			for range 2 { // the server's SETTINGS and WINDOW_UPDATE
				if _, err := fr.ReadFrame(); err != nil {
					t.Fatal(err)
				}
			}
			sent := 0
			for ; sent < 3*h2frame.MaxQueuedControlFrames; sent++ {
				if send(fr) != nil {
					break
				}
			}
			// Answers that fit in the write buffer (the smallest is a
			// 9-byte frame header) left the queue before the socket blocked.
			if bound := h2frame.MaxQueuedControlFrames + writeBufferSize/9 + 10; sent > bound {
				t.Errorf("the server took %d frames it could not answer, over %d", sent, bound)
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the connection was not closed")
			}
			if !strings.Contains(log.String(), "code=ENHANCE_YOUR_CALM") {
				t.Errorf("the connection did not end with ENHANCE_YOUR_CALM; log:\n%s", log.String())
			}
		})
	}
}

// lockedBuffer is a log's output, safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A request whose body stops arriving fails its handler's read after the
// body read timeout, and the stream is let go.
func TestBodyReadTimeout(t *testing.T) {
	readErr := make(chan error, 1)
	s := start(t, Config{BodyReadTimeout: 100 * time.Millisecond, Handler: bodyReader(readErr)})
	c := dialRaw(t, s)
	c.headers(1, false, http2.PriorityParam{})
	c.fr.WriteData(1, false, []byte("a start"))
	if err := <-readErr; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the handler's read: %v, want a deadline error", err)
	}
	for {
		f := c.next()
		if h, ok := f.(*http2.HeadersFrame); ok {
			var status string
			hpack.NewDecoder(4096, func(hf hpack.HeaderField) {
				if hf.Name == ":status" {
					status = hf.Value
				}
			}).Write(h.HeaderBlockFragment())
			if status != "408" {
				t.Errorf("status %s, want the handler's 408", status)
			}
			break
		}
		if f == nil {
			t.Fatal("the connection closed")
		}
	}
	waitFor(t, "the stream to be forgotten", func() bool { return activeStreams(s.srv) == 0 })
}

// A client we hold back (its stream window spent on a body its handler has
// not read yet) is not timed out for its silence.
func TestBodyReadTimeoutSparesAClientHeldBack(t *testing.T) {
	const window = 16 << 10
	release := make(chan struct{})
	s := start(t, Config{
		BodyReadTimeout:     50 * time.Millisecond,
		StreamReceiveWindow: window,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			<-release
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			w.Write(b[:1])
		}),
	})
	c := dialRaw(t, s)
	c.headers(1, false, http2.PriorityParam{})
	c.fr.WriteData(1, false, bytes.Repeat([]byte("b"), window))
	// Until the watchdog has passed over the stream several times, a
	// silence longer than the body read timeout.
	var last int64
	looks := 0
	waitFor(t, "the watchdog to pass over the held-back stream", func() bool {
		for _, cn := range conns(s.srv) {
			cn.mu.Lock()
			if st := cn.streams[1]; st != nil && st.lastRecv != last {
				if last != 0 {
					looks++
				}
				last = st.lastRecv
			}
			cn.mu.Unlock()
		}
		return looks >= 3
	})
	close(release)
	c.fr.WriteData(1, true, nil)
	// The handler read the whole body: its reply is not the 400 of a
	// failed read.
	for {
		switch f := c.next().(type) {
		case nil:
			t.Fatal("the connection closed")
		case *http2.RSTStreamFrame:
			t.Fatalf("RST_STREAM %v", f.ErrCode)
		case *http2.HeadersFrame:
			var status string
			hpack.NewDecoder(4096, func(hf hpack.HeaderField) {
				if hf.Name == ":status" {
					status = hf.Value
				}
			}).Write(f.HeaderBlockFragment())
			if status != "200" {
				t.Errorf("status %s, want 200", status)
			}
			return
		}
	}
}

// Rapid reset (CVE-2023-44487): streams opened and reset at once never
// have more handlers running than twice the stream limit, and the server
// serves on.
func TestRapidReset(t *testing.T) {
	const limit, attempts = 50, 5000
	var running, most atomic.Int64
	s := start(t, Config{MaxConcurrentStreams: limit, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ok" {
			return
		}
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		<-r.Context().Done()
	})})
	c := dialRaw(t, s)
	var wg sync.WaitGroup
	wg.Go(func() { // reads what the server sends, as a real attacker's client does
		for {
			if _, err := c.fr.ReadFrame(); err != nil {
				return
			}
		}
	})
	for i := range attempts {
		id := uint32(2*i + 1)
		c.hb.Reset()
		for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", "x"}, {":path", "/"}} {
			c.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		if c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hb.Bytes(), EndStream: true, EndHeaders: true}) != nil ||
			c.fr.WriteRSTStream(id, http2.ErrCodeCancel) != nil {
			break
		}
	}
	served(t, s)
	c.nc.Close()
	wg.Wait()
	if m := most.Load(); m > 2*limit {
		t.Errorf("%d handlers ran at once, over twice the stream limit of %d", m, limit)
	}
}

// CONTINUATION flood (CVE-2024-27316): a header block continued past the
// header list size is a connection error, not bytes held without end.
func TestContinuationFlood(t *testing.T) {
	const listSize = 64 << 10
	s := start(t, Config{MaxHeaderListSize: listSize, Handler: bodyReader(nil)})
	c := dialRaw(t, s)
	goAway := make(chan http2.ErrCode, 1)
	go func() {
		for {
			f, err := c.fr.ReadFrame()
			if err != nil {
				close(goAway)
				return
			}
			if ga, ok := f.(*http2.GoAwayFrame); ok {
				goAway <- ga.ErrCode
				return
			}
		}
	}()
	c.hb.Reset()
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", "x"}, {":path", "/"}} {
		c.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.hb.Bytes(), EndHeaders: false})
	var frag bytes.Buffer
	fenc := hpack.NewEncoder(&frag)
	for frag.Len() < 8<<10 {
		fenc.WriteField(hpack.HeaderField{Name: "x-flood", Value: strings.Repeat("v", 1000), Sensitive: true}) // never indexed: every one decoded anew
	}
	// The flood goes on until the server's answer (or its closing the
	// connection) stops it.
	for sent := 0; sent < 1<<30; sent += frag.Len() {
		if c.fr.WriteContinuation(1, false, frag.Bytes()) != nil {
			break
		}
		if len(goAway) > 0 {
			break
		}
	}
	if code, ok := <-goAway; !ok || code != http2.ErrCodeProtocol {
		t.Errorf("GOAWAY %v (received: %v), want PROTOCOL_ERROR", code, ok)
	}
	served(t, s)
}

// A client granting no window gets MaxStalledStreams streams; the rest are
// refused rather than run handlers that would wait holding their replies.
func TestStreamsOfAClientGrantingNoWindowAreBounded(t *testing.T) {
	const limit, streams = 5, 12
	var started atomic.Int64
	s := start(t, Config{
		MaxStalledStreams: limit,
		WriteTimeout:      time.Hour,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			started.Add(1)
			w.Write([]byte("waits for window"))
		}),
	})
	c := dialRaw(t, s)
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	for i := range streams {
		c.headers(uint32(2*i+1), true, http2.PriorityParam{})
	}
	for i := limit; i < streams; i++ {
		c.expectReset(uint32(2*i+1), http2.ErrCodeRefusedStream)
	}
	if n := started.Load(); n > limit {
		t.Errorf("%d handlers ran, over the limit of %d", n, limit)
	}
	served(t, s)
}

// paced reads at most n bytes per tick from r: a client that reads slowly
// but steadily.
type paced struct {
	r    io.Reader
	n    int
	tick <-chan time.Time
}

func (p paced) Read(b []byte) (int, error) {
	<-p.tick
	return p.r.Read(b[:min(len(b), p.n)])
}

// A client that reads slowly but steadily keeps its connection: the write
// timeout counts time in which no byte went out (x/net's WriteByteTimeout),
// not how long one write takes. Here one write, a DATA frame as large as
// the client allows, drains over several times the timeout.
func TestSlowReaderKeepsItsConnection(t *testing.T) {
	body := bytes.Repeat([]byte("y"), 1<<20)
	srv := New(Config{
		WriteTimeout: 200 * time.Millisecond,
		Handler:      http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(body) }),
	})
	cn, sn := net.Pipe()
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.ServeConn(sn)
	}()
	t.Cleanup(func() {
		cn.Close()
		srv.Close()
		<-served
	})
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	rd := http2.NewFramer(nil, paced{r: cn, n: 4 << 10, tick: tick.C})
	rd.SetMaxReadFrameSize(1 << 20)
	got := make(chan error, 1)
	go func() {
		received := 0
		for {
			f, err := rd.ReadFrame()
			if err != nil {
				got <- fmt.Errorf("after %d bytes of the body: %w", received, err)
				return
			}
			if d, ok := f.(*http2.DataFrame); ok && d.StreamID == 1 {
				received += len(d.Data())
				if d.StreamEnded() {
					if received != len(body) {
						err = fmt.Errorf("the body ended after %d bytes, want %d", received, len(body))
					}
					got <- err
					return
				}
			}
		}
	}()
	// net.Pipe buffers nothing: these writes go out as the server reads.
	wr := http2.NewFramer(cn, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", "x"}, {":path", "/"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	go func() {
		cn.Write([]byte(http2.ClientPreface))
		wr.WriteSettings(
			http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 20},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30},
		)
		wr.WriteWindowUpdate(0, 1<<30)
		wr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true})
		wr.WriteSettingsAck()
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the reply did not arrive")
	}
}
