package fakeinference

import (
	"net/http"
	"strings"
	"time"

	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

func (s *Server) handleHold(r *http.Request) (any, error) {
	var req HoldRequest
	if err := httpserver.DecodeJSONStrict(r, &req); err != nil {
		return nil, err
	}
	if (req.AfterCalls == nil) == (req.AfterCallsPerRollout == nil) {
		return nil, apierror.New(apierror.InvalidRequest, "send exactly one of after_calls and after_calls_per_rollout")
	}
	for _, n := range []*int{req.AfterCalls, req.AfterCallsPerRollout} {
		if n != nil && *n < 0 {
			return nil, apierror.New(apierror.InvalidRequest, "the hold threshold must be >= 0, got %d", *n)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// The held calls stay in s.waiters: only the threshold changes.
	s.hold = &req
	s.log.InfoContext(r.Context(), "hold placed", "after_calls", req.AfterCalls, "after_calls_per_rollout", req.AfterCallsPerRollout, "held", s.counts.Held)
	return HoldReply{Hold: req, Held: s.counts.Held}, nil
}

func (s *Server) handleRelease(r *http.Request) (any, error) {
	body, err := httpserver.ReadBody(r)
	if err != nil {
		return nil, err
	}
	var req ReleaseRequest
	if len(strings.TrimSpace(string(body))) > 0 {
		if err := codec.UnmarshalStrict(body, &req); err != nil {
			return nil, apierror.New(apierror.InvalidRequest, "%s", codec.DescribeError(err)).WithStatus(http.StatusUnprocessableEntity)
		}
		if req.Calls != nil && *req.Calls < 1 {
			return nil, apierror.New(apierror.InvalidRequest, "calls must be >= 1, got %d", *req.Calls)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := 0
	if req.Calls != nil {
		k = *req.Calls
	} else {
		s.hold = nil
	}
	n := s.releaseLocked(k)
	s.log.InfoContext(r.Context(), "held calls released", "released", n, "hold_kept", s.hold != nil)
	return ReleaseReply{Released: n}, nil
}

func (s *Server) handleCallCount(*http.Request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts, nil
}

func (s *Server) handleCalls(*http.Request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	out := CallsReply{Calls: make([]CallInfo, len(s.calls))}
	for i, c := range s.calls {
		out.Calls[i] = c.info(now)
	}
	return out, nil
}

func (s *Server) handleScript(r *http.Request) (any, error) {
	var sc Script
	if err := httpserver.DecodeJSONStrict(r, &sc); err != nil {
		return nil, err
	}
	if err := sc.Normalize(); err != nil {
		return nil, apierror.New(apierror.InvalidRequest, "%v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script = nil
	if !sc.IsZero() {
		s.script = &sc
	}
	return ScriptReply{Script: s.script}, nil
}

func (s *Server) handleGetScript(*http.Request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ScriptReply{Script: s.script}, nil
}

func (s *Server) handleCuts(*http.Request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := CutsReply{Rounds: make([][]string, len(s.cuts))}
	for i, round := range s.cuts {
		out.Rounds[i] = append([]string{}, round...)
	}
	return out, nil
}

func (s *Server) handleReset(r *http.Request) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.counts.Held > 0 || s.counts.InFlight > 0 {
		return nil, apierror.New(apierror.InvalidPhase, "cannot reset while %d calls are held and %d generating: release them and let them finish first", s.counts.Held, s.counts.InFlight)
	}
	s.resetLocked()
	s.log.InfoContext(r.Context(), "fake inference reset")
	return ResetReply{Reset: true}, nil
}
