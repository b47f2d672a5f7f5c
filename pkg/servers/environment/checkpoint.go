package environment

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	tracking "github.com/gymfleet/gymfleet/pkg/episode"
	"github.com/gymfleet/gymfleet/pkg/infra/faultpoint"
	"github.com/gymfleet/gymfleet/pkg/infra/freshstack"
	"github.com/gymfleet/gymfleet/pkg/transport/sessioncookie"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// participant is the environment server's side of checkpoints: its episodes,
// tracked by pkg/episode (imported as tracking) with a boundary after every stage.
type participant struct {
	name    string
	tracker *tracking.Tracker
	ctl     *ctlplane.Controller
	// setAliases hands the server a restore's alias table of agent
	// replicas (nil in tests of the participant alone).
	setAliases func(map[string]string)
}

var (
	_ ctlplane.Participant = (*participant)(nil)
	_ runHooks             = (*participant)(nil)
)

// ---- the /run path (runHooks) ---------------------------------------------

func (p *participant) admitRun(id rollout.EpisodeID) error { return p.ctl.CheckFence(id) }

func (p *participant) taskDigest(row Row) (string, error) { return taskDigest(row) }

// begin registers the episode with the checkpoint tracker. A replacement
// attempt with a restored record continues from its boundary; an episode
// whose record had none starts from its input.
func (p *participant) begin(ep *episode, cancel context.CancelFunc) (*tracking.Episode, *Boundary, error) {
	tracked, cont, err := p.tracker.Begin(ep.id, ep.digest, cancel)
	if err != nil {
		return nil, nil, err
	}
	if cont == nil || cont.Boundary == nil {
		return tracked, freshStart(), nil
	}
	var b Boundary
	// encoding/json recurses per level; this goroutine then waits for its
	// agent (freshstack).
	freshstack.Run(func() { err = codec.UnmarshalStrict(cont.Boundary, &b) })
	if err == nil && b.Next != "" {
		err = sessioncookie.Check(b.Handles.ResourcesCookies)
	}
	if err != nil || b.Next == "" {
		tracked.End()
		return nil, nil, apierror.New(apierror.InvalidCheckpointState, "the restored boundary of %s does not decode: %v", ep.id, err)
	}
	return tracked, &b, nil
}

func (p *participant) retired(id rollout.EpisodeID) bool { return p.ctl.Fence().Refuses(id) }

func (p *participant) close() { p.ctl.Close() }

// ---- ctlplane.Participant ------------------------------------------------

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
	return ctlplane.Extras{}, p.tracker.Export(scope, faultpoint.AfterFirst(faultpoint.EnvExportPartial, emit))
}

// Held implements ctlplane.Holder: a commit without a scope exports every
// episode the tracker holds.
func (p *participant) Held() []rollout.EpisodeID { return p.tracker.Held() }

// Committed releases restored episodes the scope no longer continues.
func (p *participant) Committed(_ context.Context, scope ctlplane.Scope, _ bool) error {
	p.tracker.DeleteRestoredOutside(scope)
	return nil
}

func (p *participant) Fresh() error { return p.tracker.Fresh() }

func (p *participant) Install(_ context.Context, records []ctlplane.Record, _ ctlplane.Scope, extras ctlplane.Extras) ([]rollout.EpisodeID, error) {
	ids, err := p.tracker.Install(records)
	if err == nil && p.setAliases != nil && len(extras.Aliases) > 0 {
		p.setAliases(extras.Aliases)
	}
	return ids, err
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
// Checkpoints hold it as tracking.TaskDigest took it of the fields decoded
// into a map[string]any; it is now taken of the same bytes without the
// decoding, which was a quarter of the server's CPU when 50,000 rollouts
// started at once. TestTaskDigest_MatchesDecoded and FuzzTaskDigest check
// that the two agree.
func taskDigest(row Row) (string, error) {
	task, err := canonicalTask(row)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(task)
	return hex.EncodeToString(sum[:]), nil
}

// canonicalTask returns the task fields of row as codec.MarshalStable
// writes them decoded into a map[string]any: names sorted in byte order,
// values by codec.Canonicalizer. An invalid value is an error.
func canonicalTask(row Row) ([]byte, error) {
	names := make([]string, 0, len(row))
	size := len("{}")
	for name, raw := range row {
		if strings.HasPrefix(name, "_ng_") {
			continue
		}
		names = append(names, name)
		size += len(name) + len(raw) + len(`"":,`)
	}
	slices.Sort(names)
	dst := make([]byte, 0, size)
	dst = append(dst, '{')
	var canon codec.Canonicalizer
	for i, name := range names {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(codec.AppendString(dst, name), ':')
		var err error
		if dst, err = canon.Append(dst, row[name]); err != nil {
			return nil, fmt.Errorf("field %q: %w", name, err)
		}
	}
	return append(dst, '}'), nil
}

// modeOf maps a stage's declared mode to the tracker's.
func modeOf(m Mode) tracking.Mode {
	if m == ModeReplay {
		return tracking.Replay
	}
	return tracking.Wait
}
