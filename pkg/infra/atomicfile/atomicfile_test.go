package atomicfile_test

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/gymfleet/gymfleet/pkg/infra/atomicfile"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// names lists dir's entries, sorted.
func names(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestWriteFile_CreatesAndReplaces(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "manifest.json")
	if err := atomicfile.WriteFile(atomicfile.OS, path, []byte("first")); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, path); got != "first" {
		t.Fatalf("content = %q", got)
	}
	if err := atomicfile.WriteFile(atomicfile.OS, path, []byte("second, longer")); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, path); got != "second, longer" {
		t.Fatalf("content after replace = %q", got)
	}
	if got := names(t, dir); !slices.Equal(got, []string{"manifest.json"}) {
		t.Fatalf("directory holds %q; a temp file was left", got)
	}
}

func TestWriteFile_RelativePath(t *testing.T) {
	t.Chdir(t.TempDir())
	if err := atomicfile.WriteFile(atomicfile.OS, "plain.txt", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, "plain.txt"); got != "x" {
		t.Fatalf("content = %q", got)
	}
	if got := names(t, "."); !slices.Equal(got, []string{"plain.txt"}) {
		t.Fatalf("directory holds %q", got)
	}
}

func TestPublish_CreateOnly(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "MANIFEST")
	if err := atomicfile.Publish(atomicfile.OS, path, []byte("one")); err != nil {
		t.Fatal(err)
	}
	err := atomicfile.Publish(atomicfile.OS, path, []byte("two"))
	if !errors.Is(err, atomicfile.ErrExists) || !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second Publish = %v, want ErrExists", err)
	}
	if got := readFile(t, path); got != "one" {
		t.Fatalf("Publish replaced the file: %q", got)
	}
	if got := names(t, dir); !slices.Equal(got, []string{"MANIFEST"}) {
		t.Fatalf("directory holds %q; a temp file was left", got)
	}
}

func TestPublish_ConcurrentPublishersOneWins(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "MANIFEST")
	const writers = 16
	errs := make([]error, writers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = atomicfile.Publish(atomicfile.OS, path, []byte(fmt.Sprintf("writer %d", i)))
		}()
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil:
			if winner >= 0 {
				t.Fatalf("writers %d and %d both published", winner, i)
			}
			winner = i
		case !errors.Is(err, atomicfile.ErrExists):
			t.Fatalf("writer %d: %v, want ErrExists", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no writer published")
	}
	if got, want := readFile(t, path), fmt.Sprintf("writer %d", winner); got != want {
		t.Fatalf("content = %q, want the winner's %q", got, want)
	}
	if got := names(t, dir); !slices.Equal(got, []string{"MANIFEST"}) {
		t.Fatalf("directory holds %q; temp files were left", got)
	}
}

func TestWriteTemp(t *testing.T) {
	dir := t.TempDir()
	tmp, err := atomicfile.WriteTemp(atomicfile.OS, dir, "rec.*.tmp", func(w io.Writer) error {
		_, err := io.WriteString(w, "payload")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(tmp) != dir || readFile(t, tmp) != "payload" {
		t.Fatalf("temp file %q", tmp)
	}
	wantErr := errors.New("encoder failed")
	_, err = atomicfile.WriteTemp(atomicfile.OS, dir, "rec.*.tmp", func(w io.Writer) error {
		_, _ = io.WriteString(w, "partial")
		return wantErr
	})
	if !errors.Is(err, wantErr) {
		t.Fatalf("err = %v, want the callback's", err)
	}
	if got := names(t, dir); !slices.Equal(got, []string{filepath.Base(tmp)}) {
		t.Fatalf("directory holds %q; the failed temp file was left", got)
	}
}

// faultyFS is the real filesystem with one operation failing.
type faultyFS struct {
	atomicfile.FS
	fail string // "create", "write", "sync", "close", "rename", "link", "syncdir"
	err  error
}

func (f faultyFS) CreateTemp(dir, pattern string) (atomicfile.File, error) {
	if f.fail == "create" {
		return nil, f.err
	}
	file, err := f.FS.CreateTemp(dir, pattern)
	if err != nil {
		return nil, err
	}
	return faultyFile{File: file, fs: f}, nil
}

func (f faultyFS) Rename(o, n string) error {
	if f.fail == "rename" {
		return f.err
	}
	return f.FS.Rename(o, n)
}

func (f faultyFS) Link(o, n string) error {
	if f.fail == "link" {
		return f.err
	}
	return f.FS.Link(o, n)
}

func (f faultyFS) SyncDir(dir string) error {
	if f.fail == "syncdir" {
		return f.err
	}
	return f.FS.SyncDir(dir)
}

type faultyFile struct {
	atomicfile.File
	fs faultyFS
}

func (f faultyFile) Write(b []byte) (int, error) {
	if f.fs.fail == "write" {
		return 0, f.fs.err
	}
	return f.File.Write(b)
}

func (f faultyFile) Sync() error {
	if f.fs.fail == "sync" {
		return f.fs.err
	}
	return f.File.Sync()
}

func (f faultyFile) Close() error {
	err := f.File.Close()
	if f.fs.fail == "close" {
		return f.fs.err
	}
	return err
}

func TestFailingFS(t *testing.T) {
	ops := []string{"create", "write", "sync", "close", "rename", "link", "syncdir"}
	writers := []struct {
		name string
		fn   func(atomicfile.FS, string, []byte) error
		uses map[string]bool // operations the writer performs
	}{
		{"WriteFile", atomicfile.WriteFile, map[string]bool{"create": true, "write": true, "sync": true, "close": true, "rename": true, "syncdir": true}},
		{"Publish", atomicfile.Publish, map[string]bool{"create": true, "write": true, "sync": true, "close": true, "link": true, "syncdir": true}},
	}
	for _, w := range writers {
		for _, op := range ops {
			t.Run(w.name+"/"+op, func(t *testing.T) {
				dir := t.TempDir()
				path := filepath.Join(dir, "target")
				injected := fmt.Errorf("injected %s failure", op)
				err := w.fn(faultyFS{FS: atomicfile.OS, fail: op, err: injected}, path, []byte("data"))
				if !w.uses[op] {
					if err != nil {
						t.Fatalf("%s does not %s, yet failed: %v", w.name, op, err)
					}
					return
				}
				if !errors.Is(err, injected) {
					t.Fatalf("err = %v, want the injected failure", err)
				}
				want := []string(nil)
				if op == "syncdir" {
					// The file is in place; only its durability is unknown,
					// which the error reports.
					want = []string{"target"}
				}
				if got := names(t, dir); !slices.Equal(got, want) {
					t.Fatalf("directory holds %q, want %q", got, want)
				}
			})
		}
	}
}

func TestOS_Helpers(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "a", "b")
	if err := atomicfile.OS.MkdirAll(sub); err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.WriteFile(atomicfile.OS, filepath.Join(sub, "f"), []byte("x")); err != nil {
		t.Fatal(err)
	}
	got, err := atomicfile.OS.ReadDir(sub)
	if err != nil || !slices.Equal(got, []string{"f"}) {
		t.Fatalf("ReadDir = %q, %v", got, err)
	}
	rc, err := atomicfile.OS.Open(filepath.Join(sub, "f"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(b) != "x" {
		t.Fatalf("Open read %q, %v", b, err)
	}
	if err := atomicfile.OS.SyncDir(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("SyncDir of a missing directory = %v", err)
	}
	if err := atomicfile.OS.Link(filepath.Join(sub, "f"), filepath.Join(sub, "f")); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("Link onto an existing name = %v, want fs.ErrExist", err)
	}
	if _, err := atomicfile.OS.ReadDir(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("ReadDir of a missing directory = %v", err)
	}
}

// InRoot writes and publishes beneath its root with names relative to it,
// and no name leads out of it: not an absolute one, not "..", not a
// symbolic link to outside.
func TestInRoot(t *testing.T) {
	base := t.TempDir()
	rootDir, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(rootDir, "d"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r, err := os.OpenRoot(rootDir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	fsys := atomicfile.InRoot(r)

	if err := atomicfile.WriteFile(fsys, "d/f", []byte("one")); err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.Publish(fsys, "d/p", []byte("two")); err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.Publish(fsys, "d/p", []byte("three")); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("a second publish: %v, want ErrExist", err)
	}
	for name, want := range map[string]string{"f": "one", "p": "two"} {
		if b, err := os.ReadFile(filepath.Join(rootDir, "d", name)); err != nil || string(b) != want {
			t.Errorf("d/%s = %q, %v; want %q", name, b, err, want)
		}
	}
	names, err := fsys.ReadDir("d")
	if slices.Sort(names); err != nil || !slices.Equal(names, []string{"f", "p"}) {
		t.Errorf("ReadDir(d) = %v, %v; want f and p (no temp file left)", names, err)
	}
	f, err := fsys.CreateTemp("d", ".x.*.tmp")
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(f.Name()) != "d" || f.(atomicfile.RootFile).OSFile() == nil {
		t.Errorf("temp file named %q, want a name in d relative to the root", f.Name())
	}
	f.Close()
	if fi, err := fsys.Lstat(f.Name()); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("Lstat(%s) = %v, %v", f.Name(), fi, err)
	}

	if err := os.Symlink(outside, filepath.Join(rootDir, "link")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{filepath.Join(outside, "f"), "../outside/f", "link/f"} {
		if err := atomicfile.WriteFile(fsys, name, []byte("x")); err == nil {
			t.Errorf("WriteFile(%s) succeeded outside the root", name)
		}
		if err := fsys.MkdirAll(name); err == nil {
			t.Errorf("MkdirAll(%s) succeeded outside the root", name)
		}
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("the directory outside the root holds %v", entries)
	}
}
