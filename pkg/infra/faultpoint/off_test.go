//go:build !gymfleet_faults || !unix

package faultpoint_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/infra/faultpoint"
)

// TestHit_IgnoredWithoutTheTag arms every point and hits it: a build
// without gymfleet_faults neither dies nor reads or writes the files.
func TestHit_IgnoredWithoutTheTag(t *testing.T) {
	if faultpoint.Enabled {
		t.Fatal("Enabled in a build without the tag")
	}
	dir := t.TempDir()
	arm, trace := filepath.Join(dir, "arm"), filepath.Join(dir, "trace")
	t.Setenv(faultpoint.EnvFile, arm)
	t.Setenv(faultpoint.EnvTrace, trace)
	for _, p := range faultpoint.All() {
		if err := os.WriteFile(arm, []byte(p), 0o644); err != nil {
			t.Fatal(err)
		}
		faultpoint.Hit(p)
	}
	if _, err := os.Stat(trace); !os.IsNotExist(err) {
		t.Fatalf("the trace file was written: %v", err)
	}
}
