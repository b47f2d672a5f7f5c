package environment

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/infra/park"
	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/sessioncookie"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/replica"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Headers of the single_agent_turn wire contract (docs/WIRE.md).
const (
	HeaderSessionID        = "X-Ng-Session-Id"
	HeaderAgentSession     = "X-Ng-Agent-Session"
	HeaderActivation       = "X-Ng-Activation"
	HeaderCheckpointVerify = "X-Ng-Checkpoint-Verify"
	// HeaderCheckpointRestart on a seed reply says the resources server can
	// only restart this session (restart_only).
	HeaderCheckpointRestart = "X-Ng-Checkpoint-Restart"
)

// stageMode is each stage's declared mode (protocol.md §4.4). Seeding and the
// agent activation are safe to replay (seeds are idempotent under
// caller-assigned ids; the agent continues from its own boundaries); closing
// the agent returns the observations exactly once, so it is waited for;
// verification runs in whatever mode the resources server announced.
func stageMode(b *Boundary) Mode {
	switch b.Next {
	case StageSeed, StageInvokeAgent:
		return ModeReplay
	case StageVerify:
		return b.Handles.ResourcesVerify
	default:
		return ModeWait
	}
}

// runSingleAgentTurn runs the stages from b until the return stage and
// calls done with the /run reply. Final cleanup is the caller's. The
// agent's activation is awaited parked (pkg/infra/park): an episode waiting
// for its agent holds no goroutine.
func (s *Server) runSingleAgentTurn(t *park.Task, ctx context.Context, ep *episode, b *Boundary, done func(codec.RawMessage, error)) {
	s.bindAgentReplica(ep, b)
	s.registerCleanup(ep, b)
	if err := ep.recordBoundary(ctx, b); err != nil {
		done(nil, err)
		return
	}
	s.advance(t, ctx, ep, b, done)
}

// advance runs the stages from b, each awaited parked, recording the
// boundary after each, up to the return stage.
func (s *Server) advance(t *park.Task, ctx context.Context, ep *episode, b *Boundary, done func(codec.RawMessage, error)) {
	if b.Next == StageReturn {
		done(episodeReply(b.Result, ep.id, observationsOf(b.Observations)))
		return
	}
	s.runStage(t, ctx, ep, b, func(next *Boundary, err error) {
		if err == nil {
			err = ep.recordBoundary(ctx, next)
		}
		if err != nil {
			done(nil, err)
			return
		}
		s.advance(t, ctx, ep, next, done)
	})
}

// runStage runs the stage b names, in its mode, timing it, parked while
// its calls are awaited; done gets the boundary after it.
func (s *Server) runStage(t *park.Task, ctx context.Context, ep *episode, b *Boundary, done func(*Boundary, error)) {
	fn := s.stageFunc(b.Next)
	if fn == nil {
		done(nil, apierror.New(apierror.Internal, "boundary names unknown stage %q", b.Next))
		return
	}
	timer := s.metrics.stageTimer(b.Next)
	ctx, span := s.startStageSpan(ctx, ep, b.Next)
	leave := ep.tracked.Enter(modeOf(stageMode(b)))
	fn(t, ctx, ep, b, func(out *Boundary, err error) {
		leave()
		if err != nil {
			tracing.Fail(span, err)
			out, err = nil, &stageError{stage: b.Next, err: err}
		}
		span.End()
		timer()
		done(out, err)
	})
}

// stageRun runs one stage, parked while its calls are awaited, and calls
// done with the boundary after it.
type stageRun func(t *park.Task, ctx context.Context, ep *episode, b *Boundary, done func(*Boundary, error))

// stageFunc is what runs a stage; nil for an unknown one.
func (s *Server) stageFunc(st Stage) stageRun {
	switch st {
	case StageSeed:
		return s.seed
	case StageInvokeAgent:
		return s.invokeAgent
	case StageCloseAgent:
		return s.closeAgent
	case StageVerify:
		return s.verify
	}
	return nil
}

// startStageSpan starts a stage's span.
func (s *Server) startStageSpan(ctx context.Context, ep *episode, st Stage) (context.Context, trace.Span) {
	ctx, span := s.tracer.Start(ctx, stageSpanName(st))
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrCaptureKey.String(ep.id.CaptureKey()))
	}
	return ctx, span
}

// stageSpanName is the span of a stage: gym.env.<stage>, spelled out so
// that nothing is built per episode when tracing is off.
func stageSpanName(st Stage) string {
	switch st {
	case StageSeed:
		return "gym.env.seed"
	case StageInvokeAgent:
		return "gym.env.invoke_agent"
	case StageCloseAgent:
		return "gym.env.close_agent"
	case StageVerify:
		return "gym.env.verify"
	}
	return "gym.env.stage"
}

// bindAgentReplica settles which agent replica the episode talks to: the
// one its boundary records (through the restore's aliases when that replica
// is gone), else the one picked for its rollout, which the boundary then
// records. A restored boundary is rewritten to the live replica, so the next
// checkpoint names one that exists.
func (s *Server) bindAgentReplica(ep *episode, b *Boundary) {
	if len(ep.agent.Replicas) < 2 {
		return
	}
	owner := b.Handles.AgentInstance
	if owner == "" && b.Next != StageSeed {
		// Recorded by a fleet with a single agent, which keeps the bare
		// name: the family's name is that instance's.
		owner = replica.Family(ep.agent.Replicas[0].Name)
	}
	if owner != "" {
		s.mu.Lock()
		aliases := s.aliases
		s.mu.Unlock()
		urls := map[string]string{}
		for _, r := range ep.agent.Replicas {
			urls[r.Name] = r.URL
		}
		live := replica.Resolve(owner, func(n string) bool { return urls[n] != "" }, aliases)
		if live != "" {
			ep.agentName, ep.agentURL = live, urls[live]
		} else {
			ep.log.Warn("the agent replica of a restored episode is unknown here; picking one", "capture_key", ep.id.CaptureKey(), "agent_instance", owner)
		}
	}
	b.Handles.AgentInstance = ep.agentName
}

// setAliases keeps a restore's alias table for bindAgentReplica.
func (s *Server) setAliases(aliases map[string]string) {
	s.mu.Lock()
	s.aliases = aliases
	s.mu.Unlock()
}

// registerCleanup registers the episode's final cleanup before any stage
// runs, so that a lost seed reply cannot hide the caller-assigned session
// ids. An episode that starts past seed (a restored boundary) has its agent
// session open already, and closed already once past close_agent.
func (s *Server) registerCleanup(ep *episode, b *Boundary) {
	switch b.Next {
	case StageInvokeAgent, StageCloseAgent:
		ep.setAgentOpened()
	case StageVerify, StageReturn:
		ep.setAgentOpened()
		ep.setAgentClosed()
	}
	h := b.Handles
	ep.setResourcesCookies(h.ResourcesCookies)
	ep.cleanup.push("close resources session", func(ctx context.Context, done func(error)) {
		h := h
		h.ResourcesCookies = ep.resourcesCookiesNow()
		s.closeResources(ctx, ep, h, done)
	})
	ep.cleanup.push("close agent session", func(ctx context.Context, done func(error)) {
		if !ep.agentNeedsClose() {
			done(nil)
			return
		}
		s.call(ctx, "agent", ep.agentURL, ep.id, "/v1/agent_sessions/close", nil, agentSessionRef{SessionID: h.AgentSessionID}, func(_ *httpclient.Reply, err error) {
			done(err)
		})
	})
}

// seed seeds the resources session, reading the verify mode the resources
// server announces, and opens the agent session bound to it.
func (s *Server) seed(t *park.Task, ctx context.Context, ep *episode, b *Boundary, done func(*Boundary, error)) {
	h := b.Handles
	s.await(t, func(then func(*httpclient.Reply, error)) {
		s.call(ctx, "resources", ep.resourcesURL, ep.id, "/seed_session", resourcesHeader(h), ep.req.Row, then)
	}, func(rep *httpclient.Reply, err error) {
		if err == nil {
			err = s.afterSeed(ctx, ep, &h, rep)
		}
		if err != nil {
			done(nil, err)
			return
		}
		ep.setAgentOpened()
		open := openAgentSession{
			SessionID:          h.AgentSessionID,
			ResourcesSessionID: h.ResourcesSessionID,
			ResourcesCookies:   h.ResourcesCookies,
			Request:            ep.req.Row,
		}
		s.await(t, func(then func(*httpclient.Reply, error)) {
			s.call(ctx, "agent", ep.agentURL, ep.id, "/v1/agent_sessions", nil, open, then)
		}, func(_ *httpclient.Reply, err error) {
			if err != nil {
				done(nil, err)
				return
			}
			done(&Boundary{Next: StageInvokeAgent, Handles: h}, nil)
		})
	})
}

// afterSeed reads the seed reply into the handles: the session's cookies
// and verify mode, and whether it can only restart.
func (s *Server) afterSeed(ctx context.Context, ep *episode, h *Handles, rep *httpclient.Reply) error {
	// A NeMo Gym resources server names the session by the cookie it sets,
	// and reads nothing else; the agent's tool calls and the verify carry it.
	cookies, err := sessioncookie.FromSetCookie(rep.Header)
	if err != nil {
		return apierror.New(apierror.UpstreamError, "resources /seed_session: %v", err)
	}
	if cookies != "" {
		h.ResourcesCookies = cookies
		ep.setResourcesCookies(cookies)
	}
	h.ResourcesVerify = verifyMode(rep.Header.Get(HeaderCheckpointVerify))
	if rep.Header.Get(HeaderCheckpointRestart) == "1" {
		// The resources server cannot capture this session: the episode
		// never blocks or is exported, and starts over after a crash.
		if err := ep.tracked.MarkRestart(ctx); err != nil {
			return err
		}
	}
	return nil
}

// await makes a parked call: call starts it, with a function for its
// outcome, and then runs as the task's next step with that outcome.
func (s *Server) await(t *park.Task, call func(then func(*httpclient.Reply, error)), then func(*httpclient.Reply, error)) {
	w := t.Hold()
	call(func(rep *httpclient.Reply, err error) {
		w.ResumeHere(func() { then(rep, err) })
	})
}

// invokeAgent runs activation 1 of the agent session on the row's
// responses_create_params, parked until the agent replies.
func (s *Server) invokeAgent(t *park.Task, ctx context.Context, ep *episode, b *Boundary, done func(*Boundary, error)) {
	s.await(t, func(then func(*httpclient.Reply, error)) {
		s.call(ctx, "agent", ep.agentURL, ep.id, "/v1/responses", agentCallHeader(b.Handles.AgentSessionID), ep.req.Params, then)
	}, func(rep *httpclient.Reply, err error) {
		if err != nil {
			done(nil, err)
			return
		}
		done(afterAgent(b, rep.Body))
	})
}

// afterAgent is the boundary after the agent's reply body.
func afterAgent(b *Boundary, body []byte) (*Boundary, error) {
	if !isObject(body) {
		return nil, apierror.New(apierror.UpstreamError, "agent /v1/responses answered a body that is not a JSON object")
	}
	return &Boundary{Next: StageCloseAgent, Handles: b.Handles, Response: body}, nil
}

// agentCallHeader names the agent session and its first activation.
func agentCallHeader(sessionID string) http.Header {
	return http.Header{HeaderAgentSession: {sessionID}, HeaderActivation: {"1"}}
}

// closeAgent closes the agent session and keeps its observations.
func (s *Server) closeAgent(t *park.Task, ctx context.Context, ep *episode, b *Boundary, done func(*Boundary, error)) {
	s.await(t, func(then func(*httpclient.Reply, error)) {
		s.call(ctx, "agent", ep.agentURL, ep.id, "/v1/agent_sessions/close", nil, agentSessionRef{SessionID: b.Handles.AgentSessionID}, then)
	}, func(rep *httpclient.Reply, err error) {
		if err != nil {
			done(nil, err)
			return
		}
		ep.setAgentClosed()
		obs := rep.Body
		if !codec.Valid(obs) {
			obs = nil
		}
		done(&Boundary{Next: StageVerify, Handles: b.Handles, Response: b.Response, Observations: obs}, nil)
	})
}

// verify asks the resources server for the reward: the row plus the agent's
// response.
func (s *Server) verify(t *park.Task, ctx context.Context, ep *episode, b *Boundary, done func(*Boundary, error)) {
	s.await(t, func(then func(*httpclient.Reply, error)) {
		s.call(ctx, "resources", ep.resourcesURL, ep.id, "/verify", resourcesHeader(b.Handles), ep.req.Row.with("response", b.Response), then)
	}, func(rep *httpclient.Reply, err error) {
		if err != nil {
			done(nil, err)
			return
		}
		if !isObject(rep.Body) {
			done(nil, apierror.New(apierror.UpstreamError, "resources /verify answered a body that is not a JSON object"))
			return
		}
		done(&Boundary{Next: StageReturn, Handles: b.Handles, Observations: b.Observations, Result: rep.Body}, nil)
	})
}

// closeResourcesSession is the body of /close_session: NeMo Gym 0.7.0's
// ResourcesCloseSessionRequest (nemo_gym/base_resources_server.py), which
// its resources servers require (422 for {}): the session the seed named
// and the episode it belongs to.
type closeResourcesSession struct {
	ResourcesSessionID string            `json:"resources_session_id"`
	EpisodeID          rollout.EpisodeID `json:"episode_id"`
}

func (s *Server) closeResources(ctx context.Context, ep *episode, h Handles, done func(error)) {
	s.call(ctx, "resources", ep.resourcesURL, ep.id, "/close_session", resourcesHeader(h),
		closeResourcesSession{ResourcesSessionID: h.ResourcesSessionID, EpisodeID: ep.id}, func(_ *httpclient.Reply, err error) {
			var up *upstreamError
			if errors.As(err, &up) && up.status == http.StatusNotFound {
				// A NeMo Gym resources server before 0.7.0 has no
				// /close_session (its sessions are never closed): nothing is
				// left to close.
				err = nil
			}
			done(err)
		})
}

// resourcesHeader names the resources session of h on a call: our header,
// and the cookies its seed reply set.
func resourcesHeader(h Handles) http.Header {
	return sessioncookie.Header(http.Header{HeaderSessionID: {h.ResourcesSessionID}}, h.ResourcesCookies)
}

// verifyMode reads X-Ng-Checkpoint-Verify: replay only when announced.
func verifyMode(v string) Mode {
	if strings.EqualFold(strings.TrimSpace(v), string(ModeReplay)) {
		return ModeReplay
	}
	return ModeWait
}

type openAgentSession struct {
	SessionID          string `json:"session_id"`
	ResourcesSessionID string `json:"resources_session_id"`
	ResourcesCookies   string `json:"resources_cookies,omitempty"`
	Request            Row    `json:"request"`
}

type agentSessionRef struct {
	SessionID string `json:"session_id"`
}

// call POSTs body to base + /ng-rollout/<capture_key> + path and calls done
// with the 2xx reply; any other outcome is an upstream error naming the
// server. No goroutine waits for the reply (httpclient.Start): done may
// run on another goroutine, or before call returns.
func (s *Server) call(ctx context.Context, kind, base string, id rollout.EpisodeID, path string, header http.Header, body any, done func(*httpclient.Reply, error)) {
	s.start(ctx, kind, base, rollout.Path(id, path), header, body, done)
}

// start POSTs body to base + path and calls done as call does.
func (s *Server) start(ctx context.Context, kind, base, path string, header http.Header, body any, done func(*httpclient.Reply, error)) {
	url := base + path
	httpclient.Start(ctx, s.client, http.MethodPost, url, header, body, func(rep *httpclient.Reply, err error) {
		done(checkReply(kind, url, rep, err))
	})
}

// checkReply is the 2xx reply of a POST to url, or its failure naming the
// server.
func checkReply(kind, url string, rep *httpclient.Reply, err error) (*httpclient.Reply, error) {
	if err != nil {
		return nil, fmt.Errorf("%s POST %s: %w", kind, url, err)
	}
	if err := rep.Err(kind + " POST " + url); err != nil {
		return nil, &upstreamError{kind: kind, url: url, status: rep.Status, err: err}
	}
	return rep, nil
}

// upstreamError is a non-2xx reply of a server an episode called.
type upstreamError struct {
	kind   string
	url    string
	status int
	err    error
}

func (e *upstreamError) Error() string {
	return fmt.Sprintf("%s POST %s answered %d: %v", e.kind, e.url, e.status, e.err)
}

func (e *upstreamError) Unwrap() error { return e.err }

// stageError is a stage's failure, naming the stage.
type stageError struct {
	stage Stage
	err   error
}

func (e *stageError) Error() string { return fmt.Sprintf("stage %s: %v", e.stage, e.err) }
func (e *stageError) Unwrap() error { return e.err }

// episodeReply is the /run reply: the JSON object result with "episode_id"
// set and, when result lacks one and observations is not empty,
// "observations" (the agent's summary of the episode: model calls, tool
// calls, usage), so a collector can report them.
func episodeReply(result codec.RawMessage, id rollout.EpisodeID, observations codec.RawMessage) (codec.RawMessage, error) {
	var obj map[string]codec.RawMessage
	if err := codec.Unmarshal(result, &obj); err != nil || obj == nil {
		return nil, apierror.New(apierror.UpstreamError, "reply to return is not a JSON object")
	}
	eid, err := codec.Marshal(id)
	if err != nil {
		return nil, err
	}
	obj["episode_id"] = eid
	if _, has := obj["observations"]; !has && len(observations) > 0 && !isNull(observations) {
		obj["observations"] = observations
	}
	return codec.Marshal(obj)
}

// observationsOf picks the observations out of the agent's close reply
// ({"session_id","closed","observations":{...}}); a reply without that field
// is taken whole.
func observationsOf(closeReply codec.RawMessage) codec.RawMessage {
	if !isObject(closeReply) {
		return nil
	}
	var r struct {
		Observations codec.RawMessage `json:"observations"`
	}
	if err := codec.Unmarshal(closeReply, &r); err == nil && r.Observations != nil {
		return r.Observations
	}
	return closeReply
}
