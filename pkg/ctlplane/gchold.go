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
// A restore holds them too, from its start until the reopen (its resume):
// a fresh process grows from a few MB to the installed state, and at
// GOGC=50 the four fresh participants of a 100,000-rollout restore
// collected 3-16 times each on the way, 1.7 of the 7.6 CPU-seconds the
// restore cost (GODEBUG=gctrace=1), on the two cores every one of them
// installs on; held only from the records being read, they still collected
// 2-11 times each while reading them (0.62 CPU-s). The restore route holds
// them while it decodes the body (it names every episode), Restore from
// its start until the reopen; before the records are read into memory,
// the hold's limit is widened to suit them (installHeadroom), not the
// little the process held before.
//
// A checkpoint's hold defers collections rather than turning them off: it
// sets GOGC to heldGCPercent, a goal thousands of times the live heap. Off
// (a negative GOGC) would make the prepare wait for a mark under way to end
// (runtime/debug.SetGCPercent waits only when turning collections off), and
// a mark at 100,000 rollouts, two cores shared with the rest of the fleet,
// takes seconds: with GOGC=25 a model server that began one just before the
// prepare took 4.19 s to prepare against 1.0-1.4 s without one. The mark
// under way then finishes beside the checkpoint instead of before it, and
// no new one starts below the limit. The idle sampler (IdleCollections) does turn them
// off (holdOff): a positive GOGC leaves the runtime's forced collection
// every two minutes in place, which is what a parked process is held
// against, and the sampler's goroutine can wait for a mark. The first hold
// sets the mode for all until the last ends: a checkpoint prepared in a
// parked process keeps collections off, and an idle hold taken during a
// checkpoint only counts.
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
	asked   int64 // the largest limit a hold has asked for since the first
}

var processGC gcHolds

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
// decodes parts of every record: in a 100,000-rollout restore the agent
// allocated 1.8 bytes per byte of records (646 MB for 358), the model 2.3
// (334 for 144), the environment 3.2 (126 for 39), the resources server
// 6.5 (117 for 18, within the least headroom). Those figures count the
// records buffer, which the hold, widened once the records are read, finds
// already in use: the headroom is generous. Past the limit the runtime
// only collects, as it would have without the hold.
const installGrowth = 4

// installHeadroom is the growth a restore's hold allows for installing
// recordBytes of records.
func installHeadroom(recordBytes int64) int64 {
	return max(gcHoldHeadroom, installGrowth*recordBytes)
}

// installHeapGrowth is the heap a restore readies for installing
// recordBytes of records (hugepage.PrepareHeap): what the installs were
// seen to allocate (up to 6.5 bytes a byte, the resources server), within
// the hold's headroom. Readying costs a few milliseconds and more with the
// span's size, so it follows the records rather than the hold's least
// headroom: at 1,000 rollouts, 256 MiB readied in each process made the
// restore 20 ms slower (0.062 -> 0.083 s, medians of 3).
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
