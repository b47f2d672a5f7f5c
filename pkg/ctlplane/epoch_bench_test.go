package ctlplane

import (
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkEpochCheck is the check every data reply makes: the epoch
// file unchanged since the last one.
func BenchmarkEpochCheck(b *testing.B) {
	path := filepath.Join(b.TempDir(), "EPOCH")
	if err := os.WriteFile(path, []byte("3\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	e, err := newEpochState(path)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := e.check(false); err != nil {
			b.Fatal(err)
		}
	}
}
