package agent

import (
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/episode"
	"github.com/gymfleet/gymfleet/pkg/rollout"
)

// SessionBoundary names the boundary a session's activation in progress
// last recorded ("" when none), so tests can wait for a specific one.
func SessionBoundary(s *Server, sessionID string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.sessions[sessionID]
	if !ok || !sess.running || sess.snap == nil {
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
		_, err := decodeSessionRecord(rec)
		return err
	}
	inner, err := decodeLegacyRecord(rec)
	if err != nil {
		return err
	}
	_, err = episode.NewTracker().Install([]ctlplane.Record{inner})
	return err
}
