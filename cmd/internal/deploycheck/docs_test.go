package deploycheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// repoPath is a path into this repository as the docs write one: pkg/...
// or cmd/..., not part of a longer path (k8s.io/apimachinery/pkg/... is
// another module's).
var repoPath = regexp.MustCompile(`(?:^|[^A-Za-z0-9_./-])((?:pkg|cmd)/[A-Za-z0-9_./*-]*)`)

// goName is a Go identifier after a package path (pkg/x.Name).
var goName = regexp.MustCompile(`\.[A-Z][A-Za-z0-9_]*$`)

// docPaths lists the repository paths a text names, each once, with
// trailing punctuation, Go's "/..." pattern and identifiers (".Name") cut.
func docPaths(text string) []string {
	var out []string
	for _, m := range repoPath.FindAllStringSubmatch(text, -1) {
		p := strings.TrimSuffix(m[1], "/...")
		p = goName.ReplaceAllString(strings.TrimRight(p, "./"), "")
		if p == "pkg" || p == "cmd" || strings.Contains(p, "*") {
			continue // the tree itself, or a pattern ("cmd/*")
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

func TestDocPaths(t *testing.T) {
	got := docPaths("see `pkg/wire/rollout`, pkg/ctlplane/phase.go: and ./cmd/...; " +
		"k8s.io/apimachinery/pkg/util, cmd/* and pkg/wire/rollout again; (cmd/gymctl), " +
		"pkg/transport/httpserver.NewRouter.")
	want := []string{"pkg/wire/rollout", "pkg/ctlplane/phase.go", "cmd/gymctl", "pkg/transport/httpserver"}
	if !slices.Equal(got, want) {
		t.Fatalf("docPaths = %q, want %q", got, want)
	}
}

// TestDocs_PathsExist keeps the folder map true: every pkg/... and cmd/...
// path that README.md, docs/*.md or a file under deploy/ names exists.
func TestDocs_PathsExist(t *testing.T) {
	root := repoRoot(t)
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	// The scale log is history: it names files as they were at each run.
	files = slices.DeleteFunc(files, func(f string) bool { return filepath.Base(f) == "scale-log.md" })
	files = append(files, filepath.Join(root, "README.md"))
	err = filepath.WalkDir(filepath.Join(root, "deploy"), func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		for _, p := range docPaths(string(b)) {
			if _, err := os.Stat(filepath.Join(root, p)); err != nil {
				t.Errorf("%s names %s, which does not exist", rel, p)
			}
		}
	}
}
