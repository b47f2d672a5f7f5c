package h2client

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// replyFrames encodes frames a server could send for stream 1.
func replyFrames(write func(fr *http2.Framer, block func(fields ...string) []byte)) []byte {
	var buf bytes.Buffer
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
	write(fr, block)
	return buf.Bytes()
}

// Whatever a server sends, a request returns (with a reply or an error)
// by its deadline and nothing panics: the frames come from the network.
func FuzzReplyFrames(f *testing.F) {
	f.Add(replyFrames(func(fr *http2.Framer, block func(...string) []byte) {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(":status", "200", "content-length", "2"), EndHeaders: true})
		fr.WriteData(1, true, []byte("ok"))
	}))
	f.Add(replyFrames(func(fr *http2.Framer, block func(...string) []byte) {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(":status", "103"), EndHeaders: true})
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(":status", "500"), EndHeaders: true})
		fr.WriteData(1, false, []byte("partial"))
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block("x-trailer", "t"), EndHeaders: true, EndStream: true})
	}))
	f.Add(replyFrames(func(fr *http2.Framer, block func(...string) []byte) {
		fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1}, http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 0})
		fr.WritePing(false, [8]byte{1})
		fr.WriteWindowUpdate(0, 1<<31-1)
		fr.WriteWindowUpdate(1, 1<<31-1)
		fr.WriteRSTStream(1, http2.ErrCodeRefusedStream)
	}))
	f.Add(replyFrames(func(fr *http2.Framer, block func(...string) []byte) {
		fr.WriteGoAway(0, http2.ErrCodeNo, []byte("bye"))
	}))
	f.Add(replyFrames(func(fr *http2.Framer, block func(...string) []byte) {
		fr.WriteData(1, true, []byte("data before headers"))
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(":status", "abc"), EndHeaders: true})
		fr.WriteRawFrame(http2.FrameSettings, 0, 0, []byte{0, 5, 0, 0, 0, 0}) // MAX_FRAME_SIZE 0
	}))
	f.Fuzz(func(t *testing.T, frames []byte) {
		client, server := net.Pipe()
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() { fakeServer(server, frames) })
		c, err := NewConn(client)
		if err != nil {
			server.Close()
			return
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		done := make(chan struct{})
		go func() {
			defer close(done)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://fuzz/run", bytes.NewReader([]byte("body")))
			resp, err := c.RoundTrip(req)
			if err != nil {
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("a request outlived its deadline by 10 s")
		}
	})
}

// fakeServer answers the client's first request with frames, reading (and
// dropping) whatever the client sends until the connection closes.
func fakeServer(nc net.Conn, frames []byte) {
	defer nc.Close()
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(nc, preface); err != nil {
		return
	}
	fr := http2.NewFramer(nil, nc)
	var wmu sync.Mutex
	write := func(b []byte) {
		wmu.Lock()
		defer wmu.Unlock()
		nc.Write(b)
	}
	var settings bytes.Buffer
	http2.NewFramer(&settings, nil).WriteSettings()
	// net.Pipe does not buffer: writes go on a goroutine of their own so
	// that this one keeps reading what the client writes.
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { write(settings.Bytes()) })
	sent := false
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		if _, ok := f.(*http2.HeadersFrame); ok && !sent {
			sent = true
			wg.Go(func() { write(frames) })
		}
	}
}
