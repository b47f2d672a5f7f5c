// Package vllmcut is the inference worker's side of generation cuts (SPEC
// §6) for a real vLLM: a sidecar in front of vLLM's OpenAI server that the
// policy model server uses as its upstream.
//
// Every route is proxied to vLLM unchanged, with these exceptions. A
// non-streaming chat call the model server names (X-Ng-Model-Call-Id and
// X-Ng-Capture-Key) is sent to vLLM with an X-Request-Id of the sidecar's,
// so a cut can abort it by id through vLLM's own
// /inference/v1/abort_requests (vLLM started with --enable-scale-out). An
// aborted non-streaming call returns what it generated with finish_reason
// "abort": that reply's token ids are the prefix, staged in this process's
// token store under gencut.StagingKey before the receipt is sent, and the
// reply reaches the model server marked X-Ng-Generation-Cut. A call that
// continues a cut (X-Ng-Continue-Cut) must render the same prompt (checked
// through vLLM's /tokenize); it continues through vLLM's /v1/completions
// with the token-id prompt prompt + prefix, and its reply is the chat reply
// of the whole generation: prefix followed by the continuation. This is how
// NeMo RL's vLLM worker continues a cut (the engine prompt is the prompt
// plus the staged prefix, and the reply restores the prefix), done from
// outside the vLLM process.
//
// A non-streaming chat call whose history carries its last turn's token ids
// (the assistant message's prompt_token_ids and generation_token_ids) is
// generated from the model's own tokens for that history, spliced in as
// NeMo RL's vLLM worker splices them, so a trajectory's token ids stay
// contiguous across turns (splice.go). A /tokenize of such a history is
// spliced the same way, so the prompt ids NeMo Gym's /tokenize fallback
// reads are the ones the call was generated from.
//
// The cut route is NeMo Gym's (POST /ng-control/v1/generation-cut, the
// inventory and receipt of nemo_gym/_checkpoint/generation_cut.py,
// pkg/checkpoint/gencut's Inventory and Receipt), which the model server
// speaks; our former body (gencut's Legacy*) is still served there and on
// POST /_ckpt/generation-cut, for a model server of an earlier release. Both
// take the same bearer token.
//
// What is not cut, and why (a failed cut only costs regeneration): streaming
// calls; calls with tools (vLLM parses tool calls out of the whole text, and
// a continued generation's text would not pass through its parser) or with
// structured outputs (the grammar's state is not in the prefix); calls that
// do not ask for token ids (the prefix is read from them); calls with n > 1.
package vllmcut

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/infra/logging"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
)

// UpstreamCutPath is NeMo Gym's worker route (GENERATION_CUT_ROUTE in
// nemo_gym/_checkpoint/generation_cut.py, NVIDIA-NeMo/Gym 012b7b66).
const UpstreamCutPath = "/ng-control/v1/generation-cut"

// Headers the model server sends (pkg/servers/modelproxy) and vLLM reads.
const (
	HeaderCaptureKey  = "X-Ng-Capture-Key"
	HeaderModelCallID = "X-Ng-Model-Call-Id"
	// HeaderRequestID is vLLM's: its external request id becomes
	// "chatcmpl-<id>" (chat) or "cmpl-<id>" (completions), the ids
	// /inference/v1/abort_requests takes (vllm/entrypoints/serve/engine/
	// serving.py _base_request_id, vLLM 0.32.0).
	HeaderRequestID = "X-Request-Id"
)

// maxReplyBytes bounds a vLLM reply the sidecar reads whole.
const maxReplyBytes = 64 << 20

// Deps are the server's collaborators; nil fields get working defaults.
type Deps struct {
	Logger   *slog.Logger
	Registry *prometheus.Registry
	Tracer   trace.TracerProvider
	// Transport reaches vLLM (nil: a pooled HTTP/1.1 transport).
	Transport http.RoundTripper
}

// Server is the cut worker.
type Server struct {
	*httpserver.Server

	cfg     Config
	log     *slog.Logger
	vllm    *url.URL
	client  *http.Client
	proxy   *httputil.ReverseProxy
	handler http.Handler

	mu     sync.Mutex
	active map[string]*call // tracked calls by model call id
	store  *tokenStore
}

// New builds a server; call Listen and Serve.
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
	if deps.Transport == nil {
		deps.Transport = &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 1024,
			IdleConnTimeout:     90 * time.Second,
		}
	}
	u, err := url.Parse(cfg.VLLMURL)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg, log: deps.Logger, vllm: u,
		client: &http.Client{Transport: deps.Transport},
		active: map[string]*call{},
		store:  newTokenStore(cfg.MaxStaged),
	}
	s.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.Out.Host = u.Host
		},
		Transport: deps.Transport,
		// Server-sent events pass through as they come.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			s.log.WarnContext(r.Context(), "vLLM did not answer", "path", r.URL.Path, "err", err)
			writeVLLMError(w, http.StatusBadGateway, "vLLM did not answer: "+err.Error())
		},
	}
	r := httpserver.NewRouter(httpserver.RouterOptions{Logger: deps.Logger, Registry: deps.Registry, Tracer: deps.Tracer})
	r.Post("/v1/chat/completions", s.handleChat)
	r.Post("/tokenize", s.handleTokenize)
	h := func(f httpserver.HandlerFunc) http.HandlerFunc { return httpserver.Handle(s.log, f) }
	r.Post(gencut.LegacyPath, h(s.handleCut))
	r.Post(UpstreamCutPath, h(s.handleCutOfEitherShape))
	r.Get("/_vllmcut/staged/*", h(s.handleStaged))
	r.NotFound(s.proxy.ServeHTTP)
	r.MethodNotAllowed(s.proxy.ServeHTTP)
	s.handler = r
	s.Server = httpserver.New(httpserver.Config{Addr: cfg.Listen, Logger: deps.Logger, HTTP: cfg.HTTP}, r)
	return s, nil
}

// Handler is the server's routes.
func (s *Server) Handler() http.Handler { return s.handler }

// Close closes the HTTP server and waits for its handlers; the server owns
// no other goroutine.
func (s *Server) Close(ctx context.Context) error { return s.Server.Close(ctx) }

// vllmURL is the URL of a vLLM route.
func (s *Server) vllmURL(path string) string {
	return s.vllm.JoinPath(path).String()
}

// postVLLM posts a JSON body to a vLLM route and reads the reply whole.
func (s *Server) postVLLM(ctx context.Context, path string, header http.Header, body []byte) (int, http.Header, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.vllmURL(path), bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes+1))
	if err != nil {
		return 0, nil, nil, err
	}
	if len(b) > maxReplyBytes {
		return 0, nil, nil, errReplyTooLarge
	}
	return resp.StatusCode, resp.Header, b, nil
}

// newRequestID is a fresh vLLM request id for one upstream request.
func newRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "ngcut-" + hex.EncodeToString(b[:])
}
