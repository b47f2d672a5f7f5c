package ckptstore

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"

	"github.com/gymfleet/gymfleet/pkg/atomicfile"
)

// Backend is the storage a Store writes through. It is narrow on purpose:
// records are one object written once and committed under a name, the
// manifest is one create-only object, and a directory can be listed. A
// shared filesystem (Lustre, NFS) is a Local backend; an object store
// implements the same with a multipart upload and If-None-Match: *.
type Backend interface {
	MkdirAll(ctx context.Context, dir string) error
	// NewRecords starts a records object in dir.
	NewRecords(ctx context.Context, dir string) (RecordsWriter, error)
	// PublishManifest creates dir/manifest.json durably and never replaces
	// it: it fails with an error matching fs.ErrExist if it is there.
	PublishManifest(ctx context.Context, dir string, data []byte) error
	// ReadManifest returns dir/manifest.json, or an error matching
	// fs.ErrNotExist.
	ReadManifest(ctx context.Context, dir string) ([]byte, error)
	OpenRecords(ctx context.Context, dir, name string) (io.ReadCloser, error)
	// List names the entries of dir.
	List(ctx context.Context, dir string) ([]string, error)
}

// RecordsWriter is a records object being written.
type RecordsWriter interface {
	io.Writer
	// Commit makes what was written durable under name and returns its size.
	// A failed Commit (an fsync error included) fails the checkpoint: it is
	// never retried on the same data.
	Commit(name string) (int64, error)
	// Abort discards an uncommitted object.
	Abort() error
}

// Local is a Backend on a POSIX filesystem, over an atomicfile.FS seam.
type Local struct {
	FS atomicfile.FS
}

// NewLocal returns a Local backend on the real filesystem.
func NewLocal() *Local { return &Local{FS: atomicfile.OS} }

// MkdirAll creates dir and its parents.
func (l *Local) MkdirAll(_ context.Context, dir string) error { return l.FS.MkdirAll(dir) }

// NewRecords creates a temp file in dir.
func (l *Local) NewRecords(_ context.Context, dir string) (RecordsWriter, error) {
	f, err := l.FS.CreateTemp(dir, ".records.jsonl.*")
	if err != nil {
		return nil, err
	}
	w := &localRecords{fs: l.FS, dir: dir, f: f}
	// Direct I/O needs the file itself; a test's FS seam gets the cache.
	if osf, ok := f.(*os.File); ok && setDirect(osf, true) == nil {
		w.direct = newDirectWriter(osf)
	}
	return w, nil
}

type localRecords struct {
	fs   atomicfile.FS
	dir  string
	f    atomicfile.File
	n    int64
	done bool
	// direct writes the file with direct I/O (see direct.go); nil where
	// the file goes through the page cache.
	direct *directWriter

	// unsynced counts the bytes written since the last writeback started.
	unsynced int64
	// syncing is closed when the writeback running in the background ends;
	// nil when none was started. syncErr is its error, read after that.
	syncing chan struct{}
	syncErr error
}

// writebackEvery is how many bytes of records are written between two
// writebacks started in the background. The kernel starts writing dirty
// pages back only past dirty_background_ratio (gigabytes here), so a commit
// waited at its fsync for the whole file to reach the disk after writing
// it: 179 MB at 180 MB/s for the agent at 50,000 rollouts. Started as the
// records are written, the writes to disk overlap the encoding, and the
// commit's own fsync finds little left.
const writebackEvery = 8 << 20

func (w *localRecords) Write(b []byte) (int, error) {
	if w.direct != nil {
		// Nothing waits in the cache to be written back.
		n, err := w.direct.Write(b)
		w.n += int64(n)
		return n, err
	}
	n, err := w.f.Write(b)
	w.n += int64(n)
	w.unsynced += int64(n)
	if w.unsynced >= writebackEvery {
		w.startWriteback()
	}
	return n, err
}

// startWriteback fsyncs the file in the background, unless the last one
// is still running or failed (Commit reports that failure).
func (w *localRecords) startWriteback() {
	if w.syncing != nil {
		select {
		case <-w.syncing:
		default:
			return
		}
		if w.syncErr != nil {
			return
		}
	}
	w.unsynced = 0
	done := make(chan struct{})
	w.syncing = done
	go func() {
		defer close(done)
		w.syncErr = w.f.Sync()
	}()
}

// waitWriteback waits for the background writeback, if any, and returns
// its error.
func (w *localRecords) waitWriteback() error {
	if w.syncing == nil {
		return nil
	}
	<-w.syncing
	return w.syncErr
}

func (w *localRecords) Commit(name string) (int64, error) {
	w.done = true
	if w.direct != nil {
		if err := w.direct.finish(); err != nil {
			_ = w.f.Close()
			_ = w.fs.Remove(w.f.Name())
			return 0, fmt.Errorf("write records: %w", err)
		}
	}
	err := w.waitWriteback()
	if err == nil {
		err = w.f.Sync()
	}
	if err != nil {
		_ = w.f.Close()
		_ = w.fs.Remove(w.f.Name())
		return 0, fmt.Errorf("fsync records: %w", err)
	}
	if err := w.f.Close(); err != nil {
		_ = w.fs.Remove(w.f.Name())
		return 0, fmt.Errorf("close records: %w", err)
	}
	if err := w.fs.Rename(w.f.Name(), path.Join(w.dir, name)); err != nil {
		_ = w.fs.Remove(w.f.Name())
		return 0, err
	}
	if err := w.fs.SyncDir(w.dir); err != nil {
		return 0, fmt.Errorf("fsync directory %s: %w", w.dir, err)
	}
	return w.n, nil
}

func (w *localRecords) Abort() error {
	if w.done {
		return nil
	}
	w.done = true
	_ = w.waitWriteback()
	if w.direct != nil {
		w.direct.abort()
	}
	_ = w.f.Close()
	return w.fs.Remove(w.f.Name())
}

// PublishManifest publishes through atomicfile.Publish (temp, fsync, link,
// directory fsync).
func (l *Local) PublishManifest(_ context.Context, dir string, data []byte) error {
	return atomicfile.Publish(l.FS, path.Join(dir, ManifestFile), data)
}

// ReadManifest reads dir/manifest.json.
func (l *Local) ReadManifest(_ context.Context, dir string) ([]byte, error) {
	rc, err := l.FS.Open(path.Join(dir, ManifestFile))
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(io.LimitReader(rc, 64<<20))
}

// OpenRecords opens a records file.
func (l *Local) OpenRecords(_ context.Context, dir, name string) (io.ReadCloser, error) {
	return l.FS.Open(path.Join(dir, name))
}

// List names the entries of dir.
func (l *Local) List(_ context.Context, dir string) ([]string, error) { return l.FS.ReadDir(dir) }
