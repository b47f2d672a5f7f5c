package tokencapture

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/infra/faultpoint"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// ImportRow is a Row as a restore imports it: its token arrays stay the
// JSON they were read as (validated as strictly as Row's are, see
// codec.IntsJSON) and are copied into the ledger's import record as they
// are. A restore installs 100,000 ledgers whose rows the ledger keeps on
// disk, not in memory: decoding their arrays into slices only to encode
// them again was most of its CPU and its garbage.
type ImportRow struct {
	CallID             string           `json:"call_id"`
	ParentCallID       string           `json:"parent_call_id"`
	CaptureKey         string           `json:"capture_key"`
	Seq                int64            `json:"seq"`
	CreatedAt          float64          `json:"created_at"`
	Model              string           `json:"model"`
	RequestDigest      string           `json:"request_digest"`
	PromptTokenIDs     codec.IntsJSON   `json:"prompt_token_ids"`
	GenerationTokenIDs codec.IntsJSON   `json:"generation_token_ids"`
	GenerationLogProbs codec.FloatsJSON `json:"generation_log_probs"`
	FinishReason       string           `json:"finish_reason"`
	ContinuedFrom      string           `json:"continued_from,omitempty"`
}

// ImportRowOf is row as an ImportRow; a log-prob that is NaN or infinite is
// an error.
func ImportRowOf(row Row) (ImportRow, error) {
	logProbs, err := codec.FloatsJSONOf(row.GenerationLogProbs)
	if err != nil {
		return ImportRow{}, fmt.Errorf("tokencapture: row %s: generation_log_probs: %w", row.CallID, err)
	}
	return ImportRow{
		CallID: row.CallID, ParentCallID: row.ParentCallID, CaptureKey: row.CaptureKey, Seq: row.Seq,
		CreatedAt: row.CreatedAt, Model: row.Model, RequestDigest: row.RequestDigest,
		PromptTokenIDs: codec.IntsJSONOf(row.PromptTokenIDs), GenerationTokenIDs: codec.IntsJSONOf(row.GenerationTokenIDs),
		GenerationLogProbs: logProbs, FinishReason: row.FinishReason, ContinuedFrom: row.ContinuedFrom,
	}, nil
}

// Row decodes r's token arrays.
func (r ImportRow) Row() (Row, error) {
	prompt, err := r.PromptTokenIDs.Ints()
	if err != nil {
		return Row{}, fmt.Errorf("prompt_token_ids: %w", err)
	}
	generated, err := r.GenerationTokenIDs.Ints()
	if err != nil {
		return Row{}, fmt.Errorf("generation_token_ids: %w", err)
	}
	logProbs, err := r.GenerationLogProbs.Floats()
	if err != nil {
		return Row{}, fmt.Errorf("generation_log_probs: %w", err)
	}
	return Row{
		CallID: r.CallID, ParentCallID: r.ParentCallID, CaptureKey: r.CaptureKey, Seq: r.Seq,
		CreatedAt: r.CreatedAt, Model: r.Model, RequestDigest: r.RequestDigest,
		PromptTokenIDs: prompt, GenerationTokenIDs: generated, GenerationLogProbs: logProbs,
		FinishReason: r.FinishReason, ContinuedFrom: r.ContinuedFrom,
	}, nil
}

// Import is one ledger ImportMany installs.
type Import struct {
	Key  string
	Rows []ImportRow
}

// Import replaces whatever key held with rows and clears its fence (a
// restore installs an attempt's ledger this way). Rows keep their seq and
// capture_key; an empty capture_key becomes key.
func (l *Ledger) Import(key string, rows []Row) error {
	if err := checkKey(key); err != nil {
		return err
	}
	im := Import{Key: key, Rows: make([]ImportRow, len(rows))}
	for i, r := range rows {
		var err error
		if im.Rows[i], err = ImportRowOf(r); err != nil {
			return err
		}
	}
	lastSeq, err := checkImport(im)
	if err != nil {
		return err
	}
	line, err := appendImportRecord(nil, im)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.usable(); err != nil {
		return err
	}
	ext, err := l.write(line)
	if err != nil {
		return err
	}
	l.installImported(im, lastSeq, ext)
	return nil
}

// maxWriteBatch bounds the bytes ImportMany hands to one write(2).
const maxWriteBatch = 1 << 20

// ImportMany does what Import does for each import, in order, with the
// records written in a few large writes rather than one write per key (a
// restore imports 100,000 ledgers). Every key and row is checked before
// anything is written. Each import is its own record, as with Import: a
// crash part way leaves a prefix of them. The records are encoded into the
// write batches, under the lock: copying the rows is cheap next to the
// writes, and the lines need no memory of their own. Of imports, only each
// key's last call id is kept once ImportMany returns (rows may point into a
// buffer of the caller's).
func (l *Ledger) ImportMany(imports []Import) error {
	lastSeqs := make([]int64, len(imports))
	for i, im := range imports {
		var err error
		if lastSeqs[i], err = checkImport(im); err != nil {
			return err
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.usable(); err != nil {
		return err
	}
	exts, err := l.writeMany(len(imports), func(dst []byte, i int) ([]byte, error) {
		return appendImportRecord(dst, imports[i])
	})
	if len(exts) > 0 {
		faultpoint.Hit(faultpoint.LedgerImportWritten)
	}
	for i, ext := range exts {
		l.installImported(imports[i], lastSeqs[i], ext)
	}
	return err
}

// installImported indexes the import written at ext. l.mu is held.
func (l *Ledger) installImported(im Import, lastSeq int64, ext extent) {
	ks := &keyState{present: true, rows: len(im.Rows), lastSeq: lastSeq, liveBytes: ext.n}
	if len(im.Rows) > 0 {
		ks.extents = []extent{ext}
		ks.lastCallID = im.Rows[len(im.Rows)-1].CallID
	}
	l.keys[im.Key] = ks
	l.index(im.Key)
}

// checkImport checks what an import needs, so that encoding its record
// cannot fail: a valid key, and rows with a call id and a finite
// created_at. It returns the highest seq of the rows.
func checkImport(im Import) (lastSeq int64, err error) {
	if err := checkKey(im.Key); err != nil {
		return 0, err
	}
	for i := range im.Rows {
		r := &im.Rows[i]
		if r.CallID == "" {
			return 0, fmt.Errorf("tokencapture: import %s: row %d has no call_id", im.Key, i)
		}
		if math.IsNaN(r.CreatedAt) || math.IsInf(r.CreatedAt, 0) {
			return 0, fmt.Errorf("tokencapture: encode import record: row %d: created_at %v is not a JSON number", i, r.CreatedAt)
		}
		lastSeq = max(lastSeq, r.Seq)
	}
	return lastSeq, nil
}

// appendImportRecord appends the record line of im, which checkImport
// accepted: the bytes encodeRecord writes for record{Op: opImport, Key:
// im.Key, Rows: rows} where rows are im.Rows decoded, with an empty
// capture_key filled in and null arrays as [] (the log format predates
// ImportRow; the fuzz test holds the two to the same bytes).
func appendImportRecord(dst []byte, im Import) ([]byte, error) {
	dst = append(dst, `{"op":"import","key":`...)
	dst = codec.AppendString(dst, im.Key)
	if len(im.Rows) > 0 {
		dst = append(dst, `,"rows":[`...)
		for i := range im.Rows {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = appendImportRow(dst, im.Key, &im.Rows[i]); err != nil {
				return dst, fmt.Errorf("tokencapture: encode import record: %w", err)
			}
		}
		dst = append(dst, ']')
	}
	return append(dst, '}', '\n'), nil
}

// appendImportRow appends r as codec.Marshal writes the Row it decodes to,
// imported under key.
func appendImportRow(dst []byte, key string, r *ImportRow) ([]byte, error) {
	captureKey := r.CaptureKey
	if captureKey == "" {
		captureKey = key
	}
	dst = append(dst, `{"call_id":`...)
	dst = codec.AppendString(dst, r.CallID)
	dst = append(dst, `,"parent_call_id":`...)
	dst = codec.AppendString(dst, r.ParentCallID)
	dst = append(dst, `,"capture_key":`...)
	dst = codec.AppendString(dst, captureKey)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendInt(dst, r.Seq, 10)
	dst = append(dst, `,"created_at":`...)
	dst, err := codec.AppendFloat(dst, r.CreatedAt)
	if err != nil {
		return dst, err
	}
	dst = append(dst, `,"model":`...)
	dst = codec.AppendString(dst, r.Model)
	dst = append(dst, `,"request_digest":`...)
	dst = codec.AppendString(dst, r.RequestDigest)
	dst = append(dst, `,"prompt_token_ids":`...)
	dst = codec.AppendIntsJSON(dst, r.PromptTokenIDs)
	dst = append(dst, `,"generation_token_ids":`...)
	dst = codec.AppendIntsJSON(dst, r.GenerationTokenIDs)
	dst = append(dst, `,"generation_log_probs":`...)
	dst = codec.AppendFloatsJSON(dst, r.GenerationLogProbs)
	dst = append(dst, `,"finish_reason":`...)
	dst = codec.AppendString(dst, r.FinishReason)
	if r.ContinuedFrom != "" {
		dst = append(dst, `,"continued_from":`...)
		dst = codec.AppendString(dst, r.ContinuedFrom)
	}
	return append(dst, '}'), nil
}

// CutImportRow reads the row at the front of b when it is laid out as the
// ledger writes rows (the bytes codec.Marshal writes for a Row, which
// ReadRawRows returns and a checkpoint record holds): every field in
// order, no whitespace, plain strings (see codec.CutString). It returns the
// row and the rest of b. The row's token arrays refer to b's bytes (see
// codec.CutIntsJSON): it is good only as long as they are. ok false means
// only that the row is laid out otherwise, valid or not: decode it with
// codec.UnmarshalStrictFast then, which reads every form and words every error.
// A restore reads every row of a checkpoint this way, several times faster,
// and copies the arrays once, into the ledger's write batch.
func CutImportRow(b []byte) (row ImportRow, rest []byte, ok bool) {
	c := rowCutter{rest: b, ok: true}
	c.literal(`{"call_id":`)
	callID := c.string()
	c.literal(`,"parent_call_id":`)
	parent := c.string()
	c.literal(`,"capture_key":`)
	captureKey := c.string()
	c.literal(`,"seq":`)
	if c.ok {
		row.Seq, c.rest, c.ok = codec.CutInt64(c.rest)
	}
	c.literal(`,"created_at":`)
	if c.ok {
		row.CreatedAt, c.rest, c.ok = codec.CutFloat64(c.rest)
	}
	c.literal(`,"model":`)
	model := c.string()
	c.literal(`,"request_digest":`)
	digest := c.string()
	c.literal(`,"prompt_token_ids":`)
	if c.ok {
		row.PromptTokenIDs, c.rest, c.ok = codec.CutIntsJSON(c.rest)
	}
	c.literal(`,"generation_token_ids":`)
	if c.ok {
		row.GenerationTokenIDs, c.rest, c.ok = codec.CutIntsJSON(c.rest)
	}
	c.literal(`,"generation_log_probs":`)
	if c.ok {
		row.GenerationLogProbs, c.rest, c.ok = codec.CutFloatsJSON(c.rest)
	}
	c.literal(`,"finish_reason":`)
	finish := c.string()
	var continued []byte
	if c.ok && len(c.rest) > 0 && c.rest[0] == ',' {
		c.literal(`,"continued_from":`)
		continued = c.string()
	}
	c.literal(`}`)
	if !c.ok {
		return ImportRow{}, b, false
	}
	// The row's strings but its call id share one allocation: only the
	// call id outlives a restore (the ledger keeps each key's last).
	row.CallID = string(callID)
	all := joinBytes(parent, captureKey, model, digest, finish, continued)
	next := func(n int) string {
		s := all[:n]
		all = all[n:]
		return s
	}
	row.ParentCallID, row.CaptureKey, row.Model = next(len(parent)), next(len(captureKey)), next(len(model))
	row.RequestDigest, row.FinishReason, row.ContinuedFrom = next(len(digest)), next(len(finish)), next(len(continued))
	return row, c.rest, true
}

// rowCutter reads a row's fields off rest until one is not as expected.
type rowCutter struct {
	rest []byte
	ok   bool
}

func (c *rowCutter) literal(s string) {
	c.ok = c.ok && len(c.rest) >= len(s) && string(c.rest[:len(s)]) == s
	if c.ok {
		c.rest = c.rest[len(s):]
	}
}

// string reads a string and returns its bytes (see codec.CutString).
func (c *rowCutter) string() []byte {
	if !c.ok {
		return nil
	}
	var raw []byte
	raw, c.rest, c.ok = codec.CutString(c.rest)
	return raw
}

// joinBytes is the parts back to back, as one string.
func joinBytes(parts ...[]byte) string {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	var all strings.Builder
	all.Grow(n)
	for _, p := range parts {
		all.Write(p)
	}
	return all.String()
}
