package ctlplane

import (
	"runtime/debug"
	runtimemetrics "runtime/metrics"
	"sync"
)

// gcHolds defers garbage collection while any controller of the process
// holds admission closed for a checkpoint, from prepare until the
// checkpoint reopens (resume, abort, lease expiry, Close).
//
// A collection marks every goroutine's stack, and a participant with
// 100,000 rollouts in flight has two parked goroutines per rollout: at that
// scale one cycle that the export's own allocations happened to start cost
// the model server 4 of the 6.7 CPU-seconds it spent in a commit, on the
// two cores the other participants were committing on. While admission is
// closed nothing new arrives, the parked goroutines do not change, and
// what the checkpoint allocates is bounded, so the collection can wait for
// the reopen. The memory limit set meanwhile keeps that wait safe: past a
// quarter more than the process held at prepare (256 MiB at least, and
// never above a limit already set), the runtime collects anyway.
//
// The runtime's GC settings belong to the process, so this does too: one
// package-level holder, counted, since a process can run several servers,
// each with its own controller (the one global of the package, mirroring
// the runtime's).
type gcHolds struct {
	mu      sync.Mutex
	holders int
	percent int   // GOGC before the first hold
	limit   int64 // the memory limit before the first hold
}

var processGC gcHolds

// gcHoldHeadroom is the least growth allowed before the runtime collects
// during a hold.
const gcHoldHeadroom = 256 << 20

// hold starts a hold; every hold must be released once.
func (g *gcHolds) hold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.holders++
	if g.holders > 1 {
		return
	}
	held := processMemory()
	limit := held + max(gcHoldHeadroom, held/4)
	current := debug.SetMemoryLimit(-1) // a negative limit reads it
	g.limit = current
	debug.SetMemoryLimit(min(current, limit))
	g.percent = debug.SetGCPercent(-1)
}

// release ends a hold; the last one restores the settings.
func (g *gcHolds) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.holders == 0 {
		return
	}
	g.holders--
	if g.holders > 0 {
		return
	}
	debug.SetGCPercent(g.percent)
	debug.SetMemoryLimit(g.limit)
}

// processMemory is the memory the Go runtime holds from the OS, the
// quantity the memory limit bounds.
func processMemory() int64 {
	s := []runtimemetrics.Sample{
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
	}
	runtimemetrics.Read(s)
	return int64(s[0].Value.Uint64() - s[1].Value.Uint64())
}
