// Package environment is the environment server: POST /run takes a NeMo Gym
// dataset row and runs one episode of it, either as the explicit stages of
// single_agent_turn (seed → invoke_agent → close_agent → verify → return,
// over a typed boundary) or by relaying it to an agent's legacy /run. Final
// cleanup (closing the agent and resources sessions) runs before /run replies
// on every path, including a client that went away.
package environment

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	tracking "github.com/gymfleet/gymfleet/pkg/episode"
	"github.com/gymfleet/gymfleet/pkg/infra/freshstack"
	"github.com/gymfleet/gymfleet/pkg/infra/logging"
	"github.com/gymfleet/gymfleet/pkg/infra/park"
	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/replica"
	"github.com/gymfleet/gymfleet/pkg/wire/rewardprofile"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Deps are the server's collaborators; nil fields get working defaults.
type Deps struct {
	Logger   *slog.Logger
	Registry *prometheus.Registry
	// Tuning is the process's runtime steering, told where checkpoints
	// stand (ctlplane.Tuning; a *runtimetune.Tuner); nil leaves the
	// runtime alone.
	Tuning ctlplane.Tuning
	// Tracer records the server's spans (pkg/infra/tracing); nil records none.
	Tracer trace.TracerProvider
}

// Server is an environment server.
type Server struct {
	*httpserver.Server
	cfg     Config
	log     *slog.Logger
	client  *http.Client
	agents  map[string]AgentConfig
	metrics *metrics
	tracer  tracing.Tracer
	// hooks are where a /run meets checkpointing: noHooks with it off,
	// else the participant (hooks.go).
	hooks runHooks
	// tracker and ctl exist only with checkpointing on; only construction
	// and tests read them.
	tracker *tracking.Tracker
	ctl     *ctlplane.Controller
	cpu     cpuGate
	// late sends again the cleanup steps that got no answer in time.
	late *lateCleanup

	mu   sync.Mutex
	live map[string]*episode // by capture key
	// aliases are the restore's: a former agent replica with no live
	// replica of its name -> the live one that took its sessions.
	aliases map[string]string
	closing bool
	running sync.WaitGroup // /run handlers, so Close can wait for their cleanup
}

// New validates cfg and builds the server; call Listen and Serve (or run it
// through lifecycle.Run).
func New(cfg Config, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("environment config: %w", err)
	}
	if deps.Logger == nil {
		deps.Logger = logging.Discard()
	}
	if deps.Registry == nil {
		deps.Registry = prometheus.NewRegistry()
	}
	s := &Server{
		cfg:     cfg,
		log:     deps.Logger,
		client:  httpclient.New(httpclient.Options{Protocol: httpclient.ProtocolAuto, HTTP: cfg.HTTP}), // peers may be NeMo Gym's (HTTP/1.1)
		agents:  make(map[string]AgentConfig, len(cfg.Agents)),
		metrics: newMetrics(deps.Registry),
		tracer:  tracing.NewTracer(deps.Tracer),
		live:    make(map[string]*episode),
		cpu:     newCPUGate(),
		hooks:   noHooks{},
	}
	for _, a := range cfg.Agents {
		a.URL = strings.TrimRight(a.URL, "/")
		a.ResourcesURL = strings.TrimRight(a.ResourcesURL, "/")
		a.Replicas = a.agentReplicas()
		for i := range a.Replicas {
			a.Replicas[i].URL = strings.TrimRight(a.Replicas[i].URL, "/")
		}
		a.ResourcesURLs = a.resourcesURLs()
		for i := range a.ResourcesURLs {
			a.ResourcesURLs[i] = strings.TrimRight(a.ResourcesURLs[i], "/")
		}
		s.agents[a.Name] = a
	}
	opts := httpserver.RouterOptions{Logger: deps.Logger, Registry: deps.Registry, Tracer: deps.Tracer, Pprof: cfg.Pprof}
	if cfg.Checkpoint.Enabled {
		s.tracker = tracking.NewTracker()
		part := &participant{name: cfg.Name, tracker: s.tracker, setAliases: s.setAliases}
		ctl, err := ctlplane.New(cfg.Checkpoint, part, ctlplane.Deps{Logger: deps.Logger, Registry: deps.Registry, Tuning: deps.Tuning, Tracer: deps.Tracer})
		if err != nil {
			return nil, err
		}
		s.ctl, part.ctl = ctl, ctl
		s.hooks = part
		s.ctl = ctl
		// Calls to the agents and resources servers carry this process's
		// epoch, and their replies are checked against it.
		s.client = ctl.Client(s.client)
		// /run names its episode in the body; the handler checks the fence
		// and the tracker decides admission (a replacement is admitted while
		// the restore keeps admission closed, a new episode is refused).
		opts.Middleware = append(opts.Middleware, ctl.Middleware(ctlplane.ByPrefix(ctlplane.AdmitPass)))
	}
	r := httpserver.NewRouter(opts)
	if s.ctl != nil {
		s.ctl.Mount(r)
	}
	r.Post("/run", httpserver.HandleParked(deps.Logger, s.handleRun))
	r.Get("/episodes", httpserver.Handle(deps.Logger, s.handleEpisodes))
	// Gym's rollout collection posts the verify replies here once a run is
	// done. Computed here rather than relayed by agent_ref: our agents and
	// resources servers have no benchmark hooks, so every one of them
	// answers the same baseline, and one call needs no fan-out.
	r.Post(rewardprofile.Path, httpserver.Handle(deps.Logger, rewardprofile.Handle))
	s.Server = httpserver.New(httpserver.Config{Addr: cfg.Listen, Logger: deps.Logger, HTTP: cfg.HTTP}, r)
	// Last: nothing after it can fail and leave its goroutines running.
	s.late = newLateCleanup(deps.Logger, cfg.CleanupTimeout, cfg.CleanupRetryWindow, newLateCleanupMetrics(deps.Registry))
	return s, nil
}

// Close stops serving and waits until every /run has finished its final
// cleanup (each is bounded by cleanup_timeout once its request is cancelled).
func (s *Server) Close(ctx context.Context) error {
	err := s.Server.Close(ctx)
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	// Every handler's request is cancelled by now, and its cleanup is bounded
	// by cleanup_timeout, so this wait is bounded too.
	s.running.Wait()
	s.late.close()
	s.hooks.close()
	s.client.CloseIdleConnections()
	return err
}

// LiveEpisode describes an episode in flight.
type LiveEpisode struct {
	Episode  rollout.EpisodeID `json:"episode_id"`
	Protocol string            `json:"protocol"`
	Agent    string            `json:"agent"`
	Started  time.Time         `json:"started"`
	// Boundary is the latest boundary (single_agent_turn only).
	Boundary Boundary `json:"boundary"`
}

// Live lists the episodes in flight, by capture key.
func (s *Server) Live() []LiveEpisode {
	s.mu.Lock()
	eps := make([]*episode, 0, len(s.live))
	for _, ep := range s.live {
		eps = append(eps, ep)
	}
	s.mu.Unlock()
	out := make([]LiveEpisode, 0, len(eps))
	for _, ep := range eps {
		out = append(out, LiveEpisode{Episode: ep.id, Protocol: ep.protocol, Agent: ep.agent.Name, Started: ep.started, Boundary: ep.latest()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Episode.CaptureKey() < out[j].Episode.CaptureKey() })
	return out
}

// EpisodesReply is the reply of GET /episodes.
type EpisodesReply struct {
	Episodes []EpisodeListing `json:"episodes"`
}

// EpisodeListing names one episode in flight and the row fields a caller
// that sent no rollout id (NeMo RL) knows its row by.
type EpisodeListing struct {
	EpisodeID rollout.EpisodeID `json:"episode_id"`
	// Generated is set when the row named no rollout and the id was
	// generated for it.
	Generated bool `json:"generated"`
	// TaskIndex and RowIdx are the row's _ng_task_index and _rowidx as
	// sent (absent when the row had none).
	TaskIndex    codec.RawMessage `json:"_ng_task_index,omitempty"`
	RolloutIndex codec.RawMessage `json:"_ng_rollout_index,omitempty"`
	RowIdx       codec.RawMessage `json:"_rowidx,omitempty"`
}

// handleEpisodes lists the episodes in flight by capture key: how a
// checkpoint controller whose rows carry no rollout id (NeMo RL's) learns
// the ids the environment gave them before their replies, to name them in
// a commit scope and to resend each continued row with _ng_rollout_id and
// the next _ng_attempt_index after a restore.
func (s *Server) handleEpisodes(*http.Request) (any, error) {
	s.mu.Lock()
	out := make([]EpisodeListing, 0, len(s.live))
	for _, ep := range s.live {
		row := ep.req.Row
		out = append(out, EpisodeListing{
			EpisodeID: ep.id, Generated: ep.req.Generated,
			TaskIndex: row[rollout.FieldTaskIndex], RolloutIndex: row[rollout.FieldRolloutIndex], RowIdx: row[rollout.FieldRowIdx],
		})
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return rollout.CompareCaptureKeys(out[i].EpisodeID, out[j].EpisodeID) < 0 })
	return EpisodesReply{Episodes: out}, nil
}

// handleRun runs one episode. It parks (pkg/infra/park) while the episode
// waits for its agent: an episode in flight holds no goroutine of this
// server.
func (s *Server) handleRun(t *park.Task, r *http.Request, reply func(any, error)) {
	ctx, ep, err := s.openRun(r)
	if err != nil {
		reply(nil, err)
		return
	}
	released := false
	release := func() {
		if !released {
			released = true
			s.release(ep)
		}
	}
	t.Defer(release) // however the task ends
	s.runEpisode(t, ctx, ep, func(rep codec.RawMessage, err error) {
		s.countEpisode(ctx, ep, err)
		release()
		if err != nil {
			reply(nil, err)
			return
		}
		reply(rep, nil)
	})
}

// openRun decodes a /run and admits its episode. Apart from handleRun, whose
// frame stays on the stack of a /run for as long as the episode runs
// (runSingleAgentTurn says why that matters).
func (s *Server) openRun(r *http.Request) (context.Context, *episode, error) {
	body, err := httpserver.ReadBody(r)
	if err != nil {
		return nil, nil, err
	}
	if err := s.cpu.enter(r.Context()); err != nil {
		return nil, nil, err
	}
	// On a goroutine of its own: the decoder's and the digest's depth
	// would double the stack the episode then waits on (freshstack).
	var req *RunRequest
	var digest string
	freshstack.Run(func() { req, digest, err = s.decodeRun(r.Context(), body) })
	s.cpu.leave()
	if err != nil {
		return nil, nil, err
	}
	name := req.Agent
	if name == "" {
		name = s.cfg.defaultAgent()
	}
	agent, ok := s.agents[name]
	if !ok {
		return nil, nil, apierror.New(apierror.InvalidRequest, "agent_ref.name %q is not an agent of environment %s (known: %s)", name, s.cfg.Name, strings.Join(s.agentNames(), ", "))
	}

	if err := s.hooks.admitRun(req.Episode); err != nil {
		return nil, nil, err
	}
	pick := replica.Pick(req.Episode.RolloutID, len(agent.Replicas))
	ep := &episode{
		id:           req.Episode,
		digest:       digest,
		protocol:     s.cfg.protocolOf(agent),
		agent:        agent,
		agentURL:     agent.Replicas[pick].URL,
		agentName:    agent.Replicas[pick].Name,
		resourcesURL: agent.ResourcesURLs[replica.Pick(req.Episode.RolloutID, len(agent.ResourcesURLs))],
		req:          req,
		started:      time.Now(),
		log:          s.log,
	}
	if err := s.admit(ep); err != nil {
		return nil, nil, err
	}
	return rollout.WithEpisode(r.Context(), req.Episode), ep, nil
}

// countEpisode counts a finished episode by outcome and logs a failure. Not
// inlined: its logging's arguments would widen handleRun's frame.
//
//go:noinline
func (s *Server) countEpisode(ctx context.Context, ep *episode, err error) {
	outcome := "ok"
	if err != nil {
		outcome = string(apierror.CodeOf(err))
		s.log.WarnContext(ctx, "episode failed", "protocol", ep.protocol, "agent", ep.agent.Name, "err", err)
	}
	s.metrics.episodes.WithLabelValues(ep.protocol, outcome).Inc()
}

// decodeRun decodes a /run body and digests its task for the hooks: the
// CPU of a /run before its episode starts (s.cpu bounds it).
func (s *Server) decodeRun(ctx context.Context, body []byte) (*RunRequest, string, error) {
	req, err := DecodeRunRequest(ctx, body)
	if err != nil {
		return req, "", err
	}
	digest, err := s.hooks.taskDigest(req.Row)
	if err != nil {
		return nil, "", apierror.New(apierror.InvalidRequest, "task digest: %v", err)
	}
	return req, digest, nil
}

// admit registers an episode as live, refusing a second /run of an attempt
// that is still running: the live one is never disturbed.
func (s *Server) admit(ep *episode) error {
	key := ep.id.CaptureKey()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return apierror.New(apierror.Unavailable, "environment %s is shutting down", s.cfg.Name)
	}
	if _, dup := s.live[key]; dup {
		return apierror.New(apierror.EpisodeRunning, "episode %s is already running on environment %s", key, s.cfg.Name)
	}
	s.live[key] = ep
	s.running.Add(1)
	s.metrics.inFlight.Inc()
	return nil
}

func (s *Server) release(ep *episode) {
	s.mu.Lock()
	delete(s.live, ep.id.CaptureKey())
	s.mu.Unlock()
	s.metrics.inFlight.Dec()
	s.running.Done()
}

// runEpisode runs the protocol under episode_timeout, then the final cleanup
// under cleanup_timeout, detached from the request so that a client that went
// away still gets its sessions closed before the handler replies, and calls
// done with the /run reply.
func (s *Server) runEpisode(t *park.Task, ctx context.Context, ep *episode, done func(codec.RawMessage, error)) {
	epCtx, cancel := context.WithTimeout(ctx, s.cfg.EpisodeTimeout)
	tracked, start, err := s.hooks.begin(ep, cancel)
	if err != nil {
		cancel()
		done(nil, err)
		return
	}
	ep.tracked = tracked
	// End runs after the final cleanup below: until then a retire waits for
	// this episode.
	ended := false
	end := func() {
		if !ended {
			ended = true
			tracked.End()
			cancel()
		}
	}
	t.Defer(end)
	finish := func(reply codec.RawMessage, err error) {
		// From here a retire no longer cancels the episode; it waits for the
		// cleanup, so its reply means the sessions are closed.
		ep.tracked.Finishing()
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.CleanupTimeout)
		ep.cleanup.run(t, cctx, s.log, ep.id.CaptureKey(), s.late, func() {
			ccancel()
			if err != nil {
				reply, err = nil, s.episodeError(ctx, epCtx, ep, err)
			}
			end()
			done(reply, err)
		})
	}
	switch ep.protocol {
	case ProtocolLegacy:
		s.runLegacy(t, epCtx, ep, finish)
	default:
		s.runSingleAgentTurn(t, epCtx, ep, start, finish)
	}
}

// episodeError maps an episode's failure to the /run error: the client went
// away, the episode ran out of time, or an upstream failed.
func (s *Server) episodeError(reqCtx, epCtx context.Context, ep *episode, err error) error {
	key := ep.id.CaptureKey()
	if s.hooks.retired(ep.id) {
		return apierror.New(apierror.StaleAttempt, "episode %s was retired", key)
	}
	// Refusals a caller must act on pass through: resend after the
	// checkpoint, or stop sending a retired attempt.
	for _, code := range []apierror.Code{apierror.AdmissionClosed, apierror.StaleAttempt} {
		if apierror.HasCode(err, code) {
			return apierror.New(code, "episode %s: %v", key, err)
		}
	}
	switch {
	case reqCtx.Err() != nil:
		return apierror.New(apierror.ClientClosed, "episode %s: the client closed the request: %v", key, err)
	case errors.Is(epCtx.Err(), context.DeadlineExceeded):
		return apierror.New(apierror.UpstreamTimeout, "episode %s exceeded episode_timeout %v: %v", key, s.cfg.EpisodeTimeout, err)
	}
	var se *stageError
	if errors.As(err, &se) {
		return apierror.New(apierror.UpstreamError, "episode %s: %v", key, err)
	}
	return apierror.From(err)
}

func (s *Server) agentNames() []string {
	names := make([]string, 0, len(s.agents))
	for n := range s.agents {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

type metrics struct {
	inFlight prometheus.Gauge
	episodes *prometheus.CounterVec
	stage    *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gymfleet_rollouts_in_flight",
			Help: "Episodes (/run requests) being run by this environment server.",
		}),
		episodes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gymfleet_env_episodes_total",
			Help: "Episodes finished, by protocol and outcome (ok or the error code).",
		}, []string{"protocol", "outcome"}),
		stage: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gymfleet_env_stage_seconds",
			Help:    "Time one episode stage took, by stage.",
			Buckets: []float64{.005, .02, .1, .5, 2, 10, 60, 300, 1800},
		}, []string{"stage"}),
	}
	reg.MustRegister(m.inFlight, m.episodes, m.stage)
	return m
}

// stageTimer starts timing a stage; call the result when it ends.
func (m *metrics) stageTimer(stage Stage) func() {
	start := time.Now()
	return func() { m.stage.WithLabelValues(string(stage)).Observe(time.Since(start).Seconds()) }
}
