package tokencapture

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/infra/atomicfile"
	"github.com/gymfleet/gymfleet/pkg/infra/hugepage"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// Record operations of the log.
const (
	opAppend   = "append"
	opImport   = "import"
	opRetire   = "retire"
	opDelete   = "delete"
	opFail     = "fail"
	opSnapshot = "snapshot"
)

// record is one line of a segment.
type record struct {
	Op      string   `json:"op"`
	Key     string   `json:"key,omitempty"`
	Keys    []string `json:"keys,omitempty"`
	Row     *Row     `json:"row,omitempty"`
	Rows    []Row    `json:"rows,omitempty"`
	Failure *Failure `json:"failure,omitempty"`
}

func encodeRecord(r record) ([]byte, error) {
	b, err := codec.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("tokencapture: encode %s record: %w", r.Op, err)
	}
	return append(b, '\n'), nil
}

const (
	segmentPrefix = "seg-"
	segmentSuffix = ".jsonl"
)

func segmentPath(dir string, id uint64) string {
	return filepath.Join(dir, fmt.Sprintf("%s%020d%s", segmentPrefix, id, segmentSuffix))
}

// parseSegmentName returns the id of a segment file name.
func parseSegmentName(name string) (uint64, bool) {
	if !strings.HasPrefix(name, segmentPrefix) || !strings.HasSuffix(name, segmentSuffix) {
		return 0, false
	}
	id, err := strconv.ParseUint(name[len(segmentPrefix):len(name)-len(segmentSuffix)], 10, 64)
	return id, err == nil
}

// replayState is the index rebuilt from the log.
type replayState struct {
	keys       map[string]*keyState
	files      map[uint64]*os.File
	ids        []uint64
	maxSeg     uint64
	totalBytes int64
}

func (s *replayState) liveBytes() int64 {
	var n int64
	for _, ks := range s.keys {
		n += ks.liveBytes
	}
	return n
}

// replayDir replays every segment of dir in order. Segments before the last
// snapshot segment are dead and removed; so are leftover temp files of an
// interrupted compaction.
func replayDir(dir string) (*replayState, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("tokencapture: read %s: %w", dir, err)
	}
	var ids []uint64
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, "."+segmentPrefix) && strings.HasSuffix(name, ".tmp") {
			_ = os.Remove(filepath.Join(dir, name))
			continue
		}
		if id, ok := parseSegmentName(name); ok && e.Type().IsRegular() {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	st := &replayState{keys: map[string]*keyState{}, files: map[uint64]*os.File{}}
	for i, id := range ids {
		f, err := os.Open(segmentPath(dir, id))
		if err != nil {
			st.closeFiles()
			return nil, fmt.Errorf("tokencapture: open segment: %w", err)
		}
		size, snapshot, err := replaySegment(f, id, st.keys)
		if err != nil {
			f.Close()
			st.closeFiles()
			return nil, fmt.Errorf("tokencapture: replay %s: %w", filepath.Base(f.Name()), err)
		}
		if snapshot {
			// Everything before a snapshot is in it: drop the older files.
			for _, old := range ids[:i] {
				if of := st.files[old]; of != nil {
					of.Close()
					delete(st.files, old)
				}
				_ = os.Remove(segmentPath(dir, old))
			}
			st.ids, st.totalBytes = nil, 0
		}
		st.files[id] = f
		st.ids = append(st.ids, id)
		st.totalBytes += size
		st.maxSeg = id
	}
	return st, nil
}

func (s *replayState) closeFiles() {
	for _, f := range s.files {
		f.Close()
	}
}

// replaySegment applies the records of one segment to keys. It returns the
// segment's size and whether it is a snapshot (its first record resets
// everything before). A torn tail (invalid or unterminated lines with no
// valid line after them) is ignored; an invalid line followed by a valid one
// is corruption.
func replaySegment(r io.Reader, seg uint64, keys map[string]*keyState) (size int64, snapshot bool, err error) {
	br := bufio.NewReaderSize(r, 256<<10)
	var off int64
	badAt := int64(-1)
	var badErr error
	first := true
	for {
		line, rerr := br.ReadBytes('\n')
		if len(line) > 0 {
			n := int64(len(line))
			if line[len(line)-1] != '\n' {
				// Unterminated: the write that held it never completed.
				off += n
				break
			}
			rec, derr := decodeRecord(line)
			if derr == nil {
				derr = validateRecord(rec, first)
			}
			if derr != nil {
				if badAt < 0 {
					badAt, badErr = off, derr
				}
			} else {
				if badAt >= 0 {
					return 0, false, fmt.Errorf("corrupt record at byte %d, followed by valid records: %w", badAt, badErr)
				}
				if rec.Op == opSnapshot {
					snapshot = true
					clear(keys)
				} else {
					apply(keys, rec, extent{seg: seg, off: off, n: n})
				}
			}
			first = false
			off += n
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				break
			}
			return 0, false, rerr
		}
	}
	return off, snapshot, nil
}

// indexRecord is what replay needs of a record: no token arrays.
type indexRecord struct {
	Op      string     `json:"op"`
	Key     string     `json:"key"`
	Keys    []string   `json:"keys"`
	Row     *indexRow  `json:"row"`
	Rows    []indexRow `json:"rows"`
	Failure *Failure   `json:"failure"`
}

type indexRow struct {
	CallID string `json:"call_id"`
	Seq    int64  `json:"seq"`
}

func decodeRecord(line []byte) (*indexRecord, error) {
	line = bytes.TrimRight(line, "\n")
	var rec indexRecord
	if err := codec.Unmarshal(line, &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

func validateRecord(rec *indexRecord, first bool) error {
	switch rec.Op {
	case opAppend:
		if rec.Row == nil || rec.Row.CallID == "" {
			return errors.New("append record without a row call_id")
		}
		return checkKey(rec.Key)
	case opImport:
		for _, r := range rec.Rows {
			if r.CallID == "" {
				return errors.New("import record with a row without call_id")
			}
		}
		return checkKey(rec.Key)
	case opFail:
		if rec.Failure == nil {
			return errors.New("fail record without a failure")
		}
		return checkKey(rec.Key)
	case opRetire, opDelete:
		for _, k := range rec.Keys {
			if err := checkKey(k); err != nil {
				return err
			}
		}
		return nil
	case opSnapshot:
		if !first {
			return errors.New("snapshot record not at the start of its segment")
		}
		return nil
	}
	return fmt.Errorf("unknown record op %q", rec.Op)
}

// apply replays one valid record into the index.
func apply(keys map[string]*keyState, rec *indexRecord, ext extent) {
	switch rec.Op {
	case opAppend:
		ks := keys[rec.Key]
		if ks == nil {
			ks = &keyState{}
			keys[rec.Key] = ks
		}
		if ks.retired {
			// Appends are refused after a retire; a record here can only
			// come from a damaged log. The fence wins.
			return
		}
		ks.extents = append(ks.extents, ext)
		ks.rows++
		ks.lastSeq = max(ks.lastSeq, rec.Row.Seq)
		ks.lastCallID = rec.Row.CallID
		ks.present = true
		ks.liveBytes += ext.n
	case opImport:
		ks := &keyState{present: true, rows: len(rec.Rows), liveBytes: ext.n}
		if len(rec.Rows) > 0 {
			ks.extents = []extent{ext}
			ks.lastCallID = rec.Rows[len(rec.Rows)-1].CallID
			for _, r := range rec.Rows {
				ks.lastSeq = max(ks.lastSeq, r.Seq)
			}
		}
		keys[rec.Key] = ks
	case opFail:
		ks := keys[rec.Key]
		if ks == nil {
			ks = &keyState{}
			keys[rec.Key] = ks
		}
		if ks.retired {
			return
		}
		ks.failures = append(ks.failures, *rec.Failure)
		ks.present = true
		ks.liveBytes += ext.n
	case opRetire:
		for _, k := range rec.Keys {
			keys[k] = &keyState{retired: true}
		}
	case opDelete:
		for _, k := range rec.Keys {
			delete(keys, k)
		}
	}
}

// readRecord reads the full record at e (rows with their tokens).
func readRecord(f *os.File, e extent) (*record, error) {
	if f == nil {
		return nil, errors.New("segment not open")
	}
	buf := make([]byte, e.n)
	if _, err := f.ReadAt(buf, e.off); err != nil {
		return nil, err
	}
	return decodeFullRecord(buf, e)
}

// decodeFullRecord decodes the record line read from e.
func decodeFullRecord(line []byte, e extent) (*record, error) {
	var rec record
	if err := codec.Unmarshal(bytes.TrimRight(line, "\n"), &rec); err != nil {
		return nil, fmt.Errorf("decode record at %d: %w", e.off, err)
	}
	return &rec, nil
}

// rawRecord is a record line with its rows left encoded.
type rawRecord struct {
	Row  codec.RawMessage   `json:"row"`
	Rows []codec.RawMessage `json:"rows"`
}

// rawRowReader reads the rows of record lines as codec.Marshal encodes
// each Row, into one buffer that every batch of keys reuses: a checkpoint
// export reads 100,000 keys' rows, and while a checkpoint holds the
// collector off every fresh byte is a page the kernel must fault in (dear
// under a hypervisor, pkg/infra/hugepage), where a reused one is not.
type rawRowReader struct {
	// chunks are filled in order within a batch; next is the one being
	// filled.
	chunks [][]byte
	next   int
}

// rawRowChunk is the size of a buffer chunk. Chunks are allocated whole,
// not grown: a grown slice copies what it held and leaves the old array
// (1.25 times as much fresh memory per growth past 256 bytes). They are
// whole huge pages (hugepage.MakePages), fresh memory that faults 2 MiB
// at a time: a 16,000-episode export fills two of them a batch.
const rawRowChunk = 4 << 20

// reset lets the next batch reuse the chunks: the rows read so far are no
// longer referenced.
func (r *rawRowReader) reset() {
	for i := range r.chunks {
		r.chunks[i] = r.chunks[i][:0]
	}
	r.next = 0
}

// room returns the chunk to append n bytes to (at r.chunks[r.next]).
func (r *rawRowReader) room(n int) []byte {
	for ; r.next < len(r.chunks); r.next++ {
		if c := r.chunks[r.next]; cap(c)-len(c) >= n {
			return c
		}
	}
	c := hugepage.MakePages(max(rawRowChunk, n))[:0]
	r.chunks = append(r.chunks, c)
	return c
}

// rows returns the rows of a record line. An import record holds them
// encoded so already; an append record's row starts with parent_call_id
// and seq, which Append splices in, and is put in the Row's field order
// (appendedRow). Anything else is decoded and encoded again.
func (r *rawRowReader) rows(line []byte, e extent) ([]codec.RawMessage, error) {
	// An append record as Append writes it, {"op":"append","key":K,"row":R},
	// needs no decoding to find its row.
	if rest, ok := bytes.CutPrefix(line, []byte(`{"op":"append","key":"`)); ok {
		if _, raw, ok := bytes.Cut(rest, []byte(`","row":`)); ok {
			if raw, ok := bytes.CutSuffix(raw, []byte("}\n")); ok {
				if row, ok := r.appended(raw); ok {
					return []codec.RawMessage{row}, nil
				}
			}
		}
	}
	var rec rawRecord
	if err := codec.Unmarshal(bytes.TrimRight(line, "\n"), &rec); err != nil {
		return nil, fmt.Errorf("decode record at %d: %w", e.off, err)
	}
	if rec.Row == nil {
		return rec.Rows, nil
	}
	if row, ok := r.appended(rec.Row); ok {
		return []codec.RawMessage{row}, nil
	}
	rows, err := decodeRows(line, e)
	if err != nil {
		return nil, err
	}
	out := make([]codec.RawMessage, len(rows))
	for i := range rows {
		if out[i], err = codec.Marshal(rows[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// appended reorders an appended row (appendedRow) into the buffer.
func (r *rawRowReader) appended(raw []byte) (row []byte, ok bool) {
	// The reordered row is as long as raw; appendedRow asks for 8 more.
	c := r.room(len(raw) + 8)
	start := len(c)
	c, ok = appendedRow(c, raw)
	if !ok {
		return nil, false
	}
	r.chunks[r.next] = c
	return c[start:len(c):len(c)], true
}

// appendedRow appends a row as Append writes it,
//
//	{"parent_call_id":P,"seq":N,"call_id":C,"capture_key":K,"created_at":...}
//
// to dst in the Row's field order, call_id, parent_call_id, capture_key,
// seq, then the rest as it is: the bytes codec.Marshal writes for the Row
// (the values are the encoder's already). ok is false for any other
// layout, and nothing is appended.
func appendedRow(dst, raw []byte) (out []byte, ok bool) {
	rest, ok := bytes.CutPrefix(raw, []byte(`{"parent_call_id":`))
	if !ok {
		return nil, false
	}
	parent, rest, ok := cutJSONString(rest)
	if !ok {
		return nil, false
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(`,"seq":`)); !ok {
		return nil, false
	}
	digits := 0
	for digits < len(rest) && rest[digits] >= '0' && rest[digits] <= '9' {
		digits++
	}
	seq := rest[:digits]
	if rest, ok = bytes.CutPrefix(rest[digits:], []byte(`,"call_id":`)); !ok || digits == 0 {
		return nil, false
	}
	callID, rest, ok := cutJSONString(rest)
	if !ok {
		return nil, false
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(`,"capture_key":`)); !ok {
		return nil, false
	}
	captureKey, rest, ok := cutJSONString(rest)
	if !ok || len(rest) < 2 || rest[0] != ',' {
		return nil, false
	}
	out = slices.Grow(dst, len(raw)+8)
	out = append(out, `{"call_id":`...)
	out = append(out, callID...)
	out = append(out, `,"parent_call_id":`...)
	out = append(out, parent...)
	out = append(out, `,"capture_key":`...)
	out = append(out, captureKey...)
	out = append(out, `,"seq":`...)
	out = append(out, seq...)
	out = append(out, rest...)
	return out, true
}

// cutJSONString splits a JSON string literal (quotes included) off the
// front of b.
func cutJSONString(b []byte) (str, rest []byte, ok bool) {
	if len(b) == 0 || b[0] != '"' {
		return nil, nil, false
	}
	for i := 1; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return b[:i+1], b[i+1:], true
		}
	}
	return nil, nil, false
}

// compact writes the live records of st into one snapshot segment after the
// last one, through atomicfile (temp file, fsync, rename, directory fsync),
// then removes the older segments. A crash at any point leaves either the
// old segments alone or a snapshot that replay prefers to them.
func compact(dir string, fsys atomicfile.FS, st *replayState) error {
	id := st.maxSeg + 1
	keys := make([]string, 0, len(st.keys))
	for k := range st.keys {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	tmp, err := atomicfile.WriteTemp(fsys, dir, "."+segmentPrefix+"*.tmp", func(w io.Writer) error {
		bw := bufio.NewWriterSize(w, 1<<20)
		if _, err := bw.WriteString(`{"op":"snapshot"}` + "\n"); err != nil {
			return err
		}
		var fenced []string
		for _, k := range keys {
			ks := st.keys[k]
			if ks.retired {
				fenced = append(fenced, k)
				continue
			}
			// Live lines are copied verbatim: they are valid records already.
			for _, e := range ks.extents {
				buf := make([]byte, e.n)
				if _, err := st.files[e.seg].ReadAt(buf, e.off); err != nil {
					return fmt.Errorf("read live record: %w", err)
				}
				if _, err := bw.Write(buf); err != nil {
					return err
				}
			}
			if ks.present && len(ks.extents) == 0 && len(ks.failures) == 0 {
				// An empty import still holds a (clean) ledger.
				line, err := encodeRecord(record{Op: opImport, Key: k})
				if err != nil {
					return err
				}
				if _, err := bw.Write(line); err != nil {
					return err
				}
			}
			for i := range ks.failures {
				line, err := encodeRecord(record{Op: opFail, Key: k, Failure: &ks.failures[i]})
				if err != nil {
					return err
				}
				if _, err := bw.Write(line); err != nil {
					return err
				}
			}
		}
		if len(fenced) > 0 {
			line, err := encodeRecord(record{Op: opRetire, Keys: fenced})
			if err != nil {
				return err
			}
			if _, err := bw.Write(line); err != nil {
				return err
			}
		}
		return bw.Flush()
	})
	if err != nil {
		return fmt.Errorf("tokencapture: compact: %w", err)
	}
	if err := fsys.Rename(tmp, segmentPath(dir, id)); err != nil {
		_ = fsys.Remove(tmp)
		return fmt.Errorf("tokencapture: compact: %w", err)
	}
	if err := fsys.SyncDir(dir); err != nil {
		return fmt.Errorf("tokencapture: compact: fsync %s: %w", dir, err)
	}
	for _, old := range st.ids {
		if err := fsys.Remove(segmentPath(dir, old)); err != nil {
			return fmt.Errorf("tokencapture: compact: %w", err)
		}
	}
	return fsys.SyncDir(dir)
}
