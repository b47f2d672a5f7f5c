// Package fakeinference is the deterministic vLLM stand-in the fleet's tests,
// demos and benchmarks run against.
//
// It answers vLLM's OpenAI-compatible routes (GET /v1/models, POST
// /v1/chat/completions as JSON or SSE, POST /tokenize) with a scripted policy
// over a tokenizer of its own, so the same request always gives the same
// tokens, ids and logprobs. It is as strict as vLLM: vLLM's nested error
// body on every error, 404 for a model it does not serve, vLLM's checks of
// token limits (errors.go, chat.go). Scripts can also fail a call mid-stream
// as vLLM does, truncate a stream, or add routed_experts (faults.go).
// Generation is paced token by token, so calls are really in flight for a
// while. Test control routes under /_ctl/ hold,
// release, script and count calls, and POST /ng-control/v1/generation-cut is the
// inference worker's side of the checkpoint protocol: it stops generations,
// stages their prefixes in the token store this process keeps, and a later
// call continues a staged prefix. The token store lives in this process on
// purpose: like a real inference server, it survives a crash of the rest of
// the fleet.
package fakeinference

import (
	"container/list"
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/infra/logging"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

// Request and reply headers (docs/WIRE.md, "Identity and headers").
const (
	// HeaderCaptureKey attributes a call to a rollout attempt.
	HeaderCaptureKey = "X-Ng-Capture-Key"
	// HeaderModelCallID is the model call id the capture ledger uses; the
	// call log and generation cuts name calls by it.
	HeaderModelCallID = "X-Ng-Model-Call-Id"
	// HeaderContinueCut asks a call to continue a staged prefix.
	HeaderContinueCut = gencut.HeaderContinueCut
	// HeaderGenerationCut is set on a reply cut by a generation cut: the
	// staging key of its prefix.
	HeaderGenerationCut = gencut.HeaderGenerationCut
)

// Deps are the server's collaborators; nil fields get working defaults.
type Deps struct {
	Logger   *slog.Logger
	Registry *prometheus.Registry
	// Tracer records the server's spans (pkg/infra/tracing); nil records none.
	Tracer trace.TracerProvider
}

// Server is the fake inference server.
type Server struct {
	*httpserver.Server

	cfg        Config
	log        *slog.Logger
	tok        Tokenizer
	metrics    *metrics
	handler    http.Handler
	created    int64
	baseScript *Script
	// closing ends held calls and generations when the server closes, so
	// Close does not wait out its grace period on calls that would never
	// finish by themselves.
	closing   chan struct{}
	closeOnce sync.Once

	mu         sync.Mutex
	seq        int              // calls admitted since start; never reset
	calls      []*call          // the call log, in arrival order
	byID       map[string]*call // latest call with each id
	active     map[string]*call // generating calls by id
	perRollout map[string]int   // calls received per rollout id
	hold       *HoldRequest
	waiters    *list.List // held calls, oldest first
	script     *Script    // set by POST /_ctl/script
	cuts       [][]string
	staged     map[string]*stagedPrefix
	counts     CallCount
}

// New builds a server; call Listen and Serve (or use Handler in process).
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
	s := &Server{
		cfg:     cfg,
		log:     deps.Logger,
		tok:     NewTokenizer(cfg.VocabSize),
		metrics: newMetrics(deps.Registry),
		created: time.Now().Unix(),
		closing: make(chan struct{}),
		waiters: list.New(),
	}
	s.resetLocked()
	if cfg.Script != "" {
		sc, err := ParseScript(cfg.Script)
		if err != nil {
			return nil, err
		}
		if !sc.IsZero() {
			s.baseScript = sc
		}
	}
	r := httpserver.NewRouter(httpserver.RouterOptions{Logger: deps.Logger, Registry: deps.Registry, Tracer: deps.Tracer, Pprof: cfg.Pprof})
	s.routes(r)
	s.handler = r
	s.Server = httpserver.New(httpserver.Config{Addr: cfg.Listen, Logger: deps.Logger, HTTP: cfg.HTTP}, r)
	return s, nil
}

func (s *Server) routes(r chi.Router) {
	r.Get("/v1/models", s.handleModels)
	r.Post("/v1/chat/completions", s.handleChat)
	r.Post("/tokenize", s.handleTokenize)
	h := func(f httpserver.HandlerFunc) http.HandlerFunc { return httpserver.Handle(s.log, f) }
	r.Route("/_ctl", func(r chi.Router) {
		r.Post("/hold", h(s.handleHold))
		r.Post("/release", h(s.handleRelease))
		r.Get("/call_count", h(s.handleCallCount))
		r.Get("/calls", h(s.handleCalls))
		r.Post("/script", h(s.handleScript))
		r.Get("/script", h(s.handleGetScript))
		r.Get("/cuts", h(s.handleCuts))
		r.Post("/reset", h(s.handleReset))
	})
	r.Post(gencut.Path, h(s.handleGenerationCut))
	r.Post(gencut.LegacyPath, h(s.handleGenerationCut))
}

// Handler is the server's routes, for tests that serve it in process.
func (s *Server) Handler() http.Handler { return s.handler }

// Tokenizer is the server's tokenizer (its vocab_size).
func (s *Server) Tokenizer() Tokenizer { return s.tok }

// Close ends held calls and generations, then closes the HTTP server and
// waits for its handlers. The server owns no other goroutine.
func (s *Server) Close(ctx context.Context) error {
	s.closeOnce.Do(func() { close(s.closing) })
	return s.Server.Close(ctx)
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	httpserver.WriteJSON(w, http.StatusOK, openai.ModelList{
		Object: "list",
		Data:   []openai.Model{{ID: s.cfg.Model, Object: "model", Created: s.created, OwnedBy: "gymfleet"}},
	})
}
