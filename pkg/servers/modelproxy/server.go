// Package modelproxy is the policy model server: an OpenAI-compatible proxy in
// front of a vLLM-shaped inference endpoint.
//
//   - POST /v1/chat/completions passes through (unknown fields forwarded, SSE
//     relayed chunk by chunk), with the model set and vLLM's token-id
//     parameters added;
//   - POST /v1/responses is converted to Chat Completions and back
//     (pkg/wire/openai), streaming included;
//   - calls under /ng-rollout/<capture_key>/ are captured: one ledger row per
//     call (pkg/tokencapture), staged before the reply is delivered;
//   - GET /capture/rollouts/{capture_key}/manifest reads a ledger.
//
// Every call follows one path (call.go): admit → upstream → build the reply
// → deliver (the single point before the first byte is written, where a
// checkpoint holds undelivered responses) → stage the ledger row → write.
//
// With checkpoint.enabled the server is a checkpoint participant of kind
// model (checkpoint.go), which the call path meets only through its hooks
// (hooks.go; with checkpointing off they do nothing): model calls arriving while a checkpoint is open
// wait unadmitted, responses not started are held at deliver, in-flight
// generations are cut by the worker (cut.go) and continued after a resume
// or a restore, and the ledger rows of delivered calls are exported and
// restored under the next attempt (record.go).
package modelproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/infra/logging"
	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
	"github.com/gymfleet/gymfleet/pkg/tokencapture"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Deps are the server's injected dependencies; nil fields get defaults.
type Deps struct {
	Logger   *slog.Logger
	Registry *prometheus.Registry
	// Tracer records the server's spans (pkg/infra/tracing); nil records none.
	Tracer trace.TracerProvider
	// Upstream is the client for the inference endpoint; nil builds one from
	// Config.Upstream.
	Upstream *http.Client
	// Control is the client for the worker's generation-cut route, kept
	// apart from the data client so a cut never queues behind generations;
	// nil builds one from Config.Upstream.
	Control *http.Client
	// Tuning is the process's runtime steering, told where checkpoints
	// stand (ctlplane.Tuning; a *runtimetune.Tuner); nil leaves the
	// runtime alone.
	Tuning ctlplane.Tuning
}

// Server is the policy model server.
type Server struct {
	*httpserver.Server
	cfg      Config
	log      *slog.Logger
	ledger   *tokencapture.Ledger
	upstream *upstreamConn
	// workers are the inference workers, picker the one of each call.
	workers []worker
	picker  *workerPicker
	metrics *metrics
	tracer  tracing.Tracer
	// hooks are where calls meet checkpointing: noHooks with it off, else
	// the participant (hooks.go).
	hooks callHooks
	// ckpt and ctl are nil with checkpointing off; only construction,
	// Close and tests read them.
	ckpt *participant
	ctl  *ctlplane.Controller

	handler http.Handler

	// extraBody and chatTemplateKwargs are upstream.extra_body and
	// upstream.chat_template_kwargs, parsed; nil when not set.
	extraBody, chatTemplateKwargs map[string]codec.RawMessage
	// droppedKwargs logs once that chat requests' own
	// chat_template_kwargs are dropped.
	droppedKwargs sync.Once

	// digests computes the request digest of captured calls (digest.go).
	digests requestDigests
}

// New opens the capture ledger and builds the server; call Listen and Serve.
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
	ledger, err := tokencapture.Open(cfg.Capture.Dir, tokencapture.Options{})
	if err != nil {
		return nil, fmt.Errorf("capture ledger: %w", err)
	}
	workers := newWorkers(cfg, deps.Registry)
	s := &Server{
		cfg:      cfg,
		log:      deps.Logger,
		ledger:   ledger,
		upstream: newUpstreamConn(cfg, deps, deps.Logger),
		workers:  workers,
		picker:   newWorkerPicker(len(workers), defaultWorkerBackoff, nil),
		metrics:  newMetrics(deps.Registry),
		hooks:    noHooks{},
		tracer:   tracing.NewTracer(deps.Tracer),
	}
	deps.Registry.MustRegister(newLedgerCollector(ledger))
	// Validate parsed both already.
	s.extraBody, _ = parseObject(cfg.Upstream.ExtraBody)
	s.chatTemplateKwargs, _ = parseObject(cfg.Upstream.ChatTemplateKwargs)
	var mw []func(http.Handler) http.Handler
	if cfg.Checkpoint.Enabled {
		s.ckpt = newParticipant(s, deps.Registry)
		ctl, err := ctlplane.New(cfg.Checkpoint, s.ckpt, ctlplane.Deps{Logger: deps.Logger, Registry: deps.Registry, Tuning: deps.Tuning, Tracer: deps.Tracer})
		if err != nil {
			_ = ledger.Close()
			return nil, fmt.Errorf("checkpoint control plane: %w", err)
		}
		s.ctl, s.ckpt.ctl = ctl, ctl
		s.hooks = s.ckpt
		// A ledger row a superseded process appends would be a call no
		// live agent made: every append is written under the epoch guard.
		ledger.SetFence(ctl.UnderEpoch)
		mw = append(mw, ctl.MiddlewareWith(classify, s.writeError))
	}
	r := httpserver.NewRouter(httpserver.RouterOptions{Logger: deps.Logger, Registry: deps.Registry, Tracer: deps.Tracer, Middleware: mw, Pprof: cfg.Pprof, Ready: s.upstream.ready,
		WriteError: s.writeError})
	s.routes(r)
	if s.ctl != nil {
		s.ctl.Mount(r)
	}
	s.handler = r
	s.Server = httpserver.New(httpserver.Config{Addr: cfg.Listen, Logger: deps.Logger, HTTP: cfg.HTTP}, r)
	return s, nil
}

func (s *Server) routes(r chi.Router) {
	r.Get("/v1/models", s.handleModels)
	r.Post("/v1/chat/completions", s.handleChat)
	r.Post("/v1/responses", s.handleResponses)
	// The rest of /v1 answers in OpenAI's error shape too. (A route, not a
	// sub-router: the upstream request carries the handler's context, and
	// an in-process upstream's router would read a sub-router's state.)
	r.HandleFunc("/v1/*", func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/v1/models", "/v1/chat/completions", "/v1/responses":
			apierror.WriteOpenAI(w, req, s.log, apierror.New(apierror.MethodNotAllowed, "method %s not allowed on %s", req.Method, req.URL.Path))
		default:
			apierror.WriteOpenAI(w, req, s.log, apierror.New(apierror.NotFound, "no route %s %s", req.Method, req.URL.Path))
		}
	})
	r.Route("/capture/rollouts", func(r chi.Router) {
		r.Use(s.requireControlToken)
		r.Get("/{capture_key}/manifest", httpserver.Handle(s.log, s.handleManifest))
		r.Post("/retire", httpserver.Handle(s.log, s.handleRetire))
		r.Post("/delete", httpserver.Handle(s.log, s.handleDelete))
	})
}

// writeError answers a refusal in OpenAI's error shape on the OpenAI
// routes (/v1/..., under a rollout prefix or not), whose callers are
// OpenAI SDKs reading error.message and x-should-retry, and in the fleet's
// envelope on the others (the ledger routes, the probes).
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	if openAIPath(r.URL.Path) {
		apierror.WriteOpenAI(w, r, s.log, err)
		return
	}
	apierror.Write(w, r, s.log, err)
}

// openAIPath reports an OpenAI route's path: /v1/..., or the same under
// /ng-rollout/<capture_key>/ when the router has not stripped the prefix
// yet (a malformed one).
func openAIPath(p string) bool {
	if rest, ok := strings.CutPrefix(p, "/ng-rollout/"); ok {
		_, p, _ = strings.Cut(rest, "/")
		p = "/" + p
		p = strings.TrimPrefix(p, "/training-token-capture")
	}
	return strings.HasPrefix(p, "/v1/")
}

// classify admits model calls with AdmitWait (a call arriving while a
// checkpoint is open waits unadmitted, so it never blocks a prepare) and
// lets everything else pass (GET /v1/models, the ledger routes).
func classify(r *http.Request) (rollout.EpisodeID, bool, ctlplane.Admission) {
	id, ok := rollout.FromContext(r.Context())
	switch r.URL.Path {
	case "/v1/chat/completions", "/v1/responses":
		return id, ok, ctlplane.AdmitWait
	}
	return id, ok, ctlplane.AdmitPass
}

// Handler is the server's HTTP handler, for in-process tests.
func (s *Server) Handler() http.Handler { return s.handler }

// Ledger is the capture ledger the server writes.
func (s *Server) Ledger() *tokencapture.Ledger { return s.ledger }

// Config is the configuration the server runs with.
func (s *Server) Config() Config { return s.cfg }

// Controller is the checkpoint control plane; nil with checkpointing off.
func (s *Server) Controller() *ctlplane.Controller { return s.ctl }

// Close stops serving (waiting for calls in flight up to ctx's deadline),
// then closes the control plane and the ledger. Responses a checkpoint
// holds are never delivered once closing starts: their streams are reset,
// as a crash would leave them, and the restored agent re-issues them.
func (s *Server) Close(ctx context.Context) error {
	s.hooks.beginShutdown()
	err := s.Server.Close(ctx)
	s.hooks.close()
	if lerr := s.ledger.Close(); lerr != nil && !errors.Is(lerr, tokencapture.ErrClosed) {
		err = errors.Join(err, fmt.Errorf("close capture ledger: %w", lerr))
	}
	s.upstream.close()
	return err
}

// metrics are the server's own Prometheus series.
type metrics struct {
	calls           *prometheus.CounterVec
	tokens          *prometheus.CounterVec
	captureFailures prometheus.Counter
	inFlight        prometheus.Gauge
	upstreamSeconds prometheus.Histogram
}

// ledgerCollector reports the capture ledger's size at each scrape (one
// pass over its index for the three gauges): what a long collection
// accumulates until the trainer retires its rollouts.
type ledgerCollector struct {
	l                 *tokencapture.Ledger
	keys, rows, bytes *prometheus.Desc
}

func newLedgerCollector(l *tokencapture.Ledger) *ledgerCollector {
	return &ledgerCollector{
		l:     l,
		keys:  prometheus.NewDesc("gymfleet_capture_ledger_keys", "Capture keys (rollout attempts) holding a ledger.", nil, nil),
		rows:  prometheus.NewDesc("gymfleet_capture_ledger_rows", "Ledger rows (captured model calls) of those keys.", nil, nil),
		bytes: prometheus.NewDesc("gymfleet_capture_ledger_bytes", "Bytes of ledger records those keys need on disk.", nil, nil),
	}
}

func (c *ledgerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.keys
	ch <- c.rows
	ch <- c.bytes
}

func (c *ledgerCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.l.Stats()
	ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(st.Keys))
	ch <- prometheus.MustNewConstMetric(c.rows, prometheus.GaugeValue, float64(st.Rows))
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(st.Bytes))
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gymfleet_model_calls_total",
			Help: "Model calls answered, by route (chat, responses, models) and outcome.",
		}, []string{"route", "outcome"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gymfleet_model_tokens_total",
			Help: "Tokens of answered model calls, by kind (prompt, generation).",
		}, []string{"kind"}),
		captureFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gymfleet_model_capture_failures_total",
			Help: "Captured model calls answered without a usable ledger row.",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gymfleet_model_calls_in_flight",
			Help: "Model calls admitted and not yet answered.",
		}),
		upstreamSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "gymfleet_model_upstream_seconds",
			Help:    "Time from sending a call upstream to its complete reply.",
			Buckets: []float64{.005, .02, .1, .5, 1, 2, 5, 10, 30, 60, 300},
		}),
	}
	reg.MustRegister(m.calls, m.tokens, m.captureFailures, m.inFlight, m.upstreamSeconds)
	return m
}
