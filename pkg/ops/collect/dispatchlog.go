package collect

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"

	"github.com/gymfleet/gymfleet/pkg/infra/atomicfile"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// File names inside a checkpoint directory.
const (
	DispatchLogName = "dispatched.jsonl"
	LatestName      = "LATEST"
	PIDFileName     = "collector.pid"
	ManifestName    = "collection.json"
)

// DispatchLog is a collection run's dispatch log as read back: its run id
// and, per rollout, the highest attempt it logged. The first line is
// {"run_id": "<hex>"}; every later line is {"<rollout_id>": attempt},
// appended just before that attempt's /run was sent (or, for the lines a
// resumed run starts with, naming an attempt it fenced or a restore
// installed).
type DispatchLog struct {
	RunID    string
	Attempts map[string]int
	// Torn reports a last line cut short by a crash; it was ignored.
	Torn bool
}

// ReadDispatchLog parses a dispatch log. A torn last line (no newline, or
// not a JSON object) is ignored, as is a log whose first line is torn (the
// run died before dispatching anything: RunID is empty). Any other bad line
// is an error naming its line number.
func ReadDispatchLog(r io.Reader) (*DispatchLog, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("reading the dispatch log: %w", err)
	}
	log := &DispatchLog{Attempts: map[string]int{}}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		// The write of the last line was cut short.
		log.Torn = true
		data = data[:bytes.LastIndexByte(data, '\n')+1]
	}
	lines := bytes.Split(data, []byte("\n"))
	lines = lines[:len(lines)-1] // after the last newline
	for i, line := range lines {
		if err := log.parseLine(i+1, bytes.TrimSpace(line)); err != nil {
			if i == len(lines)-1 {
				log.Torn = true
				break
			}
			return nil, err
		}
	}
	return log, nil
}

func (l *DispatchLog) parseLine(n int, line []byte) error {
	if len(line) == 0 {
		return nil
	}
	if n == 1 {
		var head struct {
			RunID string `json:"run_id"`
		}
		if err := codec.UnmarshalStrict(line, &head); err != nil || head.RunID == "" {
			return fmt.Errorf("dispatch log line 1 is not {\"run_id\": ...}: %s", line)
		}
		l.RunID = head.RunID
		return nil
	}
	var entry map[string]int
	if err := codec.UnmarshalStrict(line, &entry); err != nil || len(entry) != 1 {
		return fmt.Errorf("dispatch log line %d is not {\"<rollout_id>\": attempt}: %s", n, line)
	}
	for id, attempt := range entry {
		ep := rollout.EpisodeID{RolloutID: id, Attempt: attempt}
		if err := ep.Validate(); err != nil {
			return fmt.Errorf("dispatch log line %d: %w", n, err)
		}
		if cur, ok := l.Attempts[id]; !ok || attempt > cur {
			l.Attempts[id] = attempt
		}
	}
	return nil
}

// LoadDispatchLog reads the dispatch log at path; a missing file is (nil, nil).
func LoadDispatchLog(path string) (*DispatchLog, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	log, err := ReadDispatchLog(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return log, nil
}

// dispatchWriter appends to a run's dispatch log. Each line is one write
// (flushed to the kernel, never fsynced: a process crash keeps it, and a
// host crash takes the fleet's servers on that host down too).
type dispatchWriter struct {
	mu sync.Mutex
	f  *os.File
}

// createDispatchLog replaces path durably with a new log of runID whose
// first entries are carry (sorted by rollout id), then opens it to append.
func createDispatchLog(fsys atomicfile.FS, path, runID string, carry map[string]int) (*dispatchWriter, error) {
	var buf bytes.Buffer
	head, err := codec.MarshalStable(map[string]string{"run_id": runID})
	if err != nil {
		return nil, err
	}
	buf.Write(head)
	buf.WriteByte('\n')
	ids := make([]string, 0, len(carry))
	for id := range carry {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		buf.Write(dispatchLine(id, carry[id]))
	}
	if err := atomicfile.WriteFile(fsys, path, buf.Bytes()); err != nil {
		return nil, fmt.Errorf("writing the dispatch log: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, err
	}
	return &dispatchWriter{f: f}, nil
}

func dispatchLine(id string, attempt int) []byte {
	b, err := codec.MarshalStable(map[string]int{id: attempt})
	if err != nil {
		panic(fmt.Sprintf("encoding a dispatch line: %v", err)) // a string and an int always encode
	}
	return append(b, '\n')
}

// Append logs one attempt about to be sent.
func (w *dispatchWriter) Append(id string, attempt int) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return errors.New("dispatch log closed")
	}
	if _, err := w.f.Write(dispatchLine(id, attempt)); err != nil {
		return fmt.Errorf("appending to the dispatch log: %w", err)
	}
	return nil
}

func (w *dispatchWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}

// newRunID is 16 random hex digits.
func newRunID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}
