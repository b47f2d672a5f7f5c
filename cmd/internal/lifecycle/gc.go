package lifecycle

import "runtime/debug"

// ServerGCPercent is the GC goal our servers run at unless GOGC is set:
// the next collection when the heap (and stacks) have grown by 15%, not
// doubled (Go's default). A server's heap is mostly requests parked in
// held calls, all live, and the headroom above them is what the goal
// sets. At 16,000 rollouts in flight the default's headroom was ~400 MB of
// the model server's 1.1 GB, and 50 cut the fleet's peak memory by 13%
// (3.15 to 2.75 GiB) with no slower dispatch, commit or restore. 35, once
// pkg/h2server had made dispatch faster, cut the peak at 50,000 by 10%
// more (4.59 to 4.15 GiB, one run each) for a 14% slower dispatch (82.5 to
// 93.8 s), still as fast as the build before h2server at 50 (91-96 s).
// At 100,000 the fleet's peak is set while every rollout is held, not
// inside a checkpoint (RSS sampled every 0.2 s: each server's at the end of
// the commit within 0.07 GiB of its RSS when the last rollout was held),
// so the goal is what sets it: 25 took one run to 7.73 GiB against
// 8.37-8.64 at 35, dispatch 247 s against 197-236. 15 took one run to
// 7.36 GiB (7.54 in the fresh fleet) against 8.23 (8.72) at 25 the same
// evening, dispatch 249 s against 316; three runs at 15 peaked at
// 7.45-7.75 GiB (fresh fleet 7.08-7.67), dispatch 225-231 s. Checkpoints
// defer collections (ctlplane's gcHolds), so prepare, commit and restore
// do not pay for it (docs/ARCHITECTURE.md, Scale).
const ServerGCPercent = 15

// SetServerGC applies ServerGCPercent unless the environment's GOGC says
// otherwise. It is for a server's main(), before anything allocates much.
func SetServerGC(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(ServerGCPercent)
	}
}
