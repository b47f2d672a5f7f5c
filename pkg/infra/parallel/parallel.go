// Package parallel runs independent pieces of one job on every core, for
// the CPU-bound passes of a checkpoint (encoding an export's records,
// decoding a restore's).
package parallel

import (
	"sync"
	"sync/atomic"
)

// chunk is how many items a goroutine takes at a time: enough that taking
// them costs nothing beside the work, few enough that the goroutines end
// together.
const chunk = 64

// For runs fn(worker, 0) to fn(worker, n-1) on up to workers goroutines,
// which it waits for; worker, in [0, workers), tells which goroutine runs
// the call, so fn can keep scratch space per worker. fn must be safe to
// run concurrently for distinct i and worker.
func For(n, workers int, fn func(worker, i int)) {
	chunks := (n + chunk - 1) / chunk
	var next atomic.Int64
	var wg sync.WaitGroup
	for worker := range min(workers, chunks) {
		wg.Go(func() {
			for {
				start := int(next.Add(1)-1) * chunk
				if start >= n {
					return
				}
				for i := start; i < min(start+chunk, n); i++ {
					fn(worker, i)
				}
			}
		})
	}
	wg.Wait()
}
