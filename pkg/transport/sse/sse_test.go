package sse_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"

	"go.uber.org/goleak"

	"github.com/gymfleet/gymfleet/pkg/transport/sse"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestWriter_Frames(t *testing.T) {
	rec := httptest.NewRecorder()
	w := sse.NewWriter(rec)
	if w.Started() {
		t.Fatal("Started before any event")
	}
	if err := w.Event("", []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	if !w.Started() || !rec.Flushed {
		t.Fatalf("after an event: Started %v, flushed %v", w.Started(), rec.Flushed)
	}
	if err := w.Event("response.output_text.delta", []byte(`{"delta":"hi"}`)); err != nil {
		t.Fatal(err)
	}
	if err := w.Event("", []byte(sse.Done)); err != nil {
		t.Fatal(err)
	}
	want := "data: {\"a\":1}\n\n" +
		"event: response.output_text.delta\ndata: {\"delta\":\"hi\"}\n\n" +
		"data: [DONE]\n\n"
	if got := rec.Body.String(); got != want {
		t.Fatalf("body = %q, want %q", got, want)
	}
	if rec.Code != http.StatusOK {
		t.Fatalf("status = %d", rec.Code)
	}
	for k, v := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"} {
		if got := rec.Header().Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
}

// Data with line breaks becomes one data line per line, as the SSE framing
// requires, so it reads back whole.
func TestWriter_MultiLineData(t *testing.T) {
	rec := httptest.NewRecorder()
	if err := sse.NewWriter(rec).Event("e", []byte("a\n\nb\n")); err != nil {
		t.Fatal(err)
	}
	if got, want := rec.Body.String(), "event: e\ndata: a\ndata: \ndata: b\ndata: \n\n"; got != want {
		t.Fatalf("body = %q, want %q", got, want)
	}
}

func TestWriter_Start(t *testing.T) {
	rec := httptest.NewRecorder()
	w := sse.NewWriter(rec)
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	if err := w.Start(); err != nil { // idempotent: one WriteHeader
		t.Fatal(err)
	}
	if !w.Started() || !rec.Flushed || rec.Body.Len() != 0 || rec.Code != http.StatusOK {
		t.Fatalf("Start: started %v flushed %v body %q code %d", w.Started(), rec.Flushed, rec.Body, rec.Code)
	}
}

// A real server: each event reaches the client before the handler returns.
func TestWriter_FlushesEachEvent(t *testing.T) {
	next := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w := sse.NewWriter(rw)
		for _, d := range []string{"one", "two"} {
			if err := w.Event("", []byte(d)); err != nil {
				return
			}
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
		}
	}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := sse.NewReader(resp.Body)
	for _, want := range []string{"one", "two"} {
		ev, err := rd.Next()
		if err != nil || string(ev.Data) != want {
			t.Fatalf("Next = %q, %v; want %q", ev.Data, err, want)
		}
		next <- struct{}{}
	}
	if _, err := rd.Next(); err != io.EOF {
		t.Fatalf("after the last event: %v, want io.EOF", err)
	}
}

// readAll reads every event of a stream, stopping at the first error.
func readAll(r io.Reader) ([]sse.Event, error) {
	rd := sse.NewReader(r)
	var out []sse.Event
	for {
		ev, err := rd.Next()
		if err != nil {
			return out, err
		}
		out = append(out, ev)
	}
}

func TestReader(t *testing.T) {
	long := strings.Repeat("x", 200<<10) // beyond the reader's 64 KiB buffer
	tests := []struct {
		name   string
		stream string
		want   []sse.Event
	}{
		{"one event", "data: {\"a\":1}\n\n", []sse.Event{{Data: []byte(`{"a":1}`)}}},
		{"named", "event: response.created\ndata: {}\n\n", []sse.Event{{Name: "response.created", Data: []byte(`{}`)}}},
		{"multi-line data", "data: a\ndata: b\ndata:c\n\n", []sse.Event{{Data: []byte("a\nb\nc")}}},
		{"empty data lines", "data: \ndata: \n\n", []sse.Event{{Data: []byte("\n")}}},
		{"comments and unknown fields", ": ping\nid: 7\nretry: 10\ndata: x\n: mid\n\n: trailer\n", []sse.Event{{Data: []byte("x")}}},
		{"CRLF", "event: e\r\ndata: x\r\n\r\ndata: y\r\n\r\n", []sse.Event{{Name: "e", Data: []byte("x")}, {Data: []byte("y")}}},
		{"no final blank line", "data: a\n\ndata: b\n", []sse.Event{{Data: []byte("a")}, {Data: []byte("b")}}},
		{"no final newline", "data: a\n\ndata: b", []sse.Event{{Data: []byte("a")}, {Data: []byte("b")}}},
		{"blank lines between", "\n\n\ndata: a\n\n\n\ndata: b\n\n", []sse.Event{{Data: []byte("a")}, {Data: []byte("b")}}},
		{"one space stripped", "data:  two spaces\n\n", []sse.Event{{Data: []byte(" two spaces")}}},
		{"colon in value", "data: {\"k\":\"v\"}\n\n", []sse.Event{{Data: []byte(`{"k":"v"}`)}}},
		{"name only", "event: ping\n\n", []sse.Event{{Name: "ping"}}},
		{"long line", "data: " + long + "\n\ndata: after\n\n", []sse.Event{{Data: []byte(long)}, {Data: []byte("after")}}},
		{"long last line", "data: " + long, []sse.Event{{Data: []byte(long)}}},
		{"empty stream", "", nil},
		{"only comments", ": a\n: b", nil},
		{"only an unknown field, unterminated", "retry: 10", nil},
		{"only blank lines", "\n\r\n\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, mode := range []string{"whole", "one byte at a time"} {
				var r io.Reader = strings.NewReader(tt.stream)
				if mode != "whole" {
					r = iotest.OneByteReader(r)
				}
				got, err := readAll(r)
				if err != io.EOF {
					t.Fatalf("%s: stream ended with %v, want io.EOF", mode, err)
				}
				if !equalEvents(got, tt.want) {
					t.Fatalf("%s: events = %s, want %s", mode, show(got), show(tt.want))
				}
			}
		})
	}
}

func equalEvents(a, b []sse.Event) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || !bytes.Equal(a[i].Data, b[i].Data) {
			return false
		}
	}
	return true
}

func show(evs []sse.Event) string {
	var b strings.Builder
	for _, e := range evs {
		d := string(e.Data)
		if len(d) > 40 {
			d = d[:40] + "..."
		}
		b.WriteString("{" + e.Name + "|" + d + "}")
	}
	return "[" + b.String() + "]"
}

// filler reads n bytes of a repeated chunk without holding them all in
// memory, so the oversized streams below cost the reader's buffers only.
type filler struct {
	chunk []byte
	n     int
}

func (f *filler) Read(p []byte) (int, error) {
	if f.n == 0 {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), f.n)], f.chunk)
	f.n -= k
	return k, nil
}

// dataLine is a reader of "data: " + n filler bytes + "\n".
func dataLine(n int) io.Reader {
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	return io.MultiReader(strings.NewReader("data: "), &filler{chunk: chunk, n: n}, strings.NewReader("\n"))
}

func TestReader_EventTooLarge(t *testing.T) {
	// Each case pushes 16 MiB through the reader; run them side by side.
	t.Run("one line", func(t *testing.T) {
		t.Parallel()
		stream := io.MultiReader(dataLine(sse.MaxEventBytes+1), strings.NewReader("\n"))
		_, err := sse.NewReader(stream).Next()
		if !errors.Is(err, sse.ErrEventTooLarge) {
			t.Fatalf("err = %v, want ErrEventTooLarge", err)
		}
	})
	t.Run("many lines", func(t *testing.T) {
		t.Parallel()
		var lines []io.Reader
		for range sse.MaxEventBytes>>20 + 1 {
			lines = append(lines, dataLine(1<<20))
		}
		_, err := sse.NewReader(io.MultiReader(append(lines, strings.NewReader("\n"))...)).Next()
		if !errors.Is(err, sse.ErrEventTooLarge) {
			t.Fatalf("err = %v, want ErrEventTooLarge", err)
		}
	})
}

func TestReader_PropagatesReadErrors(t *testing.T) {
	wantErr := errors.New("connection reset")
	r := io.MultiReader(strings.NewReader("data: a\n\ndata: partial\n"), iotest.ErrReader(wantErr))
	rd := sse.NewReader(r)
	if ev, err := rd.Next(); err != nil || string(ev.Data) != "a" {
		t.Fatalf("first = %q, %v", ev.Data, err)
	}
	if _, err := rd.Next(); !errors.Is(err, wantErr) {
		t.Fatalf("cut-off event: err = %v, want the read error", err)
	}
}

// writeEvents writes events with the Writer and returns the stream.
func writeEvents(t *testing.T, evs []sse.Event) []byte {
	t.Helper()
	rec := httptest.NewRecorder()
	w := sse.NewWriter(rec)
	for _, ev := range evs {
		if err := w.Event(ev.Name, ev.Data); err != nil {
			t.Fatal(err)
		}
	}
	return rec.Body.Bytes()
}

func TestRoundTrip(t *testing.T) {
	evs := []sse.Event{
		{Name: "response.created", Data: []byte(`{"type":"response.created","sequence_number":0}`)},
		{Data: []byte(`{"choices":[{"delta":{"content":"é \u2028 <b>"}}]}`)},
		{Name: "multi", Data: []byte("line one\nline two\n")},
		{Name: "empty"},
		{Data: []byte(sse.Done)},
	}
	got, err := readAll(bytes.NewReader(writeEvents(t, evs)))
	if err != io.EOF {
		t.Fatal(err)
	}
	if !equalEvents(got, evs) {
		t.Fatalf("read back %s, want %s", show(got), show(evs))
	}
}

// FuzzReader: the reader never panics or loops on any input, and an event
// the Writer wrote reads back equal. SSE cannot carry a CR in data or a line
// break in an event name (both are line terminators), so those are excluded
// from the round trip.
func FuzzReader(f *testing.F) {
	f.Add([]byte("data: {\"a\":1}\n\n"), "e", []byte(`{"x":"y"}`))
	f.Add([]byte("event: x\r\ndata: a\r\ndata: b\r\n\r\n: c\n"), "", []byte("a\nb"))
	f.Add([]byte("data"), "response.output_text.delta", []byte("\n"))
	f.Add([]byte(":\n\n\ndata:\ndata\n\nevent\n"), " spaced", []byte(" lead"))
	f.Add([]byte("data: "+strings.Repeat("z", 70<<10)), "n", []byte(strings.Repeat("q", 70<<10)))
	f.Fuzz(func(t *testing.T, stream []byte, name string, data []byte) {
		rd := sse.NewReader(bytes.NewReader(stream))
		for i := 0; ; i++ {
			if i > len(stream)+1 {
				t.Fatalf("more events than bytes in %q", stream)
			}
			ev, err := rd.Next()
			if err != nil {
				break
			}
			if len(ev.Data) > len(stream) || len(ev.Name) > len(stream) {
				t.Fatalf("event %q larger than the stream", ev.Data)
			}
		}
		if strings.ContainsAny(name, "\r\n") || bytes.ContainsRune(data, '\r') {
			return
		}
		want := sse.Event{Name: name, Data: data}
		got, err := readAll(bytes.NewReader(writeEvents(t, []sse.Event{want, {Data: []byte(sse.Done)}})))
		if err != io.EOF {
			t.Fatalf("reading back: %v", err)
		}
		if !equalEvents(got, []sse.Event{want, {Data: []byte(sse.Done)}}) {
			t.Fatalf("wrote {%q %q}, read back %s", name, data, show(got))
		}
	})
}
