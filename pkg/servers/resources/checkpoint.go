package resources

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/infra/faultpoint"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// UnboundBlocker is the blocker a report lists for requests in flight that
// name no episode (a session seeded without a /ng-rollout prefix).
const UnboundBlocker = "(unbound)"

// Manifest extras of a resources commit.
const (
	manifestType = "resources_type"
	manifestMode = "checkpoint_mode"
)

// SessionRecord is the record of one session in a resources checkpoint.
// State is the type's export of the session state in saved mode, and null
// in stateless mode (the record keeps the session id routed to its episode).
type SessionRecord struct {
	// EpisodeID comes first: a records line is the record flat, the
	// episode id first (ckptstore line.go), so it is written as it is.
	EpisodeID rollout.EpisodeID `json:"episode_id"`
	SessionID string            `json:"session_id"`
	State     codec.RawMessage  `json:"state"`
}

// checkpointing is a resources server's checkpoint side. Every field after
// the first group is guarded by Server.mu.
type checkpointing struct {
	ctl   *ctlplane.Controller
	fence *ctlplane.Fence
	// mode and verify are the server's effective checkpoint and verify modes.
	mode, verify string

	// closed is set while a checkpoint holds admission closed; reopened is
	// closed when it opens again.
	closed   bool
	reopened chan struct{}
	// served is set by the first data request or install: restore needs a
	// process that has served nothing.
	served bool
	// blocking counts the requests in flight that readiness waits for, by
	// blocker label; readyCh is closed when blocking reaches 0.
	blocking   int
	blockingBy map[string]int
	readyCh    chan struct{}
	// restored holds the restored sessions no request has used yet, by id.
	restored map[string]*session
}

func newCheckpointing(s *Server, deps Deps) (*checkpointing, error) {
	ck := &checkpointing{
		mode:       s.cfg.EffectiveCheckpointMode(),
		verify:     s.cfg.EffectiveVerifyMode(),
		blockingBy: map[string]int{},
		readyCh:    make(chan struct{}),
		restored:   map[string]*session{},
	}
	if ck.mode == ModeSaved && (s.typ.exportState == nil || s.typ.restoreState == nil) {
		return nil, fmt.Errorf("resources server %s: checkpoint_mode saved, but type %s does not implement session state export and restore", s.cfg.Name, s.cfg.Type)
	}
	ctl, err := ctlplane.New(s.cfg.Checkpoint, &participant{s: s, ck: ck}, ctlplane.Deps{Logger: deps.Logger, Registry: deps.Registry, Tuning: deps.Tuning, Tracer: deps.Tracer})
	if err != nil {
		return nil, fmt.Errorf("resources server %s: %w", s.cfg.Name, err)
	}
	ck.ctl, ck.fence = ctl, ctl.Fence()
	return ck, nil
}

// waits reports whether a checkpoint holds op while admission is closed
// (SPEC §6, protocol §2.7). Seeds always wait, so a restart_only server's
// restart set stays stable; tool calls wait rather than being refused (a
// refusal would read as a tool error), except on restart_only servers,
// which never hold anything up; a replayable verify is admitted; a close
// waits and is never refused.
func (ck *checkpointing) waits(op operation) bool {
	switch op {
	case opTool:
		return ck.mode != ModeRestartOnly
	case opVerify:
		return ck.verify == VerifyWait
	}
	return true
}

// counts reports whether a request of op, once admitted, holds readiness
// until it leaves. A restart_only server is always ready, and a replayable
// verify may run again after a crash, so neither is waited for.
func (ck *checkpointing) counts(op operation) bool {
	return ck.mode != ModeRestartOnly && (op != opVerify || ck.verify != VerifyReplay)
}

func (ck *checkpointing) block(label string) {
	ck.blocking++
	ck.blockingBy[label]++
}

func (ck *checkpointing) unblock(label string) {
	if ck.blockingBy[label]--; ck.blockingBy[label] <= 0 {
		delete(ck.blockingBy, label)
	}
	if ck.blocking--; ck.blocking == 0 {
		close(ck.readyCh)
		ck.readyCh = make(chan struct{})
	}
}

// classify is the control plane's admission classifier for the data routes.
// A close names no episode, so the attempt fence never refuses it.
func (s *Server) classify(r *http.Request) (rollout.EpisodeID, bool, ctlplane.Admission) {
	op, ok := dataOperation(r)
	if !ok {
		return rollout.EpisodeID{}, false, ctlplane.AdmitPass
	}
	ep, named := rollout.FromContext(r.Context())
	if op == opClose {
		named = false
	}
	if s.ckpt.waits(op) {
		return ep, named, ctlplane.AdmitWait
	}
	return ep, named, ctlplane.AdmitPass
}

// dataOperation maps a request (prefix already stripped) to the operation
// its route performs; ok is false for /tools, /_ctl/*, /_ckpt/* and the
// fleet's own routes (and /aggregate_metrics, which touches no session).
func dataOperation(r *http.Request) (operation, bool) {
	if r.Method != http.MethodPost {
		return 0, false
	}
	name, ok := strings.CutPrefix(r.URL.Path, "/")
	if !ok || name == "" || strings.Contains(name, "/") || strings.HasPrefix(name, "_") {
		return 0, false
	}
	switch name {
	case "seed_session":
		return opSeed, true
	case "verify":
		return opVerify, true
	case "close_session":
		return opClose, true
	case "aggregate_metrics":
		// Computed from the body alone: no session, nothing to wait for.
		return 0, false
	}
	return opTool, true
}

// participant is the resources server as a checkpoint participant
// (kind resources, instance = the server's name).
type participant struct {
	s  *Server
	ck *checkpointing
}

var (
	_ ctlplane.Participant = (*participant)(nil)
	_ requestHooks         = (*participant)(nil)
)

// ---- the request path (requestHooks); s.mu is held ------------------------

// holds: a request the checkpoint holds (see waits) waits while admission
// is closed. A process that has served nothing holds every request while
// closed: that is a restore installing, and even a request a checkpoint
// admits (a replayable verify, a restart_only tool call) must not run
// before the sessions exist.
func (p *participant) holds(op operation) <-chan struct{} {
	ck := p.ck
	if !ck.closed || !(ck.waits(op) || !ck.served) {
		return nil
	}
	return ck.reopened
}

// enter checks the fence again: the controller's middleware checked it
// before the request waited or reached here; checking again under s.mu
// closes the race with a retire that raised it since (Retire takes s.mu
// after).
func (p *participant) enter(op operation, ep rollout.EpisodeID, hasEp bool) error {
	if hasEp && op != opClose && p.ck.fence.Refuses(ep) {
		return apierror.New(apierror.StaleAttempt, "attempt %d of rollout %s was retired", ep.Attempt, ep.RolloutID)
	}
	p.ck.served = true
	return nil
}

func (p *participant) track(op operation, sess *session, ep rollout.EpisodeID, hasEp bool) (string, bool) {
	if !p.ck.counts(op) {
		return "", false
	}
	label := blockerLabel(sess, ep, hasEp)
	p.ck.block(label)
	return label, true
}

func (p *participant) release(label string) { p.ck.unblock(label) }

func (p *participant) used(sess *session) { delete(p.ck.restored, sess.id) }

// seedHeaders tells the agent how to verify and whether it restarts.
func (p *participant) seedHeaders(h http.Header) {
	h.Set(VerifyModeHeader, p.ck.verify)
	if p.ck.mode == ModeRestartOnly {
		h.Set(RestartHeader, "1")
	}
}

func (p *participant) close() { p.ck.ctl.Close() }

// ---- ctlplane.Participant ------------------------------------------------

// Kind implements ctlplane.Participant.
func (p *participant) Kind() string { return ctlplane.KindResources }

// Instance implements ctlplane.Participant.
func (p *participant) Instance() string { return p.s.cfg.Name }

// CloseAdmission implements ctlplane.Participant: from now on, a request
// that waits (see checkpointing.waits) waits in enter before it counts.
func (p *participant) CloseAdmission(context.Context) error {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	if !p.ck.closed {
		p.ck.closed = true
		p.ck.reopened = make(chan struct{})
	}
	return nil
}

// OpenAdmission implements ctlplane.Participant.
func (p *participant) OpenAdmission() {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	if p.ck.closed {
		p.ck.closed = false
		close(p.ck.reopened)
	}
}

// Ready implements ctlplane.Participant: no admitted request that counts
// is in flight.
func (p *participant) Ready() bool {
	if p.ck.mode == ModeRestartOnly {
		return true
	}
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	return p.ck.blocking == 0
}

// ReadyChanged implements ctlplane.Participant.
func (p *participant) ReadyChanged() <-chan struct{} {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	return p.ck.readyCh
}

// Report implements ctlplane.Participant: the blockers are the episodes
// with counted requests in flight; on a restart_only server every live
// bound session's episode is a restart.
func (p *participant) Report(limit int) ctlplane.Report {
	s, ck := p.s, p.ck
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(ck.blockingBy))
	for k := range ck.blockingBy {
		keys = append(keys, k)
	}
	listed, n := ctlplane.Blockers(keys, limit)
	restarts := []string{}
	if ck.mode == ModeRestartOnly {
		seen := map[rollout.EpisodeID]bool{}
		for _, byID := range s.byRollout {
			for _, sess := range byID {
				if !sess.retired && !seen[sess.episode] {
					seen[sess.episode] = true
					restarts = append(restarts, sess.episode.CaptureKey())
				}
			}
		}
		sort.Strings(restarts)
	}
	return ctlplane.Report{
		Ready:        ck.mode == ModeRestartOnly || ck.blocking == 0,
		Blockers:     listed,
		BlockerCount: n,
		Counts:       map[string]int{"sessions": s.liveLocked(), "inflight": ck.blocking},
		Restarts:     restarts,
	}
}

// Export implements ctlplane.Participant: one record per live session
// whose episode is in scope (none on a restart_only server). It looks the
// scope's rollouts up in the index rather than scanning every session.
func (p *participant) Export(ctx context.Context, scope ctlplane.Scope, emit func(ctlplane.Record) error) (ctlplane.Extras, error) {
	s, ck := p.s, p.ck
	emit = faultpoint.AfterFirst(faultpoint.ResourcesExportPartial, emit)
	extras := ctlplane.Extras{Manifest: map[string]any{manifestType: s.cfg.Type, manifestMode: ck.mode}}
	if ck.mode == ModeRestartOnly {
		return extras, nil
	}
	type pick struct {
		key  string // the episode's capture key
		sess *session
	}
	// Sized for a session per episode: grown one append at a time, the
	// copies are a share of the export's CPU.
	picked := make([]pick, 0, scope.Len())
	s.mu.Lock()
	for _, id := range scope.IDs() {
		var key string
		for _, sess := range s.byRollout[id.RolloutID] {
			if !sess.retired && sess.episode == id {
				if key == "" {
					key = id.CaptureKey()
				}
				picked = append(picked, pick{key: key, sess: sess})
			}
		}
	}
	s.mu.Unlock()
	// Admission is closed and nothing counted is in flight, so a session's
	// binding no longer changes; the order makes the records file the same
	// for the same sessions.
	slices.SortFunc(picked, func(a, b pick) int {
		return cmp.Or(strings.Compare(a.key, b.key), strings.Compare(a.sess.id, b.sess.id))
	})
	null := codec.RawMessage("null")
	for _, pk := range picked {
		sess := pk.sess
		if err := ctx.Err(); err != nil {
			return ctlplane.Extras{}, err
		}
		rec := SessionRecord{SessionID: sess.id, EpisodeID: sess.episode, State: null}
		if ck.mode == ModeSaved {
			sess.mu.Lock()
			state, ok := s.typ.exportState(sess.state)
			sess.mu.Unlock()
			if !ok {
				continue // dropped by the server since: not exported
			}
			rec.State = state
		}
		data, err := codec.Marshal(rec)
		if err != nil {
			return ctlplane.Extras{}, fmt.Errorf("encode the record of session %s: %w", sess.id, err)
		}
		if err := emit(ctlplane.Record{EpisodeID: rec.EpisodeID, Data: data}); err != nil {
			return ctlplane.Extras{}, err
		}
	}
	return extras, nil
}

// Held implements ctlplane.Holder: the episodes of every live session (none
// on a restart_only server, whose sessions are restarts), each once, so a
// commit without a scope exports every session, as Gym's resources
// participant does (resources.py export with episode_ids None).
func (p *participant) Held() []rollout.EpisodeID {
	if p.ck.mode == ModeRestartOnly {
		return nil
	}
	s := p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[rollout.EpisodeID]bool{}
	var out []rollout.EpisodeID
	for _, byID := range s.byRollout {
		for _, sess := range byID {
			if !sess.retired && !seen[sess.episode] {
				seen[sess.episode] = true
				out = append(out, sess.episode)
			}
		}
	}
	return out
}

// Committed implements ctlplane.Participant: restored sessions that no
// request has used and that the scope leaves out are deleted, without a
// fence (their ids can be seeded again).
func (p *participant) Committed(_ context.Context, scope ctlplane.Scope, _ bool) error {
	s := p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sess := range p.ck.restored {
		if !scope.Has(sess.episode) {
			s.removeLocked(sess)
		}
	}
	s.updateSessionsGaugeLocked()
	return nil
}

// errNotFresh is Fresh's refusal.
var errNotFresh = errors.New("resources requires a process that has not served sessions")

// Fresh implements ctlplane.Participant.
func (p *participant) Fresh() error {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	if p.ck.served || len(p.s.sessions) > 0 {
		return fmt.Errorf("resources server %s has served requests: %w", p.s.cfg.Name, errNotFresh)
	}
	return nil
}

// installed is one validated record.
type installed struct {
	id    string
	next  rollout.EpisodeID
	state any
}

// Install implements ctlplane.Participant: every record is validated
// (session id, episode, state through the type's restore hook in saved
// mode, null state in stateless mode) before any session is installed, each
// bound to its episode's next attempt.
func (p *participant) Install(ctx context.Context, records []ctlplane.Record, _ ctlplane.Scope, manifest ctlplane.Extras) ([]rollout.EpisodeID, error) {
	s, ck := p.s, p.ck
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if t, ok := manifest.Manifest[manifestType]; ok && t != s.cfg.Type {
		return nil, apierror.New(apierror.InvalidCheckpointState, "the checkpoint of %s was taken from a %v server, not %s", s.cfg.Name, t, s.cfg.Type)
	}
	if ck.mode == ModeRestartOnly && len(records) > 0 {
		return nil, apierror.New(apierror.InvalidCheckpointState, "restart_only server %s has no session state to restore, but the checkpoint holds %d records", s.cfg.Name, len(records))
	}
	sessions, err := p.validate(records)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, in := range sessions {
		if _, exists := s.sessions[in.id]; exists {
			return nil, apierror.New(apierror.InvalidCheckpointState, "session %s already exists in this process", in.id)
		}
	}
	// A restore runs in a fresh process: sized once, the maps do not grow
	// (and rehash) their way to 100,000 sessions.
	if len(s.sessions) == 0 {
		s.sessions = make(map[string]*session, len(sessions))
	}
	if len(s.byRollout) == 0 {
		s.byRollout = make(map[string][]*session, len(sessions))
	}
	if len(ck.restored) == 0 {
		ck.restored = make(map[string]*session, len(sessions))
	}
	next := make([]rollout.EpisodeID, 0, len(sessions))
	for _, in := range sessions {
		sess := &session{id: in.id, state: in.state, restored: true}
		s.sessions[in.id] = sess
		s.bindLocked(sess, in.next)
		ck.restored[in.id] = sess
		next = append(next, in.next)
		if len(next) == 1 {
			faultpoint.Hit(faultpoint.ResourcesInstallPartial)
		}
	}
	ck.served = true
	s.updateSessionsGaugeLocked()
	// An episode with several sessions is named once: sorted, its repeats
	// are neighbours (a set of them was another 16,000-entry map).
	slices.SortFunc(next, rollout.CompareCaptureKeys)
	return slices.Compact(next), nil
}

// validate decodes and checks every record; the first bad one fails all.
func (p *participant) validate(records []ctlplane.Record) ([]installed, error) {
	out := make([]installed, 0, len(records))
	seen := make(map[string]bool, len(records))
	for i, r := range records {
		rec, err := DecodeSessionRecord(r.Data)
		if err != nil {
			return nil, apierror.New(apierror.InvalidCheckpointState, "record %d: %v", i, err)
		}
		if rec.EpisodeID != r.EpisodeID {
			return nil, apierror.New(apierror.InvalidCheckpointState, "record %d: session %s names episode %s inside a record of %s", i, rec.SessionID, rec.EpisodeID, r.EpisodeID)
		}
		if seen[rec.SessionID] {
			return nil, apierror.New(apierror.InvalidCheckpointState, "record %d: session %s appears twice", i, rec.SessionID)
		}
		seen[rec.SessionID] = true
		in := installed{id: rec.SessionID, next: rec.EpisodeID.Next()}
		null := string(rec.State) == "null"
		switch {
		case p.ck.mode == ModeSaved:
			if in.state, err = p.s.typ.restoreState(rec.State); err != nil {
				return nil, apierror.New(apierror.InvalidCheckpointState, "record %d (session %s): %v", i, rec.SessionID, err)
			}
		case !null:
			return nil, apierror.New(apierror.InvalidCheckpointState, "record %d: session %s carries state, but server %s is %s and restores none", i, rec.SessionID, p.s.cfg.Name, p.ck.mode)
		}
		out = append(out, in)
	}
	return out, nil
}

// DecodeSessionRecord decodes and checks one record of a resources
// checkpoint: known fields only, a valid session id and episode, and a
// state that is present (null in stateless mode).
func DecodeSessionRecord(data []byte) (SessionRecord, error) {
	var rec SessionRecord
	if err := codec.UnmarshalStrictFast(data, &rec); err != nil {
		return SessionRecord{}, fmt.Errorf("not a resources session record: %s", codec.DescribeError(err))
	}
	if !rollout.ValidID(rec.SessionID) {
		return SessionRecord{}, fmt.Errorf("session_id %q must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", rec.SessionID)
	}
	if err := rec.EpisodeID.Validate(); err != nil {
		return SessionRecord{}, fmt.Errorf("session %s: episode_id: %w", rec.SessionID, err)
	}
	if len(rec.State) == 0 {
		return SessionRecord{}, fmt.Errorf("session %s: state is missing (null when the server saves none)", rec.SessionID)
	}
	return rec, nil
}

// Retire implements ctlplane.Participant: the attempts' sessions (and
// earlier attempts' of the same rollouts) are refused at once, then each is
// waited for until no request of it is in flight, its state is freed and it
// is untracked, leaving only the refusal until forget. A retire cut short
// leaves the rest retired and tracked; a retry picks them up again.
func (p *participant) Retire(ctx context.Context, ids []rollout.EpisodeID) error {
	s := p.s
	s.mu.Lock()
	var targets []*session
	picked := map[*session]bool{}
	for _, id := range ids {
		for _, sess := range s.byRollout[id.RolloutID] {
			if sess.dropped || sess.episode.Attempt > id.Attempt || picked[sess] {
				continue
			}
			picked[sess] = true
			targets = append(targets, sess)
			if !sess.retired {
				sess.retired = true
				s.retired++
			}
			if sess.restored {
				sess.restored = false
				delete(p.ck.restored, sess.id)
			}
		}
	}
	s.updateSessionsGaugeLocked()
	s.mu.Unlock()
	for _, sess := range targets {
		if err := p.retireSession(ctx, sess); err != nil {
			return err
		}
	}
	return nil
}

// retireSession waits until none of sess's requests is in flight (a
// retired session admits no new one but a close, which does not count on
// it), then frees its state.
func (p *participant) retireSession(ctx context.Context, sess *session) error {
	s := p.s
	s.mu.Lock()
	for sess.inflight > 0 {
		if sess.idle == nil {
			sess.idle = make(chan struct{})
		}
		idle := sess.idle
		s.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	if !sess.dropped {
		s.typ.retire(sess)
		sess.dropped = true
	}
	return nil
}

// Forget implements ctlplane.Participant: the refusals retired sessions
// left are dropped, unless a retire of one of the rollouts has not
// finished, which refuses the whole call (nothing is dropped).
func (p *participant) Forget(_ context.Context, rolloutIDs []string) error {
	s := p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range rolloutIDs {
		for _, sess := range s.byRollout[r] {
			if sess.retired && !sess.dropped {
				return apierror.New(apierror.RetireIncomplete, "the retire of session %s (episode %s) has not finished; retire it again first", sess.id, sess.episode.CaptureKey())
			}
		}
	}
	for _, r := range rolloutIDs {
		// removeLocked takes each from the list being walked.
		for _, sess := range slices.Clone(s.byRollout[r]) {
			if sess.dropped {
				s.removeLocked(sess)
			}
		}
	}
	return nil
}

// StatusExtra implements ctlplane.Participant.
func (p *participant) StatusExtra() map[string]any {
	s := p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return map[string]any{"mode": p.ck.mode, "verify": p.ck.verify, "sessions": s.liveLocked(), "retired_sessions": s.retired}
}
