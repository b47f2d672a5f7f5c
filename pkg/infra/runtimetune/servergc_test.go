package runtimetune

import (
	"runtime/debug"
	"testing"
)

// Ensure a tuned server's GC goal is ServerGCPercent unless GOGC is set,
// and that undo gives back the goal before it. (Not parallel: GC settings
// belong to the process.)
func TestTuner_SetServerGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	tn := New(Config{Tuning: On})

	undo := tn.SetServerGC(func(string) string { return "" })
	if got := debug.SetGCPercent(ServerGCPercent); got != ServerGCPercent {
		t.Errorf("without GOGC the GC percent is %d, want %d", got, ServerGCPercent)
	}
	undo()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("after undo the GC percent is %d, want 100 again", got)
	}
	undo = tn.SetServerGC(func(k string) string {
		if k == "GOGC" {
			return "200"
		}
		return ""
	})
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("with GOGC set the GC percent was changed to %d", got)
	}
	undo()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("undo with GOGC set changed the GC percent to %d", got)
	}
}
