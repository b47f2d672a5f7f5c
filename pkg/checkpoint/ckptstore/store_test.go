package ckptstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/infra/atomicfile"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

func records(n int, tag string) func(add func(ckptstore.Record) error) (map[string]any, error) {
	return func(add func(ckptstore.Record) error) (map[string]any, error) {
		for i := 0; i < n; i++ {
			data, _ := codec.Marshal(map[string]any{"i": i, "tag": tag, "z": "last", "a": "first"})
			if err := add(ckptstore.Record{EpisodeID: rollout.EpisodeID{RolloutID: fmt.Sprintf("r%d", i), Attempt: i % 3}, Data: data}); err != nil {
				return nil, err
			}
		}
		return map[string]any{"extra_field": tag}, nil
	}
}

// tempLocal is a Local backend confined to the temp directory, which holds
// every t.TempDir(), its FS wrapped by wrap (when not nil).
func tempLocal(t testing.TB, wrap func(atomicfile.FS) atomicfile.FS) *ckptstore.Local {
	t.Helper()
	l, err := ckptstore.OpenLocal(os.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if wrap != nil {
		l.FS = wrap(l.FS)
	}
	return l
}

func tempStore(t testing.TB) *ckptstore.Store { return ckptstore.New(tempLocal(t, nil)) }

func target(dir string) ckptstore.Target {
	return ckptstore.Target{Dir: dir, Kind: "environment", Instance: "env", CheckpointID: "c1"}
}

func TestStore_RoundTrip(t *testing.T) { forEachKit(t, testRoundTrip) }

func testRoundTrip(t *testing.T, k kit) {
	ctx := context.Background()
	s := k.store(t)
	dir := k.dir(t)
	w, err := s.Write(ctx, target(dir), nil, records(5, "x"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := w.Manifest.RecordCount, 5; got != want {
		t.Fatalf("RecordCount=%d, want %d", got, want)
	}
	if !strings.HasPrefix(w.Manifest.RecordsFile, "records-"+w.Manifest.RecordsSHA256) {
		t.Fatalf("records file %q is not named by its digest %s", w.Manifest.RecordsFile, w.Manifest.RecordsSHA256)
	}
	m, recs, size, err := s.Read(ctx, target(dir), func(id rollout.EpisodeID) bool { return id.Attempt == 1 })
	if err != nil {
		t.Fatal(err)
	}
	if size != w.Bytes || m.Extras["extra_field"] != "x" {
		t.Fatalf("size %d vs %d, extras %v", size, w.Bytes, m.Extras)
	}
	if got := len(recs); got != 2 { // r1 and r4 have attempt 1
		t.Fatalf("selected %d records, want 2", got)
	}
	// ReadWith tells OnSize the records file's size.
	var told int64
	if _, recs, _, err := s.ReadWith(ctx, target(dir), ckptstore.ReadOptions{OnSize: func(n int64) { told = n }}); err != nil || len(recs) != 5 {
		t.Fatalf("ReadWith: %d records, %v", len(recs), err)
	}
	if told != w.Bytes {
		t.Fatalf("OnSize was told %d bytes, want the records file's %d", told, w.Bytes)
	}
	// Record bytes come back exactly as exported, key order included, flat
	// behind the episode id (nemo_gym/_checkpoint/store.py @ e7e449e9aa0d).
	if want := `{"episode_id":{"rollout_id":"r1","attempt":1},"a":"first","i":1,"tag":"x","z":"last"}`; string(recs[0].Data) != want {
		t.Fatalf("record data %s, want %s", recs[0].Data, want)
	}
	// Re-committing the same checkpoint with the same records returns the
	// existing manifest; with other records (a later run reusing the id
	// and directory, or state that changed since) it is refused, and the
	// directory is left as it was.
	entries := func() []string {
		t.Helper()
		return k.list(t, target(dir).ParticipantDir())
	}
	before := entries()
	again, err := s.Write(ctx, target(dir), nil, records(5, "x"))
	if err != nil || !again.Existing || again.Manifest.RecordsSHA256 != w.Manifest.RecordsSHA256 || again.Bytes != w.Bytes {
		t.Fatalf("re-commit of the same records: %+v, %v", again, err)
	}
	for _, other := range []func(add func(ckptstore.Record) error) (map[string]any, error){records(5, "different"), records(4, "x")} {
		if got, err := s.Write(ctx, target(dir), nil, other); !errors.Is(err, ckptstore.ErrDifferentCommit) {
			t.Fatalf("re-commit of other records: %+v, %v; want ErrDifferentCommit", got, err)
		}
	}
	if after := entries(); !slices.Equal(after, before) {
		t.Fatalf("the directory changed from %v to %v", before, after)
	}
	// Another checkpoint into the same directory fails.
	other := target(dir)
	other.CheckpointID = "c2"
	if _, err := s.Write(ctx, other, nil, records(1, "x")); !errors.Is(err, ckptstore.ErrDifferentCommit) {
		t.Fatalf("a different commit into the same directory: %v", err)
	}
	if ms, err := s.Verify(ctx, dir); err != nil || len(ms) != 1 {
		t.Fatalf("Verify = %v, %v", ms, err)
	}
}

func TestStore_ConcurrentCommits(t *testing.T) { forEachKit(t, testConcurrentCommits) }

func testConcurrentCommits(t *testing.T, k kit) {
	ctx := context.Background()
	s := k.store(t)
	t.Run("SameContent", func(t *testing.T) {
		dir := k.dir(t)
		var wg sync.WaitGroup
		results := make([]ckptstore.Written, 8)
		errs := make([]error, 8)
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i], errs[i] = s.Write(ctx, target(dir), nil, records(50, "same"))
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("writer %d: %v", i, err)
			}
			if results[i].Manifest.RecordsSHA256 != results[0].Manifest.RecordsSHA256 {
				t.Fatalf("writers disagree on the manifest")
			}
		}
		if _, _, _, err := s.Read(ctx, target(dir), nil); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("DifferentContent", func(t *testing.T) {
		dir := k.dir(t)
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = s.Write(ctx, target(dir), nil, records(20, fmt.Sprint("w", i)))
			}()
		}
		wg.Wait()
		ok := 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, ckptstore.ErrDifferentCommit):
				t.Fatalf("unexpected error: %v", err)
			}
		}
		if ok < 1 {
			t.Fatal("no writer published")
		}
		// Whoever published, the directory verifies as one whole commit.
		if _, recs, _, err := s.Read(ctx, target(dir), nil); err != nil || len(recs) != 20 {
			t.Fatalf("read after racing writers: %d records, %v", len(recs), err)
		}
	})
}

// crashFS fails (as a crash would stop) the manifest publication.
type crashFS struct {
	atomicfile.FS
	failLink bool
	failSync int // fail the n-th File.Sync (1-based); 0 never
	syncs    int
	mu       sync.Mutex
}

type crashFile struct {
	atomicfile.File
	fs *crashFS
}

func (c *crashFS) CreateTemp(dir, pattern string) (atomicfile.File, error) {
	f, err := c.FS.CreateTemp(dir, pattern)
	if err != nil {
		return nil, err
	}
	return crashFile{f, c}, nil
}

func (f crashFile) Sync() error {
	f.fs.mu.Lock()
	f.fs.syncs++
	n := f.fs.syncs
	f.fs.mu.Unlock()
	if n == f.fs.failSync {
		return &os.PathError{Op: "fsync", Path: f.Name(), Err: syscall.EIO}
	}
	return f.File.Sync()
}

func (c *crashFS) Link(o, n string) error {
	if c.failLink {
		return errors.New("process killed before the manifest was published")
	}
	return c.FS.Link(o, n)
}

func TestStore_CrashBetweenRecordsAndManifest(t *testing.T) {
	forEachKit(t, testCrashBetweenRecordsAndManifest)
}

func testCrashBetweenRecordsAndManifest(t *testing.T, k kit) {
	ctx := context.Background()
	dir := k.dir(t)
	crashing := k.crashing(t)
	if _, err := crashing.Write(ctx, target(dir), nil, records(3, "x")); err == nil {
		t.Fatal("the write should fail at publication")
	}
	// The records are there, the manifest is not.
	if names := k.list(t, target(dir).ParticipantDir()); len(names) == 0 || slices.Contains(names, ckptstore.ManifestFile) {
		t.Fatalf("after the crash the directory holds %v, want records and no manifest", names)
	}
	s := k.store(t)
	if _, _, _, err := s.Read(ctx, target(dir), nil); !apierror.HasCode(err, apierror.InvalidCheckpointState) {
		t.Fatalf("a directory with records and no manifest must be refused, got %v", err)
	}
	// A retry of the commit completes, with the leftover records file there.
	if _, err := s.Write(ctx, target(dir), nil, records(3, "x")); err != nil {
		t.Fatal(err)
	}
	if _, recs, _, err := s.Read(ctx, target(dir), nil); err != nil || len(recs) != 3 {
		t.Fatalf("after the retry: %d records, %v", len(recs), err)
	}
}

func TestStore_FsyncErrorFailsTheCommit(t *testing.T) {
	for _, n := range []int{1, 2} { // 1: records fsync, 2: manifest fsync
		t.Run(fmt.Sprint("sync", n), func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			s := ckptstore.New(tempLocal(t, func(base atomicfile.FS) atomicfile.FS { return &crashFS{FS: base, failSync: n} }))
			_, err := s.Write(ctx, target(dir), nil, records(3, "x"))
			if !errors.Is(err, syscall.EIO) {
				t.Fatalf("an fsync error must fail the commit, got %v", err)
			}
			if _, err := os.Stat(filepath.Join(target(dir).ParticipantDir(), "manifest.json")); !os.IsNotExist(err) {
				t.Fatalf("no manifest may exist after a failed fsync: %v", err)
			}
		})
	}
}

func TestStore_TamperedDirectoriesAreRefused(t *testing.T) {
	forEachKit(t, testTamperedDirectoriesAreRefused)
}

func testTamperedDirectoriesAreRefused(t *testing.T, k kit) {
	ctx := context.Background()
	s := k.store(t)
	pd := func(dir string) string { return target(dir).ParticipantDir() }
	edit := func(t *testing.T, dir, name string, fn func([]byte) []byte) {
		k.write(t, pd(dir), name, fn(k.read(t, pd(dir), name)))
	}
	setup := func(t *testing.T) (string, ckptstore.Manifest) {
		dir := k.dir(t)
		w, err := s.Write(ctx, target(dir), nil, records(4, "x"))
		if err != nil {
			t.Fatal(err)
		}
		return dir, w.Manifest
	}
	cases := []struct {
		name   string
		tamper func(t *testing.T, dir string, m ckptstore.Manifest) ckptstore.Target
	}{
		{"Truncated", func(t *testing.T, dir string, m ckptstore.Manifest) ckptstore.Target {
			edit(t, dir, m.RecordsFile, func(b []byte) []byte { return b[:len(b)-7] })
			return target(dir)
		}},
		{"LastLineTorn", func(t *testing.T, dir string, m ckptstore.Manifest) ckptstore.Target {
			edit(t, dir, m.RecordsFile, func(b []byte) []byte { return b[:len(b)-1] })
			return target(dir)
		}},
		{"FlippedByte", func(t *testing.T, dir string, m ckptstore.Manifest) ckptstore.Target {
			edit(t, dir, m.RecordsFile, func(b []byte) []byte {
				b[bytes.IndexByte(b, 'x')] = 'y'
				return b
			})
			return target(dir)
		}},
		{"RecordAppended", func(t *testing.T, dir string, m ckptstore.Manifest) ckptstore.Target {
			edit(t, dir, m.RecordsFile, func(b []byte) []byte {
				return append(b, `{"episode_id":{"rollout_id":"evil","attempt":0},"record":{}}`+"\n"...)
			})
			return target(dir)
		}},
		{"WrongCheckpointID", func(t *testing.T, dir string, m ckptstore.Manifest) ckptstore.Target {
			tg := target(dir)
			tg.CheckpointID = "c-other"
			return tg
		}},
		{"WrongKind", func(t *testing.T, dir string, m ckptstore.Manifest) ckptstore.Target {
			tg := target(dir)
			tg.Kind = "agent"
			k.move(t, pd(dir), tg.ParticipantDir())
			return tg
		}},
		{"ExtraFile", func(t *testing.T, dir string, m ckptstore.Manifest) ckptstore.Target {
			k.write(t, pd(dir), "notes.txt", []byte("hi"))
			return target(dir)
		}},
		{"ManifestCountEdited", func(t *testing.T, dir string, m ckptstore.Manifest) ckptstore.Target {
			edit(t, dir, ckptstore.ManifestFile, func(b []byte) []byte {
				return bytes.Replace(b, []byte(`"record_count": 4`), []byte(`"record_count": 3`), 1)
			})
			return target(dir)
		}},
		{"ManifestTruncated", func(t *testing.T, dir string, m ckptstore.Manifest) ckptstore.Target {
			edit(t, dir, ckptstore.ManifestFile, func(b []byte) []byte { return b[:len(b)/2] })
			return target(dir)
		}},
		{"RecordsFileMissing", func(t *testing.T, dir string, m ckptstore.Manifest) ckptstore.Target {
			k.remove(t, pd(dir), m.RecordsFile)
			return target(dir)
		}},
		{"RecordsFileNameEscapes", func(t *testing.T, dir string, m ckptstore.Manifest) ckptstore.Target {
			edit(t, dir, ckptstore.ManifestFile, func(b []byte) []byte {
				return bytes.Replace(b, []byte(m.RecordsFile), []byte("../../../etc/passwd"), 1)
			})
			return target(dir)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir, m := setup(t)
			tg := tc.tamper(t, dir, m)
			_, recs, _, err := s.Read(ctx, tg, nil)
			if !apierror.HasCode(err, apierror.InvalidCheckpointState) {
				t.Fatalf("got %v, want invalid_checkpoint_state", err)
			}
			if recs != nil {
				t.Fatalf("records returned from a refused directory: %d", len(recs))
			}
		})
	}
}

func TestStore_RejectsBadTargets(t *testing.T) { forEachKit(t, testRejectsBadTargets) }

func testRejectsBadTargets(t *testing.T, k kit) {
	s := k.store(t)
	_, err := s.Write(context.Background(), ckptstore.Target{Dir: k.dir(t), Kind: "..", Instance: "x", CheckpointID: "c"}, nil, records(1, "x"))
	if !apierror.HasCode(err, apierror.InvalidRequest) {
		t.Fatalf("a kind that is not a path component: %v", err)
	}
}

func TestStore_StopBeforePublish(t *testing.T) { forEachKit(t, testStopBeforePublish) }

func testStopBeforePublish(t *testing.T, k kit) {
	s := k.store(t)
	stop := &ckptstore.WriteStop{}
	stop.Stop()
	dir := k.dir(t)
	if _, err := s.Write(context.Background(), target(dir), stop, records(3, "x")); !errors.Is(err, ckptstore.ErrStopped) {
		t.Fatalf("got %v, want ErrStopped", err)
	}
	if _, _, _, err := s.Read(context.Background(), target(dir), nil); !apierror.HasCode(err, apierror.InvalidCheckpointState) {
		t.Fatalf("a stopped write published a manifest: read gives %v", err)
	}
}

// Ensure a writer whose guard refuses at publication publishes nothing: a
// process a restore superseded while it wrote.
func TestStore_GuardRefusesAtPublish(t *testing.T) {
	s := tempStore(t)
	superseded := errors.New("epoch superseded")
	stop := &ckptstore.WriteStop{Guard: func(func() error) error { return superseded }}
	dir := t.TempDir()
	if _, err := s.Write(context.Background(), target(dir), stop, records(3, "x")); !errors.Is(err, superseded) {
		t.Fatalf("got %v, want the fence's error", err)
	}
	if _, err := os.Stat(filepath.Join(target(dir).ParticipantDir(), "manifest.json")); !os.IsNotExist(err) {
		t.Fatal("a fenced write published a manifest")
	}
}

// Ensure the manifest is published inside the guard, so what the guard
// holds (the epoch lock) covers the publication.
func TestStore_PublishesInsideGuard(t *testing.T) {
	s := tempStore(t)
	dir := t.TempDir()
	manifest := filepath.Join(target(dir).ParticipantDir(), "manifest.json")
	guarded := false
	stop := &ckptstore.WriteStop{Guard: func(publish func() error) error {
		if _, err := os.Stat(manifest); !os.IsNotExist(err) {
			t.Errorf("the manifest exists before the guard ran: %v", err)
		}
		guarded = true
		err := publish()
		if _, serr := os.Stat(manifest); serr != nil {
			t.Errorf("the manifest is not there when publish returns: %v", serr)
		}
		return err
	}}
	if _, err := s.Write(context.Background(), target(dir), stop, records(3, "x")); err != nil {
		t.Fatal(err)
	}
	if !guarded {
		t.Fatal("the write published without its guard")
	}
}

func FuzzManifest(f *testing.F) {
	m := ckptstore.Manifest{SchemaVersion: 1, Kind: "model", Instance: "m", CheckpointID: "c", RecordsFile: "records.jsonl", RecordsSHA256: "00", RecordCount: 2, Extras: map[string]any{"staging_keys": []any{"a"}}}
	b, _ := m.MarshalJSON()
	f.Add(b)
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"schema_version":"1"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var got ckptstore.Manifest
		if err := got.UnmarshalJSON(data); err != nil {
			return
		}
		again, err := got.MarshalJSON()
		if err != nil {
			return // an extra colliding with a fixed field cannot be written
		}
		var back ckptstore.Manifest
		if err := back.UnmarshalJSON(again); err != nil {
			t.Fatalf("a manifest we wrote does not read back: %v\n%s", err, again)
		}
		if back.CheckpointID != got.CheckpointID || back.RecordCount != got.RecordCount || back.RecordsSHA256 != got.RecordsSHA256 {
			t.Fatalf("round trip changed the manifest: %+v vs %+v", back, got)
		}
	})
}

func FuzzRecordsReader(f *testing.F) {
	f.Add([]byte(`{"episode_id":{"rollout_id":"r","attempt":0},"record":{"a":1}}` + "\n"))
	f.Add([]byte(`{"episode_id":{"rollout_id":"r","attempt":0},"record":{"a":1}}`))
	f.Add([]byte("\n\n"))
	f.Add([]byte(`{"episode_id":{"rollout_id":"../x","attempt":-1},"record":null}` + "\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		recs, n, err := ckptstore.ReadRecordsBytes(body)
		if err != nil {
			return
		}
		// Every accepted line is one record: no line is skipped or split.
		if n != len(recs) || n != bytes.Count(body, []byte("\n")) {
			t.Fatalf("counted %d records, returned %d, for %q", n, len(recs), body)
		}
		// Records are framed, not validated: the digest Read checks proves
		// them (FuzzCanonicalLine).
		for _, r := range recs {
			if r.EpisodeID.Validate() != nil || len(r.Data) == 0 {
				t.Fatalf("reader accepted an invalid record %+v", r)
			}
		}
	})
}

// TestStore_RecordsWithLineBreaksReadBack: a record is one JSON value, and
// line breaks between its tokens are JSON whitespace; they must not split
// the line that holds it in the records file.
func TestStore_RecordsWithLineBreaksReadBack(t *testing.T) {
	forEachKit(t, testRecordsWithLineBreaksReadBack)
}

func testRecordsWithLineBreaksReadBack(t *testing.T, k kit) {
	ctx := context.Background()
	s := k.store(t)
	dir := k.dir(t)
	data := "{\n \"a\": [1,\r\n 2],\n\t\"s\": \"x\\ny\"\n}\n"
	if _, err := s.Write(ctx, target(dir), nil, func(add func(ckptstore.Record) error) (map[string]any, error) {
		return nil, add(ckptstore.Record{EpisodeID: rollout.EpisodeID{RolloutID: "r1"}, Data: []byte(data)})
	}); err != nil {
		t.Fatal(err)
	}
	_, recs, _, err := s.Read(ctx, target(dir), nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"episode_id":{"rollout_id":"r1","attempt":0},"a":[1,2],"s":"x\ny"}`; len(recs) != 1 || string(recs[0].Data) != want {
		t.Fatalf("read back %q, want one record %s", recs, want)
	}
}

// syncEvent is one File.Sync of a records file.
type syncEvent struct {
	at      int64 // bytes written to the file when the sync started
	added   int64 // records added by then
	started int   // order among starts and ends of every records sync
	ended   int
}

// writebackFS watches the records file's writes and fsyncs: it notes, for
// every sync, how far the writer had got when it started, and holds the
// first sync until release is closed. Once the writer is WritebackEvery
// bytes in, it writes nothing more until that sync has started (or a
// minute of the bubble's fake time passed without it), so where the
// writeback starts does not depend on when the goroutine running it is
// scheduled.
type writebackFS struct {
	atomicfile.FS
	added        *atomic.Int64
	firstStarted chan struct{}
	release      chan struct{}

	mu      sync.Mutex
	order   int
	syncs   []*syncEvent
	written int64
	waited  bool
}

type writebackFile struct {
	atomicfile.File
	fs *writebackFS
}

func (w *writebackFS) CreateTemp(dir, pattern string) (atomicfile.File, error) {
	f, err := w.FS.CreateTemp(dir, pattern)
	if err != nil || !strings.HasPrefix(pattern, ".records") {
		return f, err
	}
	return writebackFile{f, w}, nil
}

func (f writebackFile) Write(b []byte) (int, error) {
	w := f.fs
	w.mu.Lock()
	wait := !w.waited && w.written >= ckptstore.WritebackEvery
	w.waited = w.waited || wait
	w.mu.Unlock()
	if wait {
		select {
		case <-w.firstStarted:
		case <-time.After(time.Minute):
		}
	}
	n, err := f.File.Write(b)
	w.mu.Lock()
	w.written += int64(n)
	w.mu.Unlock()
	return n, err
}

func (f writebackFile) Sync() error {
	w := f.fs
	w.mu.Lock()
	w.order++
	ev := &syncEvent{at: w.written, added: w.added.Load(), started: w.order}
	w.syncs = append(w.syncs, ev)
	first := len(w.syncs) == 1
	w.mu.Unlock()
	if first {
		close(w.firstStarted)
		<-w.release
	}
	err := f.File.Sync()
	w.mu.Lock()
	w.order++
	ev.ended = w.order
	w.mu.Unlock()
	return err
}

func (w *writebackFS) events() []syncEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]syncEvent, len(w.syncs))
	for i, ev := range w.syncs {
		out[i] = *ev
	}
	return out
}

// TestStore_WritebackDuringTheWrite: records past a few megabytes are
// written back as they are written (a background fsync), and a failure of
// that fsync fails the commit, as the final fsync's does.
func TestStore_WritebackDuringTheWrite(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	// The first writeback starts once WritebackEvery bytes are written,
	// before the last record is, and the writer goes on writing while it
	// runs. Commit waits for it: with it held, the write ends up blocked
	// in Commit with no fsync of its own started, and returns only after
	// the writeback is released and the final fsync has run.
	t.Run("written back while writing", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			const n = 12 // 1 MB each: one writeback, and 4 MB written during it
			ctx := context.Background()
			dir := t.TempDir()
			var added atomic.Int64
			fs := &writebackFS{FS: atomicfile.OS, added: &added, firstStarted: make(chan struct{}), release: make(chan struct{})}
			var releaseOnce sync.Once
			release := func() { releaseOnce.Do(func() { close(fs.release) }) }
			s := ckptstore.New(tempLocal(t, func(base atomicfile.FS) atomicfile.FS { fs.FS = base; return fs }))
			emit := records(n, big)
			var w ckptstore.Written
			var err error
			writeDone := make(chan struct{})
			// However the test ends, the write ends in the bubble.
			defer func() {
				release()
				<-writeDone
			}()
			go func() {
				defer close(writeDone)
				w, err = s.Write(ctx, target(dir), nil, func(add func(ckptstore.Record) error) (map[string]any, error) {
					return emit(func(r ckptstore.Record) error {
						err := add(r)
						added.Add(1)
						return err
					})
				})
			}()

			// Everything in the bubble blocks: the held writeback, and the
			// writer, which can only block on it.
			synctest.Wait()
			evs := fs.events()
			if len(evs) == 0 {
				t.Fatalf("no fsync of the records started once %d bytes were written (%d of %d records)", ckptstore.WritebackEvery, added.Load(), n)
			}
			if got := added.Load(); got != n {
				t.Errorf("%d of %d records written while the writeback ran, want the writer to go on to the last", got, n)
			}
			select {
			case <-writeDone:
				t.Errorf("the write returned while its writeback was still running: %v", err)
			default:
			}
			if len(evs) != 1 {
				t.Errorf("%d fsyncs of the records started while the writeback ran, want the commit's to wait for it", len(evs))
			}

			release()
			<-writeDone
			if err != nil {
				t.Fatal(err)
			}
			evs = fs.events()
			if len(evs) != 2 {
				t.Fatalf("%d fsyncs of the records, want the writeback and the commit's: %+v", len(evs), evs)
			}
			wb, final := evs[0], evs[1]
			if wb.at < ckptstore.WritebackEvery || wb.at >= w.Bytes || wb.added >= n {
				t.Errorf("the writeback started at byte %d of %d, after %d of %d records; want it at byte %d or past, before the last record",
					wb.at, w.Bytes, wb.added, n, ckptstore.WritebackEvery)
			}
			if final.at != w.Bytes || final.started < wb.ended {
				t.Errorf("the commit's fsync started at byte %d of %d, at step %d (writeback %d-%d); want it after every byte and after the writeback ended",
					final.at, w.Bytes, final.started, wb.started, wb.ended)
			}
			if _, recs, _, err := s.Read(ctx, target(dir), nil); err != nil || len(recs) != n {
				t.Fatalf("read back %d records: %v", len(recs), err)
			}
		})
	})
	t.Run("writeback fails", func(t *testing.T) {
		ctx := context.Background()
		dir := t.TempDir()
		s := ckptstore.New(tempLocal(t, func(base atomicfile.FS) atomicfile.FS { return &crashFS{FS: base, failSync: 1} }))
		if _, err := s.Write(ctx, target(dir), nil, records(20, big)); !errors.Is(err, syscall.EIO) {
			t.Fatalf("a failed writeback must fail the commit, got %v", err)
		}
		if _, err := os.Stat(filepath.Join(target(dir).ParticipantDir(), "manifest.json")); !os.IsNotExist(err) {
			t.Fatalf("no manifest may exist after a failed writeback: %v", err)
		}
	})
}

// fullFS is a filesystem out of space: writes to files created under
// pattern prefix fail with ENOSPC.
type fullFS struct {
	atomicfile.FS
	prefix string
}

type fullFile struct{ atomicfile.File }

func (f fullFile) Write([]byte) (int, error) {
	return 0, &os.PathError{Op: "write", Path: f.Name(), Err: syscall.ENOSPC}
}

func (c *fullFS) CreateTemp(dir, pattern string) (atomicfile.File, error) {
	f, err := c.FS.CreateTemp(dir, pattern)
	if err != nil || !strings.HasPrefix(pattern, c.prefix) {
		return f, err
	}
	return fullFile{f}, nil
}

// TestStore_NoSpaceIsStorageFull fills the disk under the records and
// under the manifest: either way the write fails with storage_full (even
// when the exporter reports the failed add in words of its own), publishes
// nothing, and the answer names no file.
func TestStore_NoSpaceIsStorageFull(t *testing.T) {
	// A few small records fail at the end of the write; enough to fill
	// the store's chunks fail while records are still being added.
	big := []byte(`{"x":"` + strings.Repeat("y", 40<<10) + `"}`)
	for _, c := range []struct {
		prefix  string
		records int
		data    []byte
	}{{".records", 3, []byte(`{"x":1}`)}, {".records", 300, big}, {".manifest", 3, []byte(`{"x":1}`)}} {
		prefix := c.prefix
		t.Run(fmt.Sprintf("%s_%d", strings.TrimPrefix(prefix, "."), c.records), func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			s := ckptstore.New(tempLocal(t, func(base atomicfile.FS) atomicfile.FS { return &fullFS{FS: base, prefix: prefix} }))
			added := 0
			_, err := s.Write(ctx, target(dir), nil, func(add func(ckptstore.Record) error) (map[string]any, error) {
				for i := range c.records {
					if err := add(ckptstore.Record{EpisodeID: rollout.EpisodeID{RolloutID: fmt.Sprint("r", i)}, Data: c.data}); err != nil {
						return nil, fmt.Errorf("export stopped: %v", err) // not wrapped
					}
					added++
				}
				return nil, nil
			})
			if c.records > 100 && added == c.records {
				t.Fatalf("every one of %d records was added after the disk filled", added)
			}
			if !apierror.HasCode(err, apierror.StorageFull) {
				t.Fatalf("a full disk must fail the commit with storage_full, got %v", err)
			}
			if !strings.Contains(ckptstore.Detail(err), "no space left on device") {
				t.Fatalf("the log detail %q does not say why", ckptstore.Detail(err))
			}
			if strings.Contains(err.Error(), ".tmp") || strings.Contains(err.Error(), "records-") {
				t.Fatalf("the answer quotes a file: %v", err)
			}
			if _, err := os.Stat(filepath.Join(target(dir).ParticipantDir(), "manifest.json")); !os.IsNotExist(err) {
				t.Fatalf("no manifest may exist after a full disk: %v", err)
			}
		})
	}
}
