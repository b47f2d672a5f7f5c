package httpserver

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"strconv"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
	"github.com/gymfleet/gymfleet/pkg/transport/httpbody"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// DefaultMaxBodyBytes bounds request bodies unless a server sets its own.
const DefaultMaxBodyBytes = 32 << 20

// RouterOptions configures NewRouter.
type RouterOptions struct {
	Logger *slog.Logger
	// Registry is this server's own metrics registry; NewRouter registers the
	// HTTP metrics and the Go and process collectors on it.
	Registry *prometheus.Registry
	// Ready reports readiness for /readyz; nil means always ready.
	Ready func() error
	// MaxBodyBytes bounds request bodies; 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// WriteError answers the router's own refusals (a malformed rollout
	// prefix, no route, a method not allowed, a handler's panic); nil is
	// apierror.Write. A server whose routes speak another error shape
	// (the model server's OpenAI routes) answers them in it.
	WriteError func(w http.ResponseWriter, r *http.Request, err error)
	// Middleware runs after the fleet's own (recovery, metrics, limits, the
	// rollout prefix) and before routing, e.g. the checkpoint fence.
	Middleware []func(http.Handler) http.Handler
	// Tracer records a server span per request and carries the caller's
	// W3C trace context into the handler; nil or the no-op provider records
	// nothing (pkg/infra/tracing).
	Tracer trace.TracerProvider
	// Pprof mounts the net/http/pprof handlers under /debug/pprof/ on this
	// router (never on http.DefaultServeMux), so a fleet can be profiled
	// while it runs. Off by default: a profile costs CPU and shows internals.
	Pprof bool
}

// NewRouter returns a chi router with the fleet's middleware and the
// /healthz, /readyz, /metrics and / routes. The caller adds its own routes.
// Requests under /ng-rollout/<capture_key>/ are routed as if unprefixed, with
// the episode in their context (rollout.FromContext).
func NewRouter(opts RouterOptions) chi.Router {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	opts.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := newHTTPMetrics(opts.Registry)
	log := opts.Logger
	writeError := opts.WriteError
	if writeError == nil {
		writeError = func(w http.ResponseWriter, r *http.Request, err error) { apierror.Write(w, r, log, err) }
	}

	r := chi.NewRouter()
	for _, mw := range opts.Middleware {
		r.Use(mw)
	}
	r.NotFound(func(w http.ResponseWriter, req *http.Request) {
		writeError(w, req, apierror.New(apierror.NotFound, "no route %s %s", req.Method, req.URL.Path))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		writeError(w, req, apierror.New(apierror.MethodNotAllowed, "method %s not allowed on %s", req.Method, req.URL.Path))
	})
	ok := func(w http.ResponseWriter, _ *http.Request) {
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}
	r.Get("/", ok)
	r.Get("/healthz", ok)
	r.Get("/readyz", func(w http.ResponseWriter, req *http.Request) {
		if opts.Ready != nil {
			if err := opts.Ready(); err != nil {
				apierror.Write(w, req, nil, apierror.New(apierror.Unavailable, "not ready: %v", err))
				return
			}
		}
		ok(w, req)
	})
	r.Method(http.MethodGet, "/metrics", promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{Registry: opts.Registry}))
	if opts.Pprof {
		mountPprof(r)
	}
	var tracer tracing.Tracer
	if tracing.Enabled(opts.Tracer) {
		tracer = tracing.NewTracer(opts.Tracer)
	}
	return &router{Mux: r, edge: &edge{next: r, metrics: m, log: log, writeError: writeError, maxBody: opts.MaxBodyBytes, tracer: tracer}}
}

// router is a chi router behind the fleet's edge.
type router struct {
	*chi.Mux
	edge *edge
}

func (r *router) ServeHTTP(w http.ResponseWriter, req *http.Request) { r.edge.ServeHTTP(w, req) }

// mountPprof registers the profiling handlers. pprof.Index serves the
// named profiles (heap, goroutine, allocs, block, mutex, threadcreate) from
// the path after /debug/pprof/, so the wildcard route reaches it.
func mountPprof(r chi.Router) {
	r.Get("/debug/pprof", func(w http.ResponseWriter, req *http.Request) {
		http.Redirect(w, req, "/debug/pprof/", http.StatusMovedPermanently)
	})
	r.HandleFunc("/debug/pprof/*", pprof.Index)
	r.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	r.HandleFunc("/debug/pprof/profile", pprof.Profile)
	r.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	r.HandleFunc("/debug/pprof/trace", pprof.Trace)
}

type httpMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inflight prometheus.Gauge
}

func newHTTPMetrics(reg prometheus.Registerer) *httpMetrics {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gymfleet_http_requests_total",
			Help: "HTTP requests served, by route pattern, method and status code.",
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gymfleet_http_request_duration_seconds",
			Help:    "Time to serve an HTTP request, by route pattern and method.",
			Buckets: []float64{.001, .005, .02, .1, .5, 2, 10, 60, 300},
		}, []string{"route", "method"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gymfleet_http_requests_in_flight",
			Help: "HTTP requests being served.",
		}),
	}
	reg.MustRegister(m.requests, m.duration, m.inflight)
	return m
}

// ReadBody reads a request body, mapping an oversized body to body_too_large.
func ReadBody(r *http.Request) ([]byte, error) {
	if r.Body == nil {
		return nil, nil
	}
	b, err := httpbody.Read(r.Body, r.ContentLength, presizeBodyBytes)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, apierror.New(apierror.BodyTooLarge, "request body is larger than %d bytes", tooBig.Limit)
		}
		return nil, apierror.New(apierror.InvalidRequest, "reading request body: %v", err)
	}
	return b, nil
}

// presizeBodyBytes is the most of a body's declared length allocated
// before its bytes arrive (httpbody.Read).
const presizeBodyBytes = 1 << 20

// DecodeJSON reads and decodes a JSON request body into v, ignoring unknown
// fields (data-plane bodies pass task fields through).
func DecodeJSON(r *http.Request, v any) error {
	b, err := ReadBody(r)
	if err != nil {
		return err
	}
	if len(b) == 0 {
		return apierror.New(apierror.InvalidRequest, "request body is empty; expected a JSON object")
	}
	if err := codec.Unmarshal(b, v); err != nil {
		return apierror.New(apierror.InvalidRequest, "%s", codec.DescribeError(err))
	}
	return nil
}

// DecodeJSONStrict decodes a JSON request body into v and refuses unknown
// fields and trailing data (control bodies). v must point to a zero value.
// A body that is not JSON at all is a 400, as on every other route; JSON
// that does not fit v (an unknown field, a wrong type) is a 422.
func DecodeJSONStrict(r *http.Request, v any) error {
	b, err := ReadBody(r)
	if err != nil {
		return err
	}
	if len(b) == 0 {
		return apierror.New(apierror.InvalidRequest, "request body is empty; expected a JSON object")
	}
	if err := codec.UnmarshalStrictFast(b, v); err != nil {
		e := apierror.New(apierror.InvalidRequest, "%s", codec.DescribeError(err))
		// Checked only on failure: control bodies can name 100,000
		// episodes, and a valid one is not scanned twice.
		if !codec.Valid(b) {
			return e
		}
		return e.WithStatus(http.StatusUnprocessableEntity)
	}
	return nil
}

// WriteJSON writes v as a JSON reply.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := codec.Marshal(v)
	if err != nil {
		b, _ = codec.MarshalStable(apierror.Envelope{Error: apierror.Body{Code: apierror.Internal, Detail: "encoding reply: " + err.Error()}})
		status = http.StatusInternalServerError
	}
	WriteRawJSON(w, status, b)
}

// WriteRawJSON writes already-encoded JSON.
func WriteRawJSON(w http.ResponseWriter, status int, b []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(b)
	_, _ = w.Write([]byte{'\n'})
}

// HandlerFunc is the shape of most fleet handlers: return a reply value or an
// error, and let Handle write either.
type HandlerFunc func(r *http.Request) (any, error)

// Handle adapts a HandlerFunc: a nil error writes the reply as JSON 200 (or
// the reply's own status if it is a Reply), an error goes through apierror.
func Handle(log *slog.Logger, h HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := h(r)
		drainBody(r)
		writeResult(w, r, log, v, err)
	}
}

// writeResult writes a handler's reply value, or its error through
// apierror.
func writeResult(w http.ResponseWriter, r *http.Request, log *slog.Logger, v any, err error) {
	if err != nil {
		apierror.Write(w, r, log, err)
		return
	}
	switch rep := v.(type) {
	case Reply:
		for k, vs := range rep.Header {
			w.Header()[k] = vs
		}
		status := rep.Status
		if status == 0 {
			status = http.StatusOK
		}
		if raw, ok := rep.Body.(codec.RawMessage); ok {
			WriteRawJSON(w, status, raw)
			return
		}
		WriteJSON(w, status, rep.Body)
	case codec.RawMessage:
		WriteRawJSON(w, http.StatusOK, rep)
	default:
		WriteJSON(w, http.StatusOK, v)
	}
}

// drainBody reads what a handler left of the request body (up to the
// route's body limit). Over HTTP/2 a reply completed before the request's
// END_STREAM makes the server reset the stream and then reset again every
// DATA frame still on its way, a burst of control frames per request on a
// busy connection; a handler that ignores its body (close_session) caused
// thousands per 50k-rollout run.
func drainBody(r *http.Request) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
	}
}

// Reply is a handler result with its own status or headers.
type Reply struct {
	Status int
	Header http.Header
	Body   any
}
