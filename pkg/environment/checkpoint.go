package environment

import (
	"context"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/codec"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	tracking "github.com/gymfleet/gymfleet/pkg/episode"
	"github.com/gymfleet/gymfleet/pkg/rollout"
)

// participant is the environment server's side of checkpoints: its episodes,
// tracked by pkg/episode (imported as tracking) with a boundary after every stage.
type participant struct {
	name    string
	tracker *tracking.Tracker
}

var _ ctlplane.Participant = (*participant)(nil)

func (p *participant) Kind() string     { return ctlplane.KindEnvironment }
func (p *participant) Instance() string { return p.name }

func (p *participant) CloseAdmission(context.Context) error {
	p.tracker.CloseAdmission()
	return nil
}

func (p *participant) OpenAdmission()                { p.tracker.OpenAdmission() }
func (p *participant) Ready() bool                   { return p.tracker.Ready() }
func (p *participant) ReadyChanged() <-chan struct{} { return p.tracker.ReadyChanged() }
func (p *participant) Report(limit int) ctlplane.Report {
	return p.tracker.Report(limit)
}

func (p *participant) Export(_ context.Context, scope ctlplane.Scope, emit func(ctlplane.Record) error) (ctlplane.Extras, error) {
	return ctlplane.Extras{}, p.tracker.Export(scope, emit)
}

// Committed releases restored episodes the scope no longer continues.
func (p *participant) Committed(_ context.Context, scope ctlplane.Scope, _ bool) error {
	p.tracker.DeleteRestoredOutside(scope)
	return nil
}

func (p *participant) Fresh() error { return p.tracker.Fresh() }

func (p *participant) Install(_ context.Context, records []ctlplane.Record, _ ctlplane.Scope, _ ctlplane.Extras) ([]rollout.EpisodeID, error) {
	return p.tracker.Install(records)
}

func (p *participant) Retire(ctx context.Context, ids []rollout.EpisodeID) error {
	return p.tracker.Retire(ctx, ids)
}

// Forget has nothing to drop: the environment keeps no per-rollout state
// beyond the fence, which the Controller owns.
func (p *participant) Forget(context.Context, []string) error { return nil }

func (p *participant) StatusExtra() map[string]any {
	return map[string]any{"restored_pending": p.tracker.Pending(), "episodes": p.tracker.Len()}
}

// taskDigest is what a replacement attempt must match: the row without the
// bookkeeping fields (_ng_*: the attempt differs by design) in canonical JSON.
func taskDigest(row Row) (string, error) {
	task := make(map[string]any, len(row))
	for k, raw := range row {
		if strings.HasPrefix(k, "_ng_") {
			continue
		}
		var v any
		if err := codec.Unmarshal(raw, &v); err != nil {
			return "", err
		}
		task[k] = v
	}
	return tracking.TaskDigest(task)
}

// modeOf maps a stage's declared mode to the tracker's.
func modeOf(m Mode) tracking.Mode {
	if m == ModeReplay {
		return tracking.Replay
	}
	return tracking.Wait
}
