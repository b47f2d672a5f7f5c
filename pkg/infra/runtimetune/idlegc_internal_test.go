package runtimetune

import (
	"context"
	"math"
	"runtime/debug"
	runtimemetrics "runtime/metrics"
	"slices"
	"testing"
	"time"
)

// Ensure a period is parked only when it allocated at most QuietBytes, ran
// no collection and left at least ParkedGoroutines: the first takes the
// hold, and any other period releases it.
func TestIdleCollections_Next(t *testing.T) {
	t.Parallel()
	ic := IdleCollections{Every: time.Second, QuietBytes: 100, ParkedGoroutines: 10}
	prev := idleSample{allocated: 1000, goroutines: 50}
	cases := []struct {
		name        string
		held        bool
		allocated   uint64 // in the period
		collections uint64 // in the period
		goroutines  uint64
		want        idleAction
	}{
		{"busy", false, 101, 0, 50, idleKeep},
		{"quiet with nothing parked", false, 0, 0, 9, idleKeep},
		{"quiet but collecting", false, 0, 1, 50, idleKeep},
		{"parked", false, 100, 0, 10, idleHold},
		{"still parked", true, 0, 0, 50, idleKeep},
		{"busy again", true, 101, 0, 50, idleRelease},
		{"the parked calls ended", true, 0, 0, 9, idleRelease},
		{"the hold's limit was reached", true, 0, 1, 50, idleRelease},
	}
	for _, c := range cases {
		cur := idleSample{allocated: prev.allocated + c.allocated, collections: prev.collections + c.collections, goroutines: c.goroutines}
		if got := ic.next(c.held, prev, cur); got != c.want {
			t.Errorf("%s: next = %d, want %d", c.name, got, c.want)
		}
	}
}

// recordingHolder records what the idle sampler asks of the holds.
type recordingHolder struct{ calls []string }

func (h *recordingHolder) holdOff(int64) { h.calls = append(h.calls, "hold") }
func (h *recordingHolder) release()      { h.calls = append(h.calls, "release") }

// Ensure run acts on each period's decision and releases the hold it took
// when its context ends.
func TestIdleCollections_RunReleasesItsHoldWhenItEnds(t *testing.T) {
	t.Parallel()
	ic := IdleCollections{Every: time.Second, QuietBytes: 100, ParkedGoroutines: 10}
	ticks := make(chan time.Time)
	samples := make(chan idleSample)
	var h recordingHolder
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ic.run(ctx, ticks, func() idleSample { return <-samples }, &h)
	}()
	parked := idleSample{allocated: 10, goroutines: 50}
	samples <- idleSample{allocated: 0, goroutines: 50}
	ticks <- time.Time{}
	samples <- parked
	samples <- parked // read again once the hold is taken
	ticks <- time.Time{}
	samples <- idleSample{allocated: 20, goroutines: 50} // still parked
	ticks <- time.Time{}
	samples <- idleSample{allocated: 9999, goroutines: 50} // busy
	ticks <- time.Time{}
	samples <- idleSample{allocated: 9999, goroutines: 50} // parked again
	samples <- idleSample{allocated: 9999, goroutines: 50}
	cancel() // the last period (parked) is decided before run waits again
	<-done
	if want := []string{"hold", "release", "hold", "release"}; !slices.Equal(h.calls, want) {
		t.Fatalf("calls %v, want %v", h.calls, want)
	}
}

// Ensure RunIdle turns the process's collections off while it is parked, under
// a memory limit, and gives back GOGC and the limit when it ends. (Not
// parallel: GC settings belong to the process.)
func TestIdleCollections_RunHoldsTheProcessCollections(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	ic := IdleCollections{Every: 5 * time.Millisecond, QuietBytes: math.MaxUint64, ParkedGoroutines: 1}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		(&Tuner{on: true, idle: ic}).RunIdle(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		gogc, limit := gcSettingsNow()
		if gogc < 0 { // off reads as a negative percent
			if limit == math.MaxInt64 {
				t.Fatal("collections held without a memory limit")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GOGC = %d 10 s after RunIdle started in a parked process, want off", gogc)
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if gogc, limit := gcSettingsNow(); gogc != 100 || limit != math.MaxInt64 {
		t.Fatalf("after RunIdle ended GOGC = %d and limit = %d, want 100 and none", gogc, limit)
	}
}

// gcSettingsNow reads GOGC (off reads as a negative percent) and the memory
// limit without changing them.
func gcSettingsNow() (gogc int64, limit uint64) {
	s := []runtimemetrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	runtimemetrics.Read(s)
	return int64(s[0].Value.Uint64()), s[1].Value.Uint64()
}
