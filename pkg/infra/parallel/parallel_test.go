package parallel

import (
	"sync/atomic"
	"testing"
)

// Ensure every index runs exactly once, on a worker below the count asked
// for, for counts around the chunk size and more workers than chunks.
func TestFor_RunsEveryIndexOnce(t *testing.T) {
	for _, n := range []int{0, 1, chunk - 1, chunk, chunk + 1, 10*chunk + 3} {
		for _, workers := range []int{1, 2, 7} {
			runs := make([]atomic.Int32, n)
			var badWorker atomic.Bool
			For(n, workers, func(worker, i int) {
				if worker < 0 || worker >= workers {
					badWorker.Store(true)
				}
				runs[i].Add(1)
			})
			if badWorker.Load() {
				t.Errorf("n=%d workers=%d: a call ran on a worker outside [0, %d)", n, workers, workers)
			}
			for i := range runs {
				if got := runs[i].Load(); got != 1 {
					t.Fatalf("n=%d workers=%d: index %d ran %d times", n, workers, i, got)
				}
			}
		}
	}
}

// Ensure no two calls on one worker overlap, so per-worker scratch is
// safe (run under -race).
func TestFor_AWorkersCallsDoNotOverlap(t *testing.T) {
	const workers = 4
	scratch := make([][]int, workers)
	For(50*chunk, workers, func(worker, i int) {
		scratch[worker] = append(scratch[worker][:0], i)
		if scratch[worker][0] != i {
			t.Errorf("worker %d's scratch changed under call %d", worker, i)
		}
	})
}
