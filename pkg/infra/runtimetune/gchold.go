package runtimetune

import (
	"runtime/debug"
	runtimemetrics "runtime/metrics"
	"sync"
)

// gcHolds defers garbage collection while any checkpoint of the process
// holds admission closed, from prepare until the checkpoint reopens
// (resume, abort, lease expiry, Close).
//
// A collection marks every goroutine's stack, and a participant with many
// rollouts in flight has two parked goroutines per rollout: one cycle that
// the export's own allocations happen to start can cost most of a commit's
// CPU, on the cores the other participants are committing on. While
// admission is closed nothing new arrives, the parked goroutines do not
// change, and what the checkpoint allocates is bounded, so the collection
// can wait for the reopen. The memory limit set meanwhile keeps that wait
// safe: past a quarter more than the process held at prepare
// (gcHoldHeadroom at least, and never above a limit already set), the
// runtime collects anyway.
//
// A restore holds them too, from its start until the reopen (its resume):
// a fresh process grows from a few MB to the installed state and would
// collect again and again on the way, on the cores every participant
// installs on. Before the records are read into memory, the hold's limit
// is widened to suit them (installHeadroom), not the little the process
// held before.
//
// A checkpoint's hold defers collections rather than turning them off: it
// sets GOGC to heldGCPercent, a goal thousands of times the live heap. Off
// (a negative GOGC) would make the prepare wait for a mark under way to end
// (runtime/debug.SetGCPercent waits only when turning collections off), and
// a mark with many rollouts parked takes seconds on a shared machine. The
// mark under way then finishes beside the checkpoint instead of before it,
// and no new one starts below the limit. The idle sampler (IdleCollections)
// does turn them off (holdOff): a positive GOGC leaves the runtime's forced
// collection every two minutes in place, which is what a parked process is
// held against, and the sampler's goroutine can wait for a mark. The first
// hold sets the mode for all until the last ends: a checkpoint prepared in a
// parked process keeps collections off, and an idle hold taken during a
// checkpoint only counts.
//
// The runtime's GC settings belong to the process: a Tuner owns one
// gcHolds, counted, since a process can run several servers, each with its
// own controller, all handed the same Tuner.
type gcHolds struct {
	mu      sync.Mutex
	holders int
	percent int   // GOGC before the first hold
	limit   int64 // the memory limit before the first hold
	asked   int64 // the largest limit a hold has asked for since the first
}

// gcHoldHeadroom is the least growth allowed before the runtime collects
// during a hold.
const gcHoldHeadroom = 256 << 20

// heldGCPercent is the GOGC of a hold that defers collections: the heap
// would have to grow ten-thousandfold before the next one, so only the
// memory limit starts it. Small enough that the runtime's goal (live heap
// times the percent, in 64 bits) cannot overflow below 16 TB of heap.
const heldGCPercent = 1 << 20

// installGrowth is how many bytes a restore may allocate per byte of
// records it installs before the runtime collects during its hold. The
// records file is read whole into one buffer, and the install copies or
// decodes parts of every record; the servers were seen to allocate from
// under two to over six bytes a byte of their records (the most within the
// least headroom), buffer included, which the hold, widened once the
// records are read, finds already in use: the headroom is generous. Past
// the limit the runtime only collects, as it would have without the hold.
const installGrowth = 4

// installHeadroom is the growth a restore's hold allows for installing
// recordBytes of records.
func installHeadroom(recordBytes int64) int64 {
	return max(gcHoldHeadroom, installGrowth*recordBytes)
}

// installHeapGrowth is the heap a restore readies for installing
// recordBytes of records (hugepage.PrepareHeap): what the installs were
// seen to allocate, within the hold's headroom. Readying costs time that
// grows with the span's size, so it follows the records rather than the
// hold's least headroom, which would slow small restores.
func installHeapGrowth(recordBytes int64) int64 {
	return min(installHeadroom(recordBytes), 8*recordBytes)
}

// hold starts a hold allowing at least minHeadroom of growth (and a
// quarter of what the process holds, if more) before the runtime collects;
// every hold must be released once. A hold that needs more room than the
// holds before it raises the limit, never above a limit set before them.
// It does not wait for a mark under way.
func (g *gcHolds) hold(minHeadroom int64) { g.take(minHeadroom, false) }

// holdOff is hold that, taken first, turns collections off, the runtime's
// forced one included, until the last hold ends; it then waits for a mark
// under way to end. Taken during a hold, it only counts: waiting there
// would hold up the other holds' widen and release behind the mark.
func (g *gcHolds) holdOff(minHeadroom int64) { g.take(minHeadroom, true) }

func (g *gcHolds) take(minHeadroom int64, off bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.holders++
	if g.holders > 1 {
		g.widenLocked(minHeadroom)
		return
	}
	g.limit = debug.SetMemoryLimit(-1) // a negative limit reads it
	g.asked = 0
	// The limit first: collections are never deferred without it.
	g.widenLocked(minHeadroom)
	percent := heldGCPercent
	if off {
		percent = -1
	}
	g.percent = debug.SetGCPercent(percent)
}

// widen lets a hold already taken grow by at least minHeadroom from what
// the process holds now, as hold would, without counting another hold.
// Without a hold it does nothing.
func (g *gcHolds) widen(minHeadroom int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.holders > 0 {
		g.widenLocked(minHeadroom)
	}
}

func (g *gcHolds) widenLocked(minHeadroom int64) {
	inUse := processMemory()
	if limit := inUse + max(minHeadroom, inUse/4); limit > g.asked {
		g.asked = limit
		debug.SetMemoryLimit(min(g.limit, limit))
	}
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
