// Package resources implements the fleet's resources servers (tools and
// verifiers): weather, counter and slow_verify, each one Server on its own
// listener, speaking NeMo Gym's resources API with caller-assigned sessions
// named by the X-Ng-Session-Id header or, as NeMo Gym's agents carry them,
// by the session cookie /seed_session sets.
package resources

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/infra/logging"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/transport/sessioncookie"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rewardprofile"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Headers of the resources API.
const (
	// SessionHeader names the resources session of a request.
	SessionHeader = "X-Ng-Session-Id"
	// VerifyModeHeader on a seed reply announces wait or replay (checkpointing on only).
	VerifyModeHeader = "X-Ng-Checkpoint-Verify"
	// RestartHeader on a seed reply is "1" on a restart_only server (checkpointing on only).
	RestartHeader = "X-Ng-Checkpoint-Restart"
)

// GeneratedSessionPrefix starts the session ids a seed without a session
// header is given.
const GeneratedSessionPrefix = "resources-session-"

// Deps are a server's collaborators; nil fields get working defaults.
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

// Server is one named resources server.
type Server struct {
	*httpserver.Server
	cfg Config
	log *slog.Logger
	typ *serverType
	// cookie is the session cookie's name, Gym's "<Class>___<instance>".
	cookie  string
	router  http.Handler
	metrics *metrics
	// gate holds /verify on a slow_verify server; nil otherwise.
	gate *verifyGate
	// closing is closed when Close starts, so held verifies let go at once
	// instead of holding up the graceful shutdown.
	closing   chan struct{}
	closeOnce sync.Once
	// hooks are where data requests meet checkpointing: noHooks with it
	// off, else the participant (hooks.go).
	hooks requestHooks
	// ckpt is the checkpoint side's state and its control plane; nil when
	// checkpointing is off (only construction, the participant and tests
	// read it).
	ckpt *checkpointing

	mu       sync.Mutex
	sessions map[string]*session
	// byRollout indexes sessions by the rollout they are bound to, so
	// retiring one rollout never scans every session. A rollout has a
	// session or two, so each is a short list, not a set: a map per
	// rollout is an allocation of its own, fresh memory in a restore.
	byRollout map[string][]*session
	// inflight counts every data request between enter and leave, with or
	// without a session.
	inflight int
	// retired counts the sessions in sessions that a retire named: they
	// only refuse requests now, and are not live.
	retired int
}

// session is one resources session. Server.mu guards every field except
// state, which its own mu guards (tool calls of different sessions never
// contend on it). Lock order: Server.mu, then session.mu.
type session struct {
	id string
	// episode is the attempt that seeded the session; bound is false when the
	// seed carried no /ng-rollout prefix.
	episode rollout.EpisodeID
	bound   bool
	// inflight counts this session's requests between enter and leave.
	inflight int
	// idle, when a retire waits for this session, is closed as inflight
	// reaches 0.
	idle chan struct{}
	// retired: a retire named the session's attempt, and every request
	// reaching it (but a close) is refused. dropped: that retire finished and
	// freed the state; the session is only a refusal now, until forget or a
	// later attempt's seed of the same id.
	retired, dropped bool
	// restored: installed by a restore and used by no request since.
	restored bool

	mu    sync.Mutex
	state any
}

// New builds a resources server from cfg; call Listen and Serve to run it.
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
	typ, err := newServerType(cfg.Type)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:       cfg,
		log:       deps.Logger,
		typ:       typ,
		cookie:    sessioncookie.Name(typ.class, cfg.Name),
		metrics:   newMetrics(deps.Registry),
		closing:   make(chan struct{}),
		sessions:  map[string]*session{},
		byRollout: map[string][]*session{},
		hooks:     noHooks{},
	}
	if cfg.Type == TypeSlowVerify {
		s.gate = &verifyGate{release: make(chan struct{})}
	}
	opts := httpserver.RouterOptions{Logger: deps.Logger, Registry: deps.Registry, Tracer: deps.Tracer, Pprof: cfg.Pprof}
	if cfg.Checkpoint.Enabled {
		if s.ckpt, err = newCheckpointing(s, deps); err != nil {
			return nil, err
		}
		s.hooks = &participant{s: s, ck: s.ckpt}
		opts.Middleware = append(opts.Middleware, s.ckpt.ctl.Middleware(s.classify))
	}
	r := httpserver.NewRouter(opts)
	if s.ckpt != nil {
		s.ckpt.ctl.Mount(r)
	}
	h := func(f httpserver.HandlerFunc) http.HandlerFunc { return httpserver.Handle(s.log, f) }
	r.Get("/tools", h(func(*http.Request) (any, error) { return s.typ.tools, nil }))
	r.Get("/reverify_mode", h(func(*http.Request) (any, error) { return s.typ.reverify, nil }))
	r.Post("/seed_session", h(s.handleSeed))
	// Tool calls and verifies set the session cookie again on every reply,
	// errors included, as Gym's session middleware does: its agents pass on
	// the cookies of the latest reply only, so a tool error without it
	// would lose the session for every later call.
	withCookie := func(f httpserver.HandlerFunc) http.HandlerFunc {
		inner := h(f)
		return func(w http.ResponseWriter, r *http.Request) {
			if id, err := s.sessionID(r); err == nil && id != "" {
				sessioncookie.Set(w.Header(), s.cookie, id)
			}
			inner(w, r)
		}
	}
	r.Post("/verify", withCookie(s.handleVerify))
	r.Post("/close_session", h(s.handleClose))
	r.Post(rewardprofile.Path, h(rewardprofile.Handle))
	if s.gate != nil {
		r.Post("/_ctl/verify/hold", h(func(*http.Request) (any, error) { return s.gate.hold(), nil }))
		r.Post("/_ctl/verify/release", h(func(*http.Request) (any, error) { return s.gate.releaseAll(), nil }))
		r.Get("/_ctl/verify/count", h(func(*http.Request) (any, error) { return s.gate.counts(), nil }))
	}
	r.Post("/{tool}", withCookie(s.handleTool))
	s.router = r
	s.Server = httpserver.New(httpserver.Config{Addr: cfg.Listen, Logger: deps.Logger, HTTP: cfg.HTTP}, r)
	return s, nil
}

// Name is the server's instance name.
func (s *Server) Name() string { return s.cfg.Name }

// Handler is the server's router, for serving it in process (tests, fuzzing).
func (s *Server) Handler() http.Handler { return s.router }

// Close releases held verifies, closes the HTTP server gracefully, then
// stops the control plane (after the last control request ended).
func (s *Server) Close(ctx context.Context) error {
	s.closeOnce.Do(func() { close(s.closing) })
	err := s.Server.Close(ctx)
	s.hooks.close()
	return err
}

// operation is what a data request does to its session.
type operation int

const (
	opSeed operation = iota
	opTool
	opVerify
	opClose
)

// enter resolves the session a data request names and counts the request in
// flight; the returned leave undoes the count and must be called once. Every
// seed, tool call, verify and close passes through here, so admission and
// attempt fences have exactly one place to go.
//
// opSeed creates the session with state when it does not exist (a re-seed
// keeps the existing state) and binds it to the request's episode. opClose
// removes the session, unless an earlier attempt of the rollout sends it
// after a later one took the session over; then it changes nothing. opTool and opVerify return a nil session for an
// unknown id. A request of another attempt than the session's is refused
// with stale_attempt, except a close, which is never refused.
//
// With checkpointing on, a request that must wait out a checkpoint waits
// here before it counts (see admit), a request of a retired attempt is
// refused, and a request that counts toward readiness is tracked as a
// blocker until it leaves.
func (s *Server) enter(r *http.Request, op operation, id string, state any) (*session, func(), error) {
	ep, hasEp := rollout.FromContext(r.Context())
	if err := s.admit(r.Context(), op); err != nil {
		return nil, nil, err
	}
	// admit returns with s.mu held.
	defer s.mu.Unlock()
	if err := s.hooks.enter(op, ep, hasEp); err != nil {
		return nil, nil, err
	}
	sess := s.sessions[id]
	if id == "" {
		sess = nil
	}
	if sess != nil && sess.retired {
		var err error
		if sess, err = s.enterRetiredLocked(sess, op, ep, hasEp); err != nil {
			return nil, nil, err
		}
	}
	switch {
	case sess == nil && op == opSeed && id != "":
		sess = &session{id: id, state: state}
		s.sessions[id] = sess
		if hasEp {
			s.bindLocked(sess, ep)
		}
		s.updateSessionsGaugeLocked()
	case sess == nil:
	case op == opSeed:
		if err := s.seedEpisodeLocked(sess, ep, hasEp); err != nil {
			return nil, nil, err
		}
		if state != nil {
			// A session restored without state (stateless mode) takes the
			// seed's; any other re-seed keeps what it has.
			sess.mu.Lock()
			if sess.state == nil {
				sess.state = state
			}
			sess.mu.Unlock()
		}
	case op == opClose && hasEp && sess.bound && earlierAttempt(ep, sess.episode):
		// A close of an attempt that a later one has taken the session
		// over from (a late cleanup, sent again after its first try got no
		// answer) is answered, never refused, and leaves the later
		// attempt's session alone.
		sess = nil
	case op == opClose:
		s.removeLocked(sess)
		s.updateSessionsGaugeLocked()
	case hasEp && sess.bound && sess.episode != ep:
		return nil, nil, staleAttempt(sess, ep)
	}
	s.inflight++
	if sess != nil {
		sess.inflight++
		if sess.restored {
			sess.restored = false
			s.hooks.used(sess)
		}
	}
	blocker, counted := s.hooks.track(op, sess, ep, hasEp)
	var once sync.Once
	return sess, func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.inflight--
			if sess != nil {
				sess.inflight--
				if sess.inflight == 0 && sess.idle != nil {
					close(sess.idle)
					sess.idle = nil
				}
			}
			if counted {
				s.hooks.release(blocker)
			}
		})
	}, nil
}

// admit returns with s.mu held once the request may go on: at once unless
// the hooks hold it, else once admission reopens, without counting. The
// controller's middleware holds such requests already; this catches one
// that passed it just before admission closed, which would otherwise start
// after the checkpoint found the server ready.
func (s *Server) admit(ctx context.Context, op operation) error {
	for {
		s.mu.Lock()
		reopened := s.hooks.holds(op)
		if reopened == nil {
			return nil
		}
		s.mu.Unlock()
		select {
		case <-reopened:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closing:
			return apierror.New(apierror.Unavailable, "server is closing")
		}
	}
}

// enterRetiredLocked decides a request that reaches a session a retire
// named. A request with no episode, or of the retired attempt or an earlier
// one, is refused; a close is never refused but leaves the session to the
// retire. A later attempt (or another rollout) does not see a session the
// retire already freed, and may seed the id afresh; while the retire is
// still running, that seed is refused with retire_incomplete.
func (s *Server) enterRetiredLocked(sess *session, op operation, ep rollout.EpisodeID, hasEp bool) (*session, error) {
	if op == opClose {
		return nil, nil
	}
	if !hasEp || (ep.RolloutID == sess.episode.RolloutID && ep.Attempt <= sess.episode.Attempt) {
		return nil, apierror.New(apierror.StaleAttempt, "session %s belongs to episode %s, which was retired", sess.id, sess.episode.CaptureKey())
	}
	switch {
	case !sess.dropped && op == opSeed:
		return nil, apierror.New(apierror.RetireIncomplete, "session %s of retired episode %s is still being retired; seed it again once the retire finished", sess.id, sess.episode.CaptureKey())
	case !sess.dropped:
		return nil, staleAttempt(sess, ep)
	case op == opSeed:
		s.removeLocked(sess)
	}
	return nil, nil
}

// blockerLabel names what a counted request blocks: its session's episode,
// or the request's own when the session is unbound or absent.
func blockerLabel(sess *session, ep rollout.EpisodeID, hasEp bool) string {
	switch {
	case sess != nil && sess.bound:
		return sess.episode.CaptureKey()
	case hasEp:
		return ep.CaptureKey()
	}
	return UnboundBlocker
}

// seedEpisodeLocked checks a re-seed against the session's episode. An
// unbound session is bound; a later attempt of the same rollout takes the
// session over (a restored session is reseeded by the next attempt under the
// same caller-assigned id); anything else is another attempt's session.
func (s *Server) seedEpisodeLocked(sess *session, ep rollout.EpisodeID, hasEp bool) error {
	switch {
	case !hasEp || (sess.bound && sess.episode == ep):
		return nil
	case !sess.bound:
		s.bindLocked(sess, ep)
		return nil
	case sess.episode.RolloutID == ep.RolloutID && ep.Attempt > sess.episode.Attempt:
		s.unindexLocked(sess)
		s.bindLocked(sess, ep)
		return nil
	}
	return staleAttempt(sess, ep)
}

// earlierAttempt reports whether ep is an earlier attempt of the rollout
// that holds the session.
func earlierAttempt(ep, holder rollout.EpisodeID) bool {
	return ep.RolloutID == holder.RolloutID && ep.Attempt < holder.Attempt
}

func staleAttempt(sess *session, ep rollout.EpisodeID) error {
	return apierror.New(apierror.StaleAttempt, "session %s belongs to episode %s, not %s", sess.id, sess.episode.CaptureKey(), ep.CaptureKey())
}

func (s *Server) bindLocked(sess *session, ep rollout.EpisodeID) {
	sess.episode, sess.bound = ep, true
	s.byRollout[ep.RolloutID] = append(s.byRollout[ep.RolloutID], sess)
}

func (s *Server) unindexLocked(sess *session) {
	if !sess.bound {
		return
	}
	r := sess.episode.RolloutID
	if list := slices.DeleteFunc(s.byRollout[r], func(x *session) bool { return x == sess }); len(list) > 0 {
		s.byRollout[r] = list
	} else {
		delete(s.byRollout, r)
	}
}

func (s *Server) removeLocked(sess *session) {
	delete(s.sessions, sess.id)
	s.unindexLocked(sess)
	if sess.retired {
		s.retired--
	}
	if sess.restored {
		sess.restored = false
		s.hooks.used(sess)
	}
}

// updateSessionsGaugeLocked sets the sessions gauge to the live sessions.
func (s *Server) updateSessionsGaugeLocked() {
	s.metrics.sessions.Set(float64(s.liveLocked()))
}

// liveLocked is the number of live sessions: seeded, not closed, not retired.
func (s *Server) liveLocked() int { return len(s.sessions) - s.retired }

// CookieName is the name of the session cookie the server sets.
func (s *Server) CookieName() string { return s.cookie }

// sessionID reads and checks the request's session: the header, or when it
// is absent the session cookie (NeMo Gym's agents carry nothing else). The
// cookie names the same session id the header would and goes through the
// same checks, so it reaches no session the header could not.
func (s *Server) sessionID(r *http.Request) (string, error) {
	id, from := r.Header.Get(SessionHeader), SessionHeader
	if id == "" {
		if c, err := r.Cookie(s.cookie); err == nil {
			id, from = c.Value, "cookie "+s.cookie
		}
	}
	if id != "" && !rollout.ValidID(id) {
		return "", apierror.New(apierror.InvalidRequest, "%s %.200q must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", from, id)
	}
	return id, nil
}

// sessionReply is a reply that names its session in the header (New's
// withCookie sets the cookie).
func (s *Server) sessionReply(id string, body any) any {
	if id == "" {
		return body
	}
	return httpserver.Reply{Header: http.Header{SessionHeader: {id}}, Body: body}
}

// NewSessionID returns a fresh "resources-session-<hex>" id.
func NewSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return GeneratedSessionPrefix + hex.EncodeToString(b[:])
}

func (s *Server) handleSeed(r *http.Request) (any, error) {
	id, err := s.sessionID(r)
	if err != nil {
		return nil, err
	}
	if id == "" {
		id = NewSessionID()
	}
	body, err := httpserver.ReadBody(r)
	if err != nil {
		return nil, err
	}
	row, err := decodeObject(body, "seed_session body")
	if err != nil {
		return nil, err
	}
	state, err := s.typ.seed(row)
	if err != nil {
		return nil, err
	}
	_, leave, err := s.enter(r, opSeed, id, state)
	if err != nil {
		return nil, err
	}
	defer leave()
	h := http.Header{}
	h.Set(SessionHeader, id)
	sessioncookie.Set(h, s.cookie, id)
	s.hooks.seedHeaders(h)
	return httpserver.Reply{Header: h, Body: codec.RawMessage("{}")}, nil
}

func (s *Server) handleTool(r *http.Request) (any, error) {
	name := chi.URLParam(r, "tool")
	fn, ok := s.typ.call[name]
	if !ok {
		return nil, apierror.New(apierror.UnknownTool, "%s server %s has no tool %q", s.cfg.Type, s.cfg.Name, name)
	}
	id, err := s.sessionID(r)
	if err != nil {
		return nil, err
	}
	args, err := httpserver.ReadBody(r)
	if err != nil {
		return nil, err
	}
	sess, leave, err := s.enter(r, opTool, id, nil)
	if err != nil {
		return nil, err
	}
	defer leave()
	if sess == nil && s.typ.stateful {
		if id == "" {
			// NeMo Gym would start a new session here; a session no later
			// call can name again could only hold state no verify reads
			// (Gym's verify of it gives 0.0), so it is refused instead.
			return nil, apierror.New(apierror.UnknownSession, "%s needs a seeded session named by %s or the cookie %s", name, SessionHeader, s.cookie)
		}
		return nil, apierror.New(apierror.UnknownSession, "unknown session %q: seed it first", id)
	}
	out, err := fn(sess, args)
	if err != nil {
		return nil, err
	}
	s.metrics.toolCalls.WithLabelValues(name).Inc()
	return s.sessionReply(id, out), nil
}

func (s *Server) handleVerify(r *http.Request) (any, error) {
	id, err := s.sessionID(r)
	if err != nil {
		return nil, err
	}
	body, err := httpserver.ReadBody(r)
	if err != nil {
		return nil, err
	}
	req, err := decodeVerify(body)
	if err != nil {
		return nil, err
	}
	sess, leave, err := s.enter(r, opVerify, id, nil)
	if err != nil {
		return nil, err
	}
	defer leave()
	if s.gate != nil {
		if err := s.gate.wait(r.Context(), s.closing); err != nil {
			return nil, err
		}
		defer s.gate.finish()
	}
	reward, err := s.typ.verify(sess, req)
	if err != nil {
		return nil, err
	}
	req.fields["reward"] = codec.RawMessage(formatReward(reward))
	out, err := codec.Marshal(req.fields)
	if err != nil {
		return nil, apierror.Wrap(apierror.Internal, err)
	}
	s.metrics.verifies.Inc()
	s.metrics.rewards.Observe(reward)
	return s.sessionReply(id, codec.RawMessage(out)), nil
}

// formatReward writes a reward as Python's json.dumps writes a float, so
// 1.0 stays 1.0 for NeMo Gym readers that compare output bytes.
func formatReward(r float64) string {
	if r == math.Trunc(r) && math.Abs(r) < 1e16 {
		return strconv.FormatFloat(r, 'f', 1, 64)
	}
	return strconv.FormatFloat(r, 'g', -1, 64)
}

// closeReply is the reply of /close_session.
type closeReply struct {
	Closed bool `json:"closed"`
}

func (s *Server) handleClose(r *http.Request) (any, error) {
	id, err := s.sessionID(r)
	if err != nil {
		return nil, err
	}
	sess, leave, err := s.enter(r, opClose, id, nil)
	if err != nil {
		return nil, err
	}
	defer leave()
	h := http.Header{}
	if id != "" {
		sessioncookie.Expire(h, s.cookie)
	}
	return httpserver.Reply{Header: h, Body: closeReply{Closed: sess != nil}}, nil
}

// decodeObject decodes a JSON object into its fields; an empty body is {}.
func decodeObject(body []byte, what string) (map[string]codec.RawMessage, error) {
	fields := map[string]codec.RawMessage{}
	trimmed := strings.TrimSpace(string(body))
	if trimmed == "" {
		return fields, nil
	}
	if trimmed[0] != '{' {
		return nil, apierror.New(apierror.InvalidRequest, "%s must be a JSON object", what)
	}
	if err := codec.Unmarshal(body, &fields); err != nil {
		return nil, apierror.New(apierror.InvalidRequest, "%s: %s", what, codec.DescribeError(err))
	}
	if fields == nil {
		fields = map[string]codec.RawMessage{}
	}
	return fields, nil
}

// decodeVerify decodes a /verify body: the row's fields, which must include
// responses_create_params and a Responses object in response.
func decodeVerify(body []byte) (*verifyRequest, error) {
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil, apierror.New(apierror.InvalidRequest, "verify body is empty; expected {responses_create_params, response, ...}")
	}
	fields, err := decodeObject(body, "verify body")
	if err != nil {
		return nil, err
	}
	for _, k := range []string{"responses_create_params", "response"} {
		if v := strings.TrimSpace(string(fields[k])); v == "" || v == "null" {
			return nil, apierror.New(apierror.InvalidRequest, "verify body needs %q", k)
		}
	}
	req := &verifyRequest{fields: fields}
	if err := codec.Unmarshal(fields["response"], &req.response); err != nil {
		return nil, apierror.New(apierror.InvalidRequest, "response: %s", codec.DescribeError(err))
	}
	return req, nil
}

// verifyGate holds /verify on a slow_verify server while held.
type verifyGate struct {
	mu      sync.Mutex
	held    bool
	release chan struct{} // closed by releaseAll; replaced by the next hold
	started int
	done    int
	waiting int
}

// GateCounts is the reply of /_ctl/verify/count.
type GateCounts struct {
	Started  int `json:"started"`
	Finished int `json:"finished"`
	Waiting  int `json:"waiting"`
}

// GateState is the reply of /_ctl/verify/hold and /_ctl/verify/release.
type GateState struct {
	Held bool `json:"held"`
}

func (g *verifyGate) hold() GateState {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.held {
		g.held = true
		g.release = make(chan struct{})
	}
	return GateState{Held: true}
}

func (g *verifyGate) releaseAll() GateState {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held {
		g.held = false
		close(g.release)
	}
	return GateState{Held: false}
}

func (g *verifyGate) counts() GateCounts {
	g.mu.Lock()
	defer g.mu.Unlock()
	return GateCounts{Started: g.started, Finished: g.done, Waiting: g.waiting}
}

// wait counts a verify as started and, while held, waits for a release, the
// end of the request, or the server closing.
func (g *verifyGate) wait(ctx context.Context, closing <-chan struct{}) error {
	g.mu.Lock()
	g.started++
	if !g.held {
		g.mu.Unlock()
		return nil
	}
	release := g.release
	g.waiting++
	g.mu.Unlock()
	var err error
	select {
	case <-release:
	case <-ctx.Done():
		err = ctx.Err()
	case <-closing:
		err = apierror.New(apierror.Unavailable, "server is closing")
	}
	g.mu.Lock()
	g.waiting--
	g.mu.Unlock()
	return err
}

func (g *verifyGate) finish() {
	g.mu.Lock()
	g.done++
	g.mu.Unlock()
}

type metrics struct {
	sessions  prometheus.Gauge
	toolCalls *prometheus.CounterVec
	verifies  prometheus.Counter
	rewards   prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gymfleet_resources_sessions",
			Help: "Resources sessions open (seeded and not closed).",
		}),
		toolCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gymfleet_resources_tool_calls_total",
			Help: "Tool calls answered, by tool.",
		}, []string{"tool"}),
		verifies: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gymfleet_resources_verify_total",
			Help: "Verifications answered.",
		}),
		// A reward is any float a verifier returns: as a label it made one
		// series per distinct value, so it is a distribution instead.
		rewards: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "gymfleet_resources_verify_reward",
			Help:    "Rewards of answered verifications.",
			Buckets: []float64{0, .25, .5, .75, 1},
		}),
	}
	reg.MustRegister(m.sessions, m.toolCalls, m.verifies, m.rewards)
	return m
}
