package h2client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/gymfleet/gymfleet/pkg/transport/h2frame"
)

// pipeServer is a hand-driven server on the far end of a net.Pipe, which
// buffers nothing: a write of the client waits until the server reads it,
// so the test decides when the client's writes stall.
type pipeServer struct {
	nc net.Conn
	fr *http2.Framer
}

// newPipeServer starts a Conn on a net.Pipe and plays the server's side of
// the connection's start: the client's preface, SETTINGS and window update
// read, ours sent with settings and its acknowledgement read.
func newPipeServer(t *testing.T, settings ...http2.Setting) (*Conn, *pipeServer) {
	t.Helper()
	cn, sn := net.Pipe()
	s := &pipeServer{nc: sn, fr: http2.NewFramer(sn, sn)}
	s.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	read := make(chan error, 1)
	go func() {
		preface := make([]byte, len(http2.ClientPreface))
		_, err := io.ReadFull(sn, preface)
		for range 2 { // SETTINGS, WINDOW_UPDATE
			if err == nil {
				_, err = s.fr.ReadFrame()
			}
		}
		read <- err
	}()
	c, err := NewConn(cn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sn.Close()
		c.Close()
	})
	if err := <-read; err != nil {
		t.Fatal(err)
	}
	if err := s.fr.WriteSettings(settings...); err != nil {
		t.Fatal(err)
	}
	if f := s.readFrame(t); !isSettingsAck(f) {
		t.Fatalf("the client answered our SETTINGS with %v", f)
	}
	return c, s
}

func isSettingsAck(f http2.Frame) bool {
	sf, ok := f.(*http2.SettingsFrame)
	return ok && sf.IsAck()
}

func (s *pipeServer) readFrame(t *testing.T) http2.Frame {
	t.Helper()
	f, err := s.fr.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// readHeaders reads frames on a goroutine of its own until a request's
// headers, and sends their stream id: the client's Start returns once they
// are read.
func (s *pipeServer) readHeaders() <-chan uint32 {
	id := make(chan uint32, 1)
	go func() {
		defer close(id)
		for {
			f, err := s.fr.ReadFrame()
			if err != nil {
				return
			}
			if f, ok := f.(*http2.MetaHeadersFrame); ok {
				id <- f.StreamID
				return
			}
		}
	}()
	return id
}

// reply writes a whole reply with body on stream id.
func (s *pipeServer) reply(id uint32, body string) error {
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
	enc.WriteField(hpack.HeaderField{Name: "content-length", Value: "2"})
	if err := s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
		return err
	}
	return s.fr.WriteData(id, true, []byte(body))
}

// A server that stops reading stalls the client's writer, but not its
// reader: the PING the server sends first is answered through the queue,
// not by the read loop waiting for the writer, so the reply after it
// arrives. A read loop that waited for the writer would stop reading
// there, and the server's write of the reply would stall in turn, as two
// peers' writes stall each other when both wait for their writer to read.
func TestReadLoop_RepliesArriveWhileTheWriterIsStalled(t *testing.T) {
	c, s := newPipeServer(t, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
	ctx := context.Background()

	headers := s.readHeaders()
	a := start(c, request(t, ctx, "GET", "http://pipe/a", nil), 1<<20)
	idA := <-headers
	// B's Start returns once its body is written, after the test.
	headers = s.readHeaders()
	b := make(chan (<-chan started), 1)
	go func() { b <- start(c, request(t, ctx, "POST", "http://pipe/b", make([]byte, 256<<10)), 1<<20) }()
	if _, ok := <-headers; !ok {
		t.Fatal("B's headers did not arrive")
	}
	// The server reads nothing more: B's first DATA frame holds the writer.
	waitFor(t, "B's body to hold the writer", func() bool {
		if c.wmu.TryLock() {
			c.wmu.Unlock()
			return false
		}
		return true
	})

	wrote := make(chan error, 1)
	go func() {
		err := s.fr.WritePing(false, [8]byte{'p', 'i', 'n', 'g'})
		if err == nil {
			err = s.reply(idA, "ok")
		}
		wrote <- err
	}()
	select {
	case got := <-a:
		if got.err != nil || got.resp.StatusCode != 200 || string(got.body) != "ok" {
			t.Fatalf("A's reply: %+v", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("A's reply did not arrive while B's body held the writer: the read loop stopped reading")
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}

	// Once the server reads again, the PING's acknowledgement follows B's
	// frame out.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatal("no PING acknowledgement")
		}
		f := s.readFrame(t)
		if p, ok := f.(*http2.PingFrame); ok && p.IsAck() {
			if string(p.Data[:4]) != "ping" {
				t.Fatalf("PING acknowledged with %q", p.Data)
			}
			break
		}
	}
	c.Close()
	if got := <-<-b; got.err == nil {
		t.Fatalf("B finished on a closed connection: %+v", got)
	}
}

// A server that keeps sending PINGs and never reads our answers fails the
// connection once h2frame.MaxQueuedControlFrames wait, as x/net's server
// does with a client: the queue is bounded, and a request in flight fails
// with the reason.
func TestReadLoop_ServerThatReadsNoAnswersFailsTheConnection(t *testing.T) {
	c, s := newPipeServer(t)
	headers := s.readHeaders()
	waiting := start(c, request(t, context.Background(), "GET", "http://pipe/wait", nil), 1<<20)
	<-headers

	// A client whose read loop stopped at the first PING would stop this
	// loop here instead.
	s.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	sent := 0
	for ; sent < 2*h2frame.MaxQueuedControlFrames; sent++ {
		if s.fr.WritePing(false, [8]byte{byte(sent)}) != nil {
			break
		}
	}
	// Besides the queue, answers the flusher wrote into the connection's
	// buffer before it blocked on the pipe (17 bytes each), and the PING
	// that found the queue full.
	if bound := h2frame.MaxQueuedControlFrames + (64<<10)/17 + 2; sent > bound {
		t.Errorf("the client read %d PINGs it could not answer, want at most %d", sent, bound)
	}
	var got started
	select {
	case got = <-waiting:
	case <-time.After(10 * time.Second):
		t.Fatalf("the connection still stands after %d unanswered PINGs", sent)
	}
	if !errors.Is(got.err, errControlUnread) {
		t.Fatalf("the waiting request failed with %v, want %v", got.err, errControlUnread)
	}
}
