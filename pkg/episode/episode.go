// Package episode tracks episodes as sequences of steps with boundaries, the
// checkpoint side of the environment server and of the agent's legacy /run
// (SPEC §6, reference protocol.md §4.1).
//
// After each completed step the owner records a boundary: a JSON value naming
// the next step and what it needs. A checkpoint can always be taken at a
// boundary. A step still running when admission closes runs in one of two
// modes: Wait (the checkpoint waits for it; for anything unsafe to run twice)
// or Replay (the checkpoint does not wait: the episode counts as parked at the
// boundary before the step, and after a crash the step runs again).
//
// With checkpointing off there is no Tracker: every method works on a nil
// *Tracker and a nil *Episode and does nothing, so the data path pays nothing.
package episode

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"

	"github.com/gymfleet/gymfleet/pkg/infra/faultpoint"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/control"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Mode is how a step behaves when a checkpoint closes admission while it runs.
type Mode uint8

const (
	// Wait: the checkpoint waits for the step; its result is recorded and it
	// never runs twice.
	Wait Mode = iota
	// Replay: the checkpoint does not wait; after a crash the step runs again
	// from the boundary before it.
	Replay
)

func (m Mode) String() string {
	if m == Replay {
		return "replay"
	}
	return "wait"
}

// ParseMode reads "wait" or "replay".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "wait":
		return Wait, nil
	case "replay":
		return Replay, nil
	}
	return Wait, fmt.Errorf("step mode %q: want wait or replay", s)
}

type state uint8

const (
	running state = iota
	inWaitStep
	inReplayStep
	parked
	finishing
)

// Tracker holds the live episodes of one server and the episodes restored
// from a checkpoint whose replacement has not started.
type Tracker struct {
	mu       sync.Mutex
	episodes map[string]*Episode
	// byRollout indexes live episodes by rollout id, so a retire never scans
	// every episode.
	byRollout map[string][]*Episode
	// pending are restored records by the capture key of the replacement
	// attempt that will claim them; pendingByRollout indexes their keys by
	// rollout id, so a retire never scans every pending record.
	pending          map[string]*Record
	pendingByRollout map[string]map[string]struct{}
	closed           bool
	// reopened is closed when admission reopens.
	reopened chan struct{}
	// blocking counts episodes that keep a checkpoint from being ready;
	// changed is closed (and replaced) whenever it drops to zero.
	blocking int
	changed  chan struct{}
	served   int
}

// NewTracker returns an empty tracker with admission open.
func NewTracker() *Tracker {
	return &Tracker{
		episodes:         map[string]*Episode{},
		byRollout:        map[string][]*Episode{},
		pending:          map[string]*Record{},
		pendingByRollout: map[string]map[string]struct{}{},
		changed:          make(chan struct{}),
	}
}

// addPending files r under key. Called with t.mu held.
func (t *Tracker) addPending(key string, r *Record) {
	t.pending[key] = r
	set := t.pendingByRollout[r.EpisodeID.RolloutID]
	if set == nil {
		set = make(map[string]struct{}, 1)
		t.pendingByRollout[r.EpisodeID.RolloutID] = set
	}
	set[key] = struct{}{}
}

// deletePending drops the pending record filed under key. Called with t.mu
// held.
func (t *Tracker) deletePending(key string) {
	r, ok := t.pending[key]
	if !ok {
		return
	}
	delete(t.pending, key)
	if set := t.pendingByRollout[r.EpisodeID.RolloutID]; set != nil {
		delete(set, key)
		if len(set) == 0 {
			delete(t.pendingByRollout, r.EpisodeID.RolloutID)
		}
	}
}

// Record is an exported episode: the task it runs and its last boundary
// (null when it had none: it starts over from its input).
type Record struct {
	EpisodeID  rollout.EpisodeID `json:"episode_id"`
	TaskDigest string            `json:"task_digest"`
	Boundary   codec.RawMessage  `json:"boundary"`
}

// Episode is one live episode.
type Episode struct {
	t  *Tracker
	id rollout.EpisodeID
	// Guarded by t.mu.
	state       state
	boundary    any
	hasBoundary bool
	taskDigest  string
	restart     bool
	retired     bool
	ended       bool
	cancel      context.CancelFunc
	done        chan struct{}
	blocks      bool
}

// ID is the episode's id.
func (e *Episode) ID() rollout.EpisodeID { return e.id }

// TaskDigest is sha256 of the task's canonical JSON, which a replacement
// attempt must match.
func TaskDigest(task any) (string, error) {
	b, err := codec.MarshalStable(task)
	if err != nil {
		return "", err
	}
	return digestHex(b), nil
}

// isBlocking is the one definition of what keeps a checkpoint waiting: an
// episode being retired, or one that is neither a restart nor parked at a
// boundary nor inside a replay step nor in its final cleanup.
func (e *Episode) isBlocking() bool {
	if e.ended {
		return false
	}
	if e.retired {
		return true
	}
	return !e.restart && (e.state == running || e.state == inWaitStep)
}

// update recomputes e's contribution to the blocking count. Called with t.mu.
func (t *Tracker) update(e *Episode) {
	b := e.isBlocking()
	if b == e.blocks {
		return
	}
	e.blocks = b
	if b {
		t.blocking++
		return
	}
	t.blocking--
	if t.blocking == 0 {
		close(t.changed)
		t.changed = make(chan struct{})
	}
}

// Continuation is what a replacement attempt starts from.
type Continuation struct {
	// Boundary is the restored boundary, or nil to start from the input.
	Boundary codec.RawMessage
}

// Begin registers an episode. A replacement attempt with a restored record
// claims it (its task digest must match) and gets it as a continuation. A
// new episode is refused with admission_closed while a checkpoint is open,
// and a duplicate of a running attempt with episode_running. cancel stops
// the episode's work (used by Retire). The caller checks the attempt fence
// first.
func (t *Tracker) Begin(id rollout.EpisodeID, taskDigest string, cancel context.CancelFunc) (*Episode, *Continuation, error) {
	if t == nil {
		return nil, nil, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	key := id.CaptureKey()
	if _, ok := t.episodes[key]; ok {
		return nil, nil, apierror.New(apierror.EpisodeRunning, "episode %s is already running", key)
	}
	var cont *Continuation
	if rec, ok := t.pending[key]; ok {
		if rec.TaskDigest != taskDigest {
			return nil, nil, apierror.New(apierror.TaskMismatch, "episode %s continues a checkpoint recorded for a different task", key)
		}
		t.deletePending(key)
		cont = &Continuation{}
		if len(rec.Boundary) > 0 && string(rec.Boundary) != "null" {
			cont.Boundary = rec.Boundary
		}
	} else if t.closed {
		return nil, nil, apierror.New(apierror.AdmissionClosed, "a checkpoint is in progress; resend this /run unchanged after it")
	}
	e := &Episode{t: t, id: id, taskDigest: taskDigest, cancel: cancel, done: make(chan struct{})}
	t.episodes[key] = e
	t.byRollout[id.RolloutID] = append(t.byRollout[id.RolloutID], e)
	t.served++
	t.update(e)
	return e, cont, nil
}

// Step runs fn as a step of the given mode.
func (e *Episode) Step(ctx context.Context, mode Mode, fn func(context.Context) error) error {
	leave := e.Enter(mode)
	err := fn(ctx)
	leave()
	return err
}

// Enter begins a step of the given mode whose work goes on after the
// caller returns (a wait that holds no goroutine, pkg/infra/park); leave
// ends it. Step is Enter and leave around a function.
func (e *Episode) Enter(mode Mode) (leave func()) {
	if e == nil {
		return func() {}
	}
	t := e.t
	t.mu.Lock()
	if mode == Replay {
		e.state = inReplayStep
	} else {
		e.state = inWaitStep
	}
	t.update(e)
	t.mu.Unlock()
	return e.leaveStep
}

// leaveStep ends the step Enter began.
func (e *Episode) leaveStep() {
	t := e.t
	t.mu.Lock()
	e.state = running
	t.update(e)
	t.mu.Unlock()
}

// Boundary records a boundary (a JSON-encodable value, which must not
// change afterwards) and, while a checkpoint is open, parks the episode there
// until admission reopens (or ctx ends). A restart never parks.
func (e *Episode) Boundary(ctx context.Context, b any) error {
	if e == nil {
		return nil
	}
	t := e.t
	t.mu.Lock()
	e.boundary, e.hasBoundary = b, true
	t.mu.Unlock()
	return e.park(ctx)
}

// park waits at the current boundary while a checkpoint is open. If a new
// checkpoint closes before the episode wakes, it stays parked for that one.
func (e *Episode) park(ctx context.Context) error {
	t := e.t
	t.mu.Lock()
	defer t.mu.Unlock()
	for t.closed && !e.restart {
		e.state = parked
		t.update(e)
		ch := t.reopened
		t.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			t.mu.Lock()
			e.state = running
			t.update(e)
			return ctx.Err()
		}
		t.mu.Lock()
	}
	e.state = running
	t.update(e)
	return nil
}

// MarkRestart makes the episode a restart: it never blocks, parks or is
// exported, and the controller starts it over after a crash. It waits for
// admission to reopen first, so the restart set is stable during a checkpoint.
func (e *Episode) MarkRestart(ctx context.Context) error {
	if e == nil {
		return nil
	}
	t := e.t
	t.mu.Lock()
	defer t.mu.Unlock()
	prev := e.state
	for t.closed {
		// Waiting here is waiting at the boundary the caller stands on: it
		// must not hold the checkpoint back.
		e.state = parked
		t.update(e)
		ch := t.reopened
		t.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			t.mu.Lock()
			e.state = prev
			t.update(e)
			return ctx.Err()
		}
		t.mu.Lock()
	}
	e.state = prev
	e.restart = true
	t.update(e)
	return nil
}

// Finishing marks the start of the episode's final cleanup: a retire no
// longer cancels it (cancelling would interrupt the cleanup) and only waits.
func (e *Episode) Finishing() {
	if e == nil {
		return
	}
	t := e.t
	t.mu.Lock()
	e.state = finishing
	t.update(e)
	t.mu.Unlock()
}

// End removes the episode; every path of an episode calls it once.
func (e *Episode) End() {
	if e == nil {
		return
	}
	t := e.t
	t.mu.Lock()
	defer t.mu.Unlock()
	key := e.id.CaptureKey()
	if t.episodes[key] == e {
		delete(t.episodes, key)
		if rest := slices.DeleteFunc(t.byRollout[e.id.RolloutID], func(o *Episode) bool { return o == e }); len(rest) > 0 {
			t.byRollout[e.id.RolloutID] = rest
		} else {
			delete(t.byRollout, e.id.RolloutID)
		}
	}
	e.ended = true
	t.update(e)
	close(e.done)
}

// CloseAdmission closes admission: new episodes are refused and live ones
// park at their next boundary.
func (t *Tracker) CloseAdmission() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.closed {
		t.closed = true
		t.reopened = make(chan struct{})
	}
}

// OpenAdmission reopens and wakes every parked episode.
func (t *Tracker) OpenAdmission() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		t.closed = false
		close(t.reopened)
	}
}

// Ready reports whether no episode blocks a checkpoint (a count check).
func (t *Tracker) Ready() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.blocking == 0
}

// ReadyChanged returns a channel closed the next time the blocking count
// drops to zero.
func (t *Tracker) ReadyChanged() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.changed
}

// Report lists at most limit blockers, counts and restarts. It scans the
// episodes, so it is called once per reply.
func (t *Tracker) Report(limit int) control.Report {
	t.mu.Lock()
	defer t.mu.Unlock()
	var blockers []string
	restarts := []string{}
	parkedN := 0
	for key, e := range t.episodes {
		switch {
		case e.isBlocking():
			blockers = append(blockers, key)
		case e.restart:
			restarts = append(restarts, key)
		case e.state == parked || e.state == inReplayStep:
			parkedN++
		}
	}
	sort.Strings(restarts)
	listed, n := control.Blockers(blockers, limit)
	return control.Report{
		Ready: n == 0, Blockers: listed, BlockerCount: n, Restarts: restarts,
		Counts: map[string]int{"episodes": len(t.episodes), "parked": parkedN, "restarts": len(restarts), "restored_pending": len(t.pending)},
	}
}

// Held names every episode Export would write were the scope to name them
// all: the live ones parked at a boundary or inside a replay step (not
// retired, not restarts), and the restored ones whose replacement has not
// started, by their replacement attempt. A commit without a scope exports
// these (ctlplane.Holder).
func (t *Tracker) Held() []rollout.EpisodeID {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]rollout.EpisodeID, 0, len(t.episodes)+len(t.pending))
	for _, e := range t.episodes {
		if !e.retired && !e.restart && (e.state == parked || e.state == inReplayStep) {
			out = append(out, e.id)
		}
	}
	for _, r := range t.pending {
		out = append(out, r.EpisodeID)
	}
	return out
}

// Export emits a record for every exportable episode in scope: live ones
// parked at a boundary or inside a replay step (not retired, not restarts),
// and restored ones whose replacement has not started, which the scope names
// by their replacement attempt. Records are emitted in capture key order,
// each encoded as it is emitted: the lock is held only to list them.
func (t *Tracker) Export(scope control.Scope, emit func(control.Record) error) error {
	type exported struct {
		id rollout.EpisodeID
		// rec is a live episode's *liveRecord, encoded outside the lock (a
		// boundary never changes once recorded), or a pending *Record.
		rec any
	}
	// Records go where the scope lists their episodes, which makes the
	// file the same for the same state without sorting (an episode is
	// either running or pending, never both), and sorting every episode
	// by capture key stays off an export's path.
	byPos := make([]exported, scope.Len())
	t.mu.Lock()
	for _, e := range t.episodes {
		at, inScope := scope.Index(e.id)
		if e.retired || e.restart || !inScope || (e.state != parked && e.state != inReplayStep) {
			continue
		}
		r := &liveRecord{EpisodeID: e.id, TaskDigest: e.taskDigest}
		if e.hasBoundary {
			r.Boundary = e.boundary
		}
		byPos[at] = exported{id: e.id, rec: r}
	}
	for _, r := range t.pending {
		if at, inScope := scope.Index(r.EpisodeID); inScope {
			byPos[at] = exported{id: r.EpisodeID, rec: r}
		}
	}
	t.mu.Unlock()
	var buf []byte // emit does not retain Data: one buffer for every record
	for _, r := range byPos {
		if r.rec == nil {
			continue
		}
		var err error
		if buf, err = appendExported(buf[:0], r.rec); err != nil {
			return fmt.Errorf("record of %s: %w", r.id, err)
		}
		if err := emit(control.Record{EpisodeID: r.id, Data: buf}); err != nil {
			return err
		}
	}
	return nil
}

// BoundaryAppender is a boundary that appends its own JSON encoding, byte
// for byte what codec.Marshal writes for it. Export appends the records of
// such boundaries by hand rather than through goccy's reflection.
type BoundaryAppender interface {
	AppendJSON(dst []byte) ([]byte, error)
}

// appendExported appends the encoding of an exported record, a live
// episode's *liveRecord or a pending *Record, as codec.Marshal writes it.
func appendExported(dst []byte, rec any) ([]byte, error) {
	live, ok := rec.(*liveRecord)
	if !ok {
		return appendMarshaled(dst, rec)
	}
	appender, ok := live.Boundary.(BoundaryAppender)
	if live.Boundary != nil && !ok {
		return appendMarshaled(dst, rec)
	}
	dst = append(dst, `{"episode_id":{"rollout_id":`...)
	dst = codec.AppendString(dst, live.EpisodeID.RolloutID)
	dst = append(dst, `,"attempt":`...)
	dst = strconv.AppendInt(dst, int64(live.EpisodeID.Attempt), 10)
	dst = append(dst, `},"task_digest":`...)
	dst = codec.AppendString(dst, live.TaskDigest)
	dst = append(dst, `,"boundary":`...)
	if live.Boundary == nil {
		dst = append(dst, "null"...)
	} else {
		var err error
		if dst, err = appender.AppendJSON(dst); err != nil {
			return dst, err
		}
	}
	return append(dst, '}'), nil
}

func appendMarshaled(dst []byte, v any) ([]byte, error) {
	b, err := codec.Marshal(v)
	return append(dst, b...), err
}

// liveRecord is a live episode's Record with its boundary as the value the
// episode recorded, so a record is encoded in one pass: its bytes are those
// of Record with the boundary's encoding as Boundary (null when the episode
// has none).
type liveRecord struct {
	EpisodeID  rollout.EpisodeID `json:"episode_id"`
	TaskDigest string            `json:"task_digest"`
	Boundary   any               `json:"boundary"`
}

// DeleteRestoredOutside drops restored records the scope leaves out (no
// fence: the controller may start that rollout over as that attempt).
func (t *Tracker) DeleteRestoredOutside(scope control.Scope) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for key, r := range t.pending {
		if !scope.Has(r.EpisodeID) {
			t.deletePending(key)
			n++
		}
	}
	return n
}

// ErrNotFresh reports a tracker that has run episodes; restore needs a
// fresh process.
var ErrNotFresh = errors.New("this process has run episodes")

// Fresh reports whether no episode ever ran and nothing was restored.
func (t *Tracker) Fresh() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.served > 0 || len(t.episodes) > 0 || len(t.pending) > 0 {
		return ErrNotFresh
	}
	return nil
}

// Install validates every record and then installs every one as pending
// under its episode's next attempt. It returns the next attempts.
func (t *Tracker) Install(records []control.Record) ([]rollout.EpisodeID, error) {
	recs := make([]*Record, 0, len(records))
	for i, raw := range records {
		var r Record
		if err := codec.UnmarshalStrictFast(raw.Data, &r); err != nil {
			return nil, fmt.Errorf("episode record %d: %s", i, codec.DescribeError(err))
		}
		if r.EpisodeID != raw.EpisodeID {
			return nil, fmt.Errorf("episode record %d names %s but is filed under %s", i, r.EpisodeID, raw.EpisodeID)
		}
		if r.TaskDigest == "" {
			return nil, fmt.Errorf("episode record %s has no task digest", r.EpisodeID)
		}
		if len(r.Boundary) == 0 || !codec.Valid(r.Boundary) {
			return nil, fmt.Errorf("episode record %s has an invalid boundary", r.EpisodeID)
		}
		r.EpisodeID = r.EpisodeID.Next()
		recs = append(recs, &r)
	}
	faultpoint.Hit(faultpoint.EpisodeInstallValidated)
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.pending) == 0 {
		// A restore installs every record at once into a fresh tracker:
		// sized once, the maps do not grow (and rehash) their way to
		// 100,000 entries.
		t.pending = make(map[string]*Record, len(recs))
		t.pendingByRollout = make(map[string]map[string]struct{}, len(recs))
	}
	out := make([]rollout.EpisodeID, len(recs))
	for i, r := range recs {
		t.addPending(r.EpisodeID.CaptureKey(), r)
		out[i] = r.EpisodeID
	}
	return out, nil
}

// Pending lists the capture keys of restored records not yet claimed.
func (t *Tracker) Pending() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.pending))
	for k := range t.pending {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Len is the number of live episodes.
func (t *Tracker) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.episodes)
}

// Retire stops every live episode of the given attempts (and earlier
// attempts of the same rollouts) and waits until each has ended; restored
// records they cover are dropped. An episode already in its final cleanup is
// not cancelled, only waited for, so its reply still means its sessions are
// closed. Until a retired episode has ended it blocks prepares; a retire cut
// short by ctx leaves it so, and a retry stops it again.
func (t *Tracker) Retire(ctx context.Context, ids []rollout.EpisodeID) error {
	t.mu.Lock()
	var waits []chan struct{}
	for _, id := range ids {
		for _, e := range t.byRollout[id.RolloutID] {
			if e.id.Attempt > id.Attempt {
				continue
			}
			if !e.retired {
				e.retired = true
				t.update(e)
				if e.state != finishing && e.cancel != nil {
					// Cancelled once: a second cancel would interrupt the
					// cleanup the first one started.
					e.cancel()
				}
			}
			waits = append(waits, e.done)
		}
		// A pending record is filed under the attempt that would continue
		// it; retiring that attempt (or a later one) drops it.
		for key := range t.pendingByRollout[id.RolloutID] {
			if t.pending[key].EpisodeID.Attempt <= id.Attempt {
				t.deletePending(key)
			}
		}
	}
	t.mu.Unlock()
	for _, ch := range waits {
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Closed reports whether admission is closed.
func (t *Tracker) Closed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

func digestHex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
