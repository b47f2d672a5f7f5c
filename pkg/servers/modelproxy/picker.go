package modelproxy

import (
	"sync"
	"time"
)

// maxAffinity bounds the capture keys the picker remembers. Past it an
// arbitrary entry is forgotten: that rollout's next call only loses its
// worker's prefix cache.
const maxAffinity = 1 << 20

// defaultWorkerBackoff is how long a worker that failed a call is passed
// over while a healthy one is left.
const defaultWorkerBackoff = 2 * time.Second

// workerPicker chooses the inference worker of each upstream call. A
// rollout's calls (one capture key) go to the worker its first call went
// to while that worker is healthy, so the worker's prefix cache holds its
// growing conversation; any other call goes to the healthy worker with the
// fewest outstanding calls. A worker that failed is unhealthy for a short
// backoff; a call it provably never processed fails over, and the
// rollout's affinity moves with it. It is pure bookkeeping: no I/O, and
// time comes from now.
type workerPicker struct {
	now     func() time.Time
	backoff time.Duration

	mu       sync.Mutex
	workers  []pickerWorker
	affinity map[string]int
	// next rotates the first worker considered, so idle workers share
	// sequential calls instead of the first one taking them all.
	next int
}

type pickerWorker struct {
	outstanding int
	downUntil   time.Time
}

func newWorkerPicker(n int, backoff time.Duration, now func() time.Time) *workerPicker {
	if now == nil {
		now = time.Now
	}
	return &workerPicker{now: now, backoff: backoff, workers: make([]pickerWorker, n), affinity: make(map[string]int)}
}

// pick chooses a worker for a call of key ("" for a call of no rollout)
// among those not in tried (nil or one flag per worker), counts the call
// outstanding on it and, for a key, makes it the key's worker. ok is false
// when every worker was tried. With no healthy worker left the one
// recovering soonest is chosen: a call is never refused for want of one.
func (p *workerPicker) pick(key string, tried []bool) (worker int, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	usable := func(i int) bool { return tried == nil || !tried[i] }
	healthy := func(i int) bool { return !now.Before(p.workers[i].downUntil) }
	chosen := -1
	if w, has := p.affinity[key]; has && key != "" && w < len(p.workers) && usable(w) && healthy(w) {
		chosen = w
	}
	if chosen < 0 {
		n := len(p.workers)
		for k := range n {
			i := (p.next + k) % n
			if !usable(i) || !healthy(i) {
				continue
			}
			if chosen < 0 || p.workers[i].outstanding < p.workers[chosen].outstanding {
				chosen = i
			}
		}
		if chosen >= 0 {
			p.next = (chosen + 1) % n
		}
	}
	if chosen < 0 {
		for i := range p.workers {
			if usable(i) && (chosen < 0 || p.workers[i].downUntil.Before(p.workers[chosen].downUntil)) {
				chosen = i
			}
		}
	}
	if chosen < 0 {
		return -1, false
	}
	p.workers[chosen].outstanding++
	// One worker needs no affinity: remembering keys would only cost memory.
	if key != "" && len(p.workers) > 1 {
		if _, has := p.affinity[key]; !has && len(p.affinity) >= maxAffinity {
			for k := range p.affinity {
				delete(p.affinity, k)
				break
			}
		}
		p.affinity[key] = chosen
	}
	return chosen, true
}

// done ends a call pick counted on worker.
func (p *workerPicker) done(worker int) {
	p.mu.Lock()
	p.workers[worker].outstanding--
	p.mu.Unlock()
}

// fail marks worker unhealthy for the backoff.
func (p *workerPicker) fail(worker int) {
	p.mu.Lock()
	p.workers[worker].downUntil = p.now().Add(p.backoff)
	p.mu.Unlock()
}

// forget drops the affinity of keys whose rollouts are over.
func (p *workerPicker) forget(keys []string) {
	p.mu.Lock()
	for _, k := range keys {
		delete(p.affinity, k)
	}
	p.mu.Unlock()
}

// outstanding is the number of calls counted on worker.
func (p *workerPicker) outstanding(worker int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.workers[worker].outstanding
}

// healthy reports whether worker is not in its backoff.
func (p *workerPicker) healthy(worker int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.now().Before(p.workers[worker].downUntil)
}
