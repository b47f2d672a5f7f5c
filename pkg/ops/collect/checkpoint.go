package collect

import (
	"context"
	"errors"
	"fmt"
	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"sort"
	"strings"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
	"github.com/gymfleet/gymfleet/pkg/wire/control"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// ErrNotPrepared reports a checkpoint whose prepare did not finish by its
// deadline: the fleet was resumed and no checkpoint was taken.
var ErrNotPrepared = errors.New("checkpoint not prepared by its deadline")

// StageTiming is one prepare stage's duration.
type StageTiming struct {
	Kind     string        `json:"kind"`
	Duration time.Duration `json:"duration_ns"`
}

// CheckpointStats describe one checkpoint attempt.
type CheckpointStats struct {
	ID   string    `json:"checkpoint_id"`
	At   time.Time `json:"at"`
	Stop bool      `json:"stop"`
	// Prepared and Published say how far it got; Error says why not.
	Prepared  bool   `json:"prepared"`
	Published bool   `json:"published"`
	Error     string `json:"error,omitempty"`
	// Blockers are the servers not prepared and what they waited for.
	Blockers map[string][]string `json:"blockers,omitempty"`
	// InFlight is the scope before restarts were taken out: rows sent and
	// not replied, plus restored rows not yet sent.
	InFlight  int                 `json:"in_flight"`
	Continued []rollout.EpisodeID `json:"continued"`
	Restarted []rollout.EpisodeID `json:"restarted"`
	// Timings.
	Prepare       time.Duration `json:"prepare_ns"`
	PrepareStages []StageTiming `json:"prepare_stages"`
	Commit        time.Duration `json:"commit_ns"`
	Publish       time.Duration `json:"publish_ns"`
	Resume        time.Duration `json:"resume_ns"`
	Total         time.Duration `json:"total_ns"`
}

// RestoreStats describe the restore of a resumed collection.
type RestoreStats struct {
	CheckpointID string              `json:"checkpoint_id"`
	Rows         int                 `json:"rows"`
	Restored     bool                `json:"restored"`
	Error        string              `json:"error,omitempty"`
	Continued    []rollout.EpisodeID `json:"continued"`
	Duration     time.Duration       `json:"duration_ns"`
	Resume       time.Duration       `json:"resume_ns"`
}

// Checkpoint takes one checkpoint of the collection's fleet, under the
// checkpoint lock:
//
//  1. stop dispatch and repeat the retires that failed or wait;
//  2. prepare stage by stage (deadline now + Timeout); not prepared → log
//     the blockers, resume, no checkpoint (ErrNotPrepared);
//  3. commit the scope: rows in flight plus restored rows not yet sent,
//     minus reported restarts (recorded separately);
//  4. publish <dir>/<id>/collection.json, whose continued set is what the
//     environment servers exported, then <dir>/LATEST, and prune;
//  5. resume the fleet and reopen dispatch, or, with stop, leave the fleet
//     committed and stop the run (Run returns ErrStopped), whatever the
//     outcome.
//
// Rows in scope the environment did not export finished before prepare:
// their replies are not waited for.
func (r *Collection) Checkpoint(ctx context.Context, stop bool) (CheckpointStats, error) {
	st := CheckpointStats{Stop: stop, At: r.now()}
	if r.ckpt == nil {
		return st, errors.New("checkpoints are off for this collection")
	}
	r.ckptMu.Lock()
	defer r.ckptMu.Unlock()
	r.mu.Lock()
	if r.stopping {
		r.mu.Unlock()
		return st, errors.New("the collection has stopped")
	}
	r.gateOpen = false
	r.notifyLocked()
	r.mu.Unlock()
	start := time.Now()
	defer func() {
		st.Total = time.Since(start)
		r.mu.Lock()
		r.ckpts = append(r.ckpts, st)
		if st.Published {
			c := st
			r.lastCkpt = &c
		}
		if stop {
			r.stopped = true
			r.stopping = true
			if r.cancel != nil {
				r.cancel(ErrStopped)
			}
		} else {
			r.gateOpen = true
		}
		r.notifyLocked()
		r.mu.Unlock()
	}()

	r.retryFailedRetires(ctx)
	r.retireQueued(ctx)
	coord, err := r.coordinator(ctx)
	if err != nil {
		st.Error = err.Error()
		return st, err
	}
	id := NewCheckpointID(st.At)
	st.ID = id
	// One trace per checkpoint: prepare, commit and resume, on the
	// controller and every participant, are its spans.
	ctx, span := r.c.tracer.Start(ctx, tracing.SpanCollectionCkpt, trace.WithAttributes(
		tracing.AttrCheckpointID.String(id), tracing.AttrStop.Bool(stop)))
	defer func() {
		span.SetAttributes(tracing.AttrInFlight.Int(st.InFlight), tracing.AttrPublished.Bool(st.Published))
		if st.Error != "" {
			span.SetStatus(codes.Error, st.Error)
		}
		span.End()
	}()
	abort := func(err error) (CheckpointStats, error) {
		st.Error = err.Error()
		rs := time.Now()
		if rerr := coord.Resume(context.WithoutCancel(ctx), id, r.now().Add(r.c.opts.Fleet.Timeout)); rerr != nil {
			r.c.log.Warn("resume after a failed checkpoint", "checkpoint_id", id, "err", rerr)
		}
		st.Resume = time.Since(rs)
		r.notice("checkpoint %s not taken: %v", id, err)
		return st, err
	}

	pstart := time.Now()
	prep, err := coord.Prepare(ctx, id, r.now().Add(r.ckpt.Timeout))
	st.Prepare = time.Since(pstart)
	if prep != nil {
		for _, s := range prep.Stages {
			st.PrepareStages = append(st.PrepareStages, StageTiming{Kind: s.Kind, Duration: s.Duration})
		}
	}
	if err != nil {
		return abort(err)
	}
	if !prep.Prepared {
		st.Blockers = prep.Blockers()
		r.c.log.Warn("checkpoint not prepared by its deadline", "checkpoint_id", id, "blockers", st.Blockers)
		return abort(fmt.Errorf("%w: blockers %s", ErrNotPrepared, formatBlockers(st.Blockers)))
	}
	st.Prepared = true

	r.mu.Lock()
	var inScope []rollout.EpisodeID
	for _, t := range r.inflight {
		inScope = append(inScope, t.episode())
	}
	for _, t := range r.queue {
		if t.restored {
			inScope = append(inScope, t.episode())
		}
	}
	r.mu.Unlock()
	sortEpisodes(inScope)
	st.InFlight = len(inScope)
	scope := prep.Continued(inScope)
	st.Restarted = minus(inScope, scope)

	cstart := time.Now()
	target := ckptstore.JoinDir(r.recordsDir, id)
	cm, err := coord.Commit(ctx, id, target, scope, r.now().Add(r.ckpt.Timeout), stop)
	st.Commit = time.Since(cstart)
	if err != nil {
		return abort(err)
	}
	st.Continued = exportedByEnvironments(coord, cm, scope)

	pubStart := time.Now()
	err = PublishCheckpoint(r.fs, r.dir, CollectionManifest{
		CheckpointID: id, RunID: r.runID, CreatedAt: st.At.UTC(), Continued: st.Continued, Restarted: st.Restarted,
	})
	st.Publish = time.Since(pubStart)
	if err != nil {
		return abort(err)
	}
	st.Published = true
	// In an object store, pruning removes the collector's state of old
	// checkpoints but keeps their records objects: collect never opens the
	// store (the servers write it), so it has no client or credentials to
	// delete with; a bucket lifecycle rule on the prefix expires them.
	if pr, err := PruneCheckpoints(r.dir, r.ckpt.Keep); err != nil {
		r.c.log.Warn("pruning checkpoints", "dir", r.dir, "err", err)
	} else if n := len(pr.Old) + len(pr.Partial) + len(pr.Temp); n > 0 {
		r.c.log.Info("pruned checkpoints", "old", pr.Old, "partial", pr.Partial, "temp", pr.Temp)
	}
	if !stop {
		rs := time.Now()
		if err := coord.Resume(context.WithoutCancel(ctx), id, r.now().Add(r.c.opts.Fleet.Timeout)); err != nil {
			// Dispatch reopens anyway: a participant that missed the resume
			// reopens when its lease expires.
			r.c.log.Warn("resume after checkpoint", "checkpoint_id", id, "err", err)
		}
		st.Resume = time.Since(rs)
	}
	r.notice("checkpoint %s published: %d in-flight rows continue and %d restart, in %.3fs (prepare %.3fs, commit %.3fs)%s",
		id, len(st.Continued), len(st.Restarted), time.Since(start).Seconds(), st.Prepare.Seconds(), st.Commit.Seconds(),
		map[bool]string{true: "; stopping", false: ""}[stop])
	return st, nil
}

// exportedByEnvironments is the continued set: the scope episodes some
// environment server exported. Client-side timing never decides it: an
// episode that ended before prepare is not exported, whether or not its
// reply has arrived.
func exportedByEnvironments(coord *coordination.Coordinator, cm *coordination.CommitResult, scope []rollout.EpisodeID) []rollout.EpisodeID {
	inScope := make(map[string]bool, len(scope))
	for _, e := range scope {
		inScope[e.CaptureKey()] = true
	}
	seen := map[string]bool{}
	out := []rollout.EpisodeID{}
	for _, m := range coord.Members() {
		if m.Kind != control.KindEnvironment {
			continue
		}
		for _, key := range cm.ExportedBy(m.Name) {
			if !inScope[key] || seen[key] {
				continue
			}
			e, err := rollout.ParseCaptureKey(key)
			if err != nil {
				continue
			}
			seen[key] = true
			out = append(out, e)
		}
	}
	sortEpisodes(out)
	return out
}

func minus(all, keep []rollout.EpisodeID) []rollout.EpisodeID {
	k := make(map[rollout.EpisodeID]bool, len(keep))
	for _, e := range keep {
		k[e] = true
	}
	out := []rollout.EpisodeID{}
	for _, e := range all {
		if !k[e] {
			out = append(out, e)
		}
	}
	return out
}

func sortEpisodes(es []rollout.EpisodeID) {
	sort.Slice(es, func(i, j int) bool {
		if es[i].RolloutID != es[j].RolloutID {
			return es[i].RolloutID < es[j].RolloutID
		}
		return es[i].Attempt < es[j].Attempt
	})
}

func formatBlockers(b map[string][]string) string {
	names := make([]string, 0, len(b))
	for n := range b {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + "=[" + strings.Join(b[n], " ") + "]"
	}
	return strings.Join(parts, " ")
}
