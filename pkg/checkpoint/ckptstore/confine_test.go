package ckptstore_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
)

// confined is a store confined to root, a directory beside outside, which
// the tests check nothing reaches.
type confined struct {
	s             *ckptstore.Store
	root, outside string
}

func newConfined(t *testing.T) confined {
	t.Helper()
	base := t.TempDir()
	c := confined{root: filepath.Join(base, "root"), outside: filepath.Join(base, "outside")}
	for _, d := range []string{c.root, c.outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s, err := ckptstore.Open(c.root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c.s = s
	return c
}

// untouched fails the test if anything was created outside the root.
func (c confined) untouched(t *testing.T) {
	t.Helper()
	err := filepath.WalkDir(c.outside, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != c.outside {
			t.Errorf("%s was created outside the root", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func wantCode(t *testing.T, what string, err error, code apierror.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s succeeded, want %s", what, code)
	}
	if got := apierror.CodeOf(err); got != code {
		t.Fatalf("%s: code %s (%v), want %s", what, got, err, code)
	}
}

// A commit directory that is outside the root, climbs out of it, or
// reaches it through a symbolic link (out of the root or within it) is
// refused as a bad request, and nothing is written anywhere.
func TestStore_CommitConfinedToTheRoot(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name  string
		dir   func(c confined) string
		setup func(t *testing.T, c confined)
	}{
		{"dot-dot after the root", func(c confined) string { return filepath.Join(c.root, "ck") + "/../../outside/ck" }, nil},
		{"dot-dot staying inside", func(c confined) string { return c.root + "/a/../ck" }, nil},
		{"absolute outside", func(c confined) string { return filepath.Join(c.outside, "ck") }, nil},
		{"relative", func(confined) string { return "ck" }, nil},
		{"the root's parent", func(c confined) string { return filepath.Dir(c.root) }, nil},
		{"symlinked gym", func(c confined) string { return filepath.Join(c.root, "ck") }, func(t *testing.T, c confined) {
			symlink(t, c.outside, filepath.Join(c.root, "ck", "gym"))
		}},
		{"symlinked checkpoint dir", func(c confined) string { return filepath.Join(c.root, "ck") }, func(t *testing.T, c confined) {
			symlink(t, c.outside, filepath.Join(c.root, "ck"))
		}},
		{"symlinked instance dir", func(c confined) string { return filepath.Join(c.root, "ck") }, func(t *testing.T, c confined) {
			symlink(t, c.outside, filepath.Join(c.root, "ck", "gym", "environment", "env"))
		}},
		{"relative symlink within the root", func(c confined) string { return filepath.Join(c.root, "ck") }, func(t *testing.T, c confined) {
			if err := os.Mkdir(filepath.Join(c.root, "elsewhere"), 0o755); err != nil {
				t.Fatal(err)
			}
			symlink(t, "../elsewhere", filepath.Join(c.root, "ck", "gym"))
		}},
		{"a file on the way", func(c confined) string { return filepath.Join(c.root, "ck") }, func(t *testing.T, c confined) {
			if err := os.WriteFile(filepath.Join(c.root, "ck"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newConfined(t)
			if tc.setup != nil {
				tc.setup(t, c)
			}
			_, err := c.s.Write(ctx, target(tc.dir(c)), nil, records(3, "x"))
			wantCode(t, "a commit to "+tc.dir(c), err, apierror.InvalidRequest)
			c.untouched(t)
			if entries, _ := os.ReadDir(filepath.Join(c.root, "elsewhere")); len(entries) != 0 {
				t.Errorf("the commit wrote through a symbolic link within the root: %v", entries)
			}
		})
	}
}

// A commit and a restore beneath the root, the root itself included, work.
func TestStore_BeneathTheRoot(t *testing.T) {
	ctx := context.Background()
	c := newConfined(t)
	for _, dir := range []string{c.root, filepath.Join(c.root, "a", "b"), c.root + "/./c//"} {
		if _, err := c.s.Write(ctx, target(dir), nil, records(2, "x")); err != nil {
			t.Fatalf("commit to %s: %v", dir, err)
		}
		if _, recs, _, err := c.s.Read(ctx, target(dir), nil); err != nil || len(recs) != 2 {
			t.Fatalf("read of %s: %d records, %v", dir, len(recs), err)
		}
	}
}

// passwd is a system file the tests point symbolic links at; its first
// byte and its digest must never reach an answer.
func passwd(t *testing.T) (path string, leaks []string) {
	t.Helper()
	const p = "/etc/passwd"
	b, err := os.ReadFile(p)
	if err != nil || len(b) == 0 {
		t.Fatalf("reading %s: %v", p, err)
	}
	sum := sha256.Sum256(b)
	digest := hex.EncodeToString(sum[:])
	line, _, _ := strings.Cut(string(b), "\n")
	return p, []string{digest, digest[:12], line, "'" + string(b[0]) + "'", "looking for beginning"}
}

func noLeak(t *testing.T, err error, leaks []string) {
	t.Helper()
	for _, l := range leaks {
		if strings.Contains(err.Error(), l) {
			t.Errorf("the answer %q holds %q, from the file", err, l)
		}
	}
}

// A restore of a directory whose manifest or records file is a symbolic
// link to a system file is refused without a byte or a digest of it; a
// missing manifest, one that cannot be read and one that is a link are
// the same answer. The server's log gets the difference (Detail).
func TestStore_RestoreNeverEchoesFiles(t *testing.T) {
	ctx := context.Background()
	sys, leaks := passwd(t)
	c := newConfined(t)
	ck := filepath.Join(c.root, "ck")
	inst := target(ck).ParticipantDir()

	_, _, _, missing := c.s.Read(ctx, target(ck), nil)
	wantCode(t, "a restore of a missing directory", missing, apierror.InvalidCheckpointState)

	symlink(t, sys, filepath.Join(inst, ckptstore.ManifestFile))
	_, _, _, linked := c.s.Read(ctx, target(ck), nil)
	wantCode(t, "a restore through a linked manifest", linked, apierror.InvalidCheckpointState)
	noLeak(t, linked, leaks)

	if err := os.Remove(filepath.Join(inst, ckptstore.ManifestFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(inst, ckptstore.ManifestFile), 0o755); err != nil {
		t.Fatal(err)
	}
	_, _, _, unreadable := c.s.Read(ctx, target(ck), nil)
	wantCode(t, "a restore of an unreadable manifest", unreadable, apierror.InvalidCheckpointState)

	if err := os.Remove(filepath.Join(inst, ckptstore.ManifestFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(inst, ckptstore.ManifestFile), []byte("root:x:0:0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, _, garbled := c.s.Read(ctx, target(ck), nil)
	wantCode(t, "a restore of a manifest that is not one", garbled, apierror.InvalidCheckpointState)
	noLeak(t, garbled, []string{"root:x", "'r'"})

	for _, err := range []error{linked, unreadable, garbled} {
		if apierror.From(err).Detail != apierror.From(missing).Detail {
			t.Errorf("answers differ: %q and, for a missing manifest, %q", apierror.From(err).Detail, apierror.From(missing).Detail)
		}
	}
	if ckptstore.Detail(linked) == "" || ckptstore.Detail(linked) == ckptstore.Detail(missing) {
		t.Errorf("the log detail does not tell a link (%q) from a missing manifest (%q)", ckptstore.Detail(linked), ckptstore.Detail(missing))
	}

	// A records file replaced by a link to the system file.
	good := filepath.Join(c.root, "good")
	w, err := c.s.Write(ctx, target(good), nil, records(3, "x"))
	if err != nil {
		t.Fatal(err)
	}
	recs := filepath.Join(target(good).ParticipantDir(), w.Manifest.RecordsFile)
	if err := os.Remove(recs); err != nil {
		t.Fatal(err)
	}
	symlink(t, sys, recs)
	_, _, _, err = c.s.Read(ctx, target(good), nil)
	wantCode(t, "a restore through a linked records file", err, apierror.InvalidCheckpointState)
	noLeak(t, err, leaks)
	noLeak(t, err, []string{w.Manifest.RecordsSHA256[:12]})

	// A records file holding another file's bytes: its digest is not told.
	if err := os.Remove(recs); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(sys)
	if err := os.WriteFile(recs, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, _, err = c.s.Read(ctx, target(good), nil)
	wantCode(t, "a restore of records that are not the manifest's", err, apierror.InvalidCheckpointState)
	noLeak(t, err, leaks)
	if !strings.Contains(ckptstore.Detail(err), leaks[0]) {
		t.Errorf("the log detail %q lacks the digest found", ckptstore.Detail(err))
	}
	c.untouched(t)
}

// A commit into a directory whose manifest is a link to a system file is
// refused without its content, and the file is left as it was.
func TestStore_CommitNeverEchoesAManifest(t *testing.T) {
	ctx := context.Background()
	sys, leaks := passwd(t)
	before, _ := os.ReadFile(sys)
	c := newConfined(t)
	ck := filepath.Join(c.root, "ck")
	symlink(t, sys, filepath.Join(target(ck).ParticipantDir(), ckptstore.ManifestFile))
	_, err := c.s.Write(ctx, target(ck), nil, records(3, "x"))
	wantCode(t, "a commit over a linked manifest", err, apierror.InvalidRequest)
	noLeak(t, err, leaks)
	if after, _ := os.ReadFile(sys); string(after) != string(before) {
		t.Fatalf("%s changed", sys)
	}

	// A manifest that is a regular file but not a manifest.
	other := filepath.Join(c.root, "other")
	if err := os.MkdirAll(target(other).ParticipantDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target(other).ParticipantDir(), ckptstore.ManifestFile), before, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = c.s.Write(ctx, target(other), nil, records(3, "x"))
	wantCode(t, "a commit over a manifest that is not one", err, apierror.CheckpointConflict)
	noLeak(t, err, leaks)
	c.untouched(t)
}

// Beneath's lexical rules.
func TestBeneath(t *testing.T) {
	for _, tc := range []struct {
		root, dir, want string
		ok              bool
	}{
		{"/r", "/r", ".", true},
		{"/r", "/r/a/b", "a/b", true},
		{"/r", "/r/a/./b/", "a/b", true},
		{"/r", "/r/a/../b", "", false},
		{"/r", "/rr/a", "", false},
		{"/r", "/", "", false},
		{"/r", "r/a", "", false},
		{"", "/r/a", "", false},
		{"/", "/etc", "etc", true},
	} {
		got, err := ckptstore.Beneath(tc.root, tc.dir)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("Beneath(%q, %q) = %q, %v; want %q, ok %v", tc.root, tc.dir, got, err, tc.want, tc.ok)
		}
		if err != nil && !errors.Is(err, ckptstore.ErrNotConfined) {
			t.Errorf("Beneath(%q, %q): %v is not ErrNotConfined", tc.root, tc.dir, err)
		}
	}
}
