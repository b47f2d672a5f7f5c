package runtimetune

import (
	"context"
	runtimemetrics "runtime/metrics"
	"time"
)

// IdleCollections defers garbage collection while the process is parked:
// many goroutines exist (requests waiting on calls downstream) and it has
// allocated almost nothing for a sample period.
//
// Such a process has nothing to collect, but the runtime still forces a
// collection once two minutes pass without one, and marking every parked
// goroutine's stack is what a collection costs there. The runtime notices
// the two minutes late, when the idle process next wakes, so the forced
// collection starts with the first request after the quiet spell, and when
// that request is a prepare, the prepare waits for the whole mark
// (debug.SetGCPercent(-1) waits for one under way).
//
// The hold is the checkpoints' (gcHolds), taken turning collections off
// rather than deferring them (holdOff), so a prepare arriving during it only
// counts another hold and waits for nothing, and its memory limit keeps
// the deferral safe: past the headroom the runtime collects anyway. The
// first period that allocates more than QuietBytes, leaves fewer than
// ParkedGoroutines, or in which a collection ran (the process
// reached the hold's limit: it is not parked) ends it; the next parked
// period takes it again, its limit set from what the process holds then. A
// checkpoint's own hold, if taken, keeps collections held until its reopen.
// Garbage made before a quiet spell stays until it ends or the limit is
// reached.
type IdleCollections struct {
	// Every is how often the process's allocations are sampled.
	Every time.Duration
	// QuietBytes is the most a quiet period allocates.
	QuietBytes uint64
	// ParkedGoroutines is the fewest goroutines a parked process has: below
	// it a collection is cheap and may return memory after a burst.
	ParkedGoroutines uint64
}

// DefaultIdleCollections samples every 5 s and defers collections with at
// least 1,000 goroutines and under 4 MiB allocated in a period: a server
// with nothing in flight runs a few dozen goroutines, and one starting
// rollouts steadily allocates well over that.
func DefaultIdleCollections() IdleCollections {
	return IdleCollections{Every: 5 * time.Second, QuietBytes: 4 << 20, ParkedGoroutines: 1000}
}

// runEvery samples the process until ctx ends, holding collections off through
// g while it is parked, and releases its hold before returning.
func (ic IdleCollections) runEvery(ctx context.Context, g collectionHolder) {
	t := time.NewTicker(ic.Every)
	defer t.Stop()
	ic.run(ctx, t.C, readIdleSample, g)
}

// idleSample is what a period is judged by: the bytes allocated and the
// collections completed since the process started, and the goroutines that
// exist.
type idleSample struct {
	allocated   uint64
	collections uint64
	goroutines  uint64
}

func readIdleSample() idleSample {
	s := []runtimemetrics.Sample{
		{Name: "/gc/heap/allocs:bytes"},
		{Name: "/gc/cycles/total:gc-cycles"},
		{Name: "/sched/goroutines:goroutines"},
	}
	runtimemetrics.Read(s)
	return idleSample{allocated: s[0].Value.Uint64(), collections: s[1].Value.Uint64(), goroutines: s[2].Value.Uint64()}
}

// idleAction is what one sample period asks of the hold.
type idleAction int

const (
	idleKeep idleAction = iota
	idleHold
	idleRelease
)

// next decides, from the period that ran from prev to cur, what the hold
// does: a parked period (quiet, no collection, many goroutines) takes it,
// any other period releases it.
func (ic IdleCollections) next(held bool, prev, cur idleSample) idleAction {
	parked := cur.allocated-prev.allocated <= ic.QuietBytes && cur.collections == prev.collections &&
		cur.goroutines >= ic.ParkedGoroutines
	switch {
	case parked && !held:
		return idleHold
	case !parked && held:
		return idleRelease
	}
	return idleKeep
}

// collectionHolder is gcHolds as the idle sampler uses it.
type collectionHolder interface {
	holdOff(minHeadroom int64)
	release()
}

func (ic IdleCollections) run(ctx context.Context, ticks <-chan time.Time, sample func() idleSample, g collectionHolder) {
	held := false
	defer func() {
		if held {
			g.release()
		}
	}()
	prev := sample()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
		}
		cur := sample()
		switch ic.next(held, prev, cur) {
		case idleHold:
			g.holdOff(gcHoldHeadroom)
			held = true
			// Taking the hold first waits for a collection under way to
			// end; the next period starts after it.
			cur = sample()
		case idleRelease:
			g.release()
			held = false
		}
		prev = cur
	}
}
