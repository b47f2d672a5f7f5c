package agent

import (
	"context"
	"fmt"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/episode"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// SessionBoundary names the boundary a session's activation in progress
// last recorded ("" when none), so tests can wait for a specific one.
func SessionBoundary(s *Server, sessionID string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.sessions[sessionID]
	if !ok || !sess.running || (sess.boundary == nil && sess.boundaryErr == nil) {
		return ""
	}
	return sess.at.String()
}

// ValidateRecord runs Install's validation of one record, installing
// nothing anywhere that outlives the call.
func ValidateRecord(id rollout.EpisodeID, data []byte) error {
	rec := ctlplane.Record{EpisodeID: id, Data: data}
	typ, err := recordType(data)
	if err != nil {
		return err
	}
	if typ == recordSession {
		_, err := decodeSessionRecord(rec, nil)
		return err
	}
	inner, err := decodeLegacyRecord(rec)
	if err != nil {
		return err
	}
	_, err = episode.NewTracker().Install([]ctlplane.Record{inner})
	return err
}

// CheckpointParticipant is the agent's checkpoint participant
// (checkpointing on), for the benchmarks that drive Export and Install.
func CheckpointParticipant(s *Server) ctlplane.Participant { return participant{s} }

// LoopStateAt is the loop state a session's running activation recorded at
// its last boundary.
func LoopStateAt(s *Server, sessionID string) (LoopState, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.sessions[sessionID]
	if !ok || !sess.running || sess.boundary == nil {
		return LoopState{}, false
	}
	st, err := decodeLoopState(sess.boundary)
	if err != nil || st == nil {
		return LoopState{}, false
	}
	return *st, true
}

// StartHeldActivation opens a session as handleOpen does and starts its
// activation 1 as activate does, with the loop at st, recorded through the
// checkpoint hook at a before-model-call boundary: the state of an
// activation waiting for a model reply, built without HTTP or a goroutine
// (benchmarks hold 100,000 of them). It stays running until the server
// closes; a retire would wait for it forever.
func StartHeldActivation(ctx context.Context, s *Server, ep rollout.EpisodeID, sessionID, resourcesSessionID string, request codec.RawMessage, st *LoopState) error {
	s.mu.Lock()
	if _, ok := s.sessions[sessionID]; ok {
		s.mu.Unlock()
		return fmt.Errorf("agent session %s exists", sessionID)
	}
	sess := &session{
		id: sessionID, episode: ep, resourcesSessionID: resourcesSessionID, request: request,
		observations: Observations{ResourcesSessionID: resourcesSessionID},
	}
	s.addSessionLocked(sess)
	s.ckpt.served.Add(1)
	sess.running, sess.cancelRun, sess.runDone = true, func(error) {}, make(chan struct{})
	sess.activations++
	sess.loop = st
	s.setPhase(sess, phaseRunning)
	s.mu.Unlock()
	return sessionLoop{s: s, sess: sess}.atBoundary(ctx, BoundaryBeforeModelCall, st)
}
