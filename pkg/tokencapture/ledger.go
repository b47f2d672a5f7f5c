// Package tokencapture is the capture ledger: per capture key, an
// append-only list of the model calls a rollout attempt made (call ids,
// parent links, token ids and log-probabilities), kept durable enough that a
// process killed with SIGKILL loses nothing it acknowledged.
//
// # Durability contract
//
// Append writes its record to the kernel with one write(2) before it
// returns, so a row survives the process being killed the moment after; the
// caller (the model server) appends before it delivers the reply the row
// describes ("stage before ack"). fsync is batched by a background
// group-commit loop, so a power loss may lose the newest rows, never reorder
// or tear older ones.
//
// # On disk
//
// The capture directory holds a segmented log, not a file per key: a
// process may hold at most 20,000 descriptors and a fleet runs 100,000
// rollouts. Segments are seg-<n>.jsonl, one JSON record per line:
//
//	{"op":"append","key":K,"row":{…}}           one model call
//	{"op":"import","key":K,"rows":[…]}          replace K's rows, clear its fence (restore)
//	{"op":"retire","keys":[…]}                  remove and fence
//	{"op":"delete","keys":[…]}                  remove and clear the fence
//	{"op":"fail","key":K,"failure":{…}}         a call whose capture failed
//	{"op":"snapshot"}                           first line of a compacted segment: forget everything before
//
// Open replays the segments in order to rebuild an in-memory index (per key:
// where its records are, its last call id and seq, its fence), ignoring a
// torn last line of any segment, and always starts a new active segment so
// nothing is ever appended after a torn line. Rows are read back from disk:
// token arrays never stay in memory. When dead records dominate, Open
// compacts the live ones into one snapshot segment first.
package tokencapture

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/gymfleet/gymfleet/pkg/infra/atomicfile"
	"github.com/gymfleet/gymfleet/pkg/infra/faultpoint"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Row is one model call of a capture key.
type Row struct {
	CallID string `json:"call_id"`
	// ParentCallID is the call this one continues; "" for the first call.
	ParentCallID string `json:"parent_call_id"`
	// CaptureKey is the key the row was captured under. Imported rows keep
	// theirs, so a restored attempt's ledger names the attempt that made
	// each call.
	CaptureKey string `json:"capture_key"`
	// Seq numbers a key's calls from 1; imported rows keep theirs and later
	// appends continue after the highest.
	Seq int64 `json:"seq"`
	// CreatedAt is Unix seconds.
	CreatedAt          float64      `json:"created_at"`
	Model              string       `json:"model"`
	RequestDigest      string       `json:"request_digest"`
	PromptTokenIDs     codec.Ints   `json:"prompt_token_ids"`
	GenerationTokenIDs codec.Ints   `json:"generation_token_ids"`
	GenerationLogProbs codec.Floats `json:"generation_log_probs"`
	FinishReason       string       `json:"finish_reason"`
	// ContinuedFrom is the staging key of a cut prefix this call continued.
	ContinuedFrom string `json:"continued_from,omitempty"`
}

// Failure records a call whose capture failed: the call was answered, but
// its row is missing or unusable, so a consumer must mask the rollout.
type Failure struct {
	CallID    string  `json:"call_id"`
	Reason    string  `json:"reason"`
	CreatedAt float64 `json:"created_at"`
}

// MaxFailureReason bounds a failure's reason text.
const MaxFailureReason = 1024

// Errors of the ledger.
var (
	// ErrRetired reports a key that was retired: its rows are gone and
	// appends are refused until Import or Delete clears the fence.
	ErrRetired = errors.New("capture key retired")
	// ErrInvalidKey reports a key that is not a valid capture key.
	ErrInvalidKey = errors.New("invalid capture key")
	// ErrClosed reports use of a closed ledger.
	ErrClosed = errors.New("ledger closed")
)

// Options tune a ledger; the zero value is the defaults.
type Options struct {
	// SegmentBytes is the size at which the active segment is sealed and a
	// new one started. 0 means 64 MiB.
	SegmentBytes int64
	// CompactMinBytes is how large the log must be before Open compacts it
	// (and only when dead records outweigh live ones). 0 means 32 MiB; a
	// negative value disables compaction.
	CompactMinBytes int64
	// FS writes the compacted segment; nil means atomicfile.OS.
	FS atomicfile.FS
	// Now stamps rows appended without created_at; nil means time.Now.
	Now func() time.Time
}

func (o *Options) withDefaults() {
	if o.SegmentBytes <= 0 {
		o.SegmentBytes = 64 << 20
	}
	if o.CompactMinBytes == 0 {
		o.CompactMinBytes = 32 << 20
	}
	if o.FS == nil {
		o.FS = atomicfile.OS
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// extent locates one record line holding rows of a key.
type extent struct {
	seg uint64
	off int64
	n   int64
}

// keyState is the in-memory index entry of a key. It holds no token data.
type keyState struct {
	extents    []extent
	rows       int
	lastSeq    int64
	lastCallID string
	failures   []Failure
	// present is set once the key holds a ledger (rows, failures or an
	// import, even an empty one).
	present bool
	retired bool
	// liveBytes is the size of the records the key's state needs.
	liveBytes int64
}

// Ledger is an open capture directory. It is safe for concurrent use.
type Ledger struct {
	dir  string
	opts Options
	lock *dirLock

	mu sync.Mutex
	// fence, when set, runs every append's write (SetFence).
	fence func(write func() error) error
	keys  map[string]*keyState
	// byRollout indexes keys (with a ledger or a fence) by rollout id, so
	// the attempts of one rollout are found without a scan of every key.
	// A rollout has a key or two (an attempt, the fence of the one
	// before), so each is a short list, not a set: a map per rollout is an
	// allocation of its own for every rollout a restore installs.
	byRollout  map[string][]string
	segs       map[uint64]*os.File
	active     *os.File
	activeID   uint64
	activeSize int64
	// closing refuses writes once Close starts; closed also refuses reads.
	closing, closed bool
	// err is sticky: after a failed fsync or an unrecoverable write the
	// ledger refuses writes, since acknowledged data may not be durable.
	err error
	// written counts records written; the syncer fsyncs up to it.
	written uint64

	syncer syncer
}

// Open opens (creating if needed) the ledger in dir, replaying its log.
func Open(dir string, opts Options) (*Ledger, error) {
	opts.withDefaults()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("tokencapture: create %s: %w", dir, err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	l := &Ledger{dir: dir, opts: opts, lock: lock}
	if err := l.load(); err != nil {
		l.closeFiles()
		lock.release()
		return nil, err
	}
	l.syncer.start(l)
	return l, nil
}

// load replays the log, compacts it if worthwhile, and opens a new active
// segment.
func (l *Ledger) load() error {
	st, err := replayDir(l.dir)
	if err != nil {
		return err
	}
	if l.opts.CompactMinBytes > 0 && st.totalBytes >= l.opts.CompactMinBytes && st.totalBytes-st.liveBytes() > st.liveBytes() {
		// Compaction only saves space: if it fails part way, the log as it
		// now stands (old segments, maybe a snapshot after them) replays to
		// the same state, so the ledger opens anyway.
		_ = compact(l.dir, l.opts.FS, st)
		st.closeFiles()
		if st, err = replayDir(l.dir); err != nil {
			return err
		}
	}
	l.keys, l.segs = st.keys, st.files
	l.byRollout = make(map[string][]string, len(l.keys))
	for k := range l.keys {
		l.index(k)
	}
	id := st.maxSeg + 1
	f, err := os.OpenFile(segmentPath(l.dir, id), os.O_RDWR|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("tokencapture: create segment: %w", err)
	}
	// The new file's name must survive a crash before any row in it counts.
	if err := l.opts.FS.SyncDir(l.dir); err != nil {
		f.Close()
		return fmt.Errorf("tokencapture: fsync %s: %w", l.dir, err)
	}
	l.segs[id] = f
	l.active, l.activeID, l.activeSize = f, id, 0
	return nil
}

// ValidKey reports whether key may name a ledger: the rollout id pattern.
func ValidKey(key string) bool { return rollout.ValidCaptureKey(key) }

func checkKey(key string) error {
	if !ValidKey(key) {
		return fmt.Errorf("%w: %q is not a capture key (a rollout id matching ^[A-Za-z0-9][A-Za-z0-9._-]*$ in at most %d bytes, then -a<N> for attempt N>0)", ErrInvalidKey, key, rollout.MaxIDLength)
	}
	return nil
}

// Append records one call under key and returns the row as stored: seq is
// assigned, capture_key and created_at filled when empty, and parent_call_id
// set to the key's last call unless the row names one. The record is in the
// kernel when Append returns.
func (l *Ledger) Append(key string, row Row) (Row, error) {
	if err := checkKey(key); err != nil {
		return Row{}, err
	}
	if row.CallID == "" {
		return Row{}, errors.New("tokencapture: a row needs a call_id")
	}
	if row.CaptureKey == "" {
		row.CaptureKey = key
	}
	if row.CreatedAt == 0 {
		row.CreatedAt = unixSeconds(l.opts.Now())
	}
	// The bulky part (token arrays) is encoded outside the lock; only the
	// parent and seq, which depend on the key's last row, are spliced in
	// under it.
	tail, err := codec.Marshal(rowTail{
		CallID: row.CallID, CaptureKey: row.CaptureKey, CreatedAt: row.CreatedAt, Model: row.Model,
		RequestDigest: row.RequestDigest, PromptTokenIDs: orEmpty(row.PromptTokenIDs),
		GenerationTokenIDs: orEmpty(row.GenerationTokenIDs), GenerationLogProbs: orEmptyF(row.GenerationLogProbs),
		FinishReason: row.FinishReason, ContinuedFrom: row.ContinuedFrom,
	})
	if err != nil {
		return Row{}, fmt.Errorf("tokencapture: encode row: %w", err)
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.usable(); err != nil {
		return Row{}, err
	}
	ks := l.keys[key]
	if ks != nil && ks.retired {
		return Row{}, fmt.Errorf("%w: %s", ErrRetired, key)
	}
	if ks == nil {
		ks = &keyState{}
	}
	if row.ParentCallID == "" {
		row.ParentCallID = ks.lastCallID
	}
	row.Seq = ks.lastSeq + 1
	parent, _ := codec.MarshalStable(row.ParentCallID)
	line := make([]byte, 0, len(tail)+len(key)+len(parent)+64)
	line = append(line, `{"op":"append","key":"`...)
	line = append(line, key...)
	line = append(line, `","row":{"parent_call_id":`...)
	line = append(line, parent...)
	line = append(line, `,"seq":`...)
	line = strconv.AppendInt(line, row.Seq, 10)
	line = append(line, ',')
	line = append(line, tail[1:]...) // tail is an object: drop its '{'
	line = append(line, '}', '\n')
	ext, err := l.fencedWrite(line)
	if err != nil {
		return Row{}, err
	}
	faultpoint.Hit(faultpoint.LedgerAppendWritten)
	ks.extents = append(ks.extents, ext)
	ks.rows++
	ks.lastSeq = row.Seq
	ks.lastCallID = row.CallID
	ks.present = true
	ks.liveBytes += ext.n
	l.keys[key] = ks
	l.index(key)
	return row, nil
}

// rowTail is Row without parent_call_id and seq, which Append splices in.
type rowTail struct {
	CallID             string       `json:"call_id"`
	CaptureKey         string       `json:"capture_key"`
	CreatedAt          float64      `json:"created_at"`
	Model              string       `json:"model"`
	RequestDigest      string       `json:"request_digest"`
	PromptTokenIDs     codec.Ints   `json:"prompt_token_ids"`
	GenerationTokenIDs codec.Ints   `json:"generation_token_ids"`
	GenerationLogProbs codec.Floats `json:"generation_log_probs"`
	FinishReason       string       `json:"finish_reason"`
	ContinuedFrom      string       `json:"continued_from,omitempty"`
}

func orEmpty(s []int) []int {
	if s == nil {
		return []int{}
	}
	return s
}

func orEmptyF(s []float64) []float64 {
	if s == nil {
		return []float64{}
	}
	return s
}

func unixSeconds(t time.Time) float64 {
	return math.Round(float64(t.UnixNano())/1e3) / 1e6
}

// SetFence makes every Append and Fail write its record through fence,
// under the ledger's lock: the model server's epoch guard, which writes
// only while the process's epoch is still the fleet's and holds a restore's
// raise of the epoch off until the record is written, so a process a
// restore superseded appends nothing, even one paused between its check
// and its write. fence's error fails the call with nothing written.
func (l *Ledger) SetFence(fence func(write func() error) error) {
	l.mu.Lock()
	l.fence = fence
	l.mu.Unlock()
}

// fencedWrite writes one record through the fence; l.mu is held.
func (l *Ledger) fencedWrite(line []byte) (extent, error) {
	if l.fence == nil {
		return l.write(line)
	}
	var ext extent
	err := l.fence(func() error {
		var err error
		ext, err = l.write(line)
		return err
	})
	return ext, err
}

// Fail records that a call of key was answered without a usable row.
func (l *Ledger) Fail(key string, f Failure) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if len(f.Reason) > MaxFailureReason {
		f.Reason = f.Reason[:MaxFailureReason]
	}
	if f.CreatedAt == 0 {
		f.CreatedAt = unixSeconds(l.opts.Now())
	}
	line, err := encodeRecord(record{Op: opFail, Key: key, Failure: &f})
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.usable(); err != nil {
		return err
	}
	ks := l.keys[key]
	if ks != nil && ks.retired {
		return fmt.Errorf("%w: %s", ErrRetired, key)
	}
	if ks == nil {
		ks = &keyState{}
	}
	ext, err := l.fencedWrite(line)
	if err != nil {
		return err
	}
	ks.failures = append(ks.failures, f)
	ks.present = true
	ks.liveBytes += ext.n
	l.keys[key] = ks
	l.index(key)
	return nil
}

// Rows returns key's rows in order: empty for a key with no ledger,
// ErrRetired for a retired key.
func (l *Ledger) Rows(key string) ([]Row, error) {
	exts, files, err := l.locate(key)
	if err != nil || len(exts) == 0 {
		return nil, err
	}
	var rows []Row
	for i, e := range exts {
		rec, err := readRecord(files[i], e)
		if err != nil {
			return nil, fmt.Errorf("tokencapture: read rows of %s: %w", key, err)
		}
		if rec.Row != nil {
			rows = append(rows, *rec.Row)
		} else {
			rows = append(rows, rec.Rows...)
		}
	}
	return rows, nil
}

// rowsBatch is how many keys ReadRows locates under one lock and reads in
// one pass; it bounds the rows held in memory at once.
const rowsBatch = 4096

// maxReadRun bounds one read of adjacent records (and the buffer it needs).
const maxReadRun = 256 << 10

// ReadRows calls fn once for each key in keys with what Rows(keys[i])
// returns: the key's rows, none for a key without a ledger, or ErrRetired.
// It reads far faster than one Rows call per key (a checkpoint exports
// 100,000 keys): keys without records come first, in the order given, then
// the others in the order of their first records in the log, so that
// records written one after another are read in one call; keys are
// located in batches under one lock, and each batch's records are read in
// file order, adjacent ones in one read. ReadRows stops at the first error
// fn returns, and returns it.
func (l *Ledger) ReadRows(keys []string, fn func(i int, rows []Row, err error) error) error {
	return readRows(l, keys, decodeRows, fn, nil)
}

// ReadRawRows is ReadRows with every row as its JSON encoding, the bytes
// codec.Marshal writes for the Row, rather than decoded: a caller that
// copies rows into JSON of its own (a checkpoint export) saves decoding
// and encoding them again. The rows' bytes are valid only until fn
// returns: they live in a buffer the next batch of keys reuses.
func (l *Ledger) ReadRawRows(keys []string, fn func(i int, rows []codec.RawMessage, err error) error) error {
	var r rawRowReader
	return readRows(l, keys, r.rows, fn, r.reset)
}

// readRows reads keys batch by batch in log order (logOrder); endBatch (if
// set) is called once fn has been called for every key of a batch.
func readRows[T any](l *Ledger, keys []string, decode func(line []byte, e extent) ([]T, error), fn func(i int, rows []T, err error) error, endBatch func()) error {
	order, err := l.logOrder(keys)
	if err != nil {
		return err
	}
	var buf []byte
	batch := make([]string, 0, min(rowsBatch, len(keys)))
	for start := 0; start < len(order); start += rowsBatch {
		at := order[start:min(start+rowsBatch, len(order))]
		batch = batch[:0]
		for _, i := range at {
			batch = append(batch, keys[i])
		}
		rows, errs, err := readBatch(l, batch, &buf, decode)
		if err != nil {
			return err
		}
		for j, i := range at {
			if err := fn(int(i), rows[j], errs[j]); err != nil {
				return err
			}
		}
		if endBatch != nil {
			endBatch()
		}
	}
	return nil
}

// logOrder returns the positions of keys in the order ReadRows reads
// them: keys without records first, as given, then the others by where
// their first record lies in the log. A checkpoint lists its keys sorted,
// and each key's rows were written as its calls finished, so in that
// order a batch's records lay scattered over the log, a read or so per
// key; in log order consecutive keys' records are adjacent and a read
// takes hundreds of them. The order depends only on the log, which is
// appended to and compacted only when opened, so the same state is always
// read in the same order.
func (l *Ledger) logOrder(keys []string) ([]int32, error) {
	type placed struct {
		seg uint64
		off int64
		i   int32
	}
	order := make([]int32, 0, len(keys))
	found := make([]placed, 0, len(keys))
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	for i, key := range keys {
		ks := l.keys[key]
		if ks == nil || ks.retired || len(ks.extents) == 0 {
			order = append(order, int32(i))
			continue
		}
		first := ks.extents[0]
		found = append(found, placed{seg: first.seg, off: first.off, i: int32(i)})
	}
	l.mu.Unlock()
	slices.SortFunc(found, func(a, b placed) int {
		return cmp.Or(cmp.Compare(a.seg, b.seg), cmp.Compare(a.off, b.off), cmp.Compare(a.i, b.i))
	})
	for _, p := range found {
		order = append(order, p.i)
	}
	return order, nil
}

// located is one record of a key ReadRows reads: the key's position in its
// batch and the record's among the key's.
type located struct {
	key, nth int
	f        *os.File
	ext      extent
}

// readBatch reads the rows of keys, each record's through decode (which
// must not keep the line it is given), into *buf; errs holds each key's
// ErrRetired.
func readBatch[T any](l *Ledger, keys []string, buf *[]byte, decode func(line []byte, e extent) ([]T, error)) (rows [][]T, errs []error, err error) {
	rows, errs = make([][]T, len(keys)), make([]error, len(keys))
	// parts holds each key's records' rows in the key's order.
	parts := make([][][]T, len(keys))
	var locs []located
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, nil, ErrClosed
	}
	for i, key := range keys {
		ks := l.keys[key]
		switch {
		case ks == nil:
		case ks.retired:
			errs[i] = fmt.Errorf("%w: %s", ErrRetired, key)
		default:
			parts[i] = make([][]T, len(ks.extents))
			for n, e := range ks.extents {
				locs = append(locs, located{key: i, nth: n, f: l.segs[e.seg], ext: e})
			}
		}
	}
	l.mu.Unlock()
	slices.SortFunc(locs, func(a, b located) int {
		return cmp.Or(cmp.Compare(a.ext.seg, b.ext.seg), cmp.Compare(a.ext.off, b.ext.off))
	})
	for len(locs) > 0 {
		// A run of records that follow each other in one segment is read
		// at once.
		run := 1
		size := locs[0].ext.n
		for run < len(locs) && locs[run].ext.seg == locs[0].ext.seg &&
			locs[run].ext.off == locs[run-1].ext.off+locs[run-1].ext.n && size+locs[run].ext.n <= maxReadRun {
			size += locs[run].ext.n
			run++
		}
		if locs[0].f == nil {
			return nil, nil, fmt.Errorf("tokencapture: read rows of %s: segment not open", keys[locs[0].key])
		}
		*buf = slices.Grow((*buf)[:0], int(size))[:size]
		if _, err := locs[0].f.ReadAt(*buf, locs[0].ext.off); err != nil {
			return nil, nil, fmt.Errorf("tokencapture: read rows of %s: %w", keys[locs[0].key], err)
		}
		at := int64(0)
		for _, loc := range locs[:run] {
			r, err := decode((*buf)[at:at+loc.ext.n], loc.ext)
			if err != nil {
				return nil, nil, fmt.Errorf("tokencapture: read rows of %s: %w", keys[loc.key], err)
			}
			parts[loc.key][loc.nth] = r
			at += loc.ext.n
		}
		locs = locs[run:]
	}
	for i, p := range parts {
		if len(p) == 1 {
			rows[i] = p[0]
			continue
		}
		for _, r := range p {
			rows[i] = append(rows[i], r...)
		}
	}
	return rows, errs, nil
}

// decodeRows decodes the rows of a record line.
func decodeRows(line []byte, e extent) ([]Row, error) {
	rec, err := decodeFullRecord(line, e)
	if err != nil {
		return nil, err
	}
	if rec.Row != nil {
		return []Row{*rec.Row}, nil
	}
	return rec.Rows, nil
}

// Failures returns key's recorded capture failures; ErrRetired for a
// retired key.
func (l *Ledger) Failures(key string) ([]Failure, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, ErrClosed
	}
	ks := l.keys[key]
	if ks == nil {
		return nil, nil
	}
	if ks.retired {
		return nil, fmt.Errorf("%w: %s", ErrRetired, key)
	}
	return slices.Clone(ks.failures), nil
}

// Last returns key's last row, if it has one.
func (l *Ledger) Last(key string) (Row, bool) {
	exts, files, err := l.locate(key)
	if err != nil || len(exts) == 0 {
		return Row{}, false
	}
	rec, err := readRecord(files[len(files)-1], exts[len(exts)-1])
	if err != nil {
		return Row{}, false
	}
	if rec.Row != nil {
		return *rec.Row, true
	}
	if len(rec.Rows) == 0 {
		return Row{}, false
	}
	return rec.Rows[len(rec.Rows)-1], true
}

// locate copies a key's extents and their files under the lock, so the
// reads happen outside it.
func (l *Ledger) locate(key string) ([]extent, []*os.File, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, nil, ErrClosed
	}
	ks := l.keys[key]
	if ks == nil {
		return nil, nil, nil
	}
	if ks.retired {
		return nil, nil, fmt.Errorf("%w: %s", ErrRetired, key)
	}
	exts := slices.Clone(ks.extents)
	files := make([]*os.File, len(exts))
	for i, e := range exts {
		files[i] = l.segs[e.seg]
	}
	return exts, files, nil
}

// Retire removes each key's ledger and fences the key: later appends fail
// with ErrRetired until Import or Delete. removed names keys that held a
// ledger, absent the others. Every key is validated before anything
// changes.
func (l *Ledger) Retire(keys []string) (removed, absent []string, err error) {
	return l.remove(opRetire, keys)
}

// Delete removes each key's ledger and its fence. removed names keys that
// held a ledger or a fence, absent the others.
func (l *Ledger) Delete(keys []string) (removed, absent []string, err error) {
	return l.remove(opDelete, keys)
}

func (l *Ledger) remove(op string, keys []string) (removed, absent []string, err error) {
	keys = dedupe(keys)
	for _, k := range keys {
		if err := checkKey(k); err != nil {
			return nil, nil, err
		}
	}
	removed, absent = []string{}, []string{}
	if len(keys) == 0 {
		return removed, absent, nil
	}
	line, err := encodeRecord(record{Op: op, Keys: keys})
	if err != nil {
		return nil, nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.usable(); err != nil {
		return nil, nil, err
	}
	if _, err := l.write(line); err != nil {
		return nil, nil, err
	}
	faultpoint.Hit(faultpoint.LedgerRemoveWritten)
	for _, k := range keys {
		ks := l.keys[k]
		had := ks != nil && ks.present
		if op == opDelete {
			had = had || (ks != nil && ks.retired)
		}
		if had {
			removed = append(removed, k)
		} else {
			absent = append(absent, k)
		}
		if op == opRetire {
			l.keys[k] = &keyState{retired: true}
			l.index(k)
		} else {
			delete(l.keys, k)
			l.unindex(k)
		}
	}
	return removed, absent, nil
}

func dedupe(keys []string) []string {
	seen := make(map[string]struct{}, len(keys))
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		if _, ok := seen[k]; !ok {
			seen[k] = struct{}{}
			out = append(out, k)
		}
	}
	return out
}

// Keys lists, sorted, the keys that hold a ledger (retired keys do not).
func (l *Ledger) Keys() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.keys))
	for k, ks := range l.keys {
		if ks.present && !ks.retired {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// Stats is the size of a ledger's live content.
type Stats struct {
	// Keys hold a ledger (retired keys do not).
	Keys int
	// Rows are their rows.
	Rows int
	// Bytes are the record bytes their state needs on disk: what a
	// compaction would keep.
	Bytes int64
}

// Stats walks the index (no file is read). A scrape calls it every few
// seconds; it holds the lock for one pass over the keys, which costs less
// than keeping running totals right in every path that changes a key.
func (l *Ledger) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	var st Stats
	for _, ks := range l.keys {
		if ks.present && !ks.retired {
			st.Keys++
			st.Rows += ks.rows
			st.Bytes += ks.liveBytes
		}
	}
	return st
}

// RolloutKeys lists, sorted, the keys of one rollout's attempts that hold a
// ledger or a fence (rollout.ParseCaptureKey decides which rollout a key
// names). It reads an index, not every key.
func (l *Ledger) RolloutKeys(rolloutID string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.byRollout[rolloutID])
	slices.Sort(out)
	return out
}

// rolloutOf is the rollout a key's index entry is filed under.
func rolloutOf(key string) string {
	if id, err := rollout.ParseCaptureKey(key); err == nil {
		return id.RolloutID
	}
	return key
}

// index files key under its rollout. l.mu is held.
func (l *Ledger) index(key string) {
	r := rolloutOf(key)
	keys := l.byRollout[r]
	if !slices.Contains(keys, key) {
		l.byRollout[r] = append(keys, key)
	}
}

// unindex removes key from the index. l.mu is held.
func (l *Ledger) unindex(key string) {
	r := rolloutOf(key)
	if keys := slices.DeleteFunc(l.byRollout[r], func(k string) bool { return k == key }); len(keys) > 0 {
		l.byRollout[r] = keys
	} else {
		delete(l.byRollout, r)
	}
}

// Retired reports whether key is fenced.
func (l *Ledger) Retired(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	ks := l.keys[key]
	return ks != nil && ks.retired
}

// Sync makes everything written so far durable now.
func (l *Ledger) Sync() error {
	return l.syncer.syncNow(l)
}

// Close stops the group-commit loop, fsyncs, and closes the files. It is
// safe to call more than once.
func (l *Ledger) Close() error {
	l.mu.Lock()
	if l.closing {
		l.mu.Unlock()
		return nil
	}
	l.closing = true
	l.mu.Unlock()
	l.syncer.stop()
	err := l.syncer.syncNow(l)
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	if cerr := l.closeFiles(); err == nil {
		err = cerr
	}
	l.lock.release()
	return err
}

func (l *Ledger) closeFiles() error {
	var first error
	for _, f := range l.segs {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (l *Ledger) usable() error {
	if l.closing {
		return ErrClosed
	}
	return l.err
}

// write appends one record line to the active segment with one write(2),
// rotating first when the segment is full. l.mu is held.
func (l *Ledger) write(line []byte) (extent, error) {
	if l.activeSize > 0 && l.activeSize+int64(len(line)) > l.opts.SegmentBytes {
		if err := l.rotate(); err != nil {
			return extent{}, err
		}
	}
	n, err := l.active.Write(line)
	if err != nil {
		// Never leave a partial line for later records to follow: a torn
		// line is only tolerated at a segment's end.
		if n > 0 {
			if terr := l.active.Truncate(l.activeSize); terr != nil {
				l.err = fmt.Errorf("tokencapture: write failed (%v) and the partial record could not be removed: %w", err, terr)
			}
		}
		return extent{}, fmt.Errorf("tokencapture: write segment: %w", err)
	}
	ext := extent{seg: l.activeID, off: l.activeSize, n: int64(len(line))}
	l.activeSize += int64(len(line))
	l.written++
	l.syncer.kick()
	return ext, nil
}

// writeMany appends record lines 0 to lines-1 to the active segment as
// write does, a batch of whole lines per write(2), rotating between lines
// when the segment is full. next appends line i to dst: the lines are
// encoded into the batch being filled, one buffer for them all, rather than
// each into memory of its own (a restore writes 100,000 lines, 100 MB). It
// returns the extents of the lines written, which are all of them unless it
// fails. l.mu is held.
func (l *Ledger) writeMany(lines int, next func(dst []byte, i int) ([]byte, error)) ([]extent, error) {
	exts := make([]extent, 0, lines)
	// The line that overflows a batch is encoded into it before it is
	// moved to the next: room for it saves growing the buffer.
	batch := make([]byte, 0, maxWriteBatch+64<<10)
	batchStart := 0 // index of batch's first line
	// flush writes the first size bytes of batch, whole lines, and keeps
	// the rest (the line being added) for the next batch.
	flush := func(size int) error {
		if size == 0 {
			return nil
		}
		n, err := l.active.Write(batch[:size])
		if err != nil {
			// As in write: never leave a partial record for later ones to
			// follow. The whole batch is dropped.
			if n > 0 {
				if terr := l.active.Truncate(l.activeSize); terr != nil {
					l.err = fmt.Errorf("tokencapture: write failed (%v) and the partial record could not be removed: %w", err, terr)
				}
			}
			exts = exts[:batchStart]
			return fmt.Errorf("tokencapture: write segment: %w", err)
		}
		l.activeSize += int64(n)
		l.written += uint64(len(exts) - batchStart)
		l.syncer.kick()
		batch, batchStart = batch[:copy(batch, batch[size:])], len(exts)
		return nil
	}
	for i := range lines {
		pending := len(batch)
		var err error
		if batch, err = next(batch, i); err != nil {
			return exts[:batchStart], err
		}
		size := int64(len(batch) - pending)
		if l.activeSize+int64(pending) > 0 && l.activeSize+int64(pending)+size > l.opts.SegmentBytes {
			if err := flush(pending); err != nil {
				return exts, err
			}
			if err := l.rotate(); err != nil {
				return exts, err
			}
		} else if pending > 0 && int64(pending)+size > maxWriteBatch {
			if err := flush(pending); err != nil {
				return exts, err
			}
		}
		exts = append(exts, extent{seg: l.activeID, off: l.activeSize + int64(len(batch)) - size, n: size})
	}
	return exts, flush(len(batch))
}

// rotate seals the active segment (fsync) and starts the next. l.mu is held.
func (l *Ledger) rotate() error {
	if err := l.active.Sync(); err != nil {
		l.err = fmt.Errorf("tokencapture: fsync sealed segment: %w", err)
		return l.err
	}
	id := l.activeID + 1
	f, err := os.OpenFile(segmentPath(l.dir, id), os.O_RDWR|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("tokencapture: create segment: %w", err)
	}
	if err := l.opts.FS.SyncDir(l.dir); err != nil {
		f.Close()
		_ = os.Remove(f.Name())
		return fmt.Errorf("tokencapture: fsync %s: %w", l.dir, err)
	}
	l.segs[id] = f
	l.active, l.activeID, l.activeSize = f, id, 0
	return nil
}
