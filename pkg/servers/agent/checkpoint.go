package agent

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/infra/faultpoint"
	"github.com/gymfleet/gymfleet/pkg/infra/hugepage"
	"github.com/gymfleet/gymfleet/pkg/infra/parallel"
	"github.com/gymfleet/gymfleet/pkg/infra/park"
	"github.com/gymfleet/gymfleet/pkg/transport/sessioncookie"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/control"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// The agent as a checkpoint participant (SPEC §6 "Agent", protocol.md §7).
//
// A native session is idle, running, or at a boundary. An activation records
// a boundary before each model call, when a model response's tool calls are
// pending, and after each tool round; while a checkpoint is open it parks
// there. A session awaiting the model reply of a call made right after a
// boundary stays at that boundary: the model server holds undelivered
// replies during a checkpoint, so the loop cannot pass it. A prepare is
// ready when no activation is running. Legacy /run episodes are tracked by
// an episode.Tracker of their own (legacy.go).

// sessionPhase is where a session's activation stands.
type sessionPhase uint8

const (
	phaseIdle sessionPhase = iota
	phaseRunning
	phaseAtBoundary
)

// ckptState is the participant's own state, guarded by Server.mu.
type ckptState struct {
	closed bool
	// reopened is closed when admission reopens.
	reopened chan struct{}
	// blocking counts sessions that keep a checkpoint from being ready;
	// changed is closed (and replaced) when it drops to zero, and whenever
	// the legacy tracker's readiness may have changed.
	blocking int
	changed  chan struct{}
	// served counts sessions opened and stateless activations run, for
	// Fresh; atomic, so counting needs no lock.
	served atomic.Int64
	// watch relays the legacy tracker's readiness changes while admission
	// is closed (the only time a prepare waits on them); nil otherwise.
	watch *watcher
	// boundaryScratch holds buffers loop states are encoded into at their
	// boundaries (*boundaryScratch), before each is copied out at its
	// exact size.
	boundaryScratch sync.Pool
}

// watcher is the goroutine that relays the legacy tracker's readiness.
type watcher struct {
	stop, done chan struct{}
}

func newCkptState() *ckptState { return &ckptState{changed: make(chan struct{})} }

// encodeBoundary encodes a loop state at a boundary as a session record
// holds it, for every export until the next boundary to copy as it is.
//
// It runs on the loop's goroutine, with the state just built and in cache:
// encoded at export, each state was read from wherever the heap had put its
// parts over the rollout's life, several times slower than states built
// in one go (BenchmarkExport), and most of the agent's share of a commit. A
// boundary comes a few times a rollout and costs a few microseconds there.
//
// The state's items are then compacted onto the encoding (Item.Compact):
// their token arrays, most of a rollout's bytes, are held once, as the
// record's text, rather than decoded beside it. Nothing of the loop reads
// them again; the next model request and the final reply write the items
// from the encoding, byte for byte what encoding them again would write.
func (c *ckptState) encodeBoundary(st *LoopState) (codec.RawMessage, error) {
	scratch, _ := c.boundaryScratch.Get().(*boundaryScratch)
	if scratch == nil {
		scratch = new(boundaryScratch)
	}
	spans := scratch.spans[:0]
	b, err := appendLoopStateSpans(scratch.b[:0], st, &spans)
	if err != nil {
		return nil, err
	}
	enc := bytes.Clone(b)
	for i := range st.NewOutputs {
		start, end := spans[2*i], spans[2*i+1]
		st.NewOutputs[i] = st.NewOutputs[i].Compact(enc[start:end:end])
	}
	scratch.b, scratch.spans = b, spans
	c.boundaryScratch.Put(scratch)
	return enc, nil
}

// boundaryScratch is encodeBoundary's reusable room: the encoding and
// where each item of the state's outputs stands in it.
type boundaryScratch struct {
	b     []byte
	spans []int
}

func (c *ckptState) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// errRetired is the cause a retired attempt's work is cancelled with.
var errRetired = apierror.New(apierror.StaleAttempt, "this attempt was retired by the checkpoint controller")

// classify is the admission of the agent's data routes while a checkpoint
// is open.
func classify(r *http.Request) (rollout.EpisodeID, bool, ctlplane.Admission) {
	id, named := rollout.FromContext(r.Context())
	switch r.URL.Path {
	case "/v1/agent_sessions":
		// Deviation from the reference, which refuses opens while closed:
		// the environment opens the session inside its seed step, which is
		// replayed, and a refusal there would fail the whole episode. A
		// waiting open is not in flight, so it holds no checkpoint back.
		return id, named, ctlplane.AdmitWait
	case "/v1/responses":
		if r.Header.Get(SessionHeader) == "" {
			// A stateless loop has no session to export: it starts after
			// the checkpoint instead.
			return id, named, ctlplane.AdmitWait
		}
		// An activation invoked just before the close still starts, and
		// parks at its first boundary before doing any work.
		return id, named, ctlplane.AdmitPass
	case "/run":
		// The caller resends it unchanged after the checkpoint.
		return id, named, ctlplane.AdmitRefuse
	}
	// Closing a session is never refused or held: its caller closes once.
	return id, named, ctlplane.AdmitPass
}

// setPhase moves a session to p and updates the blocking count. Called
// with s.mu held.
func (s *Server) setPhase(sess *session, p sessionPhase) {
	sess.phase = p
	s.updateBlocking(sess)
}

// updateBlocking recomputes a session's contribution to the blocking
// count: a running activation blocks, and so does any activation of a
// retired session until it has stopped. Called with s.mu held.
func (s *Server) updateBlocking(sess *session) {
	b := sess.running && (sess.phase == phaseRunning || sess.retired)
	if b == sess.blocks {
		return
	}
	sess.blocks = b
	if b {
		s.ckpt.blocking++
		return
	}
	s.ckpt.blocking--
	if s.ckpt.blocking == 0 {
		s.ckpt.notifyLocked()
	}
}

// sessionLoop takes a native session's activation through checkpoints.
type sessionLoop struct {
	s    *Server
	sess *session
}

func (h sessionLoop) atBoundary(ctx context.Context, b Boundary, st *LoopState) error {
	s, sess := h.s, h.sess
	enc, encErr := s.ckpt.encodeBoundary(st)
	s.mu.Lock()
	defer s.mu.Unlock()
	sess.boundary, sess.boundaryErr, sess.at = enc, encErr, b
	for s.ckpt.closed {
		s.setPhase(sess, phaseAtBoundary)
		reopened := s.ckpt.reopened
		s.mu.Unlock()
		select {
		case <-reopened:
		case <-ctx.Done():
			s.mu.Lock()
			return context.Cause(ctx)
		}
		s.mu.Lock()
	}
	if b == BoundaryBeforeModelCall {
		// Awaiting the model counts as at this boundary (see awaitModel).
		s.setPhase(sess, phaseAtBoundary)
	} else {
		s.setPhase(sess, phaseRunning)
	}
	return nil
}

func (h sessionLoop) awaitModel(t *park.Task, ctx context.Context, a *activation, done func(*openai.Response, error)) {
	a.callModel(t, ctx, func(resp *openai.Response, err error) {
		h.s.mu.Lock()
		h.s.setPhase(h.sess, phaseRunning)
		h.s.mu.Unlock()
		done(resp, err)
	})
}

// startWatchLocked starts relaying the legacy tracker's readiness changes
// to ReadyChanged. Called with s.mu held.
func (s *Server) startWatchLocked() {
	if s.ckpt.watch != nil {
		return
	}
	w := &watcher{stop: make(chan struct{}), done: make(chan struct{})}
	s.ckpt.watch = w
	// Taken now, before the prepare first checks readiness: a change after
	// this point closes it.
	first := s.runs.ReadyChanged()
	go s.watchRuns(w, first)
}

func (s *Server) watchRuns(w *watcher, ch <-chan struct{}) {
	defer close(w.done)
	for {
		select {
		case <-ch:
			// Take the next channel before notifying: a change after this
			// point closes it, and one before it is covered by the notify.
			ch = s.runs.ReadyChanged()
			s.mu.Lock()
			s.ckpt.notifyLocked()
			s.mu.Unlock()
		case <-w.stop:
			return
		}
	}
}

// stopWatch stops the watcher, if any, and waits for it.
func (s *Server) stopWatch() {
	s.mu.Lock()
	w := s.ckpt.watch
	s.ckpt.watch = nil
	s.mu.Unlock()
	if w != nil {
		close(w.stop)
		<-w.done
	}
}

// participant implements ctlplane.Participant for one agent, and the
// agent's hooks with checkpointing on.
type participant struct{ s *Server }

var (
	_ ctlplane.Participant = participant{}
	_ agentHooks           = participant{}
)

// ---- the request path (agentHooks) ----------------------------------------

func (p participant) served() { p.s.ckpt.served.Add(1) }

func (p participant) startActivation(sess *session) loopHooks {
	p.s.setPhase(sess, phaseRunning)
	return sessionLoop{s: p.s, sess: sess}
}

func (p participant) endActivation(sess *session) {
	sess.boundary, sess.boundaryErr = nil, nil
	p.s.setPhase(sess, phaseIdle)
}

// admitRun checks the fence: the fence middleware reads only the prefix,
// and a row names its attempt in the body.
func (p participant) admitRun(ep rollout.EpisodeID) error { return p.s.ctl.CheckFence(ep) }

// runLegacy runs a legacy /run as an episode of the tracker: a replacement
// attempt restored from a checkpoint continues from its boundary, and a
// retire cancels it.
func (p participant) runLegacy(ctx context.Context, ep rollout.EpisodeID, row map[string]codec.RawMessage, body []byte, params *openai.ResponsesRequest) (any, error) {
	digest, err := legacyTaskDigest(body)
	if err != nil {
		return nil, apierror.Wrap(apierror.InvalidRequest, err)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	e, cont, err := p.s.runs.Begin(ep, digest, func() { cancel(errRetired) })
	if err != nil {
		return nil, err
	}
	defer e.End()
	prog := newLegacyProgress()
	if cont != nil {
		restored, err := decodeLegacyBoundary(cont.Boundary)
		if err != nil {
			return nil, apierror.Wrap(apierror.InvalidCheckpointState, err)
		}
		if restored != nil {
			prog = restored
		}
	}
	out, err := p.s.runLegacy(ctx, e, legacyHooks{e: e, p: prog}, ep, row, body, params, prog)
	if err != nil && ctx.Err() != nil {
		// A run parked at a boundary ends with the bare context error;
		// report why it was stopped (a retire says stale_attempt).
		err = context.Cause(ctx)
	}
	return out, err
}

// close closes the control plane and stops the legacy tracker's watcher.
func (p participant) close() {
	p.s.ctl.Close()
	p.s.stopWatch()
}

// ---- ctlplane.Participant ------------------------------------------------

func (p participant) Kind() string     { return ctlplane.KindAgent }
func (p participant) Instance() string { return p.s.cfg.Name }

func (p participant) CloseAdmission(context.Context) error {
	s := p.s
	s.mu.Lock()
	if !s.ckpt.closed {
		s.ckpt.closed = true
		s.ckpt.reopened = make(chan struct{})
	}
	s.startWatchLocked()
	s.mu.Unlock()
	s.runs.CloseAdmission()
	return nil
}

func (p participant) OpenAdmission() {
	s := p.s
	s.runs.OpenAdmission()
	s.mu.Lock()
	if s.ckpt.closed {
		s.ckpt.closed = false
		close(s.ckpt.reopened)
	}
	s.mu.Unlock()
	s.stopWatch()
}

func (p participant) Ready() bool {
	s := p.s
	s.mu.Lock()
	n := s.ckpt.blocking
	s.mu.Unlock()
	return n == 0 && s.runs.Ready()
}

func (p participant) ReadyChanged() <-chan struct{} {
	s := p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ckpt.changed
}

func (p participant) Report(limit int) ctlplane.Report {
	s := p.s
	runs := s.runs.Report(-1)
	s.mu.Lock()
	keys := map[string]bool{}
	open, atBoundary := 0, 0
	for _, sess := range s.sessions {
		if sess.blocks {
			keys[sess.episode.CaptureKey()] = true
		}
		if !sess.closed {
			open++
		}
		if sess.running && sess.phase == phaseAtBoundary {
			atBoundary++
		}
	}
	s.mu.Unlock()
	for _, k := range runs.Blockers {
		keys[k] = true
	}
	blockers := make([]string, 0, len(keys))
	for k := range keys {
		blockers = append(blockers, k)
	}
	listed, n := ctlplane.Blockers(blockers, limit)
	return ctlplane.Report{
		Ready: n == 0, Blockers: listed, BlockerCount: n,
		Counts: map[string]int{
			"sessions": open, "at_boundary": atBoundary,
			"legacy_runs": runs.Counts["episodes"], "legacy_runs_parked": runs.Counts["parked"],
		},
		// Native sessions are never restarts (the environment reports its
		// own); a legacy run on a restart-only resources server is.
		Restarts: runs.Restarts,
	}
}

// Record types of the records file: a native session, or a legacy /run
// episode (an episode.Record wrapped so the two are told apart).
const (
	recordSession = "agent_session"
	recordLegacy  = "legacy_run"
)

// sessionRecord is a native session's record.
type sessionRecord struct {
	EpisodeID rollout.EpisodeID `json:"episode_id"`
	Type      string            `json:"type"`
	SessionID string            `json:"session_id"`
	Session   sessionState      `json:"session"`
	// Boundary is the loop state of the activation in progress, or null.
	Boundary codec.RawMessage `json:"boundary"`
}

// sessionState is what a session carries across a restore.
type sessionState struct {
	Request            codec.RawMessage `json:"request"`
	ResourcesSessionID string           `json:"resources_session_id"`
	// ResourcesCookies is absent in records written before cookies were
	// carried, which restore as a session with none.
	ResourcesCookies    string           `json:"resources_cookies,omitempty"`
	Activations         int              `json:"activations"`
	CompletedActivation int              `json:"completed_activation"`
	CompletedReply      codec.RawMessage `json:"completed_reply"`
	Observations        Observations     `json:"observations"`
}

// legacyRecord is a legacy /run episode's record.
type legacyRecord struct {
	EpisodeID rollout.EpisodeID `json:"episode_id"`
	Type      string            `json:"type"`
	// Episode is the episode.Record the tracker exported.
	Episode codec.RawMessage `json:"episode"`
}

var jsonNull = codec.RawMessage("null")

func orNull(raw codec.RawMessage) codec.RawMessage {
	if len(raw) == 0 {
		return jsonNull
	}
	return raw
}

// exportedSession is what Export copies out under the lock: the encoding
// of the loop state of the activation in progress at its last boundary or,
// for a restored session nothing has continued yet, as the checkpoint held
// it (boundary, nil for none), or why it could not be encoded (err).
type exportedSession struct {
	rec      sessionRecord
	boundary codec.RawMessage
	err      error
}

// sessionRecordOut is sessionRecord with the loop state as a value rather
// than its encoding, what codec.Marshal and appendSessionRecord
// (record_encode.go) write the same bytes for: the encoder of a loop state
// at its boundary (encodeBoundary) and its tests. Export writes a record
// with its Boundary nil and the loop state's encoding given as it is.
type sessionRecordOut struct {
	EpisodeID rollout.EpisodeID `json:"episode_id"`
	Type      string            `json:"type"`
	SessionID string            `json:"session_id"`
	Session   sessionState      `json:"session"`
	Boundary  *LoopState        `json:"boundary"`
}

// restoredLoop is the loop boundary of a restored session's activation in
// progress, as its record held it. Install checks only what it needs to
// accept it (checkLoopShape); the activation that continues it decodes it.
type restoredLoop struct{ raw codec.RawMessage }

// decode decodes the state in full and checks it can be continued.
func (l *restoredLoop) decode() (*LoopState, error) {
	st, err := decodeLoopState(l.raw)
	if err == nil && st == nil {
		err = errors.New("loop boundary is null")
	}
	return st, err
}

// decodedLoop is a restored loop state an activation decoded, and from
// what.
type decodedLoop struct {
	from  *restoredLoop
	state *LoopState
	err   error
}

func (p participant) Export(ctx context.Context, scope ctlplane.Scope, emit func(ctlplane.Record) error) (ctlplane.Extras, error) {
	s := p.s
	emit = faultpoint.AfterFirst(faultpoint.AgentExportPartial, emit)
	s.mu.Lock()
	// Sized for every session: grown one append at a time, it allocated
	// about five times its final size.
	out := make([]exportedSession, 0, len(s.sessions))
	// at[k] is where the scope lists out[k]'s episode.
	at := make([]int32, 0, len(s.sessions))
	for _, sess := range s.sessions {
		i, inScope := scope.Index(sess.episode)
		if sess.closed || sess.retired || !inScope {
			continue
		}
		obs := sess.observations
		if obs.Usage != nil {
			u := *obs.Usage
			obs.Usage = &u
		}
		e := exportedSession{rec: sessionRecord{
			Type: recordSession, EpisodeID: sess.episode, SessionID: sess.id,
			Session: sessionState{
				Request: orNull(sess.request), ResourcesSessionID: sess.resourcesSessionID, ResourcesCookies: sess.resourcesCookies,
				Activations: sess.activations, CompletedActivation: sess.completedActivation,
				CompletedReply: orNull(sess.completedReply), Observations: obs,
			},
		}}
		switch {
		case sess.running:
			// Never modified: the next boundary encodes a state of its own.
			e.boundary, e.err = sess.boundary, sess.boundaryErr
		case sess.restoredLoop != nil:
			// Never modified: the activation that continues it decodes a
			// state of its own.
			e.boundary = sess.restoredLoop.raw
		}
		out = append(out, e)
		at = append(at, int32(i))
	}
	s.mu.Unlock()
	inScopeOrder(out, at, scope.Len())
	if err := emitWindows(out, emit); err != nil {
		return ctlplane.Extras{}, err
	}
	legacy := 0
	err := s.runs.Export(scope, func(r ctlplane.Record) error {
		data, err := codec.Marshal(legacyRecord{Type: recordLegacy, EpisodeID: r.EpisodeID, Episode: r.Data})
		if err != nil {
			return err
		}
		legacy++
		return emit(ctlplane.Record{EpisodeID: r.EpisodeID, Data: data})
	})
	if err != nil || legacy == 0 {
		return ctlplane.Extras{}, err
	}
	return ctlplane.Extras{Manifest: map[string]any{control.ManifestLegacyRuns: legacy}}, nil
}

// inScopeOrder puts out in the order of the scope's episodes, at[k] being
// where the scope lists out[k]'s, and an episode's sessions by session id:
// an export of the same state writes the same records. The sessions come
// from a map, so they are placed by position (a counting sort, each moved
// once by following the permutation's cycles) rather than compared, so
// nothing waits for a sort before the first write. at is permuted with
// out.
func inScopeOrder(out []exportedSession, at []int32, episodes int) {
	// start[i] is where episode i's first session goes.
	start := make([]int32, episodes+1)
	for _, i := range at {
		start[i+1]++
	}
	for i := range episodes {
		start[i+1] += start[i]
	}
	next := slices.Clone(start[:episodes])
	dest := make([]int32, len(out))
	for k, i := range at {
		dest[k] = next[i]
		next[i]++
	}
	for k := range out {
		for int(dest[k]) != k {
			d := dest[k]
			out[k], out[d] = out[d], out[k]
			at[k], at[d] = at[d], at[k]
			dest[k], dest[d] = dest[d], dest[k]
		}
	}
	for i := range episodes {
		if start[i+1]-start[i] > 1 {
			slices.SortFunc(out[start[i]:start[i+1]], func(a, b exportedSession) int {
				return cmp.Compare(a.rec.SessionID, b.rec.SessionID)
			})
		}
	}
}

// emitWindows encodes the records of out a window at a time on every core
// (encoding is most of the export's work, and a loop state is kilobytes of
// JSON) and emits them in order, each window while the next is encoded:
// emitting runs on one core, and the store's checks, hash and writes are a
// third of an export. Windows alternate between two sets of slots, reused
// by every other window: emit does not retain a record's data after it
// returns (ctlplane.Participant.Export), so the slots' memory is unmapped
// when the last window is emitted.
func emitWindows(out []exportedSession, emit func(ctlplane.Record) error) error {
	n := min(encodeWindow, len(out))
	even, unmapEven := newExportSlots(n)
	defer unmapEven()
	odd, unmapOdd := newExportSlots(n)
	defer unmapOdd()
	slots := [2][]exportSlot{even, odd}
	windowAt := func(k int) []exportedSession {
		return out[k*encodeWindow : min((k+1)*encodeWindow, len(out))]
	}
	encode := func(k int) {
		window, set := windowAt(k), slots[k%2]
		parallel.For(len(window), runtime.GOMAXPROCS(0), func(_, i int) { set[i].encode(&window[i]) })
	}
	windows := (len(out) + encodeWindow - 1) / encodeWindow
	if windows > 0 {
		encode(0)
	}
	for k := range windows {
		next := make(chan struct{})
		if k+1 < windows {
			go func() {
				defer close(next)
				encode(k + 1)
			}()
		} else {
			close(next)
		}
		err := emitWindow(windowAt(k), slots[k%2], emit)
		// The next window's encoding writes into slots this function
		// owns: wait for it even when returning early.
		<-next
		if err != nil {
			return err
		}
	}
	return nil
}

// emitWindow emits a window's records from the slots they were encoded in.
func emitWindow(window []exportedSession, set []exportSlot, emit func(ctlplane.Record) error) error {
	for i, e := range window {
		if set[i].err != nil {
			return set[i].err
		}
		if err := emit(ctlplane.Record{EpisodeID: e.rec.EpisodeID, Data: set[i].buf}); err != nil {
			return err
		}
	}
	return nil
}

// exportSlot is one slot of an export window, reused by every window: the
// buffer its record is encoded into.
type exportSlot struct {
	buf []byte
	err error
}

// encode encodes e's record into the slot's buffer, with its loop state's
// encoding as it is (null when there is none).
func (s *exportSlot) encode(e *exportedSession) {
	if e.err != nil {
		s.err = fmt.Errorf("agent session %s: %w", e.rec.SessionID, e.err)
		return
	}
	rec := sessionRecordOut{Type: e.rec.Type, EpisodeID: e.rec.EpisodeID, SessionID: e.rec.SessionID, Session: e.rec.Session}
	s.buf, s.err = appendSessionRecord(s.buf[:0], &rec, e.boundary)
	if s.err != nil {
		s.err = fmt.Errorf("agent session %s: %w", e.rec.SessionID, s.err)
	}
}

// recordSizeHint is the room each export slot's buffer starts with: a
// session at its second model call after one tool round encodes to about
// 3.2 KB (BenchmarkExport). A larger record grows its slot's buffer, which
// keeps the room for the next windows.
const recordSizeHint = 4 << 10

// newExportSlots returns n slots whose buffers are empty, with
// recordSizeHint bytes of room each, cut from one allocation. Each buffer
// is capped at its own room, so a record that outgrows it moves to a new
// array, on the heap, rather than into its neighbour's. The allocation is
// whole huge pages mapped outside the Go heap (hugepage.Map), which fault
// once per huge page and count toward no collection: in a process holding
// every rollout's state a commit's allocations could start one that marks
// all of it. Nothing may use the slots once unmap is called.
func newExportSlots(n int) (slots []exportSlot, unmap func()) {
	arena, unmap := hugepage.Map(n * recordSizeHint)
	slots = make([]exportSlot, n)
	for i := range slots {
		at := i * recordSizeHint
		slots[i].buf = arena[at:at:(at + recordSizeHint)]
	}
	return slots, unmap
}

// Held implements ctlplane.Holder: the episodes of every open session and
// of every legacy /run the tracker holds, so a commit without a scope
// exports them all, as Gym's agent participant does (agent.py export with
// episode_ids None).
func (p participant) Held() []rollout.EpisodeID {
	s := p.s
	out := s.runs.Held()
	s.mu.Lock()
	for _, sess := range s.sessions {
		if !sess.closed && !sess.retired {
			out = append(out, sess.episode)
		}
	}
	s.mu.Unlock()
	return out
}

func (p participant) Committed(ctx context.Context, scope ctlplane.Scope, stop bool) error {
	s := p.s
	s.mu.Lock()
	for _, sess := range s.sessions {
		// A restored session named by no episode the controller continues,
		// and untouched since the restore: nothing will continue it. No
		// fence, since the controller may start that attempt over.
		if sess.restored && !scope.Has(sess.episode) {
			s.dropSessionLocked(sess)
		}
	}
	s.mu.Unlock()
	s.runs.DeleteRestoredOutside(scope)
	return nil
}

// dropSessionLocked frees a session. Called with s.mu held.
func (s *Server) dropSessionLocked(sess *session) {
	if s.sessions[sess.id] != sess {
		return
	}
	delete(s.sessions, sess.id)
	if rest := slices.DeleteFunc(s.byRollout[sess.episode.RolloutID], func(o *session) bool { return o == sess }); len(rest) > 0 {
		s.byRollout[sess.episode.RolloutID] = rest
	} else {
		delete(s.byRollout, sess.episode.RolloutID)
	}
	if !sess.closed {
		s.metrics.sessions.Dec()
	}
}

func (p participant) Fresh() error {
	s := p.s
	s.mu.Lock()
	served, live := s.ckpt.served.Load(), len(s.sessions)
	s.mu.Unlock()
	if served > 0 || live > 0 {
		return fmt.Errorf("restore requires a process without live sessions: agent %s has served %d sessions or calls and holds %d", s.cfg.Name, served, live)
	}
	if err := s.runs.Fresh(); err != nil {
		return fmt.Errorf("restore requires a process without live sessions: agent %s: %w", s.cfg.Name, err)
	}
	return nil
}

func (p participant) Install(ctx context.Context, records []ctlplane.Record, scope ctlplane.Scope, manifest ctlplane.Extras) ([]rollout.EpisodeID, error) {
	s := p.s
	var sessions []*session
	var legacy []ctlplane.Record
	seen := make(map[string]bool, len(records))
	for i, d := range decodeRecords(records) {
		switch {
		case d.err != nil:
			return nil, invalidState("agent record %d: %v", i, d.err)
		case d.sess != nil:
			if seen[d.sess.id] {
				return nil, invalidState("agent record %d: session %s appears twice", i, d.sess.id)
			}
			seen[d.sess.id] = true
			sessions = append(sessions, d.sess)
		default:
			legacy = append(legacy, *d.legacy)
		}
	}
	s.mu.Lock()
	for _, sess := range sessions {
		if _, ok := s.sessions[sess.id]; ok {
			s.mu.Unlock()
			return nil, invalidState("agent session %s already exists in this process", sess.id)
		}
	}
	s.mu.Unlock()
	// The tracker validates every legacy record before installing any; after
	// it succeeds nothing below can fail (admission is closed and the
	// process fresh, so no session appears meanwhile).
	installed, err := s.runs.Install(legacy)
	if err != nil {
		return nil, apierror.Wrap(apierror.InvalidCheckpointState, err)
	}
	faultpoint.Hit(faultpoint.AgentInstallPartial)
	s.mu.Lock()
	for _, sess := range sessions {
		s.addSessionLocked(sess)
		installed = append(installed, sess.episode)
	}
	s.mu.Unlock()
	slices.SortFunc(installed, rollout.CompareCaptureKeys)
	return slices.Compact(installed), nil
}

// decodedRecord is one agent record decoded: a native session's, a legacy
// run's inner episode record, or why it is invalid.
type decodedRecord struct {
	sess *session
	// legacy is a pointer, as legacy runs are rare: inline, the record
	// made every element more than twice as large, fresh memory on the
	// restore's critical path.
	legacy *ctlplane.Record
	err    error
}

func decodeRecord(rec ctlplane.Record, scratch *[]byte) decodedRecord {
	typ, err := recordType(rec.Data)
	if err != nil {
		return decodedRecord{err: err}
	}
	if typ == recordSession {
		sess, err := decodeSessionRecord(rec, scratch)
		return decodedRecord{sess: sess, err: err}
	}
	inner, err := decodeLegacyRecord(rec)
	return decodedRecord{legacy: &inner, err: err}
}

// decodeRecords decodes every record on every core: decoding is nearly all
// of a restore's work (a loop state is kilobytes of JSON), records are
// independent, and the agent's records are the largest of the fleet. The
// results are in the records' order, so the caller reports the first
// invalid one as a sequential decode would.
func decodeRecords(records []ctlplane.Record) []decodedRecord {
	out := make([]decodedRecord, len(records))
	workers := runtime.GOMAXPROCS(0)
	scratch := make([][]byte, workers) // one per worker, for the records' heads
	parallel.For(len(records), workers, func(worker, i int) { out[i] = decodeRecord(records[i], &scratch[worker]) })
	return out
}

// encodeWindow is how many records Export encodes before it emits them:
// enough to keep every core busy between two hand-overs, and few, since
// the two windows' slots are fresh memory every commit faults in and the
// kernel zeroes.
const encodeWindow = 256

func invalidState(format string, args ...any) error {
	return apierror.New(apierror.InvalidCheckpointState, format, args...)
}

// Export writes a record's episode id first and its type next (a records
// line is the record flat, the episode id first: ckptstore line.go); a
// record of a checkpoint written before records were flat starts with its
// type. These are the bytes after the id, and those a former record starts
// with.
var (
	sessionTypeMember = []byte(`,"type":"` + recordSession + `",`)
	legacyTypeMember  = []byte(`,"type":"` + recordLegacy + `",`)
	sessionPrefix     = []byte(`{"type":"` + recordSession + `",`)
	legacyPrefix      = []byte(`{"type":"` + recordLegacy + `",`)
)

// recordType reads a record's type: from the bytes it starts with when it
// starts as Export writes it, else by decoding it. Either way the decoder
// of that type checks it again.
func recordType(data []byte) (string, error) {
	if rest, ok := bytes.CutPrefix(data, []byte(`{"episode_id":`)); ok {
		if _, _, rest, ok := rollout.CutEpisodeIDJSON(rest); ok {
			switch {
			case bytes.HasPrefix(rest, sessionTypeMember):
				return recordSession, nil
			case bytes.HasPrefix(rest, legacyTypeMember):
				return recordLegacy, nil
			}
		}
	}
	switch {
	case bytes.HasPrefix(data, sessionPrefix):
		return recordSession, nil
	case bytes.HasPrefix(data, legacyPrefix):
		return recordLegacy, nil
	}
	var head struct {
		Type string `json:"type"`
	}
	if err := codec.Unmarshal(data, &head); err != nil {
		return "", errors.New(codec.DescribeError(err))
	}
	switch head.Type {
	case recordSession, recordLegacy:
		return head.Type, nil
	}
	return "", fmt.Errorf("type %q is neither %s nor %s", head.Type, recordSession, recordLegacy)
}

// decodeSessionRecord validates a native session's record and returns the
// session it restores, bound to the next attempt. The loop state of its
// activation in progress is checked (checkLoopShape), not decoded: that is
// most of a record's bytes, and the activation that continues it decodes
// it (restoredLoop.decode).
func decodeSessionRecord(rec ctlplane.Record, scratch *[]byte) (*session, error) {
	r, shape, err := decodeSessionFields(rec.Data, scratch)
	if err != nil {
		return nil, err
	}
	if r.Type != recordSession {
		return nil, fmt.Errorf("type %q is not %s", r.Type, recordSession)
	}
	if r.EpisodeID != rec.EpisodeID {
		return nil, fmt.Errorf("session record names %s but is filed under %s", r.EpisodeID, rec.EpisodeID)
	}
	if err := r.EpisodeID.Validate(); err != nil {
		return nil, err
	}
	st := r.Session
	switch {
	case !rollout.ValidID(r.SessionID):
		return nil, fmt.Errorf("session_id %q is not a valid id", r.SessionID)
	case !rollout.ValidID(st.ResourcesSessionID):
		return nil, fmt.Errorf("session %s: resources_session_id %q is not a valid id", r.SessionID, st.ResourcesSessionID)
	case sessioncookie.Check(st.ResourcesCookies) != nil:
		return nil, fmt.Errorf("session %s: resources_cookies: %v", r.SessionID, sessioncookie.Check(st.ResourcesCookies))
	case st.CompletedActivation < 0 || st.Activations < st.CompletedActivation:
		return nil, fmt.Errorf("session %s: %d activations started cannot include completed activation %d", r.SessionID, st.Activations, st.CompletedActivation)
	case st.CompletedActivation > 0 && !startsObject(st.CompletedReply):
		return nil, fmt.Errorf("session %s: completed activation %d has no reply", r.SessionID, st.CompletedActivation)
	}
	var loop *restoredLoop
	if len(r.Boundary) > 0 && !isNull(r.Boundary) {
		if shape != nil {
			err = shape.invariants()
		} else {
			err = checkLoopShape(r.Boundary)
		}
		if err != nil {
			return nil, fmt.Errorf("session %s: %w", r.SessionID, err)
		}
		if st.Activations == st.CompletedActivation {
			return nil, fmt.Errorf("session %s has a loop boundary but no activation in progress", r.SessionID)
		}
		loop = &restoredLoop{raw: r.Boundary}
	}
	request := st.Request
	if isNull(request) {
		request = nil
	}
	reply := st.CompletedReply
	if isNull(reply) {
		reply = nil
	}
	return &session{
		id: r.SessionID, episode: r.EpisodeID.Next(), resourcesSessionID: st.ResourcesSessionID, resourcesCookies: st.ResourcesCookies,
		request: request, activations: st.Activations, completedActivation: st.CompletedActivation,
		completedReply: reply, observations: st.Observations,
		restoredLoop: loop, restored: true,
	}, nil
}

// decodeSessionFields decodes a session record strictly. data must be one
// JSON value, as Install's records are (the store checked them): a record
// as Export writes it has its raw values cut off first (cutSessionRecord),
// and only its head is decoded, from scratch, a buffer the caller reuses,
// which the decoded record does not retain. The raw values, parts of a
// valid value that CutValue found the ends of, are valid themselves and
// stay where they are, in the buffer of the records file (Install's records
// stay unchanged). scratch may be nil. It also returns what checkLoopShape
// reads of the loop boundary when the cut read it (nil otherwise).
func decodeSessionFields(data []byte, scratch *[]byte) (sessionRecord, *loopShape, error) {
	if scratch == nil {
		scratch = new([]byte)
	}
	if head, cut, ok := cutSessionRecord(*scratch, data); ok {
		*scratch = head
		var r sessionRecord
		if codec.UnmarshalStrictFast(head, &r) == nil {
			if cut.request != nil {
				r.Session.Request = cut.request
			}
			if cut.completedReply != nil {
				r.Session.CompletedReply = cut.completedReply
			}
			r.Boundary = cut.boundary
			return r, cut.shape, nil
		}
	}
	var r sessionRecord
	if err := codec.UnmarshalStrictFast(data, &r); err != nil {
		return sessionRecord{}, nil, errors.New(codec.DescribeError(err))
	}
	return r, nil, nil
}

// loopShape is what Install decodes of a loop boundary: the fields its
// checks read, and of new_outputs only that each item is an object. No item
// (nor its token arrays) is decoded.
type loopShape struct {
	Step              int           `json:"step"`
	PendingTools      bool          `json:"pending_tools"`
	NewOutputs        []objectShape `json:"new_outputs"`
	LastModelResponse presence      `json:"last_model_response"`
	ModelCalls        int           `json:"model_calls"`
}

// objectShape accepts a JSON object without decoding it.
type objectShape struct{}

// UnmarshalJSON refuses anything but an object (the decoder has validated it).
func (objectShape) UnmarshalJSON(b []byte) error {
	if !startsObject(b) {
		return errors.New("loop boundary: a new_outputs item is not a JSON object")
	}
	return nil
}

// presence records whether a field holds anything but null, without
// decoding it.
type presence bool

// UnmarshalJSON notes whether b is not null.
func (p *presence) UnmarshalJSON(b []byte) error {
	*p = presence(!isNull(b))
	return nil
}

// checkLoopShape checks a loop boundary (valid JSON, not null) as
// decodeLoopState does, without decoding its items: what it cannot see
// (an item's fields) fails the activation that continues the state. raw
// must have been validated: the walk of cutLoopShape trusts its syntax.
func checkLoopShape(raw codec.RawMessage) error {
	st, ok := cutLoopShape(raw)
	if !ok {
		if err := decodeLoopObject(raw, &st); err != nil {
			return err
		}
	}
	return st.invariants()
}

// invariants are loopInvariants of the shape read.
func (st *loopShape) invariants() error {
	return loopInvariants(st.Step, st.ModelCalls, st.PendingTools, bool(st.LastModelResponse))
}

// decodeLoopState reads a loop boundary (null: none) and checks it can be
// continued.
func decodeLoopState(raw codec.RawMessage) (*LoopState, error) {
	if len(raw) == 0 || isNull(raw) {
		return nil, nil
	}
	var st LoopState
	if err := decodeLoopObject(raw, &st); err != nil {
		return nil, err
	}
	if err := loopInvariants(st.Step, st.ModelCalls, st.PendingTools, st.LastModelResponse != nil); err != nil {
		return nil, err
	}
	return &st, nil
}

// decodeLoopObject decodes a loop boundary that must be a JSON object into
// v (the full LoopState or the loopShape Install reads).
func decodeLoopObject(raw codec.RawMessage, v any) error {
	if !startsObject(raw) {
		return errors.New("loop boundary is not a JSON object")
	}
	if err := codec.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("loop boundary: %s", codec.DescribeError(err))
	}
	return nil
}

// loopInvariants are what a loop boundary must hold to be continued.
func loopInvariants(step, modelCalls int, pendingTools, hasResponse bool) error {
	switch {
	case step < 0 || modelCalls < 0:
		return errors.New("loop boundary has a negative step or model call count")
	case pendingTools && !hasResponse:
		return errors.New("loop boundary has pending tools but no model response")
	}
	return nil
}

// decodeLegacyRecord validates a legacy record's envelope and its boundary
// and returns the inner episode record for the tracker.
func decodeLegacyRecord(rec ctlplane.Record) (ctlplane.Record, error) {
	var r legacyRecord
	if err := codec.UnmarshalStrictFast(rec.Data, &r); err != nil {
		return rec, errors.New(codec.DescribeError(err))
	}
	if r.Type != recordLegacy {
		return rec, fmt.Errorf("type %q is not %s", r.Type, recordLegacy)
	}
	if r.EpisodeID != rec.EpisodeID {
		return rec, fmt.Errorf("legacy record names %s but is filed under %s", r.EpisodeID, rec.EpisodeID)
	}
	var inner struct {
		Boundary codec.RawMessage `json:"boundary"`
	}
	if err := codec.Unmarshal(r.Episode, &inner); err != nil || !isObject(r.Episode) {
		return rec, fmt.Errorf("legacy run %s: episode is not a JSON object", r.EpisodeID)
	}
	if _, err := decodeLegacyBoundary(inner.Boundary); err != nil {
		return rec, fmt.Errorf("legacy run %s: %w", r.EpisodeID, err)
	}
	return ctlplane.Record{EpisodeID: r.EpisodeID, Data: r.Episode}, nil
}

func (p participant) Retire(ctx context.Context, ids []rollout.EpisodeID) error {
	s := p.s
	// upTo is the latest attempt retired of each rollout: a session is
	// covered when its attempt is that one or an earlier one.
	upTo := make(map[string]int, len(ids))
	for _, id := range ids {
		if a, ok := upTo[id.RolloutID]; !ok || id.Attempt > a {
			upTo[id.RolloutID] = id.Attempt
		}
	}
	covered := func(sess *session) bool {
		a, ok := upTo[sess.episode.RolloutID]
		return ok && sess.episode.Attempt <= a
	}
	s.mu.Lock()
	var waits []chan struct{}
	for _, id := range ids {
		for _, sess := range s.byRollout[id.RolloutID] {
			if !covered(sess) {
				continue
			}
			if !sess.retired {
				sess.retired = true
				if sess.running {
					sess.cancelRun(errRetired)
				}
				s.updateBlocking(sess)
			}
			if sess.running {
				waits = append(waits, sess.runDone)
			}
		}
	}
	s.mu.Unlock()
	if err := s.runs.Retire(ctx, ids); err != nil {
		return err
	}
	for _, ch := range waits {
		select {
		case <-ch:
		case <-ctx.Done():
			// The retired sessions still block prepares; a retry waits again.
			return ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		// A copy: dropping a session edits the rollout's list.
		for _, sess := range slices.Clone(s.byRollout[id.RolloutID]) {
			if covered(sess) && !sess.running {
				s.dropSessionLocked(sess)
			}
		}
	}
	return nil
}

func (p participant) Forget(ctx context.Context, rolloutIDs []string) error {
	s := p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range rolloutIDs {
		for _, sess := range s.byRollout[r] {
			if sess.retired {
				return apierror.New(apierror.RetireIncomplete, "agent session %s of rollout %s is still being retired; retry the retire first", sess.id, r)
			}
		}
	}
	return nil
}

func (p participant) StatusExtra() map[string]any {
	s := p.s
	pending := s.runs.Pending()
	s.mu.Lock()
	accepting := !s.ckpt.closed
	open := 0
	for _, sess := range s.sessions {
		if !sess.closed {
			open++
		}
		if sess.restored {
			pending = append(pending, sess.episode.CaptureKey())
		}
	}
	s.mu.Unlock()
	slices.Sort(pending)
	return map[string]any{"accepting": accepting, "sessions": open, "restored_pending": slices.Compact(pending)}
}
