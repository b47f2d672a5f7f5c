package h2server

import (
	"bytes"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The frame-level checks h2spec makes of stream states (RFC 9113 §5.1,
// §5.1.1, §5.3.1, §6.9.1), each answered as x/net's server answers it.

// rawClient is a client speaking frames on one connection with x/net's
// Framer, to send what a well-behaved client would not.
type rawClient struct {
	t   *testing.T
	nc  net.Conn
	fr  *http2.Framer
	hb  bytes.Buffer
	enc *hpack.Encoder
}

func dialRaw(t *testing.T, s *serving) *rawClient {
	t.Helper()
	nc, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &rawClient{t: t, nc: nc, fr: http2.NewFramer(nc, nc)}
	c.enc = hpack.NewEncoder(&c.hb)
	if _, err := nc.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return c
}

// headers sends a GET (or the method given) on stream id.
func (c *rawClient) headers(id uint32, endStream bool, prio http2.PriorityParam, fields ...string) {
	c.t.Helper()
	c.hb.Reset()
	fields = append([]string{":method", "GET", ":scheme", "http", ":authority", "x", ":path", "/"}, fields...)
	for i := 0; i+1 < len(fields); i += 2 {
		c.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hb.Bytes(), EndStream: endStream, EndHeaders: true, Priority: prio}); err != nil {
		c.t.Fatal(err)
	}
}

// next reads the server's next frame other than SETTINGS, PING and
// WINDOW_UPDATE; nil once the connection has closed.
func (c *rawClient) next() http2.Frame {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				c.t.Fatal("the server sent nothing more within 10s")
			}
			return nil
		}
		switch f.(type) {
		case *http2.SettingsFrame, *http2.PingFrame, *http2.WindowUpdateFrame:
			continue
		}
		return f
	}
}

// expectReset reads up to the server's first RST_STREAM or GOAWAY and
// fails unless it is a RST_STREAM of stream id with code.
func (c *rawClient) expectReset(id uint32, code http2.ErrCode) {
	c.t.Helper()
	for {
		switch f := c.next().(type) {
		case nil:
			c.t.Fatalf("connection closed, want RST_STREAM %d %v", id, code)
		case *http2.GoAwayFrame:
			c.t.Fatalf("GOAWAY %v, want RST_STREAM %d %v", f.ErrCode, id, code)
		case *http2.RSTStreamFrame:
			if f.StreamID != id || f.ErrCode != code {
				c.t.Fatalf("RST_STREAM %d %v, want %d %v", f.StreamID, f.ErrCode, id, code)
			}
			return
		}
	}
}

// expectGoAway reads up to the server's first RST_STREAM or GOAWAY and
// fails unless it is a GOAWAY with code, after which the connection closes.
func (c *rawClient) expectGoAway(code http2.ErrCode) {
	c.t.Helper()
	for {
		switch f := c.next().(type) {
		case nil:
			c.t.Fatalf("connection closed without GOAWAY, want GOAWAY %v", code)
		case *http2.RSTStreamFrame:
			c.t.Fatalf("RST_STREAM %d %v, want GOAWAY %v", f.StreamID, f.ErrCode, code)
		case *http2.GoAwayFrame:
			if f.ErrCode != code {
				c.t.Fatalf("GOAWAY %v, want %v", f.ErrCode, code)
			}
			for c.next() != nil {
			}
			return
		}
	}
}

// expectReplyEnd reads up to the end of stream id's reply.
func (c *rawClient) expectReplyEnd(id uint32) {
	c.t.Helper()
	for {
		f := c.next()
		if f == nil {
			c.t.Fatalf("connection closed before stream %d's reply ended", id)
		}
		if f.Header().StreamID == id && f.Header().Flags.Has(http2.FlagDataEndStream) {
			if _, ok := f.(*http2.RSTStreamFrame); !ok {
				return
			}
		}
		if rst, ok := f.(*http2.RSTStreamFrame); ok {
			c.t.Fatalf("RST_STREAM %d %v before the reply ended", rst.StreamID, rst.ErrCode)
		}
		if ga, ok := f.(*http2.GoAwayFrame); ok {
			c.t.Fatalf("GOAWAY %v before the reply ended", ga.ErrCode)
		}
	}
}

// blocking serves handlers that wait until the test ends (or their request
// is cancelled), counting those started.
func blocking(t *testing.T) (*serving, *atomic.Int64) {
	var started atomic.Int64
	release := make(chan struct{})
	s := start(t, Config{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})})
	t.Cleanup(func() { close(release) })
	return s, &started
}

// A frame other than HEADERS or PRIORITY on a stream never opened is a
// connection error.
func TestFramesOnIdleStreams(t *testing.T) {
	s, _ := blocking(t)
	for name, send := range map[string]func(c *rawClient){
		"WINDOW_UPDATE": func(c *rawClient) { c.fr.WriteWindowUpdate(1, 100) },
		"DATA":          func(c *rawClient) { c.fr.WriteData(1, true, []byte("test")) },
		"RST_STREAM":    func(c *rawClient) { c.fr.WriteRSTStream(1, http2.ErrCodeCancel) },
	} {
		t.Run(name, func(t *testing.T) {
			c := dialRaw(t, s)
			send(c)
			c.expectGoAway(http2.ErrCodeProtocol)
		})
	}
}

// HEADERS after the request's END_STREAM, while its handler runs, are a
// stream error STREAM_CLOSED; the connection goes on.
func TestHeadersOnAHalfClosedStream(t *testing.T) {
	s, started := blocking(t)
	c := dialRaw(t, s)
	c.headers(1, true, http2.PriorityParam{})
	c.headers(1, true, http2.PriorityParam{})
	c.expectReset(1, http2.ErrCodeStreamClosed)
	c.headers(3, true, http2.PriorityParam{})
	waitFor(t, "the second stream's handler", func() bool { return started.Load() == 2 })
}

// After the client reset a stream, its DATA is a stream error
// STREAM_CLOSED and its HEADERS a connection error.
func TestFramesAfterTheClientsReset(t *testing.T) {
	s, _ := blocking(t)
	t.Run("DATA", func(t *testing.T) {
		c := dialRaw(t, s)
		c.headers(1, false, http2.PriorityParam{})
		c.fr.WriteRSTStream(1, http2.ErrCodeCancel)
		c.fr.WriteData(1, true, []byte("test"))
		c.expectReset(1, http2.ErrCodeStreamClosed)
	})
	t.Run("HEADERS", func(t *testing.T) {
		c := dialRaw(t, s)
		c.headers(1, false, http2.PriorityParam{})
		c.fr.WriteRSTStream(1, http2.ErrCodeCancel)
		c.headers(1, true, http2.PriorityParam{})
		c.expectGoAway(http2.ErrCodeProtocol)
	})
}

// After both sides ended a stream, its DATA is a stream error
// STREAM_CLOSED and its HEADERS a connection error.
func TestFramesOnAClosedStream(t *testing.T) {
	s := start(t, Config{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("done"))
	})})
	t.Run("DATA", func(t *testing.T) {
		c := dialRaw(t, s)
		c.headers(1, true, http2.PriorityParam{})
		c.expectReplyEnd(1)
		c.fr.WriteData(1, true, []byte("test"))
		c.expectReset(1, http2.ErrCodeStreamClosed)
	})
	t.Run("HEADERS", func(t *testing.T) {
		c := dialRaw(t, s)
		c.headers(1, true, http2.PriorityParam{})
		c.expectReplyEnd(1)
		c.headers(1, true, http2.PriorityParam{})
		c.expectGoAway(http2.ErrCodeProtocol)
	})
}

// A new stream numbered below one already opened is a connection error.
func TestLowerStreamIDIsAConnectionError(t *testing.T) {
	s, started := blocking(t)
	c := dialRaw(t, s)
	c.headers(5, true, http2.PriorityParam{})
	c.headers(3, true, http2.PriorityParam{})
	c.expectGoAway(http2.ErrCodeProtocol)
	if n := started.Load(); n != 1 {
		t.Errorf("%d handlers started, want 1 (stream 5's)", n)
	}
}

// A stream depending on itself, in its HEADERS or a PRIORITY frame, is a
// stream error; its handler never starts.
func TestStreamDependingOnItself(t *testing.T) {
	s, started := blocking(t)
	t.Run("HEADERS", func(t *testing.T) {
		c := dialRaw(t, s)
		c.headers(1, true, http2.PriorityParam{StreamDep: 1, Weight: 15})
		c.expectReset(1, http2.ErrCodeProtocol)
	})
	t.Run("PRIORITY", func(t *testing.T) {
		c := dialRaw(t, s)
		c.fr.WritePriority(3, http2.PriorityParam{StreamDep: 3, Weight: 15})
		c.expectReset(3, http2.ErrCodeProtocol)
		// The connection goes on: a stream opened next is served.
		c.headers(5, true, http2.PriorityParam{})
		waitFor(t, "the next stream's handler", func() bool { return started.Load() == 1 })
	})
	if n := started.Load(); n != 1 {
		t.Errorf("%d handlers started, want 1", n)
	}
}

// WINDOW_UPDATEs taking a stream's send window past 2^31-1 are a stream
// error FLOW_CONTROL_ERROR.
func TestStreamWindowOverflow(t *testing.T) {
	s, _ := blocking(t)
	c := dialRaw(t, s)
	c.headers(1, false, http2.PriorityParam{})
	c.fr.WriteWindowUpdate(1, 1<<31-1)
	c.fr.WriteWindowUpdate(1, 1<<31-1)
	c.expectReset(1, http2.ErrCodeFlowControl)
}

// Frames the client sent before our RST_STREAM (after an early reply)
// reached it are still ignored once the handler returned and the stream
// was forgotten, but for those wrong in any state: a body past its
// content-length, a window past 2^31-1.
func TestFramesAfterOurResetOfAFinishedStream(t *testing.T) {
	s := start(t, Config{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("early"))
	})})
	c := dialRaw(t, s)
	open := func(id uint32, length string) {
		t.Helper()
		c.headers(id, false, http2.PriorityParam{}, "content-length", length)
		c.expectReset(id, http2.ErrCodeNo) // the reply came before the body
		waitFor(t, "the handler to return", func() bool { return activeStreams(s.srv) == 0 })
	}

	open(1, "8")
	c.fr.WriteData(1, false, []byte("1234"))
	c.fr.WriteData(1, true, []byte("5678"))
	c.fr.WritePing(false, [8]byte{1})
	c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for acked := false; !acked; {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatalf("waiting for the PING's ack: %v", err)
		}
		switch f := f.(type) {
		case *http2.PingFrame:
			acked = f.IsAck()
		case *http2.RSTStreamFrame:
			t.Fatalf("RST_STREAM %d %v for a body within its length", f.StreamID, f.ErrCode)
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v for a body within its length", f.ErrCode)
		}
	}

	open(3, "1")
	c.fr.WriteData(3, true, []byte("test"))
	c.expectReset(3, http2.ErrCodeProtocol)

	open(5, "0")
	c.fr.WriteWindowUpdate(5, 1<<31-1)
	c.expectReset(5, http2.ErrCodeFlowControl)
}
