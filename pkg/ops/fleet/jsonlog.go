package fleet

import (
	"bytes"
	"encoding/json"
	"io"
	"sync"
	"time"
)

// jsonLog keeps a process's log file JSON lines only: a line the process
// writes as a JSON object passes as it is; any other line (a server's
// "listening on" announcement on stdout, a start-up error or a panic on
// stderr) becomes an object naming its process and stream, at level
// INFO for stdout and ERROR for stderr. The launcher's own lines go
// through it too. Both streams share one file, written a line at a time.
type jsonLog struct {
	mu      *sync.Mutex
	w       io.Writer
	process string
}

// stream is the writer of one of the process's streams.
func (j jsonLog) stream(name, level string) *jsonStream {
	return &jsonStream{log: j, name: name, level: level}
}

// line writes one launcher line with fields.
func (j jsonLog) line(level, msg string, fields map[string]any) {
	rec := map[string]any{"time": time.Now().UTC().Format(time.RFC3339Nano), "level": level, "msg": msg, "process": j.process, "source": "launcher"}
	for k, v := range fields {
		rec[k] = v
	}
	b, _ := json.Marshal(rec)
	j.mu.Lock()
	defer j.mu.Unlock()
	_, _ = j.w.Write(append(b, '\n'))
}

type jsonStream struct {
	log         jsonLog
	name, level string
	buf         []byte
}

// maxLine bounds a partial line kept between writes; a longer one is
// written in pieces.
const maxLine = 1 << 20

func (s *jsonStream) Write(p []byte) (int, error) {
	s.buf = append(s.buf, p...)
	for {
		i := bytes.IndexByte(s.buf, '\n')
		if i < 0 {
			if len(s.buf) > maxLine {
				s.emit(s.buf)
				s.buf = s.buf[:0]
			}
			return len(p), nil
		}
		s.emit(s.buf[:i])
		s.buf = s.buf[i+1:]
	}
}

// Flush writes a last line without its newline.
func (s *jsonStream) Flush() {
	if len(s.buf) > 0 {
		s.emit(s.buf)
		s.buf = nil
	}
}

func (s *jsonStream) emit(line []byte) {
	line = bytes.TrimRight(line, "\r")
	if len(bytes.TrimSpace(line)) == 0 {
		return
	}
	out := line
	if line[0] != '{' || !json.Valid(line) {
		rec := map[string]any{"time": time.Now().UTC().Format(time.RFC3339Nano), "level": s.level, "msg": string(line), "process": s.log.process, "stream": s.name}
		out, _ = json.Marshal(rec)
	}
	s.log.mu.Lock()
	defer s.log.mu.Unlock()
	_, _ = s.log.w.Write(append(out, '\n'))
}

// lastError is what a process's log says about why it ended: the first
// line of a panic, else the last line at level ERROR (a server's start-up
// error, written by lifecycle.ExitCode), with its err field.
func lastError(logs string) string {
	var last string
	for _, line := range bytes.Split([]byte(logs), []byte{'\n'}) {
		var rec struct {
			Level  string `json:"level"`
			Msg    string `json:"msg"`
			Err    string `json:"err"`
			Source string `json:"source"`
		}
		if json.Unmarshal(line, &rec) != nil || rec.Level != "ERROR" || rec.Source == "launcher" {
			continue
		}
		if len(rec.Msg) > 7 && rec.Msg[:7] == "panic: " {
			return rec.Msg
		}
		last = rec.Msg
		if rec.Err != "" {
			last += ": " + rec.Err
		}
	}
	return last
}
