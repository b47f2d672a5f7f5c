// Package sse writes and reads server-sent events as OpenAI-compatible
// servers frame them: "event: <name>\n" (optional), "data: <json>\n", blank line.
package sse

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
)

// Done is the data of the last Chat Completions event.
const Done = "[DONE]"

// Writer writes events to an HTTP response and flushes each one.
type Writer struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
}

// NewWriter returns a writer on w. Headers are sent with the first event.
func NewWriter(w http.ResponseWriter) *Writer {
	return &Writer{w: w, rc: http.NewResponseController(w)}
}

// Started reports whether any event (and so the response headers) was sent.
func (s *Writer) Started() bool { return s.started }

// Start sends the response headers now.
func (s *Writer) Start() error {
	if s.started {
		return nil
	}
	s.started = true
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	s.w.WriteHeader(http.StatusOK)
	return s.rc.Flush()
}

// Event writes one event with an optional name and flushes it.
func (s *Writer) Event(name string, data []byte) error {
	if err := s.Start(); err != nil {
		return err
	}
	var b bytes.Buffer
	if name != "" {
		b.WriteString("event: ")
		b.WriteString(name)
		b.WriteByte('\n')
	}
	// One data line per line of data: a raw newline would end the field and
	// the rest would read as another (unknown) field.
	for {
		line, rest, more := bytes.Cut(data, []byte("\n"))
		b.WriteString("data: ")
		b.Write(line)
		b.WriteByte('\n')
		if !more {
			break
		}
		data = rest
	}
	b.WriteByte('\n')
	if _, err := s.w.Write(b.Bytes()); err != nil {
		return err
	}
	return s.rc.Flush()
}

// Event is one event read from a stream.
type Event struct {
	Name string
	Data []byte
}

// Reader reads events from a stream.
type Reader struct {
	br *bufio.Reader
}

// MaxEventBytes bounds one event's data.
const MaxEventBytes = 16 << 20

// NewReader returns a reader on r.
func NewReader(r io.Reader) *Reader { return &Reader{br: bufio.NewReaderSize(r, 64<<10)} }

// ErrEventTooLarge reports an event over MaxEventBytes.
var ErrEventTooLarge = errors.New("sse: event too large")

// Next returns the next event, or io.EOF at the end of the stream.
func (r *Reader) Next() (Event, error) {
	var ev Event
	var data bytes.Buffer
	seen, dataLines := false, 0
	for {
		line, err := r.br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A long line: keep reading it whole.
			full := append([]byte(nil), line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = r.br.ReadSlice('\n')
				full = append(full, line...)
				if len(full) > MaxEventBytes {
					return ev, ErrEventTooLarge
				}
			}
			line = full
		}
		if err != nil && !(errors.Is(err, io.EOF) && len(line) > 0) {
			if errors.Is(err, io.EOF) && seen {
				ev.Data = data.Bytes()
				return ev, nil
			}
			return ev, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			if seen {
				ev.Data = data.Bytes()
				return ev, nil
			}
			continue
		}
		if line[0] == ':' {
			continue // comment
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "event":
			ev.Name = string(value)
			seen = true
		case "data":
			// Lines join with "\n" even when they are empty.
			if dataLines > 0 {
				data.WriteByte('\n')
			}
			dataLines++
			if data.Len()+len(value) > MaxEventBytes {
				return ev, ErrEventTooLarge
			}
			data.Write(value)
			seen = true
		}
		if errors.Is(err, io.EOF) {
			if !seen {
				// A last line that was no event field is no event.
				return ev, io.EOF
			}
			ev.Data = data.Bytes()
			return ev, nil
		}
	}
}
