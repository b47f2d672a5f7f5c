// Package agent implements the Simple Agent: sessions bound to a rollout
// attempt, activations that each run the turn loop (call the policy model,
// run its function calls against the resources server, repeat), and the
// legacy /run that seeds, loops and verifies in one call.
package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/episode"
	"github.com/gymfleet/gymfleet/pkg/infra/logging"
	"github.com/gymfleet/gymfleet/pkg/infra/park"
	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/transport/sessioncookie"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
	"github.com/gymfleet/gymfleet/pkg/wire/rewardprofile"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Headers of the agent API.
const (
	// SessionHeader names the agent session of an activation.
	SessionHeader = "X-Ng-Agent-Session"
	// ActivationHeader is an activation's index: 1, 2, ...
	ActivationHeader = "X-Ng-Activation"
	// ResourcesSessionHeader names the resources session tool calls run in.
	ResourcesSessionHeader = "X-Ng-Session-Id"
)

// CleanupTimeout bounds closing the resources session after a legacy /run,
// which runs even when the /run's own request has ended.
const CleanupTimeout = 10 * time.Second

// Deps are an agent's collaborators; nil fields get working defaults.
type Deps struct {
	Logger   *slog.Logger
	Registry *prometheus.Registry
	// Tracer records the server's spans (pkg/infra/tracing); nil records none.
	Tracer trace.TracerProvider
	// Client calls the model and resources servers; nil means
	// httpclient.New(httpclient.Options{Protocol: httpclient.ProtocolAuto}):
	// h2c to ours, HTTP/1.1 to NeMo Gym's.
	Client *http.Client
	// Tuning is the process's runtime steering, told where checkpoints
	// stand (ctlplane.Tuning; a *runtimetune.Tuner); nil leaves the
	// runtime alone.
	Tuning ctlplane.Tuning
}

// Server is one named Simple Agent.
type Server struct {
	*httpserver.Server
	cfg    Config
	log    *slog.Logger
	client *http.Client
	// ownClient is set when New made client, so Close closes its connections.
	ownClient bool
	router    http.Handler
	metrics   *metrics
	tracer    tracing.Tracer

	mu       sync.Mutex
	sessions map[string]*session
	// byRollout indexes sessions by rollout, so retiring one rollout never
	// scans every session.
	byRollout map[string][]*session
	// closed orders closed sessions by close time, for forgetClosedLocked.
	closed closedSessions

	// hooks are where requests meet checkpointing: noHooks with it off,
	// else the participant (hooks.go).
	hooks agentHooks
	// Checkpointing (nil when it is off; only construction, the
	// participant and tests read them): the participant's state (guarded
	// by mu), the control plane, and the tracker of legacy /run episodes.
	ckpt *ckptState
	ctl  *ctlplane.Controller
	runs *episode.Tracker
}

// session is one agent session. Server.mu guards every field.
type session struct {
	id                 string
	episode            rollout.EpisodeID
	resourcesSessionID string
	// resourcesCookies are the cookies the resources session's seed reply
	// set (a Cookie header value), sent on every tool call.
	resourcesCookies string
	// request is the dataset row the session was opened with (may be empty).
	request codec.RawMessage
	// activations counts activations started, failed ones included.
	activations         int
	completedActivation int
	// completedReply is the reply of completedActivation, byte for byte.
	completedReply codec.RawMessage
	// observations sums the completed activations.
	observations Observations
	closed       bool
	// loop is the running (or last) activation's loop state. Only the
	// goroutine running the activation touches it while running is set.
	loop    *LoopState
	running bool
	// cancelRun and runDone belong to the running activation: a close
	// cancels it and waits for it to stop.
	cancelRun context.CancelCauseFunc
	runDone   chan struct{}

	// Checkpoint state, used only when checkpointing is on.
	phase sessionPhase
	// blocks is whether the session counts in ckptState.blocking.
	blocks bool
	// retired is set by a retire; the session is freed once its activation
	// has stopped.
	retired bool
	// boundary is the running activation's loop state at its last
	// boundary, encoded as a record holds it (encodeBoundary); nil when no
	// activation is in progress. boundaryErr is why it could not be.
	boundary    codec.RawMessage
	boundaryErr error
	// at is the boundary it was taken at.
	at Boundary
	// restoredLoop is the loop state a restored session's activation in
	// progress continues from when the environment re-invokes it, as the
	// checkpoint holds it: decoded by that activation, not by Install.
	restoredLoop *restoredLoop
	// restored is set on a session installed from a checkpoint until a
	// request touches it: a commit whose scope leaves it out deletes it.
	restored bool
}

// Observations summarise a session's completed activations; close returns them.
type Observations struct {
	Activations        int                   `json:"activations"`
	Steps              int                   `json:"steps"`
	ModelCalls         int                   `json:"model_calls"`
	ToolCalls          int                   `json:"tool_calls"`
	Usage              *openai.ResponseUsage `json:"usage"`
	ResourcesSessionID string                `json:"resources_session_id"`
}

// add folds one completed activation's loop state into the observations.
func (o *Observations) add(st *LoopState) {
	o.Activations++
	o.Steps += st.Step
	o.ModelCalls += st.ModelCalls
	o.ToolCalls += len(st.ToolRecords)
	if st.Usage != nil {
		if o.Usage == nil {
			u := *st.Usage
			o.Usage = &u
		} else {
			o.Usage.Add(st.Usage)
		}
	}
}

// New builds an agent from cfg; call Listen and Serve to run it.
func New(cfg Config, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Logger == nil {
		deps.Logger = logging.Discard()
	}
	if deps.Registry == nil {
		deps.Registry = prometheus.NewRegistry()
	}
	ownClient := deps.Client == nil
	if ownClient {
		deps.Client = httpclient.New(httpclient.Options{Protocol: httpclient.ProtocolAuto, HTTP: cfg.HTTP})
	}
	s := &Server{
		ownClient: ownClient,
		cfg:       cfg,
		log:       deps.Logger,
		client:    deps.Client,
		metrics:   newMetrics(deps.Registry),
		tracer:    tracing.NewTracer(deps.Tracer),
		sessions:  map[string]*session{},
		byRollout: map[string][]*session{},
	}
	s.hooks = noHooks{s}
	opts := httpserver.RouterOptions{Logger: deps.Logger, Registry: deps.Registry, Tracer: deps.Tracer, Pprof: cfg.Pprof}
	if cfg.Checkpoint.Enabled {
		s.ckpt = newCkptState()
		s.runs = episode.NewTracker()
		ctl, err := ctlplane.New(cfg.Checkpoint, participant{s}, ctlplane.Deps{Logger: deps.Logger, Registry: deps.Registry, Tuning: deps.Tuning, Tracer: deps.Tracer})
		if err != nil {
			return nil, err
		}
		s.ctl = ctl
		s.hooks = participant{s}
		// Calls to the model and resources servers carry this process's
		// epoch, and their replies are checked against it.
		s.client = ctl.Client(s.client)
		opts.Middleware = append(opts.Middleware, ctl.Middleware(classify))
	}
	r := httpserver.NewRouter(opts)
	h := func(f httpserver.HandlerFunc) http.HandlerFunc { return httpserver.Handle(s.log, f) }
	r.Post("/v1/agent_sessions", h(s.handleOpen))
	r.Post("/v1/agent_sessions/close", h(s.handleClose))
	r.Post("/v1/responses", httpserver.HandleParked(s.log, s.handleResponses))
	r.Post("/run", h(s.handleRun))
	r.Post(rewardprofile.Path, h(s.handleAggregateMetrics))
	if s.ctl != nil {
		s.ctl.Mount(r)
	}
	s.router = r
	s.Server = httpserver.New(httpserver.Config{Addr: cfg.Listen, Logger: deps.Logger, HTTP: cfg.HTTP}, r)
	return s, nil
}

// Name is the agent's instance name.
func (s *Server) Name() string { return s.cfg.Name }

// Handler is the agent's router, for serving it in process (tests, fuzzing).
func (s *Server) Handler() http.Handler { return s.router }

// Close closes the HTTP server gracefully (activations still running end
// with their requests), then the connections of the client New made.
func (s *Server) Close(ctx context.Context) error {
	err := s.Server.Close(ctx)
	s.hooks.close()
	if s.ownClient {
		s.client.CloseIdleConnections()
	}
	return err
}

// episodeOf is the attempt a request belongs to, from its /ng-rollout prefix.
func episodeOf(r *http.Request) (rollout.EpisodeID, error) {
	ep, ok := rollout.FromContext(r.Context())
	if !ok {
		return ep, apierror.New(apierror.RolloutIDRequired, "send the request under /ng-rollout/<capture_key>/")
	}
	return ep, nil
}

// openRequest is the body of POST /v1/agent_sessions.
type openRequest struct {
	SessionID          string `json:"session_id"`
	ResourcesSessionID string `json:"resources_session_id"`
	// ResourcesCookies is the Cookie header the resources session's tool
	// calls carry: what its /seed_session reply set, for a resources server
	// (NeMo Gym's) that names sessions by cookie only.
	ResourcesCookies string           `json:"resources_cookies,omitempty"`
	Request          codec.RawMessage `json:"request,omitempty"`
}

// OpenReply is the reply of POST /v1/agent_sessions.
type OpenReply struct {
	SessionID string            `json:"session_id"`
	EpisodeID rollout.EpisodeID `json:"episode_id"`
}

func decodeOpen(body []byte) (*openRequest, error) {
	var req openRequest
	if err := decodeBody(body, &req); err != nil {
		return nil, err
	}
	if !rollout.ValidID(req.SessionID) {
		return nil, apierror.New(apierror.InvalidRequest, "session_id %q must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", req.SessionID)
	}
	if !rollout.ValidID(req.ResourcesSessionID) {
		return nil, apierror.New(apierror.InvalidRequest, "resources_session_id %q must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", req.ResourcesSessionID)
	}
	if err := sessioncookie.Check(req.ResourcesCookies); err != nil {
		return nil, apierror.New(apierror.InvalidRequest, "resources_cookies: %v", err)
	}
	return &req, nil
}

func (s *Server) handleOpen(r *http.Request) (any, error) {
	ep, err := episodeOf(r)
	if err != nil {
		return nil, err
	}
	body, err := httpserver.ReadBody(r)
	if err != nil {
		return nil, err
	}
	req, err := decodeOpen(body)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sess, ok := s.sessions[req.SessionID]; ok {
		switch {
		case sess.episode != ep:
			return nil, apierror.New(apierror.StaleAttempt, "agent session %s belongs to episode %s, not %s", sess.id, sess.episode.CaptureKey(), ep.CaptureKey())
		case sess.resourcesSessionID != req.ResourcesSessionID:
			return nil, apierror.New(apierror.SessionExists, "agent session %s is open with resources session %s, not %s", sess.id, sess.resourcesSessionID, req.ResourcesSessionID)
		}
		// An open sent again after a seed sent again: a cookie-only
		// resources server may have named the session anew, and the
		// environment verifies in the one its latest seed named.
		sess.resourcesCookies = req.ResourcesCookies
		sess.restored = false
		return OpenReply{SessionID: sess.id, EpisodeID: sess.episode}, nil
	}
	sess := &session{
		id:                 req.SessionID,
		episode:            ep,
		resourcesSessionID: req.ResourcesSessionID,
		resourcesCookies:   req.ResourcesCookies,
		request:            req.Request,
		observations:       Observations{ResourcesSessionID: req.ResourcesSessionID},
	}
	s.addSessionLocked(sess)
	s.hooks.served()
	s.forgetClosedLocked(time.Now())
	return OpenReply{SessionID: sess.id, EpisodeID: ep}, nil
}

// addSessionLocked registers a new session. Called with s.mu held.
func (s *Server) addSessionLocked(sess *session) {
	s.sessions[sess.id] = sess
	s.byRollout[sess.episode.RolloutID] = append(s.byRollout[sess.episode.RolloutID], sess)
	s.metrics.sessions.Inc()
}

// closeRequest is the body of POST /v1/agent_sessions/close.
type closeRequest struct {
	SessionID string `json:"session_id"`
}

// CloseReply is the reply of POST /v1/agent_sessions/close. Observations is
// set on the first close only.
type CloseReply struct {
	SessionID    string        `json:"session_id"`
	Closed       bool          `json:"closed"`
	Observations *Observations `json:"observations"`
}

func decodeClose(body []byte) (*closeRequest, error) {
	var req closeRequest
	if err := decodeBody(body, &req); err != nil {
		return nil, err
	}
	if req.SessionID == "" {
		return nil, apierror.New(apierror.InvalidRequest, "session_id is required")
	}
	return &req, nil
}

// errSessionClosed is the cause an activation is cancelled with when its
// session is closed under it.
var errSessionClosed = apierror.New(apierror.SessionClosed, "the agent session was closed during the activation")

// handleClose closes a session once. A running activation is cancelled and
// waited for, so closing is always possible and its observations final.
// The /ng-rollout prefix is optional here (cleanup must not need it); when
// given, it must name the session's attempt.
func (s *Server) handleClose(r *http.Request) (any, error) {
	body, err := httpserver.ReadBody(r)
	if err != nil {
		return nil, err
	}
	req, err := decodeClose(body)
	if err != nil {
		return nil, err
	}
	ep, hasEp := rollout.FromContext(r.Context())
	for {
		s.mu.Lock()
		sess, ok := s.sessions[req.SessionID]
		switch {
		case !ok:
			s.mu.Unlock()
			return nil, apierror.New(apierror.UnknownSession, "unknown agent session %q", req.SessionID)
		case hasEp && sess.episode != ep:
			s.mu.Unlock()
			return nil, apierror.New(apierror.StaleAttempt, "agent session %s belongs to episode %s, not %s", sess.id, sess.episode.CaptureKey(), ep.CaptureKey())
		case sess.closed:
			s.mu.Unlock()
			return CloseReply{SessionID: sess.id}, nil
		case sess.running:
			sess.cancelRun(errSessionClosed)
			done := sess.runDone
			s.mu.Unlock()
			select {
			case <-done:
				continue
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
		}
		sess.closed, sess.restored, sess.restoredLoop = true, false, nil
		obs := sess.observations
		// A closed session only answers later closes and stale activations;
		// drop what it no longer needs.
		sess.request, sess.completedReply, sess.loop = nil, nil, nil
		s.metrics.sessions.Dec()
		now := time.Now()
		s.closed.push(sess, now)
		s.forgetClosedLocked(now)
		s.mu.Unlock()
		return CloseReply{SessionID: sess.id, Closed: true, Observations: &obs}, nil
	}
}

// handleResponses runs one activation of a session, or, without the
// session header, the loop statelessly as NeMo Gym's /v1/responses does:
// then the /ng-rollout prefix is optional too, as it is on Gym's agent,
// and without it the loop's calls carry none (its model calls are not
// captured).
//
// It parks (pkg/infra/park) while each model call is awaited: an
// activation in flight holds no goroutine of this server.
func (s *Server) handleResponses(t *park.Task, r *http.Request, reply func(any, error)) {
	sessionID := r.Header.Get(SessionHeader)
	ep, err := episodeOf(r)
	if err != nil && sessionID != "" {
		reply(nil, err)
		return
	}
	body, err := httpserver.ReadBody(r)
	if err != nil {
		reply(nil, err)
		return
	}
	params, err := decodeParams(body)
	if err != nil {
		reply(nil, err)
		return
	}
	if sessionID == "" {
		s.runStateless(t, r, params, reply)
		return
	}
	n, err := strconv.Atoi(r.Header.Get(ActivationHeader))
	if err != nil || n < 1 {
		reply(nil, apierror.New(apierror.InvalidRequest, "%s must be an activation index >= 1, got %q", ActivationHeader, r.Header.Get(ActivationHeader)))
		return
	}
	s.activate(t, r.Context(), ep, sessionID, n, params, reply)
}

func (s *Server) runStateless(t *park.Task, r *http.Request, params *openai.ResponsesRequest, reply func(any, error)) {
	ep, prefixed := rollout.FromContext(r.Context())
	rsid := r.Header.Get(ResourcesSessionHeader)
	if rsid != "" && !rollout.ValidID(rsid) {
		reply(nil, apierror.New(apierror.InvalidRequest, "%s %q must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", ResourcesSessionHeader, rsid))
		return
	}
	// As NeMo Gym's /v1/responses does (resources_server_cookies =
	// request.cookies), the caller's cookies go to every tool call.
	cookies := strings.Join(r.Header.Values("Cookie"), "; ")
	if err := sessioncookie.Check(cookies); err != nil {
		reply(nil, apierror.New(apierror.InvalidRequest, "Cookie: %v", err))
		return
	}
	s.hooks.served()
	s.metrics.inFlight.Inc()
	act := s.newActivation(ep, resourcesRef{id: rsid, cookies: cookies}, params, nil)
	act.unprefixed = !prefixed
	s.startActivationLoop(t, r.Context(), act, func(resp *openai.Response, err error) {
		s.metrics.inFlight.Dec()
		if err != nil {
			reply(nil, err)
			return
		}
		h := http.Header{}
		if rsid != "" {
			h.Set(ResourcesSessionHeader, rsid)
		}
		// Gym's agent sets the resources cookies again on its reply, and its
		// /run verifies with the cookies of that reply alone.
		for _, c := range r.Cookies() {
			h.Add("Set-Cookie", (&http.Cookie{Name: c.Name, Value: c.Value, Path: "/", Quoted: c.Quoted}).String())
		}
		reply(httpserver.Reply{Header: h, Body: resp}, nil)
	})
}

// admitActivation looks up the session an activation names and decides
// whether activation n may start (refuse nil, replay false), replays the
// stored reply, or is refused. Called with s.mu held.
func (s *Server) admitActivation(ep rollout.EpisodeID, sessionID string, n int) (sess *session, replay bool, refuse error) {
	sess, ok := s.sessions[sessionID]
	switch {
	case !ok:
		return nil, false, apierror.New(apierror.UnknownSession, "unknown agent session %q", sessionID)
	case sess.episode != ep:
		return nil, false, apierror.New(apierror.StaleAttempt, "agent session %s belongs to episode %s, not %s", sess.id, sess.episode.CaptureKey(), ep.CaptureKey())
	case sess.retired:
		return nil, false, errRetired
	case sess.closed:
		return nil, false, apierror.New(apierror.SessionClosed, "agent session %s is closed", sess.id)
	case sess.running:
		return nil, false, apierror.New(apierror.EpisodeRunning, "agent session %s is running an activation", sess.id)
	case n == sess.completedActivation:
		return sess, true, nil
	case n != sess.completedActivation+1:
		return nil, false, apierror.New(apierror.ActivationOrder, "agent session %s completed activation %d; the next is %d, not %d", sess.id, sess.completedActivation, sess.completedActivation+1, n)
	}
	return sess, false, nil
}

// activate runs activation n of a session: n == completed_activation
// returns the stored reply; anything but completed_activation + 1 is out of
// order; one activation runs at a time. On a session restored from a
// checkpoint, activation completed_activation + 1 continues from the loop
// boundary the checkpoint recorded.
func (s *Server) activate(t *park.Task, ctx context.Context, ep rollout.EpisodeID, sessionID string, n int, params *openai.ResponsesRequest, reply func(any, error)) {
	act, sess, runCtx, rep, err := s.startActivation(ctx, ep, sessionID, n, params)
	if act == nil {
		reply(rep, err)
		return
	}
	s.metrics.inFlight.Inc()
	act.start(t, runCtx, func(resp *openai.Response, err error) {
		s.metrics.inFlight.Dec()
		reply(s.endActivation(act, sess, n, resp, err))
	})
}

// startActivation admits activation n of a session and returns it ready
// to run in runCtx, which the session can cancel (nil with the reply or
// error of one that does not run: refused, or replayed).
func (s *Server) startActivation(ctx context.Context, ep rollout.EpisodeID, sessionID string, n int, params *openai.ResponsesRequest) (*activation, *session, context.Context, any, error) {
	s.mu.Lock()
	sess, replay, refuse := s.admitActivation(ep, sessionID, n)
	// The loop state a restored session continues from is decoded outside
	// the lock (it is kilobytes of JSON); the session is checked again
	// after, and decoded again should another state have replaced it.
	var pre decodedLoop
	for refuse == nil && !replay && sess.restoredLoop != nil && pre.from != sess.restoredLoop {
		pre = decodedLoop{from: sess.restoredLoop}
		s.mu.Unlock()
		pre.state, pre.err = pre.from.decode()
		s.mu.Lock()
		sess, replay, refuse = s.admitActivation(ep, sessionID, n)
	}
	if refuse != nil {
		s.mu.Unlock()
		s.metrics.activations.WithLabelValues("refused").Inc()
		return nil, nil, nil, nil, refuse
	}
	if replay {
		reply := sess.completedReply
		s.mu.Unlock()
		s.metrics.activations.WithLabelValues("replayed").Inc()
		return nil, nil, nil, reply, nil
	}
	// Only a restore sets restored and restoredLoop: with checkpointing
	// off this is a no-op.
	var from *LoopState
	sess.restored = false
	if sess.restoredLoop != nil {
		if pre.err != nil {
			// The state stays as restored: a later checkpoint carries it
			// on unchanged, and a retry fails the same way.
			s.mu.Unlock()
			s.metrics.activations.WithLabelValues("failed").Inc()
			return nil, nil, nil, nil, apierror.New(apierror.InvalidCheckpointState, "agent session %s: the restored loop state cannot be continued: %v", sess.id, pre.err)
		}
		// The activation that was in progress when the checkpoint was
		// taken continues from its boundary: no model call is repeated and
		// no pending tool skipped. It is the same activation, not a new
		// one.
		from, sess.restoredLoop = pre.state, nil
	}
	act := s.newActivation(ep, resourcesRef{id: sess.resourcesSessionID, cookies: sess.resourcesCookies}, params, from)
	runCtx, cancel := context.WithCancelCause(ctx)
	sess.running, sess.cancelRun, sess.runDone = true, cancel, make(chan struct{})
	if from == nil {
		sess.activations++
	}
	sess.loop = act.state
	act.hooks = s.hooks.startActivation(sess)
	s.mu.Unlock()
	return act, sess, runCtx, nil, nil
}

// endActivation records the end of a run activation and returns its reply.
func (s *Server) endActivation(act *activation, sess *session, n int, resp *openai.Response, err error) (any, error) {
	var reply codec.RawMessage
	if err == nil {
		reply, err = codec.Marshal(resp)
	}

	s.mu.Lock()
	done, cancel := sess.runDone, sess.cancelRun
	defer cancel(nil) // after the unlock
	defer s.mu.Unlock()
	sess.running, sess.cancelRun, sess.runDone = false, nil, nil
	s.hooks.endActivation(sess)
	close(done)
	if err == nil && sess.closed {
		err = errSessionClosed
	}
	if err != nil {
		s.metrics.activations.WithLabelValues("failed").Inc()
		return nil, err
	}
	sess.completedActivation, sess.completedReply = n, reply
	sess.observations.add(act.state)
	s.metrics.activations.WithLabelValues("completed").Inc()
	return reply, nil
}

// openaiResponseField is the row field /verify reads the loop's result from.
const openaiResponseField = "response"

// closeResourcesRequest is the body of /close_session: NeMo Gym 0.7.0's
// ResourcesCloseSessionRequest (nemo_gym/base_resources_server.py), which
// its resources servers require (422 for {}).
type closeResourcesRequest struct {
	ResourcesSessionID string            `json:"resources_session_id"`
	EpisodeID          rollout.EpisodeID `json:"episode_id"`
}

// closeResourcesSession closes a /run's resources session even when the
// /run's request has ended, bounded by CleanupTimeout.
func (s *Server) closeResourcesSession(ctx context.Context, ep rollout.EpisodeID, res resourcesRef) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), CleanupTimeout)
	defer cancel()
	u := baseURL(s.cfg.resourcesURL(ep.RolloutID)) + rollout.Path(ep, "/close_session")
	rep, err := httpclient.Do(ctx, s.client, http.MethodPost, u, res.header(), closeResourcesRequest{ResourcesSessionID: res.id, EpisodeID: ep})
	if err == nil && rep.Status != http.StatusNotFound {
		// A NeMo Gym resources server before 0.7.0 has no /close_session
		// (its sessions are never closed): its 404 leaves nothing to close.
		err = rep.Err("close_session")
	}
	if err != nil {
		s.log.WarnContext(ctx, "closing the resources session failed", "resources_session_id", res.id, "err", err)
	}
}

// NewResourcesSessionID returns a fresh "resources-session-<hex>" id.
func NewResourcesSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "resources-session-" + hex.EncodeToString(b[:])
}

// isObject reports whether raw is a JSON object.
func isObject(raw []byte) bool { return startsObject(raw) && codec.Valid(raw) }

// startsObject reports whether raw, known to be one valid JSON value, is an
// object.
func startsObject(raw []byte) bool {
	t := bytes.TrimLeft(raw, " \t\r\n")
	return len(t) > 0 && t[0] == '{'
}

// isNull reports whether raw is JSON null.
func isNull(raw []byte) bool { return string(bytes.TrimSpace(raw)) == "null" }

// decodeBody decodes a JSON object body, ignoring unknown fields.
func decodeBody(body []byte, v any) error {
	if len(strings.TrimSpace(string(body))) == 0 {
		return apierror.New(apierror.InvalidRequest, "request body is empty; expected a JSON object")
	}
	if err := codec.Unmarshal(body, v); err != nil {
		return apierror.New(apierror.InvalidRequest, "%s", codec.DescribeError(err))
	}
	return nil
}

// decodeParams decodes responses_create_params strictly, as NeMo Gym does:
// an unknown parameter is a 422, never silently dropped on the way to the
// model server.
func decodeParams(b []byte) (*openai.ResponsesRequest, error) {
	t := strings.TrimSpace(string(b))
	if t == "" || t == "null" {
		return nil, apierror.New(apierror.InvalidRequest, "responses_create_params are required")
	}
	if t[0] != '{' {
		return nil, apierror.New(apierror.InvalidRequest, "responses_create_params must be a JSON object").WithStatus(http.StatusUnprocessableEntity)
	}
	var p openai.ResponsesRequest
	if err := codec.UnmarshalStrict(b, &p); err != nil {
		return nil, apierror.New(apierror.InvalidRequest, "responses_create_params: %s", codec.DescribeError(err)).WithStatus(http.StatusUnprocessableEntity)
	}
	// The decoder grows lists by doubling; these are held for the whole
	// rollout, so at their length.
	p.Input.Items, p.Tools = clipped(p.Input.Items), clipped(p.Tools)
	return &p, nil
}

// clipped is s in a slice of its own length, when its capacity is more.
func clipped[T any](s []T) []T {
	if cap(s) == len(s) {
		return s
	}
	return append(make([]T, 0, len(s)), s...)
}

// decodeRow decodes a dataset row into its fields.
func decodeRow(body []byte) (map[string]codec.RawMessage, error) {
	t := strings.TrimSpace(string(body))
	if t == "" || t[0] != '{' {
		return nil, apierror.New(apierror.InvalidRequest, "the /run body must be a dataset row (a JSON object)")
	}
	var row map[string]codec.RawMessage
	if err := codec.Unmarshal(body, &row); err != nil {
		return nil, apierror.New(apierror.InvalidRequest, "%s", codec.DescribeError(err))
	}
	if row == nil {
		row = map[string]codec.RawMessage{}
	}
	return row, nil
}

// episodeOfRow reads a row's episode from its identity fields, generating
// one for a row that names no rollout (rollout.Resolve): NeMo RL's rows
// carry only _rowidx, and maybe _ng_task_index.
func episodeOfRow(row map[string]codec.RawMessage) (rollout.EpisodeID, error) {
	ids := map[string]any{}
	for _, k := range rollout.IdentityFields() {
		raw, ok := row[k]
		if !ok {
			continue
		}
		var v any
		if err := codec.Unmarshal(raw, &v); err != nil {
			return rollout.EpisodeID{}, apierror.New(apierror.InvalidRequest, "%s: %s", k, codec.DescribeError(err))
		}
		ids[k] = v
	}
	ep, _, err := rollout.Resolve(ids)
	if err != nil {
		return ep, apierror.Wrap(apierror.InvalidRequest, err)
	}
	return ep, nil
}

type metrics struct {
	sessions    prometheus.Gauge
	closedHeld  prometheus.Gauge
	activations *prometheus.CounterVec
	modelCalls  prometheus.Counter
	toolCalls   prometheus.Counter
	inFlight    prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gymfleet_agent_sessions",
			Help: "Agent sessions open (opened and not closed).",
		}),
		closedHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gymfleet_agent_closed_sessions_remembered",
			Help: "Closed agent sessions remembered (to answer a close sent again) until closed_session_ttl after their close.",
		}),
		activations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gymfleet_agent_activations_total",
			Help: "Turn loops run or refused, by outcome: completed, replayed, failed, refused.",
		}, []string{"outcome"}),
		modelCalls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gymfleet_agent_model_calls_total",
			Help: "Calls to the policy model server.",
		}),
		toolCalls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gymfleet_agent_tool_calls_total",
			Help: "Function calls run, including those with invalid arguments.",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gymfleet_rollouts_in_flight",
			Help: "Rollouts being worked on: legacy /run (seed to close), session activations and stateless /v1/responses.",
		}),
	}
	reg.MustRegister(m.sessions, m.closedHeld, m.activations, m.modelCalls, m.toolCalls, m.inFlight)
	return m
}
