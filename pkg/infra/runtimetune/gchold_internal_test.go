package runtimetune

import (
	"math"
	"runtime/debug"
	"testing"
)

// Ensure a hold that needs more room than the holds before it raises the
// limit, one that needs less leaves it, the limit never rises above one set
// before the holds, and the last release restores both settings. (Not
// parallel: GC settings belong to the process.)
func TestGCHolds_ALaterHoldRaisesTheLimitWithinTheOperators(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	var g gcHolds
	limit := func() int64 { return debug.SetMemoryLimit(-1) }

	g.hold(gcHoldHeadroom)
	first := limit()
	if first == math.MaxInt64 || first < gcHoldHeadroom {
		t.Fatalf("limit after a prepare's hold = %d, want a bound of at least %d", first, gcHoldHeadroom)
	}
	g.hold(installHeadroom(1 << 30)) // a restore installing 1 GiB of records
	raised := limit()
	if raised < first+(2<<30) {
		t.Fatalf("limit after a restore's hold of 1 GiB of records = %d, want %d raised by about %d", raised, first, installGrowth<<30)
	}
	g.hold(0)
	if l := limit(); l != raised {
		t.Fatalf("limit after a hold needing less room = %d, want it left at %d", l, raised)
	}
	for range 3 {
		g.release()
	}
	if l := limit(); l != math.MaxInt64 || debug.SetGCPercent(100) != 100 {
		t.Fatalf("after the last release limit = %d, want none and GOGC 100", l)
	}

	const operatorLimit = 512 << 20
	debug.SetMemoryLimit(operatorLimit)
	g.hold(installHeadroom(1 << 30))
	if l := limit(); l != operatorLimit {
		t.Fatalf("limit during a hold under an operator's %d = %d, want the operator's", operatorLimit, l)
	}
	g.release()
	if l := limit(); l != operatorLimit {
		t.Fatalf("after the release limit = %d, want the operator's %d", l, operatorLimit)
	}
}

// Ensure widening raises a hold's limit without counting another hold (one
// release ends it), never above a limit set before the hold, and does
// nothing without a hold. (Not parallel: GC settings belong to the process.)
func TestGCHolds_WideningRaisesTheLimitOfTheHoldTaken(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	var g gcHolds
	limit := func() int64 { return debug.SetMemoryLimit(-1) }

	g.widen(1 << 30)
	if l := limit(); l != math.MaxInt64 || debug.SetGCPercent(100) != 100 {
		t.Fatalf("widening without a hold set limit %d; want none and GOGC 100", l)
	}
	g.hold(gcHoldHeadroom)
	first := limit()
	g.widen(installHeadroom(1 << 30))
	if l := limit(); l < first+(2<<30) {
		t.Fatalf("limit after widening for 1 GiB of records = %d, want %d raised by about %d", l, first, installGrowth<<30)
	}
	g.release()
	if l := limit(); l != math.MaxInt64 || debug.SetGCPercent(100) != 100 {
		t.Fatalf("after the one release limit = %d, want none and GOGC 100", l)
	}

	const operatorLimit = 512 << 20
	debug.SetMemoryLimit(operatorLimit)
	g.hold(0)
	g.widen(installHeadroom(1 << 30))
	if l := limit(); l != operatorLimit {
		t.Fatalf("limit after widening under an operator's %d = %d, want the operator's", operatorLimit, l)
	}
	g.release()
}

// Ensure a restore's headroom grows with its records, never below a prepare's.
func TestInstallHeadroom(t *testing.T) {
	if h := installHeadroom(0); h != gcHoldHeadroom {
		t.Errorf("installHeadroom(0) = %d, want %d", h, gcHoldHeadroom)
	}
	if h := installHeadroom(1 << 30); h != installGrowth<<30 {
		t.Errorf("installHeadroom(1 GiB) = %d, want %d", h, installGrowth<<30)
	}
}

// Ensure the heap a restore readies follows its records, within the hold's
// headroom: little records, a little heap (none under PrepareHeap's least).
func TestInstallHeapGrowth(t *testing.T) {
	for _, c := range []struct{ records, want int64 }{
		{0, 0},
		{1 << 20, 8 << 20},
		{32 << 20, gcHoldHeadroom},
		{1 << 30, installGrowth << 30},
	} {
		if got := installHeapGrowth(c.records); got != c.want {
			t.Errorf("installHeapGrowth(%d) = %d, want %d", c.records, got, c.want)
		}
		if got := installHeapGrowth(c.records); got > installHeadroom(c.records) {
			t.Errorf("installHeapGrowth(%d) = %d, above the hold's headroom %d", c.records, got, installHeadroom(c.records))
		}
	}
}

// Ensure a checkpoint's hold defers collections (a positive GOGC, which
// never waits for a mark under way) and the idle sampler's turns them off,
// the first hold deciding for all until the last release. (Not parallel:
// GC settings belong to the process.)
func TestGCHolds_TheFirstHoldDecidesWhetherCollectionsAreDeferredOrOff(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	var g gcHolds
	gogc := func() int64 {
		p, _ := gcSettingsNow()
		return p
	}
	for _, c := range []struct {
		name          string
		first, second func(int64)
		want          int64
	}{
		{"a checkpoint first", g.hold, g.holdOff, heldGCPercent},
		{"the idle sampler first", g.holdOff, g.hold, -1},
	} {
		c.first(gcHoldHeadroom)
		if p := gogc(); p != c.want {
			t.Fatalf("%s: GOGC = %d after the first hold, want %d", c.name, p, c.want)
		}
		c.second(gcHoldHeadroom)
		if p := gogc(); p != c.want {
			t.Fatalf("%s: GOGC = %d after the second hold, want %d", c.name, p, c.want)
		}
		g.release()
		if p := gogc(); p != c.want {
			t.Fatalf("%s: GOGC = %d with one hold left, want %d", c.name, p, c.want)
		}
		g.release()
		if p := gogc(); p != 100 {
			t.Fatalf("%s: GOGC = %d after the last release, want 100", c.name, p)
		}
	}
}
