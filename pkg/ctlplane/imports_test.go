package ctlplane_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Ensure the control plane steers no runtime itself: GC settings and
// memory advice are its Tuning's (pkg/infra/runtimetune), reached only through
// the interface.
func TestImportsNoRuntimeSteering(t *testing.T) {
	t.Parallel()
	forbidden := map[string]bool{
		"runtime/debug": true,
		"github.com/gymfleet/gymfleet/pkg/infra/hugepage":    true,
		"github.com/gymfleet/gymfleet/pkg/infra/runtimetune": true,
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if forbidden[path] {
				t.Errorf("%s imports %s", name, path)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no source files checked")
	}
}
