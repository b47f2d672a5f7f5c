package modelproxy

import (
	"testing"
	"time"
)

// clock is a settable time for the picker.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newTestPicker(n int) (*workerPicker, *clock) {
	c := &clock{t: time.Unix(1000, 0)}
	return newWorkerPicker(n, time.Second, c.now), c
}

func mustPick(t *testing.T, p *workerPicker, key string, tried []bool) int {
	t.Helper()
	w, ok := p.pick(key, tried)
	if !ok {
		t.Fatalf("pick(%q, %v): no worker", key, tried)
	}
	return w
}

// Calls of no rollout go to the worker with the fewest outstanding calls.
func TestPicker_BalancesByOutstandingCalls(t *testing.T) {
	p, _ := newTestPicker(3)
	counts := make([]int, 3)
	for range 9 {
		counts[mustPick(t, p, "", nil)]++
	}
	for w, n := range counts {
		if n != 3 || p.outstanding(w) != 3 {
			t.Fatalf("worker %d got %d calls (%d outstanding), want 3 each: %v", w, n, p.outstanding(w), counts)
		}
	}
	// Worker 1 finishes its calls: the next ones go there until it catches up.
	for range 3 {
		p.done(1)
	}
	for range 3 {
		if w := mustPick(t, p, "", nil); w != 1 {
			t.Fatalf("picked %d, want the idle worker 1", w)
		}
	}
}

// A rollout's later calls go to its first call's worker, even when another
// worker has fewer outstanding calls.
func TestPicker_AffinityKeepsARolloutOnItsWorker(t *testing.T) {
	p, _ := newTestPicker(2)
	first := mustPick(t, p, "r1-a0", nil)
	p.done(first)
	for range 5 {
		mustPick(t, p, "", nil) // load the other worker... and this one
	}
	for range 4 {
		if w := mustPick(t, p, "r1-a0", nil); w != first {
			t.Fatalf("rollout call went to %d, want its worker %d", w, first)
		}
	}
	// Another rollout's first call is balanced: it goes to the less
	// loaded worker.
	other := 1 - first
	if w := mustPick(t, p, "r2-a0", nil); w != other || p.outstanding(other) >= p.outstanding(first) {
		t.Fatalf("new rollout went to %d (outstanding %d vs %d), want the less loaded %d", w, p.outstanding(other), p.outstanding(first), other)
	}
}

// A failed worker is passed over and the rollout's affinity moves with the
// failover; a worker already tried is never picked again for that call.
func TestPicker_FailoverMovesAffinity(t *testing.T) {
	p, _ := newTestPicker(2)
	w0 := mustPick(t, p, "r1-a0", nil)
	p.done(w0)
	p.fail(w0)
	tried := []bool{false, false}
	tried[w0] = true
	w1 := mustPick(t, p, "r1-a0", tried)
	if w1 == w0 {
		t.Fatalf("failover picked the failed worker %d", w0)
	}
	p.done(w1)
	if w := mustPick(t, p, "r1-a0", nil); w != w1 {
		t.Fatalf("after failover the rollout went to %d, want %d", w, w1)
	}
	tried[w1] = true
	if w, ok := p.pick("r1-a0", tried); ok {
		t.Fatalf("every worker tried, yet picked %d", w)
	}
}

// A failed worker is healthy again after the backoff; with every worker
// failed the one recovering soonest is still chosen.
func TestPicker_RecoversAfterBackoff(t *testing.T) {
	p, c := newTestPicker(2)
	p.fail(0)
	for range 3 {
		if w := mustPick(t, p, "", nil); w != 1 {
			t.Fatalf("picked failed worker %d during its backoff", w)
		}
	}
	c.t = c.t.Add(500 * time.Millisecond)
	p.fail(1)
	if w := mustPick(t, p, "", nil); w != 0 {
		t.Fatalf("all failed: picked %d, want worker 0, recovering first", w)
	}
	c.t = c.t.Add(700 * time.Millisecond)
	if !p.healthy(0) || p.healthy(1) {
		t.Fatalf("after 1.2s: healthy(0)=%v healthy(1)=%v, want true false", p.healthy(0), p.healthy(1))
	}
	// Worker 0 is the only healthy one: it takes the call despite its
	// load.
	if w := mustPick(t, p, "", nil); w != 0 {
		t.Fatalf("picked %d, want the recovered worker 0", w)
	}
	c.t = c.t.Add(time.Second)
	for range 3 {
		p.done(1)
	}
	if w := mustPick(t, p, "", nil); w != 1 {
		t.Fatalf("both healthy: picked %d, want the less loaded worker 1 (outstanding %d vs %d)", w, p.outstanding(1), p.outstanding(0))
	}
}

// A rollout's worker is kept only while it is healthy: when it fails the
// next call goes elsewhere, and the rollout stays there once it recovers.
func TestPicker_AffinityFollowsHealth(t *testing.T) {
	p, c := newTestPicker(2)
	w0 := mustPick(t, p, "r1-a0", nil)
	p.done(w0)
	p.fail(w0)
	w1 := mustPick(t, p, "r1-a0", nil)
	p.done(w1)
	if w1 == w0 {
		t.Fatalf("the rollout stayed on its failed worker %d", w0)
	}
	c.t = c.t.Add(2 * time.Second)
	if w := mustPick(t, p, "r1-a0", nil); w != w1 {
		t.Fatalf("after recovery the rollout went to %d, want %d where it moved", w, w1)
	}
	p.forget([]string{"r1-a0"})
	if _, has := p.affinity["r1-a0"]; has {
		t.Fatal("forget kept the rollout's affinity")
	}
}
