// Package ckptstore is the checkpoint directory (SPEC §5):
//
//	<checkpoint_dir>/gym/<kind>/<instance>/records-<sha256>.jsonl  one flat JSON line per record (line.go)
//	<checkpoint_dir>/gym/<kind>/<instance>/manifest.json            written last, create-only
//
// Records are written to a temp name (with direct I/O where the filesystem
// takes it, see direct.go), hashed while written, fsynced and renamed to
// their digest; then the manifest is written to a temp file,
// fsynced, published with a hard link (never replaces: of two racing writers
// exactly one publishes) and the directory fsynced. A directory with a
// manifest never changes. Reading streams the records once and verifies
// schema, kind, instance, checkpoint id, digest and count over the whole
// file; anything torn, truncated or tampered is refused with
// invalid_checkpoint_state and nothing is returned. A store with a signing
// key also signs every manifest it writes and refuses, on reading, one it
// did not sign (sign.go).
package ckptstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/gymfleet/gymfleet/pkg/infra/faultpoint"
	"github.com/gymfleet/gymfleet/pkg/infra/hugepage"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// SchemaVersion is the manifest schema this code writes and reads.
const SchemaVersion = 1

// ManifestFile is the name of the commit record of a participant directory.
const ManifestFile = "manifest.json"

var recordsName = regexp.MustCompile(`^records(-[0-9a-f]{64})?\.jsonl$`)

// Manifest is manifest.json. Extras holds participant-specific fields, which
// are written at the top level next to the fixed ones.
type Manifest struct {
	SchemaVersion int    `json:"schema_version"`
	Kind          string `json:"kind"`
	Instance      string `json:"instance"`
	CheckpointID  string `json:"checkpoint_id"`
	RecordsFile   string `json:"records_file"`
	RecordsSHA256 string `json:"records_sha256"`
	RecordCount   int    `json:"record_count"`
	// HMAC is the hex signature a store with a signing key writes
	// (HMACField); empty in a manifest written without one.
	HMAC   string         `json:"hmac_sha256,omitempty"`
	Extras map[string]any `json:"-"`
}

var fixedManifestKeys = map[string]bool{
	"schema_version": true, "kind": true, "instance": true, "checkpoint_id": true,
	"records_file": true, "records_sha256": true, "record_count": true,
	HMACField: true,
}

// MarshalJSON writes the fixed fields and the extras in one object with
// sorted keys, so the same manifest always has the same bytes.
func (m Manifest) MarshalJSON() ([]byte, error) {
	all := make(map[string]any, len(m.Extras)+7)
	for k, v := range m.Extras {
		if fixedManifestKeys[k] {
			return nil, fmt.Errorf("manifest extra %q collides with a fixed field", k)
		}
		all[k] = v
	}
	all["schema_version"] = m.SchemaVersion
	all["kind"] = m.Kind
	all["instance"] = m.Instance
	all["checkpoint_id"] = m.CheckpointID
	all["records_file"] = m.RecordsFile
	all["records_sha256"] = m.RecordsSHA256
	all["record_count"] = m.RecordCount
	if m.HMAC != "" {
		all[HMACField] = m.HMAC
	}
	return codec.MarshalIndent(all)
}

// UnmarshalJSON reads the fixed fields, each required and of its exact
// type, and keeps every other field as an extra.
func (m *Manifest) UnmarshalJSON(b []byte) error {
	var all map[string]codec.RawMessage
	if err := codec.UnmarshalStrict(b, &all); err != nil {
		return err
	}
	return m.fromFields(all)
}

// fromFields is UnmarshalJSON of the manifest's fields; HMACField is
// optional.
func (m *Manifest) fromFields(all map[string]codec.RawMessage) error {
	field := func(name string, dst any) error {
		raw, ok := all[name]
		if !ok {
			return fmt.Errorf("manifest lacks %s", name)
		}
		if err := codec.UnmarshalStrict(raw, dst); err != nil {
			return fmt.Errorf("manifest %s: %s", name, codec.DescribeError(err))
		}
		return nil
	}
	var out Manifest
	for _, f := range []struct {
		name string
		dst  any
	}{
		{"schema_version", &out.SchemaVersion}, {"kind", &out.Kind}, {"instance", &out.Instance},
		{"checkpoint_id", &out.CheckpointID}, {"records_file", &out.RecordsFile},
		{"records_sha256", &out.RecordsSHA256}, {"record_count", &out.RecordCount},
	} {
		if err := field(f.name, f.dst); err != nil {
			return err
		}
	}
	if _, ok := all[HMACField]; ok {
		if err := field(HMACField, &out.HMAC); err != nil {
			return err
		}
	}
	for k, raw := range all {
		if fixedManifestKeys[k] {
			continue
		}
		if out.Extras == nil {
			out.Extras = map[string]any{}
		}
		var v any
		if err := codec.UnmarshalStrict(raw, &v); err != nil {
			return fmt.Errorf("manifest extra %q: %w", k, err)
		}
		out.Extras[k] = v
	}
	*m = out
	return nil
}

// Record is one line of a records file (line.go): the episode and the
// record, a JSON object whose members are the line's. Read returns the
// whole object, episode_id member included; of a line written before
// records were flat, the record it wrapped.
type Record struct {
	EpisodeID rollout.EpisodeID
	Data      codec.RawMessage
}

// Errors.
var (
	// ErrStopped reports a write stopped by a resume before it published.
	ErrStopped = errors.New("checkpoint write stopped before it was published")
	// ErrDifferentCommit reports a directory that already holds another commit.
	ErrDifferentCommit = errors.New("checkpoint directory already holds a different commit")
)

// hidden is an error the caller is told as public, while its cause, which
// may quote a file, its digest, or say whether a path exists or could not
// be read, is kept for the server's log (Detail). A control token lets its
// holder name any path: what it learns of files must not depend on them.
type hidden struct {
	public *apierror.Error
	cause  error
}

func (e *hidden) Error() string { return e.public.Error() }

// Unwrap is the public error only: the cause is for the log.
func (e *hidden) Unwrap() error { return e.public }

func hide(public *apierror.Error, cause error) error { return &hidden{public: public, cause: cause} }

// Detail is what err keeps from the caller, for the server's log; "" when
// it keeps nothing.
func Detail(err error) string {
	var h *hidden
	if errors.As(err, &h) && h.cause != nil {
		return h.cause.Error()
	}
	return ""
}

// unreadable is every failure to find or read a participant's manifest:
// missing, unreadable, a symbolic link, not a manifest. They are one answer
// so that a restore cannot probe the filesystem.
func (t Target) unreadable(cause error) error {
	return hide(apierror.New(apierror.InvalidCheckpointState,
		"no readable checkpoint manifest for %s/%s in %s (missing, unreadable, or not a manifest; the server's log says which)",
		t.Kind, t.Instance, t.Dir), cause)
}

// unverified is a failure to verify a manifest that was read, or its
// records: the caller learns which check failed, never what the file holds.
func (t Target) unverified(check string, cause error) error {
	return hide(apierror.New(apierror.InvalidCheckpointState,
		"the checkpoint of %s/%s in %s fails verification: %s (the server's log has the details)",
		t.Kind, t.Instance, t.Dir, check), cause)
}

// notConfined answers a directory outside the root or reached through a
// symbolic link.
func notConfined(t Target, cause error) error {
	return hide(apierror.New(apierror.InvalidRequest,
		"checkpoint_dir %s is not a directory beneath this server's checkpoint root reached without symbolic links", t.Dir), cause)
}

// WriteStop lets a resume stop a write: the writer checks it before every
// record, and publication happens under its lock, so once Stop returns no
// manifest will ever appear.
type WriteStop struct {
	// Guard, when set, runs the manifest's publication (under the lock):
	// the control plane's epoch guard, which publishes only if the
	// writer's epoch is still the fleet's and holds off a raise of the
	// epoch until the manifest is durable. Its error fails the write.
	Guard func(publish func() error) error
	mu    sync.Mutex
	// stopped is set under mu (so a publication in progress finishes
	// first) and read without it before every record.
	stopped atomic.Bool
}

// Stop stops the write; it waits for a publication in progress to finish.
func (s *WriteStop) Stop() {
	s.mu.Lock()
	s.stopped.Store(true)
	s.mu.Unlock()
}

// Stopped reports whether Stop was called.
func (s *WriteStop) Stopped() bool {
	return s != nil && s.stopped.Load()
}

// publish runs fn under the lock unless stopped.
func (s *WriteStop) publish(fn func() error) error {
	if s == nil {
		return fn()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped.Load() {
		return ErrStopped
	}
	if s.Guard != nil {
		return s.Guard(fn)
	}
	return fn()
}

// Store reads and writes participant directories through a Backend.
type Store struct {
	b Backend
	// key signs and verifies manifests (sign.go); nil when unkeyed.
	key []byte
}

// New returns a store over b that neither signs nor verifies manifests.
func New(b Backend) *Store { return &Store{b: b} }

// NewWith returns a store over b with options.
func NewWith(b Backend, o Options) (*Store, error) {
	if o.SigningKey != nil && len(o.SigningKey) < MinSigningKeyBytes {
		return nil, fmt.Errorf("checkpoint signing key of %d bytes: at least %d are required", len(o.SigningKey), MinSigningKeyBytes)
	}
	return &Store{b: b, key: slices.Clone(o.SigningKey)}, nil
}

// Open returns a store confined to root: a directory on the local
// filesystem (OpenLocal), or a bucket and prefix, s3://bucket/prefix
// (OpenS3). Close releases it.
func Open(root string) (*Store, error) {
	return OpenWith(root, Options{})
}

// OpenWith is Open with options.
func OpenWith(root string, o Options) (*Store, error) {
	if IsS3(root) {
		b, err := OpenS3(context.Background(), root, o.S3)
		if err != nil {
			return nil, err
		}
		return NewWith(b, o)
	}
	l, err := OpenLocal(root)
	if err != nil {
		return nil, err
	}
	s, err := NewWith(l, o)
	if err != nil {
		_ = l.Close()
		return nil, err
	}
	return s, nil
}

// Backend is the backend the store writes through.
func (s *Store) Backend() Backend { return s.b }

// Close closes the backend if it holds anything open.
func (s *Store) Close() error {
	if c, ok := s.b.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// Target names one participant's directory of one checkpoint.
type Target struct {
	Dir          string
	Kind         string
	Instance     string
	CheckpointID string
}

// validate checks the path components; an empty checkpoint id is allowed
// only for reads that accept any.
func (t Target) validate(requireID bool) error {
	if t.Dir == "" {
		return apierror.New(apierror.InvalidRequest, "checkpoint_dir is empty")
	}
	// Joining the participant's path would clean a ".." away before the
	// backend could see it.
	if slices.Contains(strings.Split(filepath.ToSlash(t.Dir), "/"), "..") {
		return apierror.New(apierror.InvalidRequest, "checkpoint_dir %q has a \"..\" component", t.Dir)
	}
	for _, c := range []struct{ what, v string }{{"kind", t.Kind}, {"instance", t.Instance}, {"checkpoint id", t.CheckpointID}} {
		if c.v == "" && c.what == "checkpoint id" && !requireID {
			continue
		}
		if !rollout.ValidID(c.v) {
			return apierror.New(apierror.InvalidRequest, "%s %q is not a valid path component", c.what, c.v)
		}
	}
	return nil
}

// ParticipantDir is <dir>/gym/<kind>/<instance>.
func (t Target) ParticipantDir() string { return JoinDir(t.Dir, "gym", t.Kind, t.Instance) }

// Written reports a finished write.
type Written struct {
	Manifest Manifest
	Bytes    int64
	// Existing is set when the directory already held this commit: the
	// same checkpoint with the same records.
	Existing bool
}

// Write writes one participant's commit: emit is called once with a function
// that appends one record, and returns the extras for the manifest. A write
// that fails for want of space is storage_full (whatever emit made of the
// error add returned it), its cause for the server's log.
func (s *Store) Write(ctx context.Context, t Target, stop *WriteStop, emit func(add func(Record) error) (map[string]any, error)) (Written, error) {
	var sinkErr error
	w, err := s.write(ctx, t, stop, emit, &sinkErr)
	if err != nil && (noSpace(err) || noSpace(sinkErr)) {
		cause := err
		if !noSpace(err) {
			cause = fmt.Errorf("%w (after writing records failed: %w)", err, sinkErr)
		}
		return Written{}, hide(apierror.New(apierror.StorageFull,
			"the checkpoint storage of %s/%s in %s is full; nothing was published and the previous checkpoint stands", t.Kind, t.Instance, t.Dir), cause)
	}
	return w, err
}

// noSpace reports an error of a filesystem out of space or quota.
func noSpace(err error) bool {
	return err != nil && (errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT))
}

// write is Write; *sinkErr is set to the error of a failed write of the
// records.
func (s *Store) write(ctx context.Context, t Target, stop *WriteStop, emit func(add func(Record) error) (map[string]any, error), sinkErr *error) (Written, error) {
	if err := t.validate(true); err != nil {
		return Written{}, err
	}
	dir := t.ParticipantDir()
	// A directory that already has a manifest never changes. Another
	// checkpoint's is refused before exporting. Re-committing the same
	// checkpoint returns it only if the records are the same: a checkpoint
	// id and directory reused by a later run (or a retry after the state
	// changed) must not pass for a commit of the state at hand, which the
	// participant would then treat as saved.
	existing, fields, err := s.readManifest(ctx, dir)
	found := err == nil
	if found {
		if merr := s.checkMAC(fields); merr != nil {
			// Not ours to vouch for: neither a commit to return as saved
			// nor one to overwrite.
			return Written{}, hide(apierror.New(apierror.CheckpointConflict, "%s holds a manifest this server cannot verify with its signing key", dir), merr)
		}
	}
	switch {
	case found && (existing.CheckpointID != t.CheckpointID || existing.Kind != t.Kind || existing.Instance != t.Instance):
		return Written{}, fmt.Errorf("%w: %s holds another checkpoint", ErrDifferentCommit, dir)
	case errors.Is(err, ErrNotConfined):
		return Written{}, notConfined(t, err)
	case !found && !errors.Is(err, fs.ErrNotExist):
		// Not the manifest's bytes: a token holder must not read files
		// through the answer.
		return Written{}, hide(apierror.New(apierror.CheckpointConflict, "%s holds a manifest this server cannot read", dir), err)
	}
	// Records the directory already holds under this checkpoint are only
	// compared with: the export is hashed, not written again.
	var rw RecordsWriter
	committed := false
	var out io.Writer
	if !found {
		if err := s.b.MkdirAll(ctx, dir); err != nil {
			if errors.Is(err, ErrNotConfined) {
				return Written{}, notConfined(t, err)
			}
			return Written{}, fmt.Errorf("create %s: %w", dir, err)
		}
		if rw, err = s.b.NewRecords(ctx, dir); err != nil {
			return Written{}, fmt.Errorf("create records in %s: %w", dir, err)
		}
		defer func() {
			if !committed {
				_ = rw.Abort()
			}
		}()
		out = rw
	}
	sink := newRecordsSink(out)
	// The sink's goroutine ends before the records object is aborted or
	// committed (deferred calls run last in, first out).
	defer sink.stop()
	count := 0
	var written int64
	var scratch []byte
	var compact bytes.Buffer
	add := func(r Record) error {
		if stop.Stopped() {
			return ErrStopped
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := r.EpisodeID.Validate(); err != nil {
			return fmt.Errorf("record %d: %w", count, err)
		}
		// Data is not validated here: every record is made by its
		// participant's own encoder (Participant.Export), from values
		// checked where they arrived; scanning each again was commit CPU
		// spent for nothing. What the store itself relies on, one object
		// per line, is checked (recordLine, and the line breaks below).
		if len(r.Data) == 0 {
			return fmt.Errorf("record %d (%s): no data", count, r.EpisodeID)
		}
		if bytes.IndexByte(r.Data, '\n') >= 0 {
			// Line breaks between a value's tokens are JSON white space, but
			// each record is one line of the file.
			compact.Reset()
			if err := codec.Compact(&compact, r.Data); err != nil {
				return fmt.Errorf("record %d (%s): %w", count, r.EpisodeID, err)
			}
			r.Data = compact.Bytes()
		}
		line, built, err := recordLine(scratch[:0], r)
		if err != nil {
			return fmt.Errorf("record %d (%s): %w", count, r.EpisodeID, err)
		}
		scratch = built
		count++
		written += int64(len(line)) + 1
		if err = sink.write(line); err == nil {
			err = sink.writeByte('\n')
		}
		if err != nil {
			*sinkErr = err
		}
		return err
	}
	extras, err := emit(add)
	if err != nil {
		return Written{}, err
	}
	sum, err := sink.finish()
	if err != nil {
		*sinkErr = err
		return Written{}, fmt.Errorf("write records: %w", err)
	}
	digest := hex.EncodeToString(sum)
	if found {
		if existing.RecordsSHA256 == digest && existing.RecordCount == count {
			return Written{Manifest: existing, Bytes: written, Existing: true}, nil
		}
		return Written{}, fmt.Errorf("%w: %s holds checkpoint %s with other records", ErrDifferentCommit, dir, existing.CheckpointID)
	}
	name := "records-" + digest + ".jsonl"
	size, err := rw.Commit(name)
	if err != nil {
		return Written{}, fmt.Errorf("commit records %s: %w", name, err)
	}
	committed = true
	faultpoint.Hit(faultpoint.StoreRecordsCommitted)
	m, data, err := s.sign(Manifest{
		SchemaVersion: SchemaVersion, Kind: t.Kind, Instance: t.Instance, CheckpointID: t.CheckpointID,
		RecordsFile: name, RecordsSHA256: digest, RecordCount: count, Extras: extras,
	})
	if err != nil {
		return Written{}, err
	}
	err = stop.publish(func() error {
		return s.b.PublishManifest(ctx, dir, append(data, '\n'))
	})
	if errors.Is(err, fs.ErrExist) {
		// Another writer published first; it is our commit only if identical.
		other, otherFields, rerr := s.readManifest(ctx, dir)
		if rerr == nil {
			rerr = s.checkMAC(otherFields)
		}
		if rerr == nil && other.CheckpointID == m.CheckpointID && other.RecordsSHA256 == m.RecordsSHA256 && other.RecordCount == m.RecordCount {
			return Written{Manifest: other, Bytes: size, Existing: true}, nil
		}
		return Written{}, fmt.Errorf("%w: %s", ErrDifferentCommit, dir)
	}
	if err != nil {
		return Written{}, err
	}
	faultpoint.Hit(faultpoint.StoreManifestPublished)
	return Written{Manifest: m, Bytes: size}, nil
}

// Read verifies one participant's commit and returns the records keep
// selects (all when keep is nil). The whole file is hashed and counted even
// when keep drops records. Every failure is invalid_checkpoint_state.
func (s *Store) Read(ctx context.Context, t Target, keep func(rollout.EpisodeID) bool) (Manifest, []Record, int64, error) {
	return s.ReadWith(ctx, t, ReadOptions{Keep: keep})
}

// ReadOptions are what ReadWith does besides reading the target.
type ReadOptions struct {
	// Keep selects the records returned (all when nil).
	Keep func(rollout.EpisodeID) bool
	// OnSize, if set, learns the records file's size before the buffer it
	// is read into is allocated, where the backend can tell it (a restore
	// sizes its process's collections by it).
	OnSize func(size int64)
}

// ReadWith is Read with options.
func (s *Store) ReadWith(ctx context.Context, t Target, o ReadOptions) (Manifest, []Record, int64, error) {
	keep := o.Keep
	if err := t.validate(false); err != nil {
		return Manifest{}, nil, 0, err
	}
	dir := t.ParticipantDir()
	m, fields, err := s.readManifest(ctx, dir)
	if err != nil {
		return Manifest{}, nil, 0, t.unreadable(fmt.Errorf("%s: %w", dir, err))
	}
	// Before any field is believed: a keyed store trusts nothing it did
	// not sign, and says only that (never the signature found or the one
	// expected).
	if err := s.checkMAC(fields); err != nil {
		return Manifest{}, nil, 0, t.unverified("the manifest is unsigned or its signature does not verify with this server's signing key",
			fmt.Errorf("%s: %w", dir, err))
	}
	switch {
	case m.SchemaVersion != SchemaVersion:
		return m, nil, 0, t.unverified(fmt.Sprintf("a manifest schema this build does not read (it reads %d)", SchemaVersion),
			fmt.Errorf("%s: schema_version %d", dir, m.SchemaVersion))
	case m.Kind != t.Kind || m.Instance != t.Instance:
		return m, nil, 0, t.unverified("the manifest is another participant's", fmt.Errorf("%s holds %s/%s", dir, m.Kind, m.Instance))
	case t.CheckpointID != "" && m.CheckpointID != t.CheckpointID:
		return m, nil, 0, t.unverified("the manifest is of another checkpoint", fmt.Errorf("%s holds checkpoint %s", dir, m.CheckpointID))
	case !recordsName.MatchString(m.RecordsFile):
		return m, nil, 0, t.unverified("the manifest names no records file", fmt.Errorf("%s: records_file %q", dir, m.RecordsFile))
	case m.RecordCount < 0:
		return m, nil, 0, t.unverified("the manifest's record count is negative", fmt.Errorf("%s: record_count %d", dir, m.RecordCount))
	}
	names, err := s.b.List(ctx, dir)
	if err != nil {
		return m, nil, 0, t.unreadable(fmt.Errorf("list %s: %w", dir, err))
	}
	// Nothing in a shared directory is ever deleted (a racing writer could
	// lose a file the published manifest names), so records files of failed
	// attempts and dot-prefixed temp files may remain; anything else is not
	// ours.
	for _, n := range names {
		if n != ManifestFile && !recordsName.MatchString(n) && !strings.HasPrefix(n, ".") {
			return m, nil, 0, t.unverified("the directory holds a file that is not the checkpoint's", fmt.Errorf("%s holds %q", dir, n))
		}
	}
	rc, err := s.b.OpenRecords(ctx, dir, m.RecordsFile)
	if err != nil {
		return m, nil, 0, t.unverified("the records file cannot be read", fmt.Errorf("%s: open %s: %w", dir, m.RecordsFile, err))
	}
	defer rc.Close()
	buf, hashed, err := readAll(rc, o.OnSize)
	if err != nil {
		return m, nil, 0, t.unverified("the records file cannot be read", fmt.Errorf("%s/%s: %w", dir, m.RecordsFile, err))
	}
	// The digest and the parse are independent passes over the buffer: on
	// a restore's critical path the digest follows the read where it can
	// (readAll), else it runs beside the parse. The parse does not check
	// each record is one JSON value (readCanonical): the records are
	// returned only once the digest matches, which proves every line is
	// one Write wrote, each a participant's own encoding.
	sums := make(chan [sha256.Size]byte, 1)
	if hashed != nil {
		sums <- *hashed
	} else {
		go func() { sums <- sha256.Sum256(buf) }()
	}
	recs, n, size, err := readRecords(ctx, buf, keep, m.RecordCount)
	sum := <-sums
	if got := hex.EncodeToString(sum[:]); got != m.RecordsSHA256 {
		return m, nil, 0, t.unverified("the records do not match the manifest's digest",
			fmt.Errorf("%s/%s: sha256 %s, the manifest's %s", dir, m.RecordsFile, got, m.RecordsSHA256))
	}
	if err != nil {
		return m, nil, 0, t.unverified("the records do not parse", fmt.Errorf("%s/%s: %w", dir, m.RecordsFile, err))
	}
	if n != m.RecordCount {
		return m, nil, 0, t.unverified("the records are not as many as the manifest says",
			fmt.Errorf("%s/%s: %d records, the manifest says %d", dir, m.RecordsFile, n, m.RecordCount))
	}
	return m, recs, size, nil
}

// readRecords parses a whole records file. The records point into buf: one
// allocation for the file instead of one per line, and no copy of any
// record's bytes. A line as Write writes it is framed, not validated
// (readCanonical): its records are valid JSON only once the file's digest
// has matched its manifest's. The slice of records is sized once for the count the
// manifest gives, bounded by the lines buf can hold (a count the file
// does not match fails after the parse).
func readRecords(ctx context.Context, buf []byte, keep func(rollout.EpisodeID) bool, count int) ([]Record, int, int64, error) {
	out := make([]Record, 0, min(count, len(buf)/minLineBytes))
	n := 0
	for rest := buf; len(rest) > 0; {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			return nil, 0, 0, fmt.Errorf("record %d is torn (no newline at the end of the file)", n+1)
		}
		line := rest[: i+1 : i+1]
		rest = rest[i+1:]
		rec, err := readLine(line)
		if err != nil {
			return nil, 0, 0, fmt.Errorf("record %d: %v", n+1, err)
		}
		if err := rec.EpisodeID.Validate(); err != nil {
			return nil, 0, 0, fmt.Errorf("record %d: %v", n+1, err)
		}
		if len(rec.Data) == 0 {
			return nil, 0, 0, fmt.Errorf("record %d has no data", n+1)
		}
		n++
		if keep == nil || keep(rec.EpisodeID) {
			out = append(out, rec)
		}
		if n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, 0, 0, err
			}
		}
	}
	return out, n, int64(len(buf)), nil
}

// minLineBytes is fewer bytes than any line of a records file can have,
// {"episode_id":{"rollout_id":"x"}} and its newline: the most
// lines a buffer can hold is its length over it.
const minLineBytes = 32

// errRecordsChanged reports a records file that grew or shrank while it was
// read: not the file the manifest names.
var errRecordsChanged = errors.New("the records file changed while it was read")

// readAll reads r to its end into one buffer, allocated once when r knows
// its size (a file does). Where it reads the file direct, in parallel
// chunks, it hashes them in order as they arrive and returns the digest
// too (hashed); otherwise hashed is nil.
func readAll(r io.Reader, onSize func(int64)) (buf []byte, hashed *[sha256.Size]byte, err error) {
	st, ok := r.(interface{ Stat() (fs.FileInfo, error) })
	if !ok {
		buf, err := io.ReadAll(r)
		return buf, nil, err
	}
	fi, err := st.Stat()
	if err != nil {
		return nil, nil, err
	}
	if onSize != nil {
		onSize(fi.Size())
	}
	if f, ok := r.(*os.File); ok {
		h := sha256.New()
		buf, ok, err := readDirect(f, int(fi.Size()), func(b []byte) { h.Write(b) })
		if ok {
			if err != nil {
				return nil, nil, err
			}
			// Direct reads stop at the size: a file that grew after the
			// stat shows in a second one.
			if after, err := f.Stat(); err != nil || after.Size() != fi.Size() {
				return nil, nil, errRecordsChanged
			}
			var sum [sha256.Size]byte
			h.Sum(sum[:0])
			return buf, &sum, nil
		}
	}
	buf = hugepage.MakeBuffer(int(fi.Size()))
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, nil, err
	}
	// A file that grew after the stat is not the file the manifest names.
	var one [1]byte
	if n, _ := r.Read(one[:]); n != 0 {
		return nil, nil, errRecordsChanged
	}
	return buf, nil, nil
}

// readManifest returns dir's manifest and its fields as read, which its
// signature covers.
func (s *Store) readManifest(ctx context.Context, dir string) (Manifest, map[string]codec.RawMessage, error) {
	b, err := s.b.ReadManifest(ctx, dir)
	if err != nil {
		return Manifest{}, nil, err
	}
	var fields map[string]codec.RawMessage
	if err := codec.UnmarshalStrict(b, &fields); err != nil {
		return Manifest{}, nil, fmt.Errorf("manifest: %s", codec.DescribeError(err))
	}
	var m Manifest
	if err := m.fromFields(fields); err != nil {
		return Manifest{}, nil, fmt.Errorf("manifest: %s", codec.DescribeError(err))
	}
	return m, fields, nil
}

// Manifests reads the manifest of every participant directory under dir,
// without its records: which instances of each kind a checkpoint holds, and
// how many records each, for a restore into a different set of replicas.
// A manifest is checked as ReadWith checks it before reading records.
func (s *Store) Manifests(ctx context.Context, dir string) ([]Manifest, error) {
	kinds, err := s.b.List(ctx, JoinDir(dir, "gym"))
	if err != nil {
		return nil, hide(apierror.New(apierror.InvalidCheckpointState, "%s holds no readable participant directories", dir), err)
	}
	sort.Strings(kinds)
	var out []Manifest
	for _, kind := range kinds {
		insts, err := s.b.List(ctx, JoinDir(dir, "gym", kind))
		if err != nil {
			return nil, hide(apierror.New(apierror.InvalidCheckpointState, "%s/gym/%s cannot be listed", dir, kind), err)
		}
		sort.Strings(insts)
		for _, inst := range insts {
			t := Target{Dir: dir, Kind: kind, Instance: inst}
			m, fields, err := s.readManifest(ctx, t.ParticipantDir())
			if err != nil {
				return nil, t.unreadable(err)
			}
			if err := s.checkMAC(fields); err != nil {
				return nil, t.unverified("the manifest is unsigned or its signature does not verify with this store's signing key", err)
			}
			if m.Kind != kind || m.Instance != inst {
				return nil, t.unverified("the manifest is another participant's", fmt.Errorf("holds %s/%s", m.Kind, m.Instance))
			}
			out = append(out, m)
		}
	}
	return out, nil
}

// Verify reads every participant directory under dir and reports each
// manifest, or the first error. Used by operators and tests.
func (s *Store) Verify(ctx context.Context, dir string) ([]Manifest, error) {
	kinds, err := s.b.List(ctx, JoinDir(dir, "gym"))
	if err != nil {
		return nil, hide(apierror.New(apierror.InvalidCheckpointState, "%s holds no readable participant directories", dir), err)
	}
	sort.Strings(kinds)
	var out []Manifest
	for _, kind := range kinds {
		insts, err := s.b.List(ctx, JoinDir(dir, "gym", kind))
		if err != nil {
			return nil, hide(apierror.New(apierror.InvalidCheckpointState, "%s/gym/%s cannot be listed", dir, kind), err)
		}
		sort.Strings(insts)
		for _, inst := range insts {
			m, _, _, err := s.Read(ctx, Target{Dir: dir, Kind: kind, Instance: inst}, func(rollout.EpisodeID) bool { return false })
			if err != nil {
				return nil, err
			}
			out = append(out, m)
		}
	}
	return out, nil
}
