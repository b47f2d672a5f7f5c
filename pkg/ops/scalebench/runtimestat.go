package scalebench

import (
	"context"
	"sync"
	"time"
)

// runtimeStat is what a server's Go runtime reports with every rollout in
// flight: goroutine stacks are memory a heap profile leaves out, and with
// two goroutines parked per rollout in each server they are a third of its
// memory.
type runtimeStat struct {
	stackBytes uint64
	goroutines int
	heapBytes  uint64
}

// runtimeScrapeTimeout bounds reading one server's /metrics at the
// boundary; the collector's figures take a stop of the world.
const runtimeScrapeTimeout = 30 * time.Second

// readRuntimeStats reads every running server's runtime figures from its
// /metrics. A server that does not answer is left out (and logged): the
// figures are reported, not checked.
func (b *bench) readRuntimeStats(ctx context.Context) map[string]runtimeStat {
	var mu sync.Mutex
	out := make(map[string]runtimeStat)
	var wg sync.WaitGroup
	for _, t := range b.runtimeURLs() {
		wg.Go(func() {
			st, err := b.scrapeRuntimeStat(ctx, t.url+"/metrics")
			if err != nil {
				b.logf("runtime figures of %s: %v", t.name, err)
				return
			}
			mu.Lock()
			out[t.name] = st
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

func (b *bench) scrapeRuntimeStat(ctx context.Context, url string) (runtimeStat, error) {
	exposition, err := b.scrapeMetrics(ctx, url, runtimeScrapeTimeout)
	if err != nil {
		return runtimeStat{}, err
	}
	return parseRuntimeStat(exposition)
}

// parseRuntimeStat takes the figures from the exposition client_golang's
// Go collector writes.
func parseRuntimeStat(exposition []byte) (runtimeStat, error) {
	v, err := metricValues(exposition, "go_memstats_stack_inuse_bytes", "go_goroutines", "go_memstats_heap_inuse_bytes")
	if err != nil {
		return runtimeStat{}, err
	}
	stacks, goroutines, heap := v[0], v[1], v[2]
	return runtimeStat{stackBytes: uint64(stacks), goroutines: int(goroutines), heapBytes: uint64(heap)}, nil
}
