package ckptstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/infra/atomicfile"
	"github.com/gymfleet/gymfleet/pkg/infra/faultpoint"
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

// Local is a Backend on a POSIX filesystem beneath one root directory,
// over an atomicfile.FS seam whose names are relative to that root. Every
// directory it is given must lie beneath Root (Beneath), and is followed
// from it one component at a time without crossing a symbolic link; files
// are opened only if they are regular files. The root itself may be a
// symbolic link: the operator chose it.
type Local struct {
	// Root is the absolute path of the directory FS's names are relative to.
	Root string
	FS   atomicfile.FS
	// root is the open directory FS works in; nil when FS was given.
	root *os.Root
}

// OpenLocal opens the directory root, which must exist, and returns a
// Local backend confined to it. Close releases it.
func OpenLocal(root string) (*Local, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	r, err := os.OpenRoot(abs)
	if err != nil {
		return nil, fmt.Errorf("checkpoint root: %w", err)
	}
	return &Local{Root: abs, FS: atomicfile.InRoot(r), root: r}, nil
}

// Close closes the root OpenLocal opened.
func (l *Local) Close() error {
	if l.root == nil {
		return nil
	}
	return l.root.Close()
}

// ErrNotConfined reports a directory that is not beneath the root, or that
// reaches it only through a symbolic link or something not a directory.
var ErrNotConfined = errors.New("not a directory beneath the checkpoint root")

// Beneath returns dir relative to root (slash-separated, "." for the root
// itself). dir must be absolute, hold no ".." component and lie beneath
// root once cleaned; root must be absolute and clean.
func Beneath(root, dir string) (string, error) {
	if root == "" || !filepath.IsAbs(root) {
		return "", fmt.Errorf("%w: no checkpoint root is configured", ErrNotConfined)
	}
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("%w: %q is not an absolute path", ErrNotConfined, dir)
	}
	for _, c := range strings.Split(filepath.ToSlash(dir), "/") {
		if c == ".." {
			return "", fmt.Errorf("%w: %q has a \"..\" component", ErrNotConfined, dir)
		}
	}
	rel, err := filepath.Rel(root, filepath.Clean(dir))
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
		return "", fmt.Errorf("%w: %q is outside the checkpoint root %q", ErrNotConfined, dir, root)
	}
	return filepath.ToSlash(rel), nil
}

// dirIn returns dir relative to the root once each of its components is a
// directory and not a symbolic link; with create, missing ones are made.
// The walk costs a few system calls per component, once per call, never
// per record. A component swapped for a link after it was checked still
// cannot lead out of the root: FS resolves every name within it.
func (l *Local) dirIn(dir string, create bool) (string, error) {
	rel, err := Beneath(l.Root, dir)
	if err != nil || rel == "." {
		return rel, err
	}
	parts := strings.Split(rel, "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		fi, err := l.FS.Lstat(p)
		if create && errors.Is(err, fs.ErrNotExist) {
			// The components checked so far are directories; MkdirAll makes
			// this one and the rest, which the loop goes on to check.
			if err := l.FS.MkdirAll(rel); err != nil {
				return "", err
			}
			fi, err = l.FS.Lstat(p)
		}
		if err != nil {
			return "", err
		}
		if !fi.IsDir() || fi.Mode()&fs.ModeSymlink != 0 {
			return "", fmt.Errorf("%w: %s is a symbolic link or not a directory", ErrNotConfined, path.Join(l.Root, p))
		}
	}
	return rel, nil
}

// fileIn returns name in dir relative to the root, if it is a regular file
// (not a symbolic link).
func (l *Local) fileIn(dir, name string) (string, error) {
	rel, err := l.dirIn(dir, false)
	if err != nil {
		return "", err
	}
	p := path.Join(rel, name)
	fi, err := l.FS.Lstat(p)
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%w: %s is not a regular file", ErrNotConfined, path.Join(l.Root, p))
	}
	return p, nil
}

// MkdirAll creates dir and its parents beneath the root.
func (l *Local) MkdirAll(_ context.Context, dir string) error {
	_, err := l.dirIn(dir, true)
	return err
}

// NewRecords creates a temp file in dir.
func (l *Local) NewRecords(_ context.Context, dir string) (RecordsWriter, error) {
	rel, err := l.dirIn(dir, false)
	if err != nil {
		return nil, err
	}
	f, err := l.FS.CreateTemp(rel, ".records.jsonl.*")
	if err != nil {
		return nil, err
	}
	w := &localRecords{fs: l.FS, dir: rel, f: f}
	// Direct I/O needs the file itself; a test's FS seam gets the cache.
	if osf := osFile(f); osf != nil && setDirect(osf, true) == nil {
		w.direct = newDirectWriter(osf)
	}
	return w, nil
}

// osFile is the *os.File behind f, or nil.
func osFile(f atomicfile.File) *os.File {
	switch f := f.(type) {
	case *os.File:
		return f
	case interface{ OSFile() *os.File }:
		return f.OSFile()
	}
	return nil
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
// it. Started as the
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
	faultpoint.Hit(faultpoint.StoreRecordsSynced)
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
	rel, err := l.dirIn(dir, false)
	if err != nil {
		return err
	}
	return atomicfile.Publish(l.FS, path.Join(rel, ManifestFile), data)
}

// ReadManifest reads dir/manifest.json.
func (l *Local) ReadManifest(_ context.Context, dir string) ([]byte, error) {
	p, err := l.fileIn(dir, ManifestFile)
	if err != nil {
		return nil, err
	}
	rc, err := l.FS.Open(p)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(io.LimitReader(rc, 64<<20))
}

// OpenRecords opens a records file.
func (l *Local) OpenRecords(_ context.Context, dir, name string) (io.ReadCloser, error) {
	p, err := l.fileIn(dir, name)
	if err != nil {
		return nil, err
	}
	return l.FS.Open(p)
}

// List names the entries of dir.
func (l *Local) List(_ context.Context, dir string) ([]string, error) {
	rel, err := l.dirIn(dir, false)
	if err != nil {
		return nil, err
	}
	return l.FS.ReadDir(rel)
}
