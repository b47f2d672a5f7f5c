package modelproxy

import (
	"errors"
	"net/http"
	"net/url"

	"github.com/go-chi/chi/v5"

	"github.com/gymfleet/gymfleet/pkg/tokencapture"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Manifest is a capture key's ledger as GET /capture/rollouts/{key}/manifest
// returns it (the reference's manifest shape, rollout_id being the capture key).
type Manifest struct {
	RolloutID string                 `json:"rollout_id"`
	Records   []tokencapture.Row     `json:"records"`
	Failures  []tokencapture.Failure `json:"failures"`
}

// RemoveRequest is the body of POST /capture/rollouts/retire and /delete.
type RemoveRequest struct {
	RolloutIDs []string `json:"rollout_ids"`
}

// RemoveReply is their reply.
type RemoveReply struct {
	Removed []string `json:"removed"`
	Absent  []string `json:"absent"`
}

// MaxRemoveIDs bounds the ids of one retire or delete call.
const MaxRemoveIDs = 4096

// requireControlToken guards the ledger routes with capture.control_auth_token.
func (s *Server) requireControlToken(next http.Handler) http.Handler {
	want := s.cfg.Capture.ControlAuthToken
	if want == "" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !httpserver.BearerMatches(r, want) {
			apierror.Write(w, r, s.log, apierror.New(apierror.Unauthorized, "missing or invalid control-plane bearer token"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// handleManifest answers a capture key's rows and failures: 410 for a
// retired key ("gone, not empty": an empty manifest would read as a rollout
// that made no calls), 400 for an invalid key.
func (s *Server) handleManifest(r *http.Request) (any, error) {
	key, err := url.PathUnescape(chi.URLParam(r, "capture_key"))
	if err != nil || !rollout.ValidCaptureKey(key) {
		return nil, apierror.New(apierror.InvalidRequest, "capture key %q is not a rollout id or <rollout id>-a<N>", key)
	}
	rows, err := s.ledger.Rows(key)
	if err == nil {
		var failures []tokencapture.Failure
		if failures, err = s.ledger.Failures(key); err == nil {
			m := Manifest{RolloutID: key, Records: rows, Failures: failures}
			if m.Records == nil {
				m.Records = []tokencapture.Row{}
			}
			if m.Failures == nil {
				m.Failures = []tokencapture.Failure{}
			}
			return m, nil
		}
	}
	if errors.Is(err, tokencapture.ErrRetired) {
		return nil, apierror.New(apierror.Gone, "the ledger of %s was retired", key)
	}
	return nil, apierror.Wrap(apierror.Internal, err)
}

func (s *Server) handleRetire(r *http.Request) (any, error) {
	if err := s.hooks.refuseRemoval(); err != nil {
		return nil, err
	}
	return s.remove(r, s.ledger.Retire)
}

func (s *Server) handleDelete(r *http.Request) (any, error) {
	if err := s.hooks.refuseRemoval(); err != nil {
		return nil, err
	}
	return s.remove(r, s.ledger.Delete)
}

// remove runs retire or delete: 422 for an unknown field or an empty or
// oversized list, 400 (and nothing changed) if any id is invalid.
func (s *Server) remove(r *http.Request, op func([]string) ([]string, []string, error)) (any, error) {
	var req RemoveRequest
	if err := httpserver.DecodeJSONStrict(r, &req); err != nil {
		return nil, err
	}
	if len(req.RolloutIDs) == 0 || len(req.RolloutIDs) > MaxRemoveIDs {
		return nil, apierror.New(apierror.InvalidRequest, "rollout_ids must hold 1 to %d capture keys, got %d", MaxRemoveIDs, len(req.RolloutIDs)).WithStatus(http.StatusUnprocessableEntity)
	}
	for _, id := range req.RolloutIDs {
		if !rollout.ValidCaptureKey(id) {
			return nil, apierror.New(apierror.InvalidRequest, "capture key %q is not a rollout id or <rollout id>-a<N>; nothing was removed", id)
		}
	}
	s.picker.forget(req.RolloutIDs)
	removed, absent, err := op(req.RolloutIDs)
	if err != nil {
		return nil, apierror.Wrap(apierror.Internal, err)
	}
	return RemoveReply{Removed: removed, Absent: absent}, nil
}
