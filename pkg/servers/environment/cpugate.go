package environment

import (
	"context"
	"runtime"
)

// cpuGate bounds the /run handlers doing their CPU work (decoding the run,
// digesting its task) at once. A restore's replacements arrive together:
// 50,000 /run make as many goroutines runnable, each needing a millisecond
// or more, and every other goroutine of the process waits behind them in
// the scheduler's queue; the reply of a cleanup call to the resources
// server then waited past its 30 s budget (hundreds of sessions left open
// per 50k run). Handlers waiting here are parked, not runnable, so the
// queue stays a few goroutines long. The work inside does no I/O and takes
// no lock, so a slot is never held while waiting on anything else.
type cpuGate chan struct{}

// newCPUGate admits two handlers per core: enough to keep every core busy
// while one handler is descheduled.
func newCPUGate() cpuGate { return make(cpuGate, 2*runtime.GOMAXPROCS(0)) }

// enter waits for a slot, or for ctx to end.
func (g cpuGate) enter(ctx context.Context) error {
	select {
	case g <- struct{}{}:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// leave frees the slot enter took.
func (g cpuGate) leave() { <-g }
