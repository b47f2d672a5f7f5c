package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/episode"
	"github.com/gymfleet/gymfleet/pkg/infra/park"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/transport/sessioncookie"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Headers a resources server's seed reply carries when checkpointing is on.
const (
	// VerifyModeHeader announces whether /verify may be replayed ("replay")
	// or must be waited for ("wait", the default).
	VerifyModeHeader = "X-Ng-Checkpoint-Verify"
	// RestartHeader is "1" on a restart-only resources server: the run can
	// only start over after a crash.
	RestartHeader = "X-Ng-Checkpoint-Restart"
)

// The stages of a legacy /run, as the "next" of its boundaries.
const (
	stageSeed   = "seed"
	stageLoop   = "loop"
	stageVerify = "verify"
	stageReturn = "return"
)

// legacyProgress is where a legacy /run stands: the stage it runs next and
// what that stage needs.
type legacyProgress struct {
	next string
	rsid string
	// cookies are what the seed reply set, sent on every later call.
	cookies string
	verify  episode.Mode
	// loop is the state the loop continues from (nil: from the start).
	loop     *LoopState
	response codec.RawMessage
	result   codec.RawMessage
}

// legacyBoundary is a legacy /run's boundary as a checkpoint records it.
type legacyBoundary struct {
	Next               string `json:"next"`
	ResourcesSessionID string `json:"resources_session_id"`
	// ResourcesCookies is absent in records written before cookies were
	// carried, which restore as a session with none.
	ResourcesCookies string           `json:"resources_cookies,omitempty"`
	VerifyMode       string           `json:"verify_mode"`
	Loop             *loopSnapshot    `json:"loop,omitempty"`
	Response         codec.RawMessage `json:"response,omitempty"`
	Result           codec.RawMessage `json:"result,omitempty"`
}

// loopSnapshot encodes the loop state pinned at a boundary; it is built
// only when a checkpoint exports it.
type loopSnapshot struct{ build func() LoopState }

// MarshalJSON encodes the pinned loop state.
func (l *loopSnapshot) MarshalJSON() ([]byte, error) { return codec.Marshal(l.build()) }

// storedLegacyBoundary is a legacy boundary read back from a checkpoint.
type storedLegacyBoundary struct {
	Next               string           `json:"next"`
	ResourcesSessionID string           `json:"resources_session_id"`
	ResourcesCookies   string           `json:"resources_cookies"`
	VerifyMode         string           `json:"verify_mode"`
	Loop               codec.RawMessage `json:"loop,omitempty"`
	Response           codec.RawMessage `json:"response,omitempty"`
	Result             codec.RawMessage `json:"result,omitempty"`
}

// decodeLegacyBoundary checks a restored legacy boundary and returns the
// progress it continues from; nil (a run recorded before any boundary)
// starts over from the row.
func decodeLegacyBoundary(raw codec.RawMessage) (*legacyProgress, error) {
	if len(raw) == 0 || isNull(raw) {
		return nil, nil
	}
	var b storedLegacyBoundary
	if err := codec.UnmarshalStrict(raw, &b); err != nil {
		return nil, fmt.Errorf("boundary: %s", codec.DescribeError(err))
	}
	if !rollout.ValidID(b.ResourcesSessionID) {
		return nil, fmt.Errorf("boundary: resources_session_id %q is not a valid id", b.ResourcesSessionID)
	}
	if err := sessioncookie.Check(b.ResourcesCookies); err != nil {
		return nil, fmt.Errorf("boundary: resources_cookies: %w", err)
	}
	mode, err := episode.ParseMode(b.VerifyMode)
	if err != nil {
		return nil, fmt.Errorf("boundary: verify_mode: %w", err)
	}
	p := &legacyProgress{next: b.Next, rsid: b.ResourcesSessionID, cookies: b.ResourcesCookies, verify: mode}
	switch b.Next {
	case stageSeed:
	case stageLoop:
		if p.loop, err = decodeLoopState(b.Loop); err != nil {
			return nil, err
		}
	case stageVerify:
		if !isObject(b.Response) {
			return nil, errors.New("boundary: next verify needs the loop's response")
		}
		p.response = b.Response
	case stageReturn:
		if len(b.Result) == 0 || !codec.Valid(b.Result) {
			return nil, errors.New("boundary: next return needs the verify result")
		}
		p.result = b.Result
	default:
		return nil, fmt.Errorf("boundary: next %q is not a legacy /run stage", b.Next)
	}
	return p, nil
}

// resources is the resources session the run's calls carry.
func (p *legacyProgress) resources() resourcesRef {
	return resourcesRef{id: p.rsid, cookies: p.cookies}
}

// record records p as the run's boundary and parks there while a
// checkpoint is open.
func (p *legacyProgress) record(ctx context.Context, e *episode.Episode) error {
	if e == nil {
		return nil
	}
	b := legacyBoundary{Next: p.next, ResourcesSessionID: p.rsid, ResourcesCookies: p.cookies, VerifyMode: p.verify.String()}
	switch p.next {
	case stageLoop:
		// Not yet running: the state it continues from (none: the loop
		// starts afresh). The loop records its own boundaries from here.
		if p.loop != nil {
			b.Loop = &loopSnapshot{build: p.loop.Snapshot()}
		}
	case stageVerify:
		b.Response = p.response
	case stageReturn:
		b.Result = p.result
	}
	return e.Boundary(ctx, b)
}

// legacyHooks make the loop's boundaries the run's: each loop boundary is
// the run's boundary, and a model call is a replay step (the loop is at
// the boundary before it while it waits).
type legacyHooks struct {
	e *episode.Episode
	p *legacyProgress
}

func (h legacyHooks) atBoundary(ctx context.Context, _ Boundary, st *LoopState) error {
	return h.e.Boundary(ctx, legacyBoundary{
		Next: stageLoop, ResourcesSessionID: h.p.rsid, ResourcesCookies: h.p.cookies, VerifyMode: h.p.verify.String(),
		Loop: &loopSnapshot{build: st.Snapshot()},
	})
}

func (h legacyHooks) awaitModel(t *park.Task, ctx context.Context, a *activation, done func(*openai.Response, error)) {
	leave := h.e.Enter(episode.Replay)
	a.callModel(t, ctx, func(resp *openai.Response, err error) {
		leave()
		done(resp, err)
	})
}

// handleRun is NeMo Gym's legacy /run: seed a fresh resources session, run
// the loop on the row's responses_create_params, verify, and always close
// the resources session. The reply is /verify's. With checkpointing on the
// run is an episode whose stages record boundaries, and a replacement
// attempt restored from a checkpoint continues from its boundary.
func (s *Server) handleRun(r *http.Request) (any, error) {
	body, err := httpserver.ReadBody(r)
	if err != nil {
		return nil, err
	}
	row, err := decodeRow(body)
	if err != nil {
		return nil, err
	}
	ep, ok := rollout.FromContext(r.Context())
	if !ok {
		if ep, err = episodeOfRow(row); err != nil {
			return nil, err
		}
	}
	params, err := decodeParams(row[rollout.FieldParams])
	if err != nil {
		return nil, err
	}
	if err := s.hooks.admitRun(ep); err != nil {
		return nil, err
	}
	ctx := rollout.WithEpisode(r.Context(), ep)
	s.metrics.inFlight.Inc()
	defer s.metrics.inFlight.Dec()
	return s.hooks.runLegacy(ctx, ep, row, body, params)
}

func newLegacyProgress() *legacyProgress {
	return &legacyProgress{next: stageSeed, rsid: NewResourcesSessionID(), verify: episode.Wait}
}

// runLegacy runs a legacy /run's stages from p, its loop with loop hooks
// lh. e is nil with checkpointing off (a nil Episode records nothing).
func (s *Server) runLegacy(ctx context.Context, e *episode.Episode, lh loopHooks, ep rollout.EpisodeID, row map[string]codec.RawMessage, body []byte, params *openai.ResponsesRequest, p *legacyProgress) (any, error) {
	resources := baseURL(s.cfg.resourcesURL(ep.RolloutID))
	defer func() {
		// A retire no longer cancels the run from here on: its reply must
		// mean the resources session is closed.
		e.Finishing()
		s.closeResourcesSession(ctx, ep, p.resources())
	}()
	for {
		if err := p.record(ctx, e); err != nil {
			return nil, err
		}
		switch p.next {
		case stageSeed:
			restart := false
			err := e.Step(ctx, episode.Replay, func(ctx context.Context) error {
				rep, err := httpclient.Do(ctx, s.client, http.MethodPost, resources+rollout.Path(ep, "/seed_session"), p.resources().header(), body)
				if err == nil {
					err = rep.Err("seed_session")
				}
				if err != nil {
					return upstream(ctx, "resources server /seed_session", err)
				}
				// A NeMo Gym resources server names the session by the
				// cookie it sets, and reads nothing else.
				if p.cookies, err = sessioncookie.FromSetCookie(rep.Header); err != nil {
					return apierror.New(apierror.UpstreamError, "resources server /seed_session: %v", err)
				}
				p.verify = verifyModeOf(rep.Header.Get(VerifyModeHeader))
				restart = strings.TrimSpace(rep.Header.Get(RestartHeader)) == "1"
				return nil
			})
			if err != nil {
				return nil, err
			}
			p.next = stageLoop
			if restart {
				// MarkRestart waits for admission to reopen; waiting parked
				// at the boundary after the seed keeps a prepare from
				// waiting on this run meanwhile.
				if err := p.record(ctx, e); err != nil {
					return nil, err
				}
				if err := e.MarkRestart(ctx); err != nil {
					return nil, err
				}
			}
		case stageLoop:
			act := s.newActivation(ep, p.resources(), params, p.loop)
			act.hooks = lh
			resp, err := s.runActivation(ctx, act)
			if err != nil {
				return nil, err
			}
			if p.response, err = codec.Marshal(resp); err != nil {
				return nil, apierror.Wrap(apierror.Internal, err)
			}
			p.next, p.loop = stageVerify, nil
		case stageVerify:
			row[openaiResponseField] = p.response
			err := e.Step(ctx, p.verify, func(ctx context.Context) error {
				rep, err := httpclient.Do(ctx, s.client, http.MethodPost, resources+rollout.Path(ep, "/verify"), p.resources().header(), row)
				if err == nil {
					err = rep.Err("verify")
				}
				if err != nil {
					return upstream(ctx, "resources server /verify", err)
				}
				p.result = codec.RawMessage(strings.TrimRight(string(rep.Body), "\r\n"))
				return nil
			})
			if err != nil {
				return nil, err
			}
			p.next, p.response = stageReturn, nil
		case stageReturn:
			// Recorded (and parked at, while a checkpoint is open) above: a
			// run that finished during a prepare replies after the resume,
			// and its record says next: return.
			return withEpisodeID(p.result, ep)
		default:
			return nil, apierror.New(apierror.Internal, "legacy /run at unknown stage %q", p.next)
		}
	}
}

// withEpisodeID adds episode_id to /verify's reply, as the environment's
// /run does: a caller whose row named no rollout learns the id it ran under.
func withEpisodeID(result codec.RawMessage, ep rollout.EpisodeID) (codec.RawMessage, error) {
	var obj map[string]codec.RawMessage
	if err := codec.Unmarshal(result, &obj); err != nil || obj == nil {
		return nil, apierror.New(apierror.UpstreamError, "resources server /verify answered a body that is not a JSON object")
	}
	id, err := codec.Marshal(ep)
	if err != nil {
		return nil, apierror.Wrap(apierror.Internal, err)
	}
	obj["episode_id"] = id
	out, err := codec.Marshal(obj)
	if err != nil {
		return nil, apierror.Wrap(apierror.Internal, err)
	}
	return out, nil
}

// verifyModeOf reads X-Ng-Checkpoint-Verify: replay only when announced.
func verifyModeOf(v string) episode.Mode {
	if m, err := episode.ParseMode(strings.ToLower(strings.TrimSpace(v))); err == nil {
		return m
	}
	return episode.Wait
}

// legacyTaskDigest is the task a legacy /run row carries: the row without
// the fields naming its rollout and attempt (the replacement attempt's row
// differs there), in canonical JSON.
func legacyTaskDigest(body []byte) (string, error) {
	var task map[string]any
	if err := codec.Unmarshal(body, &task); err != nil {
		return "", err
	}
	for _, f := range []string{rollout.FieldRolloutID, rollout.FieldAttemptIndex, rollout.FieldTaskIndex, rollout.FieldRolloutIndex} {
		delete(task, f)
	}
	// _rowidx stays in the task: NeMo RL's rows of one prompt differ only
	// there, and a replacement row carries its original _rowidx.
	return episode.TaskDigest(task)
}
