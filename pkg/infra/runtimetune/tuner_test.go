package runtimetune_test

import (
	"context"
	"math"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
)

// gcSettings reads GOGC (off reads as a negative percent) and the memory
// limit without changing them.
func gcSettings() (gogc int64, limit int64) {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64()), int64(s[1].Value.Uint64())
}

// wantGoDefaults fails t unless GOGC is 100 with no memory limit.
func wantGoDefaults(t *testing.T, when string) {
	t.Helper()
	if gogc, limit := gcSettings(); gogc != 100 || limit != math.MaxInt64 {
		t.Fatalf("%s: GOGC = %d, limit = %d; want 100 and no limit", when, gogc, limit)
	}
}

// Ensure on, off and the empty default are valid and anything else is
// refused with an error naming the key.
func TestConfig_Validate(t *testing.T) {
	t.Parallel()
	for _, m := range []runtimetune.Mode{runtimetune.On, runtimetune.Off, ""} {
		if err := (runtimetune.Config{Tuning: m}).Validate(); err != nil {
			t.Errorf("runtime.tuning %q: %v", m, err)
		}
	}
	for _, m := range []runtimetune.Mode{"maybe", "ON", "1", "true"} {
		err := (runtimetune.Config{Tuning: m}).Validate()
		if err == nil || !strings.Contains(err.Error(), "runtime.tuning") {
			t.Errorf("runtime.tuning %q: err = %v, want one naming runtime.tuning", m, err)
		}
	}
	if got := (runtimetune.Config{}).EffectiveMode(); got != runtimetune.DefaultMode {
		t.Errorf("empty mode is %q, want the default %q", got, runtimetune.DefaultMode)
	}
	if got := runtimetune.DefaultConfig().EffectiveMode(); got != runtimetune.DefaultMode {
		t.Errorf("DefaultConfig's mode is %q, want %q", got, runtimetune.DefaultMode)
	}
}

// Ensure a checkpoint's hold defers collections under a memory limit, a
// restore's size widens that limit, and the last finish gives back GOGC and
// the limit as they were. (Not parallel: GC settings belong to the process.)
func TestTuner_CheckpointHoldIsRestoredAfterwards(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	tn := runtimetune.New(runtimetune.Config{Tuning: runtimetune.On})

	tn.CheckpointStarted()
	gogc, first := gcSettings()
	if gogc != runtimetune.HeldGCPercent || first == math.MaxInt64 {
		t.Fatalf("during a checkpoint GOGC = %d, limit = %d; want %d under a bound", gogc, first, runtimetune.HeldGCPercent)
	}
	tn.CheckpointStarted() // a second server of the process
	tn.RestoreSized(1 << 30)
	if _, widened := gcSettings(); widened <= first {
		t.Fatalf("limit %d after a restore sized 1 GiB, want above %d", widened, first)
	}
	tn.CheckpointFinished()
	if gogc, _ := gcSettings(); gogc != runtimetune.HeldGCPercent {
		t.Fatalf("with one checkpoint left GOGC = %d, want still deferred", gogc)
	}
	tn.CheckpointFinished()
	wantGoDefaults(t, "after the last checkpoint finished")
	// A finish without a start changes nothing.
	tn.CheckpointFinished()
	wantGoDefaults(t, "after an unmatched finish")

	done := tn.RequestDecoding()
	if gogc, _ := gcSettings(); gogc != runtimetune.HeldGCPercent {
		t.Fatalf("while a request decodes GOGC = %d, want %d", gogc, runtimetune.HeldGCPercent)
	}
	done()
	wantGoDefaults(t, "after the request decoded")
	tn.InstallStarting(64 << 20)()
	wantGoDefaults(t, "after an install readied and released the heap")
}

// Ensure a Tuner that is off, and a nil one, leave every runtime setting
// as it is, and RunIdle returns at once. (Not parallel: GC settings belong
// to the process.)
func TestTuner_OffDoesNothing(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	for _, tn := range []*runtimetune.Tuner{runtimetune.New(runtimetune.Config{Tuning: runtimetune.Off}), nil} {
		if tn.On() {
			t.Fatal("an off Tuner reports on")
		}
		undo := tn.SetServerGC(func(string) string { return "" })
		wantGoDefaults(t, "after SetServerGC off")
		tn.CheckpointStarted()
		tn.RestoreSized(1 << 30)
		wantGoDefaults(t, "during a checkpoint off")
		done := tn.RequestDecoding()
		wantGoDefaults(t, "while a request decodes off")
		tn.InstallStarting(64 << 20)()
		done()
		tn.CheckpointFinished()
		undo()
		// Not cancelled: off, RunIdle must return without waiting for it.
		tn.RunIdle(context.Background())
		wantGoDefaults(t, "after everything off")
	}
}
