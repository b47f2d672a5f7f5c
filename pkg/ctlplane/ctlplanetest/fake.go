// Package ctlplanetest holds the conformance suite every checkpoint
// participant runs against itself, and a scriptable fake participant for
// tests of the control plane and of coordination.
package ctlplanetest

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Fake is a participant whose state is a set of episodes, each ready or
// blocking. Every call is logged, so tests can assert orders.
type Fake struct {
	kind, instance string

	mu       sync.Mutex
	episodes map[rollout.EpisodeID]bool // value: ready
	restarts map[rollout.EpisodeID]bool
	closed   bool
	served   bool
	changed  chan struct{}
	calls    []string
	// Installed holds the episodes installed by the last Install.
	installed []rollout.EpisodeID
	retired   []rollout.EpisodeID

	// Hooks, set by tests before use.
	CloseErr   error
	InstallErr error
	// RetireGate, when set, blocks Retire until it is closed.
	RetireGate chan struct{}
	// ExportGate, when set, blocks Export until it is closed.
	ExportGate chan struct{}
	// OnRetire runs at the start of Retire (e.g. to observe the fence).
	OnRetire func(ids []rollout.EpisodeID)
	// OnInstall runs at the start of Install (e.g. to observe the
	// process's GC settings while a restore installs).
	OnInstall func()
}

// NewFake returns an idle, ready fake of a kind.
func NewFake(kind, instance string) *Fake {
	return &Fake{kind: kind, instance: instance, episodes: map[rollout.EpisodeID]bool{}, restarts: map[rollout.EpisodeID]bool{}, changed: make(chan struct{})}
}

func (f *Fake) log(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func (f *Fake) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// SetEpisode adds or updates an episode; ready false makes it a blocker.
func (f *Fake) SetEpisode(id rollout.EpisodeID, ready bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.episodes[id] = ready
	f.served = true
	f.notifyLocked()
}

// SetRestart marks an episode a restart (never blocks, never exported).
func (f *Fake) SetRestart(id rollout.EpisodeID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.restarts[id] = true
	f.served = true
	f.notifyLocked()
}

// EndEpisode removes an episode.
func (f *Fake) EndEpisode(id rollout.EpisodeID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.episodes, id)
	f.notifyLocked()
}

// Calls returns the log of participant calls.
func (f *Fake) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// Closed reports whether admission is closed.
func (f *Fake) Closed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

// Installed returns what the last Install installed.
func (f *Fake) Installed() []rollout.EpisodeID {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]rollout.EpisodeID(nil), f.installed...)
}

// Episodes lists the tracked episodes.
func (f *Fake) Episodes() []rollout.EpisodeID {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []rollout.EpisodeID
	for id := range f.episodes {
		out = append(out, id)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CaptureKey() < out[j].CaptureKey() })
	return out
}

// Kind implements ctlplane.Participant.
func (f *Fake) Kind() string { return f.kind }

// Instance implements ctlplane.Participant.
func (f *Fake) Instance() string { return f.instance }

// CloseAdmission implements ctlplane.Participant.
func (f *Fake) CloseAdmission(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("close")
	if f.CloseErr != nil {
		return f.CloseErr
	}
	f.closed = true
	return nil
}

// OpenAdmission implements ctlplane.Participant.
func (f *Fake) OpenAdmission() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("open")
	f.closed = false
}

// Ready implements ctlplane.Participant.
func (f *Fake) Ready() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, ready := range f.episodes {
		if !ready && !f.restarts[id] {
			return false
		}
	}
	return true
}

// ReadyChanged implements ctlplane.Participant.
func (f *Fake) ReadyChanged() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

// Report implements ctlplane.Participant.
func (f *Fake) Report(limit int) ctlplane.Report {
	f.mu.Lock()
	defer f.mu.Unlock()
	var blockers, restarts []string
	for id, ready := range f.episodes {
		if !ready && !f.restarts[id] {
			blockers = append(blockers, id.CaptureKey())
		}
	}
	for id := range f.restarts {
		restarts = append(restarts, id.CaptureKey())
	}
	sort.Strings(restarts)
	if restarts == nil {
		restarts = []string{}
	}
	listed, n := ctlplane.Blockers(blockers, limit)
	return ctlplane.Report{Ready: n == 0, Blockers: listed, BlockerCount: n, Counts: map[string]int{"episodes": len(f.episodes)}, Restarts: restarts}
}

// Export implements ctlplane.Participant: one record per episode in scope.
func (f *Fake) Export(ctx context.Context, scope ctlplane.Scope, emit func(ctlplane.Record) error) (ctlplane.Extras, error) {
	if f.ExportGate != nil {
		select {
		case <-f.ExportGate:
		case <-ctx.Done():
			return ctlplane.Extras{}, ctx.Err()
		}
	}
	f.mu.Lock()
	f.log("export %d", scope.Len())
	var ids []rollout.EpisodeID
	for id := range f.episodes {
		if scope.Has(id) && !f.restarts[id] {
			ids = append(ids, id)
		}
	}
	f.mu.Unlock()
	sort.Slice(ids, func(i, j int) bool { return ids[i].CaptureKey() < ids[j].CaptureKey() })
	for _, id := range ids {
		data, _ := codec.Marshal(map[string]any{"kind": f.kind, "key": id.CaptureKey()})
		if err := emit(ctlplane.Record{EpisodeID: id, Data: data}); err != nil {
			return ctlplane.Extras{}, err
		}
	}
	return ctlplane.Extras{Manifest: map[string]any{"fake": f.kind}, Reply: map[string]any{"fake_exported": len(ids)}}, nil
}

// Committed implements ctlplane.Participant.
func (f *Fake) Committed(_ context.Context, scope ctlplane.Scope, stop bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("committed %d stop=%v", scope.Len(), stop)
	return nil
}

// ErrNotFresh reports a fake that has served something.
var ErrNotFresh = errors.New("this fake has served episodes")

// Fresh implements ctlplane.Participant.
func (f *Fake) Fresh() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.served {
		return ErrNotFresh
	}
	return nil
}

// Install implements ctlplane.Participant: every record must be one of this
// kind's; all are installed or none.
func (f *Fake) Install(_ context.Context, records []ctlplane.Record, _ ctlplane.Scope, manifest ctlplane.Extras) ([]rollout.EpisodeID, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("install %d", len(records))
	if f.OnInstall != nil {
		f.OnInstall()
	}
	if f.InstallErr != nil {
		return nil, f.InstallErr
	}
	var next []rollout.EpisodeID
	for _, r := range records {
		var v struct {
			Kind string `json:"kind"`
		}
		if err := codec.Unmarshal(r.Data, &v); err != nil || v.Kind != f.kind {
			return nil, fmt.Errorf("record of %s is not a %s record", r.EpisodeID, f.kind)
		}
		next = append(next, r.EpisodeID.Next())
	}
	for _, id := range next {
		f.episodes[id] = true
	}
	f.installed = next
	f.served = true
	return next, nil
}

// Retire implements ctlplane.Participant.
func (f *Fake) Retire(ctx context.Context, ids []rollout.EpisodeID) error {
	if f.OnRetire != nil {
		f.OnRetire(ids)
	}
	if f.RetireGate != nil {
		select {
		case <-f.RetireGate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("retire %d", len(ids))
	for _, id := range ids {
		for e := range f.episodes {
			if e.RolloutID == id.RolloutID && e.Attempt <= id.Attempt {
				delete(f.episodes, e)
			}
		}
	}
	f.retired = append(f.retired, ids...)
	f.notifyLocked()
	return nil
}

// Forget implements ctlplane.Participant.
func (f *Fake) Forget(_ context.Context, rolloutIDs []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("forget %d", len(rolloutIDs))
	return nil
}

// StatusExtra implements ctlplane.Participant.
func (f *Fake) StatusExtra() map[string]any {
	return map[string]any{"fake": true}
}

var _ ctlplane.Participant = (*Fake)(nil)
