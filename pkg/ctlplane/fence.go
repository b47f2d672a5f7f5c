package ctlplane

import (
	"context"
	"sync"

	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Fence remembers, per rollout, the highest retired attempt. A request of
// that attempt or an earlier one is refused with stale_attempt until the
// rollout is forgotten. Marks are raised before anything is stopped (a
// request sent just before a retire can arrive after it) and never lowered.
type Fence struct {
	mu    sync.RWMutex
	marks map[string]int
}

// NewFence returns an empty fence.
func NewFence() *Fence { return &Fence{marks: map[string]int{}} }

// Raise marks every id retired (keeping a higher existing mark).
func (f *Fence) Raise(ids []rollout.EpisodeID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		if m, ok := f.marks[id.RolloutID]; !ok || id.Attempt > m {
			f.marks[id.RolloutID] = id.Attempt
		}
	}
}

// Refuses reports whether id is retired.
func (f *Fence) Refuses(id rollout.EpisodeID) bool {
	f.mu.RLock()
	m, ok := f.marks[id.RolloutID]
	f.mu.RUnlock()
	return ok && id.Attempt <= m
}

// Mark returns the highest retired attempt of a rollout.
func (f *Fence) Mark(rolloutID string) (int, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	m, ok := f.marks[rolloutID]
	return m, ok
}

// Forget drops the marks of rollouts and returns those that had one.
func (f *Fence) Forget(rolloutIDs []string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(rolloutIDs))
	for _, r := range rolloutIDs {
		if _, ok := f.marks[r]; ok {
			delete(f.marks, r)
			out = append(out, r)
		}
	}
	return out
}

// Len is the number of rollouts with a mark.
func (f *Fence) Len() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return len(f.marks)
}

// gate is admission for the data routes: open, or closed with a channel
// that closes when it reopens.
type gate struct {
	mu       sync.Mutex
	closed   bool
	reopened chan struct{}
}

func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed = true
		g.reopened = make(chan struct{})
	}
}

func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		g.closed = false
		close(g.reopened)
	}
}

// state returns whether the gate is closed and, if so, the channel that
// closes when it reopens.
func (g *gate) state() (bool, <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed, g.reopened
}

// wait blocks until the gate is open or ctx ends.
func (g *gate) wait(ctx context.Context) error {
	for {
		closed, ch := g.state()
		if !closed {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
