package runtimetune

import "runtime/debug"

// ServerGCPercent is the GC goal a tuned server runs at unless GOGC is
// set: the next collection when the heap (and stacks) have grown by 15%,
// not doubled (Go's default). A server's heap is mostly requests parked in
// held calls, all live, and the headroom above them is what the goal sets;
// with every rollout held, the fleet's peak memory is set by it. A lower
// goal costs collections during dispatch, each scanning every parked
// stack; checkpoints defer collections (gcHolds), so prepare, commit and
// restore do not pay for it. docs/scale-log.md has the goals measured.
const ServerGCPercent = 15

// setServerGC applies ServerGCPercent unless the environment's GOGC says
// otherwise, and returns what undoes it.
func setServerGC(getenv func(string) string) (undo func()) {
	if getenv("GOGC") != "" {
		return func() {}
	}
	prev := debug.SetGCPercent(ServerGCPercent)
	return func() { debug.SetGCPercent(prev) }
}
