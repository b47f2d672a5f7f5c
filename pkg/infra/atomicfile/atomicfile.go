// Package atomicfile is the fleet's one way to make a file durable: write a
// temp file in the target's directory, fsync it, rename (or hard-link) it into
// place, and fsync the directory. Every durable write goes through it, over an
// FS seam so tests can fail one exact operation (an fsync, a rename). The
// seam has two real filesystems: OS, on whole paths, and InRoot, on names
// beneath one directory that cannot resolve outside it (os.Root).
package atomicfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/infra/faultpoint"
)

// File is a file being written.
type File interface {
	io.Writer
	Sync() error
	Close() error
	Name() string
}

// FS is the filesystem seam. OS is the real one.
type FS interface {
	CreateTemp(dir, pattern string) (File, error)
	Rename(oldpath, newpath string) error
	// Link creates newpath as a hard link to oldpath and fails with an error
	// matching fs.ErrExist if newpath exists: it never replaces.
	Link(oldpath, newpath string) error
	Remove(name string) error
	SyncDir(dir string) error
	MkdirAll(dir string) error
	Open(name string) (io.ReadCloser, error)
	ReadDir(dir string) ([]string, error)
	// Lstat describes name itself: a symbolic link is not followed.
	Lstat(name string) (fs.FileInfo, error)
}

// OS is the real filesystem.
var OS FS = osFS{}

type osFS struct{}

func (osFS) CreateTemp(dir, pattern string) (File, error) { return os.CreateTemp(dir, pattern) }
func (osFS) Rename(o, n string) error                     { return os.Rename(o, n) }
func (osFS) Link(o, n string) error                       { return os.Link(o, n) }
func (osFS) Remove(name string) error                     { return os.Remove(name) }
func (osFS) MkdirAll(dir string) error                    { return os.MkdirAll(dir, 0o755) }
func (osFS) Open(name string) (io.ReadCloser, error)      { return os.Open(name) }
func (osFS) Lstat(name string) (fs.FileInfo, error)       { return os.Lstat(name) }

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		d.Close()
		return err
	}
	return d.Close()
}

func (osFS) ReadDir(dir string) ([]string, error) {
	es, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(es))
	for i, e := range es {
		names[i] = e.Name()
	}
	return names, nil
}

// InRoot is the filesystem beneath r: every name is relative to r, and one
// that is absolute, climbs out with "..", or crosses a symbolic link leading
// out of r fails (os.Root), whatever the caller was given. Files it creates
// are os.Files, named by their name relative to r (what Rename, Link and
// Remove take back).
func InRoot(r *os.Root) FS { return rootFS{r} }

type rootFS struct{ r *os.Root }

// RootFile is a file InRoot created: its Name is relative to the root, and
// OSFile is the file itself (for direct I/O).
type RootFile struct {
	*os.File
	name string
}

// Name is the file's name relative to the root.
func (f RootFile) Name() string { return f.name }

// OSFile is the open file.
func (f RootFile) OSFile() *os.File { return f.File }

// CreateTemp creates a new file in dir named by pattern, whose last "*" is
// replaced by a random string, as os.CreateTemp does (os.Root has none).
func (r rootFS) CreateTemp(dir, pattern string) (File, error) {
	prefix, suffix := pattern, ""
	if i := strings.LastIndexByte(pattern, '*'); i >= 0 {
		prefix, suffix = pattern[:i], pattern[i+1:]
	}
	for try := 0; ; try++ {
		name := path.Join(dir, prefix+strconv.FormatUint(rand.Uint64(), 36)+suffix)
		f, err := r.r.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) && try < 100 {
			continue
		}
		if err != nil {
			return nil, err
		}
		return RootFile{File: f, name: name}, nil
	}
}

func (r rootFS) Rename(o, n string) error                { return r.r.Rename(o, n) }
func (r rootFS) Link(o, n string) error                  { return r.r.Link(o, n) }
func (r rootFS) Remove(name string) error                { return r.r.Remove(name) }
func (r rootFS) MkdirAll(dir string) error               { return r.r.MkdirAll(dir, 0o755) }
func (r rootFS) Open(name string) (io.ReadCloser, error) { return r.r.Open(name) }
func (r rootFS) Lstat(name string) (fs.FileInfo, error)  { return r.r.Lstat(name) }

func (r rootFS) SyncDir(dir string) error {
	d, err := r.r.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		d.Close()
		return err
	}
	return d.Close()
}

func (r rootFS) ReadDir(dir string) ([]string, error) {
	d, err := r.r.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.Readdirnames(-1)
}

// WriteTemp writes data through fn into a new temp file in dir and fsyncs it.
// The caller renames or links it into place; on error the temp file is gone.
func WriteTemp(fsys FS, dir, pattern string, fn func(io.Writer) error) (tmp string, err error) {
	f, err := fsys.CreateTemp(dir, pattern)
	if err != nil {
		return "", fmt.Errorf("create temp file in %s: %w", dir, err)
	}
	// A local name, not the tmp result: the error returns below set tmp to
	// "" before the deferred cleanup runs.
	name := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = fsys.Remove(name)
		}
	}()
	if err = fn(f); err != nil {
		return "", err
	}
	// A failed fsync means the data may never reach the disk; the write fails
	// and is never retried on the same file (PostgreSQL's "fsyncgate").
	if err = f.Sync(); err != nil {
		return "", fmt.Errorf("fsync %s: %w", name, err)
	}
	if err = f.Close(); err != nil {
		return "", fmt.Errorf("close %s: %w", name, err)
	}
	faultpoint.Hit(faultpoint.AtomicTempSynced)
	return name, nil
}

// WriteFile replaces path with data durably: temp file, fsync, rename, fsync
// of the directory. Readers see the old content or the new, never a mix.
func WriteFile(fsys FS, path string, data []byte) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := WriteTemp(fsys, dir, "."+base+".*.tmp", func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
	if err != nil {
		return err
	}
	if err := fsys.Rename(tmp, path); err != nil {
		_ = fsys.Remove(tmp)
		return fmt.Errorf("rename %s to %s: %w", tmp, path, err)
	}
	faultpoint.Hit(faultpoint.AtomicRenamed)
	if err := fsys.SyncDir(dir); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

// ErrExists reports that a create-only publish found the file already there.
var ErrExists = fs.ErrExist

// Publish creates path with data durably and never replaces it: the data is
// written to a temp file and fsynced, then hard-linked to path (link fails if
// path exists, so of two racing writers exactly one publishes), then the temp
// name is removed and the directory fsynced. It returns an error matching
// ErrExists if path was already there.
func Publish(fsys FS, path string, data []byte) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := WriteTemp(fsys, dir, "."+base+".*.tmp", func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
	if err != nil {
		return err
	}
	linkErr := fsys.Link(tmp, path)
	if linkErr == nil {
		faultpoint.Hit(faultpoint.AtomicLinked)
	}
	_ = fsys.Remove(tmp)
	if linkErr != nil {
		if errors.Is(linkErr, fs.ErrExist) {
			return fmt.Errorf("publish %s: %w", path, fs.ErrExist)
		}
		return fmt.Errorf("link %s to %s: %w", tmp, path, linkErr)
	}
	if err := fsys.SyncDir(dir); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}
