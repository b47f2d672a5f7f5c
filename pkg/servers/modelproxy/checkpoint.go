package modelproxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/infra/faultpoint"
	"github.com/gymfleet/gymfleet/pkg/infra/parallel"
	"github.com/gymfleet/gymfleet/pkg/infra/park"
	"github.com/gymfleet/gymfleet/pkg/tokencapture"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// participant is the model server's side of checkpoints (SPEC §6, "Policy
// model"). It keeps a ticket per admitted call, indexed by call id and by
// rollout id; while a checkpoint holds admission closed it holds responses
// that have not started at deliver(), waits only for responses already
// streaming, and asks the inference worker to cut generations in flight.
// Its records are the ledger rows of delivered calls plus at most one cut
// per episode.
//
// The per-call state is split into shards by rollout id (by call id for a
// call outside any rollout), each with its own lock: every call takes its
// shard's lock several times, and with one lock for all, a holder the
// scheduler or a collection paused queued every call behind it, each
// waiting handler holding its stack. What concerns a rollout (its calls,
// its fence check, its restored attempt) lies in one shard, so a retire
// or a restored cut needs one lock; admission is closed shard by shard,
// and a checkpoint's close has closed every shard before it returns.
// Lock order: p.mu is never held while a shard's lock is taken, and no
// shard's lock is held while p.mu is taken.
type participant struct {
	s       *Server
	log     *slog.Logger
	metrics *ckptMetrics
	// cutURLs are each worker's cut route; nil with cuts off.
	cutURLs []string
	// ctl is the server's controller: its fence (re-checked when a call
	// registers) and phase (to name cut rounds and refuse ledger removal).
	ctl *ctlplane.Controller

	// ctx is cancelled by close; cut rounds derive from it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// shutdown is closed when the server starts closing: held calls give up.
	shutdown     chan struct{}
	shutdownOnce sync.Once

	seed   maphash.Seed
	shards [callShards]*callShard

	// Counts over every shard, changed under a shard's lock.
	admitted  atomic.Int64
	delivered atomic.Int64
	held      atomic.Int64
	// unsettled counts captured responses that started and have not
	// staged their row: what a prepare waits for.
	unsettled atomic.Int64

	// mu guards the checkpoint-wide state below; the call path takes it
	// only when the last unsettled response settles.
	mu         sync.Mutex
	changed    chan struct{}
	cutRunning bool
	round      roundCounts
	// restoredOnce: an Install ran (the process is no longer fresh).
	restoredOnce bool
	// incomplete holds rollouts whose last retire did not finish.
	incomplete map[string]struct{}
}

// callShards is how many shards the per-call state is split into.
const callShards = 64

// callShard is the per-call state of the rollouts whose ids hash to it.
type callShard struct {
	mu sync.Mutex
	// closed: admission is closed, responses not started are held.
	closed bool
	calls  map[string]*ticket
	// byRollout indexes captured tickets by rollout id (retire and export
	// visit one rollout's calls, never every call).
	byRollout map[string][]*ticket
	// unsettled holds captured responses that started and have not staged
	// their row.
	unsettled map[*ticket]struct{}
	// restored holds what the last Install put under each next attempt,
	// by rollout id (one attempt per rollout is restored).
	restored map[string]*restoredEpisode
	// openWaits are the calls waiting, parked, for admission to reopen.
	openWaits map[*openWait]struct{}
}

func newCallShard() *callShard {
	return &callShard{
		calls: map[string]*ticket{}, byRollout: map[string][]*ticket{}, unsettled: map[*ticket]struct{}{},
		restored: map[string]*restoredEpisode{}, openWaits: map[*openWait]struct{}{},
	}
}

// restoredOf is the restored state of exactly this attempt, if any. sh.mu
// is held.
func (sh *callShard) restoredOf(id rollout.EpisodeID) *restoredEpisode {
	if r := sh.restored[id.RolloutID]; r != nil && r.id == id {
		return r
	}
	return nil
}

// shardOf is the shard of a rollout id (or of a call id, for a call
// outside any rollout).
func (p *participant) shardOf(id string) *callShard {
	return p.shards[p.shardIndex(id)]
}

func (p *participant) shardIndex(id string) int {
	return int(maphash.String(p.seed, id) % callShards)
}

// shardOfCall is the shard a ticket's state lies in.
func (p *participant) shardOfCall(t *ticket) *callShard {
	if t.captureKey != "" {
		return p.shardOf(t.episode.RolloutID)
	}
	return p.shardOf(t.callID)
}

// roundCounts are the cut outcomes of the latest checkpoint.
type roundCounts struct{ cut, failed, skipped int }

// restoredEpisode is an attempt Install created.
type restoredEpisode struct {
	id rollout.EpisodeID
	// used is set when a call of the attempt arrives; until then the
	// attempt is pending and a commit that leaves it out deletes it.
	used bool
	// cut is the restored generation cut, kept until a call of the attempt
	// delivers, so a re-issue undelivered again still continues it.
	cut *GenerationCut
}

type ckptMetrics struct {
	held prometheus.Gauge
	cuts *prometheus.CounterVec
}

func newCkptMetrics(reg prometheus.Registerer) *ckptMetrics {
	m := &ckptMetrics{
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gymfleet_model_held_calls",
			Help: "Model calls waiting for a checkpoint to reopen admission before they deliver.",
		}),
		cuts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gymfleet_model_generation_cuts_total",
			Help: "Generation cuts by disposition (durable_prefix, durable_failure, skipped).",
		}, []string{"disposition"}),
	}
	reg.MustRegister(m.held, m.cuts)
	return m
}

// errShuttingDown ends held calls when the server closes.
var errShuttingDown = errors.New("the model server is shutting down")

func newParticipant(s *Server, reg prometheus.Registerer) *participant {
	ctx, cancel := context.WithCancel(context.Background())
	p := &participant{
		s: s, log: s.log.With("component", "model_participant"), metrics: newCkptMetrics(reg),
		ctx: ctx, cancel: cancel, shutdown: make(chan struct{}), seed: maphash.MakeSeed(),
		changed: make(chan struct{}), incomplete: map[string]struct{}{},
	}
	for i := range p.shards {
		p.shards[i] = newCallShard()
	}
	if s.cfg.cutsOn() {
		for _, w := range s.workers {
			p.cutURLs = append(p.cutURLs, w.root+GenerationCutPath)
		}
	}
	return p
}

// beginShutdown wakes held calls: nothing held is delivered once the
// server is closing.
func (p *participant) beginShutdown() {
	p.shutdownOnce.Do(func() {
		close(p.shutdown)
		p.wakeAll(errShuttingDown)
	})
}

// close closes the control plane, then stops a cut round and waits for it.
func (p *participant) close() {
	p.ctl.Close()
	p.beginShutdown()
	p.cancel()
	p.wg.Wait()
}

func (p *participant) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// readyLocked: no started response is still streaming, and the cut round
// (if any) finished. p.mu is held.
func (p *participant) readyLocked() bool {
	return p.unsettled.Load() == 0 && !p.cutRunning
}

// notifyIfReady wakes a prepare's wait once the last unsettled response
// settled. Called with no lock held: a settle first counts the response
// settled, then notifies, so a waiter that took the channel before the
// count fell is woken and one that took it after sees the count.
func (p *participant) notifyIfReady() {
	p.mu.Lock()
	if p.readyLocked() {
		p.notifyLocked()
	}
	p.mu.Unlock()
}

// ---- the call path -------------------------------------------------------

// admit registers a call: it is refused if its attempt was retired (the
// fence is re-checked under the shard lock a retire takes to list the
// rollout's calls, so a call is either listed and stopped or refused), and
// its work derives from the returned request's context, which a retire
// cancels.
func (p *participant) admit(r *http.Request, t *ticket) (*http.Request, error) {
	// Allocated before the lock, which every call takes several times.
	ctx, cancel := context.WithCancelCause(r.Context())
	done := make(chan struct{})
	r = r.WithContext(ctx)
	sh := p.shardOfCall(t)
	sh.mu.Lock()
	if t.captureKey != "" && p.ctl.Fence().Refuses(t.episode) {
		sh.mu.Unlock()
		cancel(nil)
		return nil, apierror.New(apierror.StaleAttempt, "attempt %d of rollout %s was retired", t.episode.Attempt, t.episode.RolloutID)
	}
	t.shard, t.cancel, t.done = sh, cancel, done
	sh.calls[t.callID] = t
	if t.captureKey != "" {
		sh.byRollout[t.episode.RolloutID] = append(sh.byRollout[t.episode.RolloutID], t)
		if rs := sh.restoredOf(t.episode); rs != nil {
			rs.used = true
		}
	}
	sh.mu.Unlock()
	p.admitted.Add(1)
	return r, nil
}

// shuttingDown reports whether the server has started closing.
func (p *participant) shuttingDown() bool {
	select {
	case <-p.shutdown:
		return true
	default:
		return false
	}
}

// release ends a call's registration when its handler returns. A call
// that never started its response was stopped by a retire (it is answered
// stale_attempt, before the retire that waits for it returns) or by a
// shutdown while held (its stream is reset, as a crash would leave it: it
// was never delivered).
func (p *participant) release(w http.ResponseWriter, r *http.Request, t *ticket) {
	abort := false
	if !t.started.Load() {
		if cause := context.Cause(r.Context()); apierror.HasCode(cause, apierror.StaleAttempt) {
			apierror.WriteOpenAI(w, r, p.s.log, cause)
		} else {
			abort = p.shuttingDown()
		}
	}
	p.unregister(t)
	if abort {
		panic(http.ErrAbortHandler)
	}
}

// unregister forgets a call whose handler is returning; a retire waiting
// for it may then go on.
func (p *participant) unregister(t *ticket) {
	sh := t.shard
	sh.mu.Lock()
	delete(sh.calls, t.callID)
	if t.captureKey != "" {
		rid := t.episode.RolloutID
		if rest := slices.DeleteFunc(sh.byRollout[rid], func(o *ticket) bool { return o == t }); len(rest) > 0 {
			sh.byRollout[rid] = rest
		} else {
			delete(sh.byRollout, rid)
		}
	}
	p.unholdLocked(t)
	settledLast := p.settleLocked(sh, t)
	close(t.done)
	sh.mu.Unlock()
	t.cancel(nil)
	if settledLast {
		p.notifyIfReady()
	}
}

// describeChat describes a Chat Completions call.
func (p *participant) describeChat(t *ticket, digest string, f chatFields) {
	p.describe(t, digest, f.streaming(), constrainedChat(f))
}

// describeResponses describes a Responses call.
func (p *participant) describeResponses(t *ticket, digest string, req *openai.ResponsesRequest, chat *openai.ChatRequest) {
	p.describe(t, digest, req.Streaming(), constrainedResponses(req, chat))
}

// describe records the request's digest and kind; a call whose capture key
// and digest match a restored generation cut continues its prefix.
func (p *participant) describe(t *ticket, digest string, stream, constrained bool) {
	sh := t.shard
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t.digest, t.stream, t.constrained = digest, stream, constrained
	if t.captureKey == "" || t.continueKey != "" {
		return
	}
	if r := sh.restoredOf(t.episode); r != nil && r.cut != nil && r.cut.RequestDigest == digest {
		t.continueKey = r.cut.Continuation.StagingKeys[0]
	}
}

func (p *participant) upstreamRunning(t *ticket, running bool) { t.running.Store(running) }

// deliver lets a response start, holding it (parked) while admission is
// closed.
func (p *participant) deliver(task *park.Task, ctx context.Context, t *ticket, done func(error)) {
	p.waitOpen(task, ctx, t, func() {
		t.started.Store(true)
		p.delivered.Add(1)
		if t.captureKey != "" {
			// Counted under the shard's lock while its admission is open:
			// a close, which closes every shard before the prepare waits,
			// finds every started response counted.
			t.unsettled = true
			t.shard.unsettled[t] = struct{}{}
			p.unsettled.Add(1)
		}
	}, done)
}

// awaitResume waits, holding a cut call (parked), until admission is open.
func (p *participant) awaitResume(task *park.Task, ctx context.Context, t *ticket, done func(error)) {
	p.waitOpen(task, ctx, t, func() {}, done)
}

// waitOpen runs onOpen under the shard's lock once its admission is open,
// counting the call as held while it waits, then calls done. It waits
// parked in task: a call held through a checkpoint holds no goroutine, and
// the resume, a shutdown or the call's context ending resumes it.
func (p *participant) waitOpen(task *park.Task, ctx context.Context, t *ticket, onOpen func(), done func(error)) {
	sh := t.shard
	sh.mu.Lock()
	if !sh.closed {
		p.unholdLocked(t)
		onOpen()
		sh.mu.Unlock()
		done(nil)
		return
	}
	if !t.held {
		t.held = true
		p.held.Add(1)
		p.metrics.held.Inc()
	}
	if p.shuttingDown() {
		p.unholdLocked(t)
		sh.mu.Unlock()
		done(errShuttingDown)
		return
	}
	ow := &openWait{w: task.Hold(), shard: sh}
	sh.openWaits[ow] = struct{}{}
	sh.mu.Unlock()
	// Registered after the wait is filed: a context already ended wakes it
	// at once.
	stop := context.AfterFunc(ctx, func() { p.wake(ow, ctx.Err()) })
	ow.resume = func(err error) {
		stop()
		if err != nil {
			p.unhold(t)
			done(err)
			return
		}
		p.waitOpen(task, ctx, t, onOpen, done)
	}
}

// openWait is a call waiting, parked, for admission to reopen.
type openWait struct {
	w *park.Wait
	// shard is where the wait is filed.
	shard *callShard
	// resume is the call's next step, told why it woke (nil: admission
	// may be open again).
	resume func(error)
}

// wake resumes a waiting call once, if it is still filed.
func (p *participant) wake(ow *openWait, err error) {
	sh := ow.shard
	sh.mu.Lock()
	_, filed := sh.openWaits[ow]
	delete(sh.openWaits, ow)
	sh.mu.Unlock()
	if filed {
		ow.w.Resume(func() { ow.resume(err) })
	}
}

// wakeAll resumes every waiting call with err.
func (p *participant) wakeAll(err error) {
	for _, sh := range p.shards {
		p.wakeShard(sh, false, err)
	}
}

// wakeShard resumes the calls waiting in sh with err, reopening its
// admission first if open is set.
func (p *participant) wakeShard(sh *callShard, open bool, err error) {
	sh.mu.Lock()
	if open {
		sh.closed = false
	}
	waits := sh.openWaits
	if len(waits) > 0 {
		sh.openWaits = map[*openWait]struct{}{}
	}
	sh.mu.Unlock()
	for ow := range waits {
		ow.w.Resume(func() { ow.resume(err) })
	}
}

func (p *participant) unhold(t *ticket) {
	t.shard.mu.Lock()
	p.unholdLocked(t)
	t.shard.mu.Unlock()
}

// unholdLocked: the ticket's shard lock is held.
func (p *participant) unholdLocked(t *ticket) {
	if t.held {
		t.held = false
		p.held.Add(-1)
		p.metrics.held.Dec()
	}
}

// settle notes that a started response staged its row (or has none), so a
// checkpoint may capture it; a delivered completion consumes the restored
// cut of its attempt (the episode has moved past the call it named).
func (p *participant) settle(t *ticket, completion bool) {
	sh := t.shard
	sh.mu.Lock()
	if completion && t.captureKey != "" {
		if r := sh.restoredOf(t.episode); r != nil {
			r.cut = nil
		}
	}
	settledLast := p.settleLocked(sh, t)
	sh.mu.Unlock()
	if settledLast {
		p.notifyIfReady()
	}
}

// settleLocked counts t settled, under sh's lock, and reports whether it
// was the last unsettled response (the caller then notifies, unlocked).
func (p *participant) settleLocked(sh *callShard, t *ticket) bool {
	if !t.unsettled {
		return false
	}
	t.unsettled = false
	delete(sh.unsettled, t)
	return p.unsettled.Add(-1) == 0
}

// ---- ctlplane.Participant -------------------------------------------------

// Kind implements ctlplane.Participant.
func (p *participant) Kind() string { return ctlplane.KindModel }

// Instance implements ctlplane.Participant.
func (p *participant) Instance() string { return p.s.cfg.Name }

// CloseAdmission holds responses from now on and starts one cut round over
// calls generating upstream that have not started their response. Streaming
// and constrained calls are skipped. The round's budget is half the time
// left to the operation's deadline: a cut is optional and later stages need
// time. The controller serializes it with OpenAdmission.
func (p *participant) CloseAdmission(ctx context.Context) error {
	p.mu.Lock()
	p.round = roundCounts{}
	listing := len(p.cutURLs) > 0 && !p.cutRunning
	p.mu.Unlock()
	var listed []*ticket
	skipped := 0
	for _, sh := range p.shards {
		sh.mu.Lock()
		sh.closed = true
		if listing {
			listed, skipped = sh.listCuttableLocked(listed, skipped)
		}
		sh.mu.Unlock()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !listing {
		return nil
	}
	p.round.skipped += skipped
	p.metrics.cuts.WithLabelValues(DispositionSkipped).Add(float64(skipped))
	if len(listed) == 0 {
		return nil
	}
	slices.SortFunc(listed, func(a, b *ticket) int { return cmp.Compare(a.callID, b.callID) })
	budget := defaultCutBudget
	if dl, ok := ctx.Deadline(); ok {
		budget = time.Until(dl) / 2
	}
	if budget <= 0 {
		p.round.failed += len(listed)
		p.metrics.cuts.WithLabelValues(DispositionDurableFailure).Add(float64(len(listed)))
		return nil
	}
	// The participant's context (the round outlives the call), carrying
	// the prepare's span so the cut is a stage of the checkpoint's trace.
	rctx, cancel := context.WithTimeout(trace.ContextWithSpan(p.ctx, trace.SpanFromContext(ctx)), budget)
	p.cutRunning = true
	p.wg.Add(1)
	go p.cutRound(rctx, cancel, listed)
	return nil
}

// listCuttableLocked appends to listed the captured calls generating
// upstream that have not started their response, counting those a cut
// skips (streaming or constrained). sh.mu is held.
func (sh *callShard) listCuttableLocked(listed []*ticket, skipped int) ([]*ticket, int) {
	for _, t := range sh.calls {
		if t.captureKey == "" || !t.running.Load() || t.started.Load() {
			continue
		}
		if t.stream || t.constrained {
			skipped++
			continue
		}
		listed = append(listed, t)
	}
	return listed, skipped
}

// OpenAdmission releases held responses and cut calls.
func (p *participant) OpenAdmission() {
	// Each woken call looks again: one filed for a checkpoint that closed
	// since waits on.
	for _, sh := range p.shards {
		p.wakeShard(sh, true, nil)
	}
}

// Ready: no started response is still streaming, and the cut round (if
// any) finished.
func (p *participant) Ready() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.readyLocked()
}

// ReadyChanged implements ctlplane.Participant.
func (p *participant) ReadyChanged() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed
}

// Report lists the capture keys of responses still streaming.
func (p *participant) Report(limit int) ctlplane.Report {
	seen := map[string]struct{}{}
	keys := []string{}
	inflight := 0
	for _, sh := range p.shards {
		sh.mu.Lock()
		inflight += len(sh.calls)
		for t := range sh.unsettled {
			if _, dup := seen[t.captureKey]; !dup {
				seen[t.captureKey] = struct{}{}
				keys = append(keys, t.captureKey)
			}
		}
		sh.mu.Unlock()
	}
	p.mu.Lock()
	counts := map[string]int{
		"inflight": inflight, "held": int(p.held.Load()), "streaming": int(p.unsettled.Load()),
		"cut": p.round.cut, "cut_failed": p.round.failed, "cut_skipped": p.round.skipped,
	}
	ready := p.readyLocked()
	p.mu.Unlock()
	listed, n := ctlplane.Blockers(keys, limit)
	return ctlplane.Report{Ready: ready, Blockers: listed, BlockerCount: n, Counts: counts, Restarts: []string{}}
}

// episodeCuts are the generation cuts the records of ids carry, by
// position in ids (nil: none). Each shard's lock is taken once for all
// its episodes: an export runs while the calls a prepare's cut stopped may
// still be parking themselves, each under its shard's lock, and a lock
// taken per episode would wait behind them at every turn.
func (p *participant) episodeCuts(ids []rollout.EpisodeID) []*GenerationCut {
	var byShard [callShards][]int
	for i, id := range ids {
		k := p.shardIndex(id.RolloutID)
		byShard[k] = append(byShard[k], i)
	}
	cuts := make([]*GenerationCut, len(ids))
	for k, sh := range p.shards {
		if len(byShard[k]) == 0 {
			continue
		}
		sh.mu.Lock()
		for _, i := range byShard[k] {
			cuts[i] = sh.episodeCutLocked(ids[i])
		}
		sh.mu.Unlock()
	}
	return cuts
}

// episodeCutLocked is the one generation cut an episode's record carries:
// the latest admitted undelivered call of the attempt that the worker
// cut, or else the restored cut no call has consumed. sh is the episode's
// shard, and its lock is held.
func (sh *callShard) episodeCutLocked(id rollout.EpisodeID) *GenerationCut {
	key := id.CaptureKey()
	var latest *ticket
	for _, t := range sh.byRollout[id.RolloutID] {
		if t.captureKey != key || t.cut == nil || t.started.Load() {
			continue
		}
		if latest == nil || t.admittedAt.After(latest.admittedAt) {
			latest = t
		}
	}
	if latest != nil {
		return &GenerationCut{
			ModelCallID: latest.callID, RequestDigest: latest.digest,
			Continuation: Continuation{
				SourceCaptureKey: key, SourceModelCallID: latest.callID, StagingKeys: []string{latest.cut.stagingKey},
				PrefixTokenCount: latest.cut.tokenCount, PrefixDigest: latest.cut.digest,
			},
		}
	}
	if r := sh.restoredOf(id); r != nil && r.cut != nil {
		c := *r.cut
		return &c
	}
	return nil
}

// Export writes one record per scope episode that has delivered rows or a
// cut. Rows are appended only when a response is delivered, so a held
// call has none: the restored agent re-issues it.
//
// Records are assembled on a goroutine of their own, a batch at a time,
// while the caller's goroutine emits the batch before (the store's checks,
// hash and writes): in one goroutine the export was the longest stage of
// a commit.
func (p *participant) Export(ctx context.Context, scope ctlplane.Scope, emit func(ctlplane.Record) error) (ctlplane.Extras, error) {
	ids := scope.IDs()
	emit = faultpoint.AfterFirst(faultpoint.ModelExportPartial, emit)
	captureKeys := make([]string, len(ids))
	for i, id := range ids {
		captureKeys[i] = id.CaptureKey()
	}
	stop := make(chan struct{})
	full := make(chan *recordBatch)
	free := make(chan *recordBatch, 2)
	free <- &recordBatch{}
	free <- &recordBatch{}
	var a assembly
	go func() {
		// Closing full ends the loop below once a's fields are set.
		defer close(full)
		a.run(ctx, p, ids, captureKeys, stop, free, full)
	}()
	var emitErr error
	for b := range full {
		if emitErr == nil {
			emitErr = b.emit(emit)
			if emitErr != nil {
				close(stop)
			}
		}
		free <- b
	}
	if emitErr != nil {
		return ctlplane.Extras{}, emitErr
	}
	if a.err != nil {
		return ctlplane.Extras{}, a.err
	}
	keys := make([]string, 0, len(a.all))
	for k := range a.all {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return ctlplane.Extras{Reply: map[string]any{"staging_keys": keys, "staging_keys_by_episode": a.byEpisode}}, nil
}

func dedupeSorted(ss []string) []string {
	slices.Sort(ss)
	return slices.Compact(ss)
}

// errExportStopped ends an export's ledger read when the caller could not
// emit; the caller's error is the export's.
var errExportStopped = errors.New("export stopped")

// recordBatchBytes is how much record data a batch of an export holds
// before it is handed over to be emitted: two batches are in use at once.
const recordBatchBytes = 1 << 20

// recordBatchSlack is room past recordBatchBytes for the record that takes
// a batch over it; a longer one grows the batch.
const recordBatchSlack = 64 << 10

// recordBatch is records an export assembled, in order, for the caller to
// emit: their data back to back, where each ends, and whose they are.
type recordBatch struct {
	data []byte
	ends []int
	ids  []rollout.EpisodeID
}

func (b *recordBatch) reset() {
	b.data, b.ends, b.ids = b.data[:0], b.ends[:0], b.ids[:0]
}

// emit emits the batch's records in order; emit copies each record's data
// (ctlplane.Participant.Export), so the batch can be filled again after.
func (b *recordBatch) emit(emit func(ctlplane.Record) error) error {
	start := 0
	for i, end := range b.ends {
		if err := emit(ctlplane.Record{EpisodeID: b.ids[i], Data: b.data[start:end]}); err != nil {
			return err
		}
		start = end
	}
	return nil
}

// assembly is the goroutine of an export that reads the ledgers and
// assembles the records; its fields are read once it has ended.
type assembly struct {
	err       error
	all       map[string]struct{}
	byEpisode map[string][]string
}

// run assembles the records of ids into batches taken from free, handing
// each over on full once it holds recordBatchBytes, until every key is read,
// ctx ends, stop is closed (the caller could not emit) or a record fails.
// The ledger reads the rows of every key in one sequential pass, in
// batches, and hands them over in the order they lie in its log (adjacent
// records are read at once), encoded: a record is assembled from them as
// they are rather than decoded and encoded again. That order depends only
// on the ledger, so an export of the same state writes the same records.
func (a *assembly) run(ctx context.Context, p *participant, ids []rollout.EpisodeID, captureKeys []string, stop <-chan struct{}, free <-chan *recordBatch, full chan<- *recordBatch) {
	a.all, a.byEpisode = map[string]struct{}{}, map[string][]string{}
	b := <-free
	b.reset()
	handOver := func() bool {
		select {
		case full <- b:
		case <-stop:
			return false
		}
		select {
		case b = <-free:
		case <-stop:
			return false
		}
		b.reset()
		return true
	}
	cuts := p.episodeCuts(ids)
	var stopped error
	err := p.s.ledger.ReadRawRows(captureKeys, func(i int, rows []codec.RawMessage, err error) error {
		if err := ctx.Err(); err != nil {
			stopped = err
			return err
		}
		id, key := ids[i], captureKeys[i]
		if err != nil && !errors.Is(err, tokencapture.ErrRetired) {
			stopped = fmt.Errorf("reading the ledger of %s: %w", key, err)
			return stopped
		}
		cut := cuts[i]
		if len(rows) == 0 && cut == nil {
			return nil
		}
		if b.data == nil {
			// Grown by append from nothing, a batch would allocate several
			// times its size on the way to recordBatchBytes.
			b.data = make([]byte, 0, recordBatchBytes+recordBatchSlack)
		}
		var staging []string
		// A records line is the record flat, its episode id first
		// (ckptstore line.go): the id's member, then the record's members,
		// whose opening brace becomes the comma between.
		b.data = appendEpisodeIDMember(b.data, id)
		brace := len(b.data)
		b.data, staging, err = appendModelRecord(b.data, rows, cut)
		if err == nil {
			b.data[brace] = ','
		}
		if err != nil {
			stopped = fmt.Errorf("the record of %s: %w", key, err)
			return stopped
		}
		b.ends, b.ids = append(b.ends, len(b.data)), append(b.ids, id)
		if keys := dedupeSorted(staging); len(keys) > 0 {
			a.byEpisode[key] = keys
			for _, k := range keys {
				a.all[k] = struct{}{}
			}
		}
		if len(b.data) >= recordBatchBytes && !handOver() {
			return errExportStopped
		}
		return nil
	})
	switch {
	case errors.Is(err, errExportStopped):
		// The caller's error is the export's.
	case err != nil && stopped != nil:
		a.err = stopped
	case err != nil:
		a.err = fmt.Errorf("reading the ledgers: %w", err)
	case len(b.ends) > 0:
		select {
		case full <- b:
		case <-stop:
		}
	}
}

// Committed deletes (without a fence) the ledgers of restored attempts the
// scope leaves out and no call has used: the controller will not continue
// them, and they may be started afresh.
func (p *participant) Committed(_ context.Context, scope ctlplane.Scope, _ bool) error {
	var drop []string
	for _, sh := range p.shards {
		sh.mu.Lock()
		for rid, r := range sh.restored {
			if !r.used && !scope.Has(r.id) {
				drop = append(drop, r.id.CaptureKey())
				delete(sh.restored, rid)
			}
		}
		sh.mu.Unlock()
	}
	if len(drop) == 0 {
		return nil
	}
	_, _, err := p.s.ledger.Delete(drop)
	return err
}

// Fresh refuses a process that has admitted a model call or restored.
func (p *participant) Fresh() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.admitted.Load() > 0 || p.restoredOnce {
		return errors.New("requires a freshly started model server; this one has served calls")
	}
	return nil
}

// Install validates every record, then, for every scope episode E, replaces
// the ledger of E.Next() with E's rows (empty without a record: a dead
// execution's rows must not survive), deletes ledgers of later attempts,
// and retires (fences) the ledgers of attempts 0..E.Attempt, which nothing
// writes again. Restored cuts wait for their re-issued call.
func (p *participant) Install(ctx context.Context, records []ctlplane.Record, scope ctlplane.Scope, _ ctlplane.Extras) ([]rollout.EpisodeID, error) {
	ids := scope.IDs()
	seenRollout := make(map[string]bool, len(ids))
	for _, id := range ids {
		if seenRollout[id.RolloutID] {
			return nil, apierror.New(apierror.InvalidRequest, "the scope names rollout %s twice; a restore continues one attempt per rollout", id.RolloutID)
		}
		seenRollout[id.RolloutID] = true
	}
	// The rows' token arrays are validated, not decoded, and may refer to
	// the records' bytes (a buffer of the checkpoint store's) until the
	// ledger copies them into its import records: nothing of decoded
	// outlives Install but the generation cuts, which are copies.
	// Records are decoded on every core (each is independent; at 100,000
	// episodes the serial decode was a fifth of the model's restore), then
	// checked in order, so the first invalid record is the one reported.
	each := make([]*importRecord, len(records))
	errs := make([]error, len(records))
	parallel.For(len(records), runtime.GOMAXPROCS(0), func(_, i int) {
		each[i], errs[i] = decodeImportRecord(records[i].Data)
	})
	// decoded[i] is the record of the scope's i-th episode, if it has one.
	decoded := make([]*importRecord, len(ids))
	imports := make([]tokencapture.Import, 0, len(ids))
	for i, r := range records {
		if err := r.EpisodeID.Validate(); err != nil {
			return nil, fmt.Errorf("record episode: %w", err)
		}
		at, inScope := scope.Index(r.EpisodeID)
		if !inScope {
			return nil, fmt.Errorf("record of %s is outside the scope", r.EpisodeID)
		}
		if decoded[at] != nil {
			return nil, fmt.Errorf("two records of %s", r.EpisodeID)
		}
		if errs[i] != nil {
			return nil, fmt.Errorf("record of %s: %w", r.EpisodeID, errs[i])
		}
		decoded[at] = each[i]
		// Ledgers with rows are imported in the records' order: their rows
		// are slices of the records buffer, which the import then copies
		// from start to end rather than in scope order (an export writes
		// its records in the order of its own log).
		imports = append(imports, tokencapture.Import{Key: r.EpisodeID.Next().CaptureKey(), Rows: each[i].Rows})
	}

	next := make([]rollout.EpisodeID, 0, len(ids))
	var restored [callShards]map[string]*restoredEpisode
	for i := range restored {
		restored[i] = map[string]*restoredEpisode{}
	}
	for i, id := range ids {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n := id.Next()
		r := &restoredEpisode{id: n}
		if m := decoded[i]; m != nil {
			if len(m.GenerationCuts) == 1 {
				c := m.GenerationCuts[0]
				r.cut = &c
			}
			// The reply names the attempts whose records were installed,
			// as NeMo Gym's restore does (control.py: sorted next attempts
			// of the records read); every one in scope is restored pending.
			next = append(next, n)
		} else {
			// Without a record the next attempt's ledger starts empty.
			imports = append(imports, tokencapture.Import{Key: n.CaptureKey()})
		}
		restored[p.shardIndex(n.RolloutID)][n.RolloutID] = r
	}
	// One batch of writes for every ledger rather than one write each.
	if err := p.s.ledger.ImportMany(imports); err != nil {
		return nil, apierror.Wrap(apierror.Internal, fmt.Errorf("importing the ledgers of the next attempts: %w", err))
	}
	faultpoint.Hit(faultpoint.ModelInstallImported)
	var later, sources []string
	for _, id := range ids {
		n := id.Next()
		sources = append(sources, id.CaptureKey())
		for _, k := range p.s.ledger.RolloutKeys(id.RolloutID) {
			e, err := rollout.ParseCaptureKey(k)
			if err != nil || e.RolloutID != id.RolloutID {
				continue
			}
			switch {
			case e.Attempt > n.Attempt:
				later = append(later, k)
			case e.Attempt < id.Attempt:
				sources = append(sources, k)
			}
		}
	}
	if _, _, err := p.s.ledger.Delete(later); err != nil {
		return nil, apierror.Wrap(apierror.Internal, fmt.Errorf("deleting ledgers of later attempts: %w", err))
	}
	faultpoint.Hit(faultpoint.ModelInstallDeleted)
	if _, _, err := p.s.ledger.Retire(sources); err != nil {
		return nil, apierror.Wrap(apierror.Internal, fmt.Errorf("retiring the source attempts' ledgers: %w", err))
	}
	for i, sh := range p.shards {
		sh.mu.Lock()
		sh.restored = restored[i]
		sh.mu.Unlock()
	}
	p.mu.Lock()
	p.restoredOnce = true
	p.mu.Unlock()
	p.log.InfoContext(ctx, "restored model ledgers", "episodes", len(ids), "records", len(records))
	return next, nil
}

// Retire cancels the calls of the covered attempts (same rollout, attempt
// up to the named one), waits until their handlers returned, then retires
// (fences) their ledgers so no late row recreates one.
func (p *participant) Retire(ctx context.Context, ids []rollout.EpisodeID) error {
	cause := func(id rollout.EpisodeID) error {
		return apierror.New(apierror.StaleAttempt, "attempt %d of rollout %s was retired while this call ran", id.Attempt, id.RolloutID)
	}
	var waits []chan struct{}
	p.mu.Lock()
	for _, id := range ids {
		p.incomplete[id.RolloutID] = struct{}{}
	}
	p.mu.Unlock()
	for _, id := range ids {
		sh := p.shardOf(id.RolloutID)
		sh.mu.Lock()
		for _, t := range sh.byRollout[id.RolloutID] {
			if t.episode.Attempt <= id.Attempt {
				t.cancel(cause(t.episode))
				waits = append(waits, t.done)
			}
		}
		if r := sh.restored[id.RolloutID]; r != nil && r.id.Attempt <= id.Attempt {
			delete(sh.restored, id.RolloutID)
		}
		sh.mu.Unlock()
	}
	for _, done := range waits {
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var keys []string
	for _, id := range ids {
		keys = append(keys, id.CaptureKey())
		for _, k := range p.s.ledger.RolloutKeys(id.RolloutID) {
			if e, err := rollout.ParseCaptureKey(k); err == nil && e.RolloutID == id.RolloutID && e.Attempt <= id.Attempt {
				keys = append(keys, k)
			}
		}
	}
	if _, _, err := p.s.ledger.Retire(keys); err != nil {
		return apierror.Wrap(apierror.Internal, fmt.Errorf("retiring ledgers: %w", err))
	}
	p.mu.Lock()
	for _, id := range ids {
		delete(p.incomplete, id.RolloutID)
	}
	p.mu.Unlock()
	return nil
}

// Forget clears the ledger fences of the rollouts, unless a retire of one
// of them has not finished.
func (p *participant) Forget(_ context.Context, rolloutIDs []string) error {
	p.mu.Lock()
	for _, r := range rolloutIDs {
		if _, ok := p.incomplete[r]; ok {
			p.mu.Unlock()
			return apierror.New(apierror.RetireIncomplete, "a retire of rollout %s has not finished; retry the retire first", r)
		}
	}
	p.mu.Unlock()
	var keys []string
	for _, r := range rolloutIDs {
		for _, k := range p.s.ledger.RolloutKeys(r) {
			if p.s.ledger.Retired(k) {
				keys = append(keys, k)
			}
		}
	}
	if _, _, err := p.s.ledger.Delete(keys); err != nil {
		return apierror.Wrap(apierror.Internal, fmt.Errorf("clearing ledger fences: %w", err))
	}
	return nil
}

// StatusExtra adds restored cuts and attempts, and the call counts.
func (p *participant) StatusExtra() map[string]any {
	// The restored attempts whose cut no call has consumed yet, as NeMo
	// Gym's model participant lists them (model.py status_extra:
	// sorted(restored cuts)).
	cuts := []string{}
	pending := []string{}
	inflight := 0
	for _, sh := range p.shards {
		sh.mu.Lock()
		inflight += len(sh.calls)
		for _, r := range sh.restored {
			if r.cut != nil {
				cuts = append(cuts, r.id.CaptureKey())
			}
			if !r.used {
				pending = append(pending, r.id.CaptureKey())
			}
		}
		sh.mu.Unlock()
	}
	slices.Sort(pending)
	slices.Sort(cuts)
	return map[string]any{
		"restored_generation_cuts": cuts, "restored_pending": pending,
		"served": p.delivered.Load(), "inflight": inflight, "held": p.held.Load(),
	}
}

// refuseRemoval answers 409 checkpoint_open while a checkpoint is open: a
// ledger removed then would be missing from (or resurrected by) its export
// or install.
func (p *participant) refuseRemoval() error {
	if p.checkpointOpen() {
		return apierror.New(apierror.CheckpointOpen, "a checkpoint is open on this model server; retry ledger retire and delete after it resumes")
	}
	return nil
}

// checkpointOpen reports whether a checkpoint is open: its phase is not
// idle, or admission is closed.
func (p *participant) checkpointOpen() bool {
	if phase, _ := p.ctl.Phase(); phase != ctlplane.PhaseIdle {
		return true
	}
	closed, _ := p.ctl.AdmissionClosed()
	return closed
}

var (
	_ ctlplane.Participant = (*participant)(nil)
	_ callHooks            = (*participant)(nil)
)
