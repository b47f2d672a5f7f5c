package lifecycle

import "runtime/debug"

// ServerGCPercent is the GC goal our servers run at unless GOGC is set:
// the next collection when the heap has grown by half, not doubled (Go's
// default). A server's heap is mostly requests parked in held calls, all
// live; at 16,000 rollouts in flight the default's headroom was ~400 MB of
// the model server's 1.1 GB, and halving it cut the fleet's peak memory by
// 13% (3.15 to 2.75 GiB) with no slower dispatch, commit or restore
// (docs/ARCHITECTURE.md, Scale).
const ServerGCPercent = 50

// SetServerGC applies ServerGCPercent unless the environment's GOGC says
// otherwise. It is for a server's main(), before anything allocates much.
func SetServerGC(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(ServerGCPercent)
	}
}
