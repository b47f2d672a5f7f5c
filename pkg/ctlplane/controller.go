package ctlplane

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/infra/faultpoint"
	"github.com/gymfleet/gymfleet/pkg/infra/logging"
	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/replica"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// ReadyRecheck bounds the time between readiness checks while a prepare
// waits: readiness is signalled by notification, and this only catches a
// participant that missed one.
const ReadyRecheck = time.Second

// Deps are what a Controller needs besides its participant.
type Deps struct {
	Logger   *slog.Logger
	Registry prometheus.Registerer
	// Tracer records the gym.checkpoint.<op> spans and their stages
	// (pkg/infra/tracing); nil records none.
	Tracer trace.TracerProvider
	// Clock defaults to the wall clock.
	Clock Clock
	// Store defaults to the local filesystem beneath the configured root.
	Store *ckptstore.Store
	// Tuning is told where checkpoints stand (see Tuning); nil leaves the
	// runtime alone.
	Tuning Tuning
}

// Controller is one server's control plane: it owns the phase state, the
// lease, the attempt fence and data-route admission, and drives its
// Participant through them.
type Controller struct {
	p     Participant
	cfg   Config
	clock Clock
	store *ckptstore.Store
	// root is cfg.Root made absolute; ownStore is set when the controller
	// opened store and so closes it.
	root     string
	ownStore bool
	log      *slog.Logger
	tuning   Tuning
	metrics  *metrics
	tracer   tracing.Tracer
	fence    *Fence
	gate     gate
	epoch    *epochState

	// ctx is cancelled by Close; background writes and installs derive from it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu         sync.Mutex
	st         State
	leaseUntil time.Time
	leaseTimer Timer
	prepared   *PrepareReply
	write      *task
	install    *task
	committed  *CommitReply
	restored   *RestoreReply
	// tuned is set while this controller has told its Tuning a checkpoint
	// started and not yet that it finished: from prepare closing admission,
	// or from a restore's start, until the reopen.
	tuned bool
}

type task struct {
	id   string
	done chan struct{}
	stop *ckptstore.WriteStop
	// Set before done is closed.
	reply any
	err   error
}

func newTask(id string) *task {
	return &task{id: id, done: make(chan struct{}), stop: &ckptstore.WriteStop{}}
}

func (t *task) finish(reply any, err error) {
	t.reply, t.err = reply, err
	close(t.done)
}

// New returns the control plane of participant p. cfg must be enabled and valid.
func New(cfg Config, p Participant, deps Deps) (*Controller, error) {
	if !cfg.Enabled {
		return nil, errors.New("ctlplane.New called with checkpointing disabled")
	}
	if err := cfg.validateSettings(); err != nil {
		return nil, err
	}
	if !rollout.ValidID(p.Kind()) || !rollout.ValidID(p.Instance()) {
		return nil, fmt.Errorf("participant kind %q and instance %q must match the id pattern (they are path components)", p.Kind(), p.Instance())
	}
	if deps.Logger == nil {
		deps.Logger = logging.Discard()
	}
	if deps.Registry == nil {
		deps.Registry = prometheus.NewRegistry()
	}
	if deps.Clock == nil {
		deps.Clock = RealClock{}
	}
	if deps.Tuning == nil {
		deps.Tuning = noTuning{}
	}
	root := cfg.Root
	if !ckptstore.IsS3(root) {
		var err error
		if root, err = filepath.Abs(cfg.Root); err != nil {
			return nil, fmt.Errorf("checkpoint.root: %w", err)
		}
		if err := os.MkdirAll(root, 0o755); err != nil {
			return nil, fmt.Errorf("checkpoint.root: %w", err)
		}
	}
	// Read once: a key changed on disk takes effect at the next start.
	key, err := cfg.SigningKey()
	if err != nil {
		return nil, err
	}
	epoch, err := newEpochState(cfg.EffectiveEpochFile(root))
	if err != nil {
		return nil, err
	}
	ownStore := deps.Store == nil
	if ownStore {
		if deps.Store, err = ckptstore.OpenWith(root, ckptstore.Options{SigningKey: key, S3: cfg.S3Options()}); err != nil {
			return nil, err
		}
	} else if key != nil && !deps.Store.Signed() {
		return nil, errors.New("checkpoint.signing_key_file is set but the store given is not keyed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Controller{
		p: p, cfg: cfg, clock: deps.Clock, store: deps.Store, root: root, ownStore: ownStore,
		log: deps.Logger.With("component", "ctlplane"), tuning: deps.Tuning,
		fence: NewFence(), epoch: epoch, ctx: ctx, cancel: cancel, tracer: tracing.NewTracer(deps.Tracer),
	}
	c.metrics = newMetrics(deps.Registry, c)
	return c, nil
}

// startSpan starts the span of one stage of an operation, with the
// participant's identity and the checkpoint id (protocol.md §9).
func (c *Controller) startSpan(ctx context.Context, name, checkpointID string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	attrs = append(attrs,
		tracing.AttrCheckpointID.String(checkpointID),
		tracing.AttrParticipantKind.String(c.p.Kind()),
		tracing.AttrInstance.String(c.p.Instance()))
	return c.tracer.Start(ctx, name, trace.WithAttributes(attrs...))
}

// Close stops the lease timer, tells the Tuning a checkpoint under way
// finished, and waits for background writes and installs.
func (c *Controller) Close() {
	c.mu.Lock()
	if c.leaseTimer != nil {
		c.leaseTimer.Stop()
		c.leaseTimer = nil
	}
	c.finishTuningLocked()
	// Cancelled under c.mu: an install that has read its records tells
	// the Tuning their size under c.mu only while its checkpoint is
	// started, so nothing reaches the Tuning for it after this finish.
	c.cancel()
	c.mu.Unlock()
	c.wg.Wait()
	if c.ownStore {
		_ = c.store.Close()
	}
	c.epoch.lock.close()
}

// Fence is the attempt fence, for participants that check it themselves
// (the environment reads the episode from the /run body).
func (c *Controller) Fence() *Fence { return c.fence }

// CheckFence returns stale_attempt if id is retired.
func (c *Controller) CheckFence(id rollout.EpisodeID) error {
	if c.fence.Refuses(id) {
		c.metrics.refusal(apierror.StaleAttempt)
		return apierror.New(apierror.StaleAttempt, "attempt %d of rollout %s was retired", id.Attempt, id.RolloutID)
	}
	return nil
}

// AdmissionClosed reports whether a checkpoint holds admission closed, and
// the channel that closes when it reopens.
func (c *Controller) AdmissionClosed() (bool, <-chan struct{}) { return c.gate.state() }

// WaitOpen blocks until admission is open or ctx ends.
func (c *Controller) WaitOpen(ctx context.Context) error { return c.gate.wait(ctx) }

// Phase is the current phase and checkpoint id.
func (c *Controller) Phase() (Phase, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st.Phase, c.st.CheckpointID
}

func (c *Controller) now() time.Time { return c.clock.Now() }

// MaxDeadlineAhead bounds how far ahead of now a deadline_ts may be. The
// lease runs to the deadline plus the grace, so an unbounded deadline would
// let one control call keep admission closed long after its controller died.
const MaxDeadlineAhead = 24 * time.Hour

// deadline converts and checks deadline_ts.
func (c *Controller) deadline(ts float64) (time.Time, error) {
	if math.IsNaN(ts) || math.IsInf(ts, 0) || ts <= 0 {
		return time.Time{}, apierror.New(apierror.InvalidRequest, "deadline_ts must be a positive finite Unix time in seconds")
	}
	now := c.now()
	// Compared in float seconds before converting: ts*1e9 overflows int64
	// past the year 2262 and would wrap into the past.
	nowTS := float64(now.UnixNano()) / 1e9
	if ts > nowTS+MaxDeadlineAhead.Seconds() {
		return time.Time{}, apierror.New(apierror.InvalidRequest, "deadline_ts %g is more than %s ahead of the server's clock (%.3f)", ts, MaxDeadlineAhead, nowTS)
	}
	sec, frac := math.Modf(ts)
	d := time.Unix(int64(sec), int64(frac*1e9))
	if !d.After(now) {
		return time.Time{}, apierror.New(apierror.DeadlineExceeded, "deadline_ts %.3f is in the past", ts)
	}
	return d, nil
}

func validCheckpointID(id string) error {
	if !rollout.ValidID(id) {
		return apierror.New(apierror.InvalidRequest, "checkpoint_id %q must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", id)
	}
	return nil
}

// validDir refuses, before anything changes, a checkpoint_dir that is not
// an absolute path beneath the root; the store refuses the rest (symbolic
// links) as it opens the directory.
func (c *Controller) validDir(dir string) error {
	if ckptstore.IsS3(c.root) {
		if err := ckptstore.InRoot(c.root, dir); err != nil {
			return apierror.New(apierror.InvalidRequest, "checkpoint_dir %q must lie beneath this server's checkpoint root %s, with no empty, \".\" or \"..\" component", dir, c.root)
		}
		return nil
	}
	if dir == "" || !filepath.IsAbs(dir) {
		return apierror.New(apierror.InvalidRequest, "checkpoint_dir %q must be an absolute path every server can reach", dir)
	}
	if _, err := ckptstore.Beneath(c.root, dir); err != nil {
		return apierror.New(apierror.InvalidRequest, "checkpoint_dir %q must lie beneath this server's checkpoint root %s, with no \"..\" component", dir, c.root)
	}
	return nil
}

func validEpisodes(ids []rollout.EpisodeID) error {
	for _, id := range ids {
		if err := id.Validate(); err != nil {
			return apierror.Wrap(apierror.InvalidRequest, err)
		}
	}
	return nil
}

// scopeDigest names a scope canonically, to tell retries from conflicts.
func scopeDigest(s Scope) string { return s.Digest() }

// heldScopeDigest names a commit without a scope (episode_ids null): a
// retry without one is the same commit, one with a list another.
const heldScopeDigest = "held"

// extendLease moves the lease to deadline + grace if that is later, and
// (re)arms the expiry timer. Called with c.mu held.
func (c *Controller) extendLease(deadline time.Time) {
	until := deadline.Add(c.cfg.LeaseGrace())
	if !until.After(c.leaseUntil) {
		return
	}
	c.leaseUntil = until
	if c.leaseTimer != nil {
		c.leaseTimer.Stop()
	}
	id := c.st.CheckpointID
	c.leaseTimer = c.clock.AfterFunc(until.Sub(c.now()), func() { c.leaseExpired(id) })
}

func (c *Controller) leaseExpired(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.now().Before(c.leaseUntil) {
		return // extended since this timer was armed
	}
	d := Step(c.st, Input{Op: OpLeaseExpired, CheckpointID: id})
	if d.Action != ActReopen {
		return
	}
	c.log.Warn("checkpoint lease expired; reopening as a resume would", "checkpoint_id", id, "phase", c.st.Phase.String())
	c.metrics.leaseExpiries.Inc()
	c.reopenLocked()
	c.st = d.Next
}

// reopenLocked undoes a checkpoint: stop an unfinished write before it
// publishes, reopen admission, drop the lease and cached replies.
func (c *Controller) reopenLocked() {
	if c.write != nil {
		c.write.stop.Stop()
		c.write = nil
	}
	c.install = nil
	c.gate.open()
	c.p.OpenAdmission()
	c.finishTuningLocked()
	if c.leaseTimer != nil {
		c.leaseTimer.Stop()
		c.leaseTimer = nil
	}
	c.leaseUntil = time.Time{}
	c.prepared, c.committed, c.restored = nil, nil, nil
}

// startTuningLocked tells the Tuning a checkpoint started, once until
// the reopen. Called with c.mu held.
func (c *Controller) startTuningLocked() {
	if !c.tuned {
		c.tuned = true
		c.tuning.CheckpointStarted()
	}
}

// sizeTuningLocked tells the Tuning the size of the records a restore
// installs, if this controller's checkpoint is still started. Called with
// c.mu held.
func (c *Controller) sizeTuningLocked(recordBytes int64) {
	if c.tuned {
		c.tuning.RestoreSized(recordBytes)
	}
}

// finishTuningLocked tells the Tuning the checkpoint finished, if it was
// told it started. Called with c.mu held.
func (c *Controller) finishTuningLocked() {
	if c.tuned {
		c.tuned = false
		c.tuning.CheckpointFinished()
	}
}

// Prepare closes admission and waits, until the deadline, for the
// participant to be ready.
func (c *Controller) Prepare(ctx context.Context, req CheckpointRequest) (*PrepareReply, error) {
	if err := validCheckpointID(req.CheckpointID); err != nil {
		return nil, err
	}
	deadline, err := c.deadline(req.DeadlineTS)
	if err != nil {
		return nil, err
	}
	id := req.CheckpointID
	// A process a restore superseded takes part in no checkpoint.
	if err := c.CheckEpoch(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	prev := c.st
	d := Step(c.st, Input{Op: OpPrepare, CheckpointID: id})
	if d.Err != nil {
		c.mu.Unlock()
		return nil, d.Err
	}
	c.st = d.Next
	switch d.Action {
	case ActReplay:
		c.extendLease(deadline)
		r := c.prepared
		c.mu.Unlock()
		return r, nil
	case ActCloseAndWait:
		c.gate.close()
		c.startTuningLocked()
		cctx, cancel := context.WithDeadline(ctx, deadline)
		err := c.p.CloseAdmission(cctx)
		cancel()
		if err != nil {
			// Phase and admission never disagree: reopen and refuse.
			c.gate.open()
			c.p.OpenAdmission()
			c.finishTuningLocked()
			c.st = prev
			c.mu.Unlock()
			return nil, fmt.Errorf("close admission: %w", err)
		}
	}
	c.extendLease(deadline)
	c.mu.Unlock()

	_, wait := c.startSpan(ctx, tracing.SpanWaitReady, id)
	ready := c.waitReady(ctx, deadline)
	wait.SetAttributes(attribute.Bool("nemo.gym.checkpoint.ready", ready))
	wait.End()

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.st.CheckpointID != id || (c.st.Phase != PhasePreparing && c.st.Phase != PhasePrepared) {
		return nil, apierror.New(apierror.StaleCheckpoint, "checkpoint %s was resumed while preparing", id)
	}
	if c.st.Phase == PhasePrepared {
		return c.prepared, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if ready {
		c.st = Step(c.st, Input{Op: OpReady, CheckpointID: id}).Next
		c.prepared = &PrepareReply{Phase: PhasePrepared, Report: c.p.Report(MaxBlockers)}
		c.prepared.Report.Ready = true
		return c.prepared, nil
	}
	// At the deadline the reply says preparing, with the blockers, and
	// admission stays closed: the controller resumes or retires them.
	c.metrics.notReady.Inc()
	rep := c.p.Report(MaxBlockers)
	rep.Ready = false
	return &PrepareReply{Phase: PhasePreparing, Report: rep}, nil
}

// waitReady waits for readiness by notification, rechecking at least every
// ReadyRecheck, until the deadline or ctx ends.
func (c *Controller) waitReady(ctx context.Context, deadline time.Time) bool {
	expired := make(chan struct{})
	t := c.clock.AfterFunc(deadline.Sub(c.now()), func() { close(expired) })
	defer t.Stop()
	recheck := time.NewTimer(ReadyRecheck)
	defer recheck.Stop()
	for {
		changed := c.p.ReadyChanged()
		if c.p.Ready() {
			return true
		}
		select {
		case <-changed:
		case <-recheck.C:
			recheck.Reset(ReadyRecheck)
		case <-expired:
			return c.p.Ready()
		case <-ctx.Done():
			return false
		}
	}
}

// Renew extends the lease of the open checkpoint.
func (c *Controller) Renew(req CheckpointRequest) (map[string]any, error) {
	if err := validCheckpointID(req.CheckpointID); err != nil {
		return nil, err
	}
	deadline, err := c.deadline(req.DeadlineTS)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	d := Step(c.st, Input{Op: OpRenew, CheckpointID: req.CheckpointID})
	if d.Err != nil {
		return nil, d.Err
	}
	c.extendLease(deadline)
	return map[string]any{"lease_expires_at": unixSeconds(c.leaseUntil)}, nil
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// Commit exports the scope once and writes it once; a retry awaits or
// replays the same write.
func (c *Controller) Commit(ctx context.Context, req CommitRequest) (*CommitReply, error) {
	return c.commit(ctx, req, false)
}

// commit is Commit; owned says req.EpisodeIDs is the controller's to sort
// in place (a body the route decoded) rather than the caller's.
func (c *Controller) commit(ctx context.Context, req CommitRequest, owned bool) (*CommitReply, error) {
	if err := validCheckpointID(req.CheckpointID); err != nil {
		return nil, err
	}
	deadline, err := c.deadline(req.DeadlineTS)
	if err != nil {
		return nil, err
	}
	if err := c.validDir(req.CheckpointDir); err != nil {
		return nil, err
	}
	// No scope (episode_ids null or absent) exports everything the
	// participant holds, as NeMo Gym's CommitRequest allows; the scope is
	// then the participant's own list, taken once the commit writes.
	everything := req.EpisodeIDs == nil
	var scope Scope
	digest := heldScopeDigest
	if !everything {
		if err := validEpisodes(req.EpisodeIDs); err != nil {
			return nil, err
		}
		scope = newScope(req.EpisodeIDs, owned)
		digest = scopeDigest(scope)
	}
	if req.Stop {
		digest += "+stop"
	}
	id := req.CheckpointID
	// A process a restore superseded commits nothing, not even a replay.
	if err := c.CheckEpoch(); err != nil {
		return nil, err
	}

	c.mu.Lock()
	d := Step(c.st, Input{Op: OpCommit, CheckpointID: id, Dir: req.CheckpointDir, Scope: digest, Ready: c.p.Ready()})
	if d.Err != nil {
		c.mu.Unlock()
		return nil, d.Err
	}
	switch d.Action {
	case ActReplay:
		c.extendLease(deadline)
		r := c.committed
		c.mu.Unlock()
		return r, nil
	case ActAwaitWrite:
		c.extendLease(deadline)
		t := c.write
		c.mu.Unlock()
		return awaitTask[*CommitReply](ctx, c, t, deadline)
	}
	// ActWrite.
	if everything {
		h, ok := c.p.(Holder)
		if !ok {
			c.extendLease(deadline)
			c.mu.Unlock()
			return nil, apierror.New(apierror.CheckpointError, "this %s participant needs the episode_ids the controller continues from this checkpoint: it exports only the episodes a scope names", c.p.Kind())
		}
		// What it holds excludes its restarts: none can be in scope.
		scope = NewScope(h.Held())
	} else if restarts := c.p.Report(0).Restarts; len(restarts) > 0 {
		// A scope that names an episode this participant can only restart
		// would promise a continuation nobody can give.
		for _, k := range restarts {
			if eid, err := rollout.ParseCaptureKey(k); err == nil && scope.Has(eid) {
				c.mu.Unlock()
				return nil, apierror.New(apierror.RestartInScope, "episode %s is a restart on this %s participant and cannot be continued; leave it out of the scope", k, c.p.Kind())
			}
		}
	}
	c.st = d.Next
	c.extendLease(deadline)
	t := newTask(id)
	// The store publishes the manifest under the epoch guard: a process
	// paused mid-write and superseded meanwhile publishes nothing, and
	// one paused inside the publication holds the raise off until its
	// manifest is durable.
	t.stop.Guard = c.UnderEpoch
	c.write = t
	c.wg.Add(1)
	go c.runWrite(trace.ContextWithSpan(c.ctx, trace.SpanFromContext(ctx)), t, req, scope)
	c.mu.Unlock()
	return awaitTask[*CommitReply](ctx, c, t, deadline)
}

// runWrite exports and writes the scope. ctx is the controller's (a write
// outlives the call that started it) carrying that call's span, so export
// and write are stages of the commit's trace.
func (c *Controller) runWrite(ctx context.Context, t *task, req CommitRequest, scope Scope) {
	defer c.wg.Done()
	start := time.Now()
	wctx, write := c.startSpan(ctx, tracing.SpanWrite, t.id, tracing.AttrEpisodes.Int(scope.Len()))
	defer write.End()
	// Most participants export a record per episode: grown one append at
	// a time, the list's copies were fresh memory, in page faults.
	keys := make([]string, 0, scope.Len())
	var extras Extras
	target := ckptstore.Target{Dir: req.CheckpointDir, Kind: c.p.Kind(), Instance: c.p.Instance(), CheckpointID: t.id}
	w, err := c.store.Write(wctx, target, t.stop, func(add func(ckptstore.Record) error) (map[string]any, error) {
		// A sibling of write under the commit: records stream from the
		// export into the write as they are made.
		ectx, export := c.startSpan(ctx, tracing.SpanExport, t.id)
		defer export.End()
		var err error
		extras, err = c.p.Export(ectx, scope, func(r Record) error {
			keys = append(keys, r.EpisodeID.CaptureKey())
			return add(r)
		})
		export.SetAttributes(tracing.AttrRecords.Int(len(keys)))
		tracing.Fail(export, err)
		return extras.Manifest, err
	})
	if err == nil {
		write.SetAttributes(tracing.AttrRecords.Int(w.Manifest.RecordCount), tracing.AttrBytes.Int64(w.Bytes))
	}
	tracing.Fail(write, err)
	if err == nil {
		faultpoint.Hit(faultpoint.CommitWritten)
		err = c.p.Committed(wctx, scope, req.Stop)
		if err != nil {
			err = fmt.Errorf("after the commit was written: %w", err)
		} else {
			faultpoint.Hit(faultpoint.CommitAcked)
		}
	}
	took := time.Since(start)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.metrics.observe("commit_write", start, err)
	if err != nil {
		c.st = Step(c.st, Input{Op: OpCommitDone, CheckpointID: t.id, OK: false}).Next
		if c.write == t {
			c.write = nil
		}
		c.log.Warn("checkpoint commit failed", "checkpoint_id", t.id, "checkpoint_dir", req.CheckpointDir, "err", err, "detail", ckptstore.Detail(err))
		t.finish(nil, commitError(err))
		return
	}
	c.st = Step(c.st, Input{Op: OpCommitDone, CheckpointID: t.id, OK: true}).Next
	keys = sortedKeys(keys)
	reply := &CommitReply{Phase: PhaseCommitted, Manifest: w.Manifest, EpisodeIDs: keys, Extras: extras.Reply, Records: w.Manifest.RecordCount, Bytes: w.Bytes, WriteSeconds: took.Seconds()}
	if c.st.Phase == PhaseCommitted && c.st.CheckpointID == t.id {
		c.committed = reply
	}
	c.metrics.records.WithLabelValues("commit").Add(float64(w.Manifest.RecordCount))
	c.metrics.bytes.WithLabelValues("commit").Add(float64(w.Bytes))
	if c.write == t {
		c.write = nil
	}
	t.finish(reply, nil)
}

// sortedKeys is keys sorted, each once: the capture keys a commit or
// restore reply lists, as NeMo Gym replies them (control.py:
// sorted({key ...})) and NeMo RL's adapter refuses duplicates. An export
// writes in scope order, sorted already for most ids, so the sort is
// usually only its check; a participant with several records of one
// episode (sessions) lists its key once.
func sortedKeys(keys []string) []string {
	if !slices.IsSorted(keys) {
		slices.Sort(keys)
	}
	return slices.Compact(keys)
}

func commitError(err error) error {
	switch {
	case errors.Is(err, ckptstore.ErrStopped):
		return apierror.New(apierror.StaleCheckpoint, "the checkpoint was resumed before its write was published")
	case errors.Is(err, ckptstore.ErrDifferentCommit):
		return apierror.Wrap(apierror.CheckpointConflict, err)
	}
	var ae *apierror.Error
	if errors.As(err, &ae) {
		return err
	}
	return apierror.Wrap(apierror.Internal, fmt.Errorf("commit write failed: %w", err))
}

// awaitTask waits for t until the deadline; a deadline that passes fails
// the call while the task goes on, so a retry can await it.
func awaitTask[T any](ctx context.Context, c *Controller, t *task, deadline time.Time) (T, error) {
	var zero T
	expired := make(chan struct{})
	timer := c.clock.AfterFunc(deadline.Sub(c.now()), func() { close(expired) })
	defer timer.Stop()
	select {
	case <-t.done:
		if t.err != nil {
			return zero, t.err
		}
		return t.reply.(T), nil
	case <-expired:
		return zero, apierror.New(apierror.DeadlineExceeded, "the deadline passed while checkpoint %s was still being written or installed; retry with the same id to await it", t.id)
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// Restore reads this participant's records of the scope and installs them
// under the next attempts, in a fresh process, all or nothing.
func (c *Controller) Restore(ctx context.Context, req RestoreRequest) (*RestoreReply, error) {
	return c.restore(ctx, req, false)
}

// restore is Restore; owned as for commit.
func (c *Controller) restore(ctx context.Context, req RestoreRequest, owned bool) (*RestoreReply, error) {
	if err := validCheckpointID(req.CheckpointID); err != nil {
		return nil, err
	}
	deadline, err := c.deadline(req.DeadlineTS)
	if err != nil {
		return nil, err
	}
	if err := c.validDir(req.CheckpointDir); err != nil {
		return nil, err
	}
	if req.EpisodeIDs == nil {
		return nil, apierror.New(apierror.InvalidRequest, "episode_ids is required: name the checkpointed attempts to continue")
	}
	if err := validEpisodes(req.EpisodeIDs); err != nil {
		return nil, err
	}
	scope := newScope(req.EpisodeIDs, owned)
	digest := scopeDigest(scope)

	c.mu.Lock()
	d := Step(c.st, Input{Op: OpRestore, CheckpointID: req.CheckpointID, Dir: req.CheckpointDir, Scope: digest})
	if d.Err != nil {
		c.mu.Unlock()
		return nil, d.Err
	}
	switch d.Action {
	case ActReplay:
		c.extendLease(deadline)
		r := c.restored
		c.mu.Unlock()
		return r, nil
	case ActAwaitInstall:
		c.extendLease(deadline)
		t := c.install
		c.mu.Unlock()
		return awaitTask[*RestoreReply](ctx, c, t, deadline)
	}
	// The fleet moves to the restore's epoch whatever becomes of this
	// install, so every process the controller restores stays one fleet.
	if err := c.epoch.adopt(req.Epoch); err != nil {
		c.mu.Unlock()
		return nil, err
	}
	// Gym's participants refuse it with ControlError, checkpoint_error
	// (model.py install: "requires a freshly started model server").
	if err := c.p.Fresh(); err != nil {
		c.mu.Unlock()
		return nil, apierror.New(apierror.CheckpointError, "restore requires a fresh process: %v", err)
	}
	c.st = d.Next
	c.extendLease(deadline)
	c.gate.close()
	cctx, cancel := context.WithDeadline(ctx, deadline)
	err = c.p.CloseAdmission(cctx)
	cancel()
	if err != nil {
		c.gate.open()
		c.p.OpenAdmission()
		c.st = Step(c.st, Input{Op: OpRestoreDone, CheckpointID: req.CheckpointID}).Next
		c.mu.Unlock()
		return nil, fmt.Errorf("close admission: %w", err)
	}
	c.startTuningLocked() // sized once the records' size is known
	t := newTask(req.CheckpointID)
	c.install = t
	c.wg.Add(1)
	go c.runInstall(trace.ContextWithSpan(c.ctx, trace.SpanFromContext(ctx)), t, req, scope)
	c.mu.Unlock()
	return awaitTask[*RestoreReply](ctx, c, t, deadline)
}

// runInstall reads and installs the scope; ctx as for runWrite.
func (c *Controller) runInstall(ctx context.Context, t *task, req RestoreRequest, scope Scope) {
	defer c.wg.Done()
	start := time.Now()
	// The directory may hold another checkpoint id than the restore's: NeMo
	// Gym's restore reads whatever manifest the directory holds and replies
	// its id as source_checkpoint_id, which NeMo RL's adapter checks
	// (control.py _restore; gym_checkpoint_adapter.py @ ec883a24be08).
	target := ckptstore.Target{Dir: req.CheckpointDir, Kind: c.p.Kind(), Instance: c.p.Instance()}
	// The Tuning learns the records' size once: before they are read into
	// memory, or after for a backend that could not tell it (a runtime
	// hold readied for a fresh process's few MB would not suit them).
	// OnSize runs in this goroutine, inside ReadWith.
	widened := false
	widen := func(size int64) {
		widened = true
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.install == t { // not reopened meanwhile
			c.sizeTuningLocked(size)
		}
	}
	rctx, readSpan := c.startSpan(ctx, tracing.SpanRead, t.id, tracing.AttrEpisodes.Int(scope.Len()))
	m, recs, size, err := c.readSources(rctx, target, req.Replicas, ckptstore.ReadOptions{Keep: scope.Has, OnSize: widen})
	read := time.Since(start)
	readSpan.SetAttributes(tracing.AttrRecords.Int(len(recs)), tracing.AttrBytes.Int64(size))
	tracing.Fail(readSpan, err)
	readSpan.End()
	var installed []rollout.EpisodeID
	if err == nil {
		if !widened {
			widen(size)
		}
		faultpoint.Hit(faultpoint.RestoreRead)
		// This process is fresh: every page the install writes would be a
		// fault of its own. The Tuning hears of the install once the
		// records are read, not before: their buffer is then fresh memory
		// the read fills, where a buffer placed in a heap readied for the
		// install would be zeroed by the runtime first.
		done := c.tuning.InstallStarting(size)
		ictx, install := c.startSpan(ctx, tracing.SpanInstall, t.id, tracing.AttrRecords.Int(len(recs)))
		var aliases map[string]string
		if req.Replicas != nil {
			aliases = req.Replicas.Aliases
		}
		installed, err = c.p.Install(ictx, recs, scope, Extras{Manifest: m.Extras, Aliases: aliases})
		install.SetAttributes(tracing.AttrEpisodes.Int(len(installed)))
		tracing.Fail(install, err)
		install.End()
		done()
		if err == nil {
			faultpoint.Hit(faultpoint.RestoreInstalled)
		}
		if err != nil && !apierror.HasCode(err, apierror.Internal) {
			var ae *apierror.Error
			if !errors.As(err, &ae) {
				err = apierror.Wrap(apierror.InvalidCheckpointState, err)
			}
		}
	}
	took := time.Since(start)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.metrics.observe("restore_install", start, err)
	if err != nil {
		before := c.st
		c.st = Step(c.st, Input{Op: OpRestoreDone, CheckpointID: t.id, OK: false}).Next
		if before.Busy && before.CheckpointID == t.id {
			// Nothing is recorded: admission reopens and the phase is idle.
			c.gate.open()
			c.p.OpenAdmission()
			c.finishTuningLocked()
			if c.leaseTimer != nil {
				c.leaseTimer.Stop()
				c.leaseTimer = nil
			}
			c.leaseUntil = time.Time{}
		}
		if c.install == t {
			c.install = nil
		}
		c.log.Warn("checkpoint restore failed", "checkpoint_id", t.id, "checkpoint_dir", req.CheckpointDir, "err", err, "detail", ckptstore.Detail(err))
		t.finish(nil, err)
		return
	}
	keys := make([]string, len(installed))
	for i, id := range installed {
		keys[i] = id.CaptureKey()
	}
	keys = sortedKeys(keys)
	reply := &RestoreReply{
		Phase: PhaseRestored, SourceCheckpointID: cmp.Or(m.CheckpointID, t.id), Restored: keys, Records: len(recs),
		ReadSeconds: read.Seconds(), InstallSeconds: (took - read).Seconds(),
	}
	c.st = Step(c.st, Input{Op: OpRestoreDone, CheckpointID: t.id, OK: true}).Next
	if c.st.Phase == PhaseRestored && c.st.CheckpointID == t.id {
		c.restored = reply
	}
	c.metrics.records.WithLabelValues("restore").Add(float64(len(recs)))
	c.metrics.bytes.WithLabelValues("restore").Add(float64(size))
	if c.install == t {
		c.install = nil
	}
	t.finish(reply, nil)
}

// readSources reads the records a restore installs: this instance's own,
// or, in a restore across replicas, those of every former instance the plan
// names (all of them or none; an empty plan reads nothing), of which a
// plan's partition keeps the rollouts routed to this replica. The manifest
// returned is the first source's: replicas of one server write the same
// extras.
func (c *Controller) readSources(ctx context.Context, target ckptstore.Target, plan *ReplicaPlan, o ckptstore.ReadOptions) (ckptstore.Manifest, []Record, int64, error) {
	if plan == nil {
		return c.store.ReadWith(ctx, target, o)
	}
	var (
		first ckptstore.Manifest
		all   []Record
		total int64
	)
	if part := plan.Partition; part != nil {
		if p, ok := replica.Of(replica.Family(target.Instance), target.Instance, part.Count); !ok || p != *part {
			return first, nil, 0, apierror.New(apierror.InvalidRequest, "replicas.partition %d of %d is not %s's place among its replicas", part.Index, part.Count, target.Instance)
		}
		keep, mine := o.Keep, *part
		o.Keep = func(id rollout.EpisodeID) bool { return mine.Keeps(id.RolloutID) && (keep == nil || keep(id)) }
		// The Tuning sizes the install by what it keeps: about a Count-th
		// of what it reads.
		if onSize := o.OnSize; onSize != nil && mine.Count > 1 {
			o.OnSize = func(size int64) { onSize(size / int64(mine.Count)) }
		}
	}
	for i, src := range plan.Sources {
		if !rollout.ValidID(src) || replica.Family(src) != replica.Family(target.Instance) {
			return first, nil, 0, apierror.New(apierror.InvalidRequest, "replicas.sources names %q, not a replica of %s", src, target.Instance)
		}
		t := target
		t.Instance = src
		m, recs, size, err := c.store.ReadWith(ctx, t, o)
		if err != nil {
			return first, nil, 0, err
		}
		if i == 0 {
			first = m
		}
		all = append(all, recs...)
		total += size
	}
	if len(plan.Sources) == 0 && o.OnSize != nil {
		o.OnSize(0)
	}
	return first, all, total, nil
}

// Resume reopens (also aborting an unpublished checkpoint).
func (c *Controller) Resume(req CheckpointRequest) (*ResumeReply, error) {
	if err := validCheckpointID(req.CheckpointID); err != nil {
		return nil, err
	}
	if _, err := c.deadline(req.DeadlineTS); err != nil && !apierror.HasCode(err, apierror.DeadlineExceeded) {
		// A late resume still reopens: a controller must always be able to
		// undo a checkpoint.
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	d := Step(c.st, Input{Op: OpResume, CheckpointID: req.CheckpointID})
	if d.Err != nil {
		return nil, d.Err
	}
	if d.Action == ActReopen {
		c.reopenLocked()
	}
	c.st = d.Next
	return &ResumeReply{Phase: c.st.Phase, Idempotent: d.Idempotent}, nil
}

// Retire raises the fence for the attempts, then has the participant stop
// their work and free their state.
func (c *Controller) Retire(ctx context.Context, req RetireRequest) (map[string]any, error) {
	// Required, as NeMo Gym's RetireRequest and ForgetRequest require it
	// (control.py): outside a checkpoint only its form is checked.
	if err := validCheckpointID(req.CheckpointID); err != nil {
		return nil, err
	}
	deadline, err := c.deadline(req.DeadlineTS)
	if err != nil {
		return nil, err
	}
	if len(req.EpisodeIDs) == 0 {
		return nil, apierror.New(apierror.InvalidRequest, "episode_ids must name at least one episode")
	}
	if err := validEpisodes(req.EpisodeIDs); err != nil {
		return nil, err
	}
	c.mu.Lock()
	d := Step(c.st, Input{Op: OpRetire, CheckpointID: req.CheckpointID})
	if d.Err != nil {
		c.mu.Unlock()
		return nil, d.Err
	}
	// The mark goes up before anything stops: a request sent just before the
	// retire may arrive after it.
	c.fence.Raise(req.EpisodeIDs)
	c.mu.Unlock()
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if err := c.p.Retire(rctx, req.EpisodeIDs); err != nil {
		if rctx.Err() != nil && ctx.Err() == nil {
			return nil, apierror.New(apierror.DeadlineExceeded, "retire did not finish before its deadline; the work stays tracked and a retry stops it again")
		}
		return nil, err
	}
	keys := make([]string, len(req.EpisodeIDs))
	for i, id := range req.EpisodeIDs {
		keys[i] = id.CaptureKey()
	}
	return map[string]any{"retired": keys}, nil
}

// Forget drops the fence marks of rollouts that are done for good.
func (c *Controller) Forget(ctx context.Context, req ForgetRequest) (map[string]any, error) {
	// Required, as NeMo Gym's RetireRequest and ForgetRequest require it
	// (control.py): outside a checkpoint only its form is checked.
	if err := validCheckpointID(req.CheckpointID); err != nil {
		return nil, err
	}
	deadline, err := c.deadline(req.DeadlineTS)
	if err != nil {
		return nil, err
	}
	if len(req.RolloutIDs) == 0 {
		return nil, apierror.New(apierror.InvalidRequest, "rollout_ids must name at least one rollout")
	}
	for _, r := range req.RolloutIDs {
		if err := rollout.ValidateRolloutID(r); err != nil {
			return nil, apierror.Wrap(apierror.InvalidRequest, err)
		}
	}
	c.mu.Lock()
	d := Step(c.st, Input{Op: OpForget, CheckpointID: req.CheckpointID})
	c.mu.Unlock()
	if d.Err != nil {
		return nil, d.Err
	}
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	// The participant may refuse (retire_incomplete); the marks stay then.
	if err := c.p.Forget(rctx, req.RolloutIDs); err != nil {
		return nil, err
	}
	c.fence.Forget(req.RolloutIDs)
	// sorted(request.rollout_ids), as NeMo Gym's control.py replies.
	return map[string]any{"forgotten": slices.Sorted(slices.Values(req.RolloutIDs))}, nil
}

// Status is GET status: phase, lease, fence size, readiness and extras.
func (c *Controller) Status() map[string]any {
	c.mu.Lock()
	st := c.st
	lease := c.leaseUntil
	c.mu.Unlock()
	m := map[string]any{}
	for k, v := range c.p.StatusExtra() {
		m[k] = v
	}
	m["kind"] = c.p.Kind()
	m["instance"] = c.p.Instance()
	m["phase"] = st.Phase
	m["checkpoint_id"] = nilIfEmpty(st.CheckpointID)
	if lease.IsZero() {
		m["lease_expires_at"] = nil
	} else {
		m["lease_expires_at"] = unixSeconds(lease)
	}
	m["retired_rollouts"] = c.fence.Len()
	m["epoch"] = c.epoch.cur.Load()
	m["fenced"] = c.epoch.fenced.Load()
	m["report"] = c.p.Report(MaxBlockers)
	return m
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}
