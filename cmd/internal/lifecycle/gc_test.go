package lifecycle

import (
	"runtime/debug"
	"testing"
)

func TestSetServerGC(t *testing.T) {
	orig := debug.SetGCPercent(100)
	defer debug.SetGCPercent(orig)

	SetServerGC(func(string) string { return "" })
	if got := debug.SetGCPercent(100); got != ServerGCPercent {
		t.Errorf("without GOGC the GC percent is %d, want %d", got, ServerGCPercent)
	}
	SetServerGC(func(k string) string {
		if k == "GOGC" {
			return "200"
		}
		return ""
	})
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("with GOGC set the GC percent was changed to %d", got)
	}
}
