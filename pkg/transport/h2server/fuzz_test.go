package h2server

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// clientFrames encodes the preface and frames a client could send.
func clientFrames(write func(fr *http2.Framer, block func(fields ...string) []byte)) []byte {
	var buf bytes.Buffer
	buf.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(&buf, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	block := func(fields ...string) []byte {
		hb.Reset()
		for i := 0; i+1 < len(fields); i += 2 {
			enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
		}
		return bytes.Clone(hb.Bytes())
	}
	fr.WriteSettings()
	write(fr, block)
	return buf.Bytes()
}

// Whatever a client sends, the server neither panics nor hangs: once the
// client's bytes end, the connection and every handler it started end.
func FuzzRequestFrames(f *testing.F) {
	req := func(fields ...string) []string {
		return append([]string{":method", "POST", ":scheme", "http", ":authority", "fuzz", ":path", "/run"}, fields...)
	}
	f.Add(clientFrames(func(fr *http2.Framer, block func(...string) []byte) {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(req("content-length", "4")...), EndHeaders: true})
		fr.WriteData(1, true, []byte("body"))
	}))
	f.Add(clientFrames(func(fr *http2.Framer, block func(...string) []byte) {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(req()...), EndHeaders: true})
		fr.WriteData(1, false, []byte("part"))
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block("x-trailer", "t"), EndHeaders: true, EndStream: true})
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block(":method", "GET", ":scheme", "http", ":path", "*"), EndHeaders: true, EndStream: true})
	}))
	f.Add(clientFrames(func(fr *http2.Framer, block func(...string) []byte) {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(req("content-length", "1")...), EndHeaders: true})
		fr.WriteData(1, true, []byte("longer than declared"))
		fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1}, http2.Setting{ID: http2.SettingMaxFrameSize, Val: 16384})
		fr.WritePing(false, [8]byte{1})
		fr.WriteWindowUpdate(0, 1<<31-1)
		fr.WriteWindowUpdate(1, 1<<31-1)
		fr.WriteRSTStream(1, http2.ErrCodeCancel)
		fr.WriteRSTStream(9, http2.ErrCodeCancel)
	}))
	f.Add(clientFrames(func(fr *http2.Framer, block func(...string) []byte) {
		fr.WriteData(5, true, []byte("data on a stream never opened"))
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 2, BlockFragment: block(req()...), EndHeaders: true})
		fr.WriteRawFrame(http2.FrameSettings, 0, 0, []byte{0, 5, 0, 0, 0, 0}) // MAX_FRAME_SIZE 0
	}))
	f.Add(clientFrames(func(fr *http2.Framer, block func(...string) []byte) {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(":method", "GET", ":path", "relative", "connection", "close"), EndHeaders: true, EndStream: true})
		fr.WriteGoAway(0, http2.ErrCodeNo, []byte("bye"))
		fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, BlockFragment: block(req()...), EndHeaders: true})
	}))
	f.Fuzz(func(t *testing.T, frames []byte) {
		srv := New(Config{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(w, r.Body)
		})})
		client, server := net.Pipe()
		served := make(chan struct{})
		go func() {
			defer close(served)
			srv.ServeConn(server)
		}()
		// net.Pipe does not buffer: what the server writes is read (and
		// dropped) while the frames are written.
		var wg sync.WaitGroup
		wg.Go(func() { io.Copy(io.Discard, client) })
		client.SetWriteDeadline(time.Now().Add(time.Second))
		client.Write(frames)
		client.Close()
		wg.Wait()
		select {
		case <-served:
		case <-time.After(10 * time.Second):
			t.Fatal("the connection outlived its client by 10 s")
		}
	})
}
