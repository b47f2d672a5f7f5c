package collect

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/infra/atomicfile"
	"github.com/gymfleet/gymfleet/pkg/infra/backoff"
	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// task is one row on its way: the attempt it is sent as and why.
type task struct {
	row     *Row
	attempt int
	// restored: a restore installed this attempt and it has not been sent
	// yet; a checkpoint names it in its scope.
	restored bool
	// tries counts sends that got no reply (or a stale_attempt refusal).
	tries   int
	lastErr string
	// closedRefusals counts the refusals in a row by an outside
	// checkpoint's closed admission; the pause before each resend grows
	// with it (closedBackoff).
	closedRefusals int
}

// closedBackoff is the pause before the resend that follows the nth refusal
// in a row by an outside checkpoint: short at first, doubling to a cap, so
// a checkpoint's closed window is polled without a busy loop.
func closedBackoff(n int) time.Duration {
	return backoff.Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Second}.Delay(n)
}

func (t *task) episode() rollout.EpisodeID {
	return rollout.EpisodeID{RolloutID: t.row.Episode.RolloutID, Attempt: t.attempt}
}

// body is the /run body: the row, as the attempt the task sends.
func (t *task) body() map[string]codec.RawMessage {
	if t.attempt == t.row.Episode.Attempt {
		return t.row.Fields
	}
	b := make(map[string]codec.RawMessage, len(t.row.Fields)+1)
	for k, v := range t.row.Fields {
		b[k] = v
	}
	b[rollout.FieldAttemptIndex] = codec.RawMessage(strconv.Itoa(t.attempt))
	return b
}

// Collection is one collection run: the controller of the rows it sends
// and, with checkpoints on, of the fleet's checkpoints. Open (or
// Collector.Run) makes one; Run sends the rows; Checkpoint and
// RequestCheckpoint may be called while Run runs.
type Collection struct {
	c    *Collector
	ckpt *CheckpointOptions
	fs   atomicfile.FS

	dir string // absolute state directory ("" without checkpoints)
	// recordsDir is where the servers commit: dir, or an s3:// directory.
	recordsDir string
	runID      string
	dlog       *dispatchWriter

	out      io.Writer
	failures io.Writer
	closers  []func() error
	pidFile  string

	coordMu sync.Mutex
	coord   *coordination.Coordinator

	// ckptMu is the checkpoint lock: a checkpoint, a retire batch and a
	// forget batch never overlap, so no retire lands inside a checkpoint.
	ckptMu sync.Mutex

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced on every change under mu
	poke     chan struct{} // wakes Run's controller loop for a request
	queue    []*task
	inflight map[string]*task
	pending  int // rows not final yet: queued, in flight, or awaiting retire
	gateOpen bool
	stopping bool // no further dispatch: a stop checkpoint or a fatal error
	stopped  bool // a stop checkpoint was taken (or tried)
	closing  bool
	ran      bool
	cancel   context.CancelCauseFunc
	wantCkpt bool
	wantStop bool

	retireQ       []*task
	failedRetires []rollout.EpisodeID
	retired       map[string]bool // rollouts with a retired attempt
	retireFailed  map[string]bool // rollouts with an attempt whose retire failed
	done          map[string]bool // rollouts final in this run
	forgetReady   int

	st  *stats
	bar *progressbar.ProgressBar
	// plain, when set (PlainProgress), gets a progress line every tenth
	// of the rows or plainEvery instead of the bar; plainAt is the last.
	plain       io.Writer
	plainAt     time.Time
	plainTenths int
	skipped     []LineIssue
	failuresOut *lazyFile
	finishedOld int
	restore     *RestoreStats
	ckpts       []CheckpointStats
	lastCkpt    *CheckpointStats
}

func (c *Collector) newCollection(out, failures io.Writer) *Collection {
	return &Collection{
		c: c, ckpt: c.opts.Checkpoints, fs: atomicfile.OS,
		out: out, failures: failures,
		changed:  make(chan struct{}),
		poke:     make(chan struct{}, 1),
		inflight: map[string]*task{},
		gateOpen: true,
		retired:  map[string]bool{}, retireFailed: map[string]bool{}, done: map[string]bool{},
		st: newStats(0),
	}
}

// queueRows queues every row, at next[id] when given, else at its own
// attempt; restored rows (by id) go first.
func (r *Collection) queueRows(rows []Row, plan *ResumePlan) {
	var first, rest []*task
	restored := map[string]bool{}
	var restarts map[string]bool
	if plan != nil {
		for _, e := range plan.Restore {
			restored[e.RolloutID] = true
		}
		restarts = plan.Restarts()
	}
	for i := range rows {
		row := &rows[i]
		id := row.Episode.RolloutID
		t := &task{row: row, attempt: row.Episode.Attempt}
		if plan != nil {
			a, ok := plan.Next[id]
			if !ok {
				continue // finished
			}
			t.attempt = a
		}
		if restored[id] {
			t.restored = true
			first = append(first, t)
			continue
		}
		if restarts[id] {
			r.st.restartedSet[id] = true
		}
		rest = append(rest, t)
	}
	r.queue = append(first, rest...)
	r.pending = len(r.queue)
	r.st.rows = len(r.queue)
	r.st.continued = len(first)
}

// notifyLocked wakes everything waiting on a change.
func (r *Collection) notifyLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
	r.describeLocked()
}

func (r *Collection) notice(format string, args ...any) {
	if w := r.c.opts.Notices; w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

func (r *Collection) now() time.Time { return r.c.opts.Now() }

// Open reads input and gets the collection ready to Run: with checkpoints
// on, it prepares the checkpoint directory and, when resuming, keeps the
// rows already in output, restores LATEST if it is the previous run's and
// retires every other attempt the previous run sent. Nothing is sent to
// /run before Run. An input with bad lines is refused (BadInputError)
// unless SkipBadLines.
func (c *Collector) Open(ctx context.Context, input, output string) (_ *Collection, err error) {
	in, err := os.Open(input)
	if err != nil {
		return nil, err
	}
	rows, issues, err := ReadRows(in, c.opts.Limit)
	in.Close()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", input, err)
	}
	if len(issues) > 0 && !c.opts.SkipBadLines {
		return nil, &BadInputError{Path: input, Issues: issues}
	}
	// Before the output is truncated or anything is retired: a fleet that
	// is down fails here with its cause, rather than after every row has
	// spent its attempts.
	if err := c.reachable(ctx); err != nil {
		return nil, err
	}
	r := c.newCollection(nil, nil)
	r.skipped = issues
	defer func() {
		if err != nil {
			_ = r.Close()
		}
	}()
	if r.ckpt == nil {
		out, err := os.Create(output)
		if err != nil {
			return nil, err
		}
		r.out = out
		r.closers = append(r.closers, out.Close)
		r.queueRows(rows, nil)
	} else if err := r.openCheckpointed(ctx, rows, output); err != nil {
		return nil, err
	}
	// The failures file describes this run: a stale one would name rows
	// that are being run again.
	if err := removeIfExists(FailuresPath(output)); err != nil {
		return nil, err
	}
	r.failuresOut = &lazyFile{path: FailuresPath(output)}
	r.failures = r.failuresOut
	r.closers = append(r.closers, r.failuresOut.Close)
	return r, nil
}

// openCheckpointed prepares the checkpoint directory, and resumes the
// previous run when asked. The new dispatch log is written before anything
// is retired, restored or sent.
func (r *Collection) openCheckpointed(ctx context.Context, rows []Row, output string) error {
	r.recordsDir = r.ckpt.Dir
	state := r.ckpt.StateDir
	if state == "" {
		state = r.ckpt.Dir
	}
	dir, err := filepath.Abs(state)
	if err != nil {
		return err
	}
	if !ckptstore.IsS3(r.recordsDir) {
		r.recordsDir = dir
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("checkpoint directory: %w", err)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return fmt.Errorf("checkpoint directory %s is not a directory", dir)
	}
	r.dir = dir
	pid := filepath.Join(dir, PIDFileName)
	if err := atomicfile.WriteFile(r.fs, pid, []byte(strconv.Itoa(os.Getpid())+"\n")); err != nil {
		return fmt.Errorf("checkpoint directory %s is not writable: %w", dir, err)
	}
	r.pidFile = pid
	logPath := filepath.Join(dir, DispatchLogName)
	r.runID = newRunID()
	r.st.runID = r.runID

	if !r.ckpt.Resume {
		if _, err := os.Stat(logPath); err == nil {
			r.notice("starting over: the previous run's dispatch log in %s is replaced (--resume continues it)", dir)
		}
		out, err := os.Create(output)
		if err != nil {
			return err
		}
		r.out = out
		r.closers = append(r.closers, out.Close)
		if r.dlog, err = createDispatchLog(r.fs, logPath, r.runID, nil); err != nil {
			return err
		}
		r.queueRows(rows, nil)
		return nil
	}

	out, finished, err := openOutputForResume(output)
	if err != nil {
		return err
	}
	r.out = out
	r.closers = append(r.closers, out.Close)
	prev, err := LoadDispatchLog(logPath)
	if err != nil {
		return err
	}
	latest, err := ReadLatest(dir)
	switch {
	case errors.Is(err, ErrNoLatest):
		latest = nil
	case err != nil:
		r.notice("LATEST is not usable, so every unfinished row the previous run sent starts over: %v", err)
		latest = nil
	}
	plan := PlanResume(ResumeState{Rows: rows, Finished: finished, Log: prev, Latest: latest})
	r.finishedOld = plan.Finished
	if plan.LatestIgnored != "" {
		r.notice("not restoring LATEST: %s", plan.LatestIgnored)
	}
	// Discover before the new log replaces the old one: a fleet that is not
	// up yet must not cost the previous run its checkpoint.
	coord, err := r.coordinator(ctx)
	if err != nil {
		return fmt.Errorf("resuming needs the fleet: %w", err)
	}
	if r.dlog, err = createDispatchLog(r.fs, logPath, r.runID, plan.Carry); err != nil {
		return err
	}
	if len(plan.Restore) > 0 {
		r.restoreLatest(ctx, coord, &plan)
	}
	r.reopenLeftovers(ctx, coord)
	if len(plan.Retire) > 0 {
		r.ckptMu.Lock()
		r.retireAttempts(ctx, plan.Retire)
		r.ckptMu.Unlock()
	}
	r.queueRows(rows, &plan)
	restarts := len(plan.Restarts())
	r.notice("resuming %s: %d rows already in the output, %d continue from %s, %d start over, %d not sent before",
		dir, plan.Finished, r.st.continued, orDash(plan.CheckpointID), restarts, len(r.queue)-r.st.continued-restarts)
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// restoreLatest restores the plan's scope and resumes the fleet; on
// failure the plan starts those rows over (coordination.Restore already
// retired the next attempts and resumed everything).
func (r *Collection) restoreLatest(ctx context.Context, coord *coordination.Coordinator, plan *ResumePlan) {
	start := time.Now()
	id := plan.CheckpointID
	rs := &RestoreStats{CheckpointID: id, Rows: len(plan.Restore)}
	r.restore = rs
	deadline := r.now().Add(r.ckpt.Timeout)
	ctx, span := r.c.tracer.Start(ctx, tracing.SpanCollectionRest, trace.WithAttributes(
		tracing.AttrCheckpointID.String(id), tracing.AttrRows.Int(len(plan.Restore))))
	defer span.End()
	_, err := coord.Restore(ctx, id, ckptstore.JoinDir(r.recordsDir, id), plan.Restore, deadline)
	tracing.Fail(span, err)
	rs.Duration = time.Since(start)
	if err != nil {
		rs.Error = err.Error()
		r.notice("restoring %s failed, so its %d rows start over (as attempt + 2): %v", id, len(plan.Restore), err)
		r.c.log.Warn("restore failed", "checkpoint_id", id, "err", err)
		plan.RestoreFailed()
		return
	}
	rs.Restored = true
	rs.Continued = append([]rollout.EpisodeID(nil), plan.Restore...)
	rstart := time.Now()
	if err := coord.Resume(context.WithoutCancel(ctx), id, r.now().Add(r.c.opts.Fleet.Timeout)); err != nil {
		// A participant that missed the resume reopens when its lease
		// expires; /run meanwhile answers admission_closed and is resent.
		r.c.log.Warn("resume after restore", "checkpoint_id", id, "err", err)
	}
	rs.Resume = time.Since(rstart)
	r.notice("restored %s: %d rows continue as their next attempt, in %.3fs", id, len(plan.Restore), rs.Duration.Seconds())
}

// reopenLeftovers resumes the checkpoints a previous collection left open
// on a fleet that kept running (a stop checkpoint closes the fleet until a
// crash or the lease): retires would be refused and /run would wait for
// the lease otherwise.
func (r *Collection) reopenLeftovers(ctx context.Context, coord *coordination.Coordinator) {
	st, err := coord.Status(ctx)
	if err != nil {
		r.c.log.Warn("reading the fleet's status", "err", err)
	}
	open := map[string]bool{}
	for _, s := range st {
		phase, _ := s["phase"].(string)
		id, _ := s["checkpoint_id"].(string)
		if phase != "" && phase != "idle" && ValidCheckpointID(id) {
			open[id] = true
		}
	}
	for id := range open {
		err := coord.Resume(context.WithoutCancel(ctx), id, r.now().Add(r.c.opts.Fleet.Timeout))
		r.notice("the fleet still held checkpoint %s open (a stop checkpoint without a crash): resumed it (%v)", id, errOrOK(err))
	}
}

func errOrOK(err error) string {
	if err != nil {
		return err.Error()
	}
	return "ok"
}

// coordinator discovers the fleet's participants once.
func (r *Collection) coordinator(ctx context.Context) (*coordination.Coordinator, error) {
	f := r.c.opts.Fleet
	if f == nil {
		return nil, errors.New("no fleet control: retire and checkpoints need the fleet file's endpoints and control token")
	}
	r.coordMu.Lock()
	defer r.coordMu.Unlock()
	if r.coord != nil {
		return r.coord, nil
	}
	if f.Coordinator != nil {
		r.coord = f.Coordinator
		return r.coord, nil
	}
	c, err := coordination.Discover(ctx, f.Endpoints, coordination.Options{Token: f.Token, Client: f.Client, HTTP: r.c.opts.HTTP, Logger: r.c.log, Tracer: r.c.opts.Tracer})
	if err != nil {
		return nil, err
	}
	r.coord = c
	return c, nil
}

// Close releases what Open opened; Run calls it. It is safe to call twice.
func (r *Collection) Close() error {
	var errs []error
	for i := len(r.closers) - 1; i >= 0; i-- {
		errs = append(errs, r.closers[i]())
	}
	r.closers = nil
	if r.dlog != nil {
		errs = append(errs, r.dlog.Close())
	}
	if r.pidFile != "" {
		errs = append(errs, removeIfExists(r.pidFile))
		r.pidFile = ""
	}
	return errors.Join(errs...)
}

// RunID is this run's id (the first line of its dispatch log); "" without
// checkpoints.
func (r *Collection) RunID() string { return r.runID }

// Dir is the absolute directory of the collector's state: LATEST,
// collection.json, the dispatch log ("" without checkpoints).
func (r *Collection) Dir() string { return r.dir }

// RecordsDir is where the servers commit their records: Dir, or an s3://
// directory.
func (r *Collection) RecordsDir() string { return r.recordsDir }

// RequestCheckpoint asks Run's controller to take a checkpoint as soon as
// it can (stop: a preemption; Run then returns ErrStopped). It never
// blocks, and a request before Run starts waits for Run.
func (r *Collection) RequestCheckpoint(stop bool) {
	r.mu.Lock()
	if stop {
		r.wantStop = true
	} else {
		r.wantCkpt = true
	}
	r.mu.Unlock()
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

// Progress is a snapshot of a running collection.
type Progress struct {
	Rows, Finished, Succeeded, Failed, InFlight, Queued int
	Continued, Restarted                                int
	LastCheckpoint                                      *CheckpointStats
}

// Progress returns the collection's counts now.
func (r *Collection) Progress() Progress {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := Progress{
		Rows: r.st.rows, Succeeded: r.st.succeeded, Failed: r.st.failed, Finished: r.st.succeeded + r.st.failed,
		InFlight: len(r.inflight), Queued: len(r.queue), Continued: r.st.continued, Restarted: len(r.st.restartedSet),
	}
	if r.lastCkpt != nil {
		c := *r.lastCkpt
		p.LastCheckpoint = &c
	}
	return p
}

// Run sends the rows and returns the summary once every row is final, or
// a stop checkpoint was taken (ErrStopped), or ctx ended (its error), or
// writing a row failed. It closes what Open opened.
func (r *Collection) Run(ctx context.Context) (sum *Summary, err error) {
	r.mu.Lock()
	if r.ran {
		r.mu.Unlock()
		return nil, errors.New("collection: Run called twice")
	}
	r.ran = true
	workCtx, cancel := context.WithCancelCause(ctx)
	r.cancel = cancel
	if r.stopping {
		cancel(ErrStopped)
	}
	r.st.start = time.Now()
	if w := r.c.opts.Progress; w != nil && r.st.rows > 0 && r.c.opts.PlainProgress {
		r.plain, r.plainAt = w, time.Now()
	} else if w != nil && r.st.rows > 0 {
		r.bar = progressbar.NewOptions(r.st.rows,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetWidth(30),
			progressbar.OptionShowCount(),
			progressbar.OptionSetItsString("rollouts"),
			progressbar.OptionShowIts(),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionSetDescription("collecting"),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }),
		)
		r.describeLocked()
	}
	r.mu.Unlock()
	defer func() {
		cancel(nil)
		if cerr := r.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()

	var workers, helpers sync.WaitGroup
	for i := 0; i < r.c.opts.Concurrency && i < r.st.rows; i++ {
		workers.Go(func() { r.worker(workCtx) })
	}
	if r.c.opts.Fleet != nil {
		helpers.Go(func() { r.retirer(workCtx) })
	}
	workersDone := make(chan struct{})
	helpers.Go(func() {
		workers.Wait()
		close(workersDone)
	})
	r.control(ctx, workersDone)
	r.mu.Lock()
	r.closing = true
	r.notifyLocked()
	r.mu.Unlock()
	cancel(nil) // the retirer stops with the workers
	helpers.Wait()

	r.mu.Lock()
	stopped := r.stopped
	r.mu.Unlock()
	if !stopped && ctx.Err() == nil && r.c.opts.Fleet != nil {
		r.closeFleet(context.WithoutCancel(ctx))
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	sum = r.summaryLocked()
	if r.bar != nil && !stopped && sum.Succeeded+sum.Failed == sum.Rows {
		_ = r.bar.Finish()
	}
	if r.plain != nil {
		r.plainLineLocked()
	}
	switch cause := context.Cause(workCtx); {
	case stopped:
		return sum, ErrStopped
	case ctx.Err() != nil:
		return sum, context.Cause(ctx)
	case cause != nil && !errors.Is(cause, context.Canceled):
		return sum, cause
	}
	return sum, nil
}

// control is Run's controller loop: it takes the requested and periodic
// checkpoints until the workers are done.
func (r *Collection) control(ctx context.Context, workersDone <-chan struct{}) {
	var tick, redraw <-chan time.Time
	if r.ckpt != nil && r.ckpt.Every > 0 {
		t := time.NewTicker(r.ckpt.Every)
		defer t.Stop()
		tick = t.C
	}
	if r.bar != nil && r.ckpt != nil {
		// The last checkpoint's age moves on without any other change.
		t := time.NewTicker(time.Second)
		defer t.Stop()
		redraw = t.C
	}
	for {
		select {
		case <-workersDone:
			return
		case <-redraw:
			r.mu.Lock()
			r.describeLocked()
			r.mu.Unlock()
		case <-r.poke:
			r.mu.Lock()
			stop, want := r.wantStop, r.wantCkpt
			r.wantStop, r.wantCkpt = false, false
			r.mu.Unlock()
			if stop || want {
				r.checkpointLogged(ctx, stop)
			}
		case <-tick:
			r.mu.Lock()
			busy := len(r.inflight) > 0
			r.mu.Unlock()
			if busy {
				r.checkpointLogged(ctx, false)
			}
		}
	}
}

func (r *Collection) checkpointLogged(ctx context.Context, stop bool) {
	if _, err := r.Checkpoint(ctx, stop); err != nil {
		r.c.log.Warn("checkpoint", "stop", stop, "err", err)
	}
}

// next waits for a row to send: the gate open and a row queued. It returns
// nil when the run is over for this worker.
func (r *Collection) next(ctx context.Context) *task {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		if r.stopping || r.pending == 0 || ctx.Err() != nil {
			return nil
		}
		if r.gateOpen && len(r.queue) > 0 {
			t := r.queue[0]
			r.queue = r.queue[1:]
			r.inflight[t.row.Episode.RolloutID] = t
			r.describeLocked()
			return t
		}
		ch := r.changed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
		r.mu.Lock()
	}
}

func (r *Collection) worker(ctx context.Context) {
	for {
		t := r.next(ctx)
		if t == nil {
			return
		}
		if r.dlog != nil {
			if err := r.dlog.Append(t.row.Episode.RolloutID, t.attempt); err != nil {
				r.mu.Lock()
				delete(r.inflight, t.row.Episode.RolloutID)
				r.st.interrupted++
				r.abortLocked(err)
				r.mu.Unlock()
				return
			}
		}
		r.settle(ctx, t, r.c.send(ctx, t))
	}
}

// abortLocked stops the run for a fatal error (a write that failed).
func (r *Collection) abortLocked(err error) {
	r.stopping = true
	if r.cancel != nil {
		r.cancel(err)
	}
	r.notifyLocked()
}

// settle records what one /run came to.
func (r *Collection) settle(ctx context.Context, t *task, res result) {
	id := t.row.Episode.RolloutID
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.inflight, id)
	switch res.outcome {
	case interrupted:
		r.st.interrupted++
	case admissionClosed:
		// Never started: resend the same attempt once admission reopens.
		if !r.gateOpen {
			r.requeueLocked(t)
			break
		}
		// An outside checkpoint closed admission: back off, then resend.
		t.closedRefusals++
		wait := closedBackoff(t.closedRefusals)
		r.mu.Unlock()
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
		r.mu.Lock()
		if ctx.Err() != nil {
			r.st.interrupted++
			break
		}
		r.requeueLocked(t)
	case staleAttempt:
		t.tries++
		t.lastErr = res.err.Detail
		r.retryOrFailLocked(t)
	case noReply:
		t.tries++
		t.lastErr = res.err.Detail
		if r.c.opts.Fleet != nil {
			r.retireQ = append(r.retireQ, t)
		} else {
			r.retryOrFailLocked(t)
		}
	default:
		t.closedRefusals = 0
		r.finishLocked(t, res)
	}
	r.notifyLocked()
}

func (r *Collection) requeueLocked(t *task) {
	r.queue = append([]*task{t}, r.queue...)
}

// retryOrFailLocked sends the row again as its next attempt, or, after
// MaxAttempts, writes it to the failures file.
func (r *Collection) retryOrFailLocked(t *task) {
	id := t.row.Episode.RolloutID
	if t.tries < r.c.opts.MaxAttempts {
		t.attempt++
		t.restored = false
		r.st.restartedSet[id] = true
		r.requeueLocked(t)
		return
	}
	e := &apierror.Error{Code: apierror.UpstreamError, Detail: fmt.Sprintf("no reply after %d attempt(s); last: %s", t.tries, t.lastErr)}
	r.finishLocked(t, result{outcome: replied, err: e, line: r.c.line(t, nil, e), finished: time.Now()})
}

// finishLocked writes a final row and counts it.
func (r *Collection) finishLocked(t *task, res result) {
	id := t.row.Episode.RolloutID
	dst := r.out
	if res.err != nil {
		dst = r.failures
	}
	if _, err := dst.Write(res.line); err != nil {
		r.st.interrupted++
		r.abortLocked(fmt.Errorf("writing row of line %d: %w", t.row.Line, err))
		return
	}
	r.pending--
	r.done[id] = true
	if r.retired[id] {
		r.forgetReady++
	}
	r.st.add(t.row, res)
	if r.bar != nil {
		_ = r.bar.Add(1)
	}
	if r.plain != nil {
		done := r.st.succeeded + r.st.failed
		if tenths := done * 10 / r.st.rows; tenths > r.plainTenths || time.Since(r.plainAt) >= plainEvery {
			r.plainTenths = tenths
			r.plainLineLocked()
		}
	}
}

// plainEvery is the longest time between two plain progress lines.
const plainEvery = 10 * time.Second

// plainLineLocked writes one plain progress line: no carriage return or
// escape sequence, for a log or a pipe.
func (r *Collection) plainLineLocked() {
	r.plainAt = time.Now()
	fmt.Fprintf(r.plain, "collecting: %d/%d rollouts finished, %d in flight, %d failed, %.1f/s\n",
		r.st.succeeded+r.st.failed, r.st.rows, len(r.inflight), r.st.failed,
		float64(r.st.succeeded+r.st.failed)/max(time.Since(r.st.start).Seconds(), 1e-3))
}

// describeLocked refreshes the progress bar's counts.
func (r *Collection) describeLocked() {
	if r.bar == nil {
		return
	}
	d := fmt.Sprintf("finished %d | in flight %d | continued %d | restarted %d | failed %d",
		r.st.succeeded+r.st.failed, len(r.inflight), r.st.continued, len(r.st.restartedSet), r.st.failed)
	if c := r.lastCkpt; c != nil {
		d += fmt.Sprintf(" | ckpt %s %s ago", c.ID, time.Since(c.At).Round(time.Second))
	}
	r.bar.Describe(d)
}

// retirer retires the attempts whose /run got no reply, in batches under
// the checkpoint lock, and sends their rows again; it also forgets
// finished rollouts once a batch of them is ready.
func (r *Collection) retirer(ctx context.Context) {
	for {
		r.mu.Lock()
		for len(r.retireQ) == 0 && r.forgetReady < RetireBatch && !r.closing {
			ch := r.changed
			r.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return
			}
			r.mu.Lock()
		}
		closing, forget := r.closing, r.forgetReady >= RetireBatch
		r.mu.Unlock()
		if closing {
			return
		}
		r.ckptMu.Lock()
		r.retireQueued(ctx)
		if forget {
			r.forgetDone(ctx)
		}
		r.ckptMu.Unlock()
	}
}

// retireQueued retires the queued attempts and sends their rows again (or
// fails them). The caller holds the checkpoint lock.
func (r *Collection) retireQueued(ctx context.Context) {
	for {
		r.mu.Lock()
		n := min(len(r.retireQ), RetireBatch)
		batch := r.retireQ[:n:n]
		r.retireQ = r.retireQ[n:]
		r.mu.Unlock()
		if n == 0 {
			return
		}
		ids := make([]rollout.EpisodeID, n)
		for i, t := range batch {
			ids[i] = t.episode()
		}
		r.retireAttempts(ctx, ids)
		r.mu.Lock()
		for _, t := range batch {
			r.retryOrFailLocked(t)
		}
		r.notifyLocked()
		r.mu.Unlock()
	}
}

// retireAttempts retires ids everywhere in batches; a batch that fails is
// kept to retry before the next checkpoint and at the end. The caller holds
// the checkpoint lock.
func (r *Collection) retireAttempts(ctx context.Context, ids []rollout.EpisodeID) {
	for len(ids) > 0 {
		n := min(len(ids), RetireBatch)
		batch := ids[:n]
		ids = ids[n:]
		err := r.retireBatch(ctx, batch)
		r.mu.Lock()
		for _, e := range batch {
			r.retired[e.RolloutID] = true
			if err != nil {
				r.retireFailed[e.RolloutID] = true
			}
		}
		if err != nil {
			r.failedRetires = append(r.failedRetires, batch...)
		} else {
			r.st.retired += len(batch)
		}
		r.mu.Unlock()
	}
}

func (r *Collection) retireBatch(ctx context.Context, ids []rollout.EpisodeID) error {
	coord, err := r.coordinator(ctx)
	if err == nil {
		err = coord.Retire(ctx, "", ids, r.now().Add(r.c.opts.Fleet.Timeout))
	}
	if err != nil {
		r.c.log.Warn("retire failed; retried before the next checkpoint and at the end", "attempts", len(ids), "err", err)
	}
	return err
}

// retryFailedRetires repeats the retires that failed. The caller holds the
// checkpoint lock.
func (r *Collection) retryFailedRetires(ctx context.Context) {
	r.mu.Lock()
	ids := r.failedRetires
	r.failedRetires = nil
	for _, e := range ids {
		delete(r.retireFailed, e.RolloutID)
	}
	r.mu.Unlock()
	if len(ids) > 0 {
		r.retireAttempts(ctx, ids)
	}
}

// forgetDone forgets the rollouts that had an attempt retired and are
// final: nothing of theirs runs or will be sent again. The caller holds
// the checkpoint lock.
func (r *Collection) forgetDone(ctx context.Context) {
	r.mu.Lock()
	var ids []string
	for id := range r.retired {
		if r.done[id] && !r.retireFailed[id] {
			ids = append(ids, id)
		}
	}
	r.forgetReady = 0
	r.mu.Unlock()
	sort.Strings(ids)
	for len(ids) > 0 {
		n := min(len(ids), RetireBatch)
		batch := ids[:n]
		ids = ids[n:]
		coord, err := r.coordinator(ctx)
		if err == nil {
			err = coord.Forget(ctx, batch, r.now().Add(r.c.opts.Fleet.Timeout))
		}
		if err != nil {
			r.c.log.Warn("forget failed", "rollouts", len(batch), "err", err)
			continue
		}
		r.mu.Lock()
		for _, id := range batch {
			delete(r.retired, id)
		}
		r.st.forgotten += len(batch)
		r.mu.Unlock()
	}
}

// closeFleet repeats failed retires and forgets every finished rollout
// that had a retired attempt.
func (r *Collection) closeFleet(ctx context.Context) {
	r.mu.Lock()
	work := len(r.failedRetires) > 0 || len(r.retired) > 0
	r.mu.Unlock()
	if !work {
		return
	}
	r.ckptMu.Lock()
	defer r.ckptMu.Unlock()
	r.retryFailedRetires(ctx)
	r.forgetDone(ctx)
}

// summaryLocked is the run's summary so far.
func (r *Collection) summaryLocked() *Summary {
	s := r.st.summary()
	s.Skipped = r.skipped
	if r.failuresOut != nil && r.failuresOut.f != nil {
		s.FailuresFile = r.failuresOut.path
	}
	s.RunID = r.st.runID
	s.AlreadyFinished = r.finishedOld
	s.Continued = r.st.continued
	s.Restarted = len(r.st.restartedSet)
	s.Retired = r.st.retired
	s.Forgotten = r.st.forgotten
	s.Restore = r.restore
	s.Checkpoints = append([]CheckpointStats(nil), r.ckpts...)
	return s
}
