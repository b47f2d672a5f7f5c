package httpserver

import (
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// edge is the fleet's own middleware as one handler: metrics outermost
// (a recovered panic counts as the 500 the client got), panic recovery,
// the body limit, the /ng-rollout/<capture_key>/ prefix, and a server
// span named by the route (after the prefix is stripped, so the span names
// its capture key). One frame, not five: a request held for a rollout
// parks with every frame beneath its handler on its goroutine's stack,
// and that stack is most of what a held rollout costs a server.
type edge struct {
	next    http.Handler
	metrics *httpMetrics
	log     *slog.Logger
	// writeError answers the edge's own refusals (a malformed prefix, a
	// recovered panic) in the server's error shape.
	writeError func(http.ResponseWriter, *http.Request, error)
	maxBody    int64
	// tracer is off with tracing off: a caller's trace context is then
	// only carried through.
	tracer tracing.Tracer
}

func newEdge(m *httpMetrics, writeError func(http.ResponseWriter, *http.Request, error), log *slog.Logger, maxBody int64, tp trace.TracerProvider) func(http.Handler) http.Handler {
	var tracer tracing.Tracer
	if tracing.Enabled(tp) {
		tracer = tracing.NewTracer(tp)
	}
	return func(next http.Handler) http.Handler {
		return &edge{next: next, metrics: m, log: log, writeError: writeError, maxBody: maxBody, tracer: tracer}
	}
}

func (e *edge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &statusRecorder{ResponseWriter: w}
	start := time.Now()
	e.metrics.inflight.Inc()
	var span trace.Span
	defer e.finish(rec, r, start, &span)
	if r.Body != nil {
		r.Body = http.MaxBytesReader(rec, r.Body, e.maxBody)
	}
	inner, err := rollout.Unprefix(r)
	if err != nil {
		e.writeError(rec, r, apierror.Wrap(apierror.InvalidRequest, err))
		return
	}
	if e.tracer.On() {
		inner, span = e.startSpan(inner)
	} else if len(inner.Header["Traceparent"]) > 0 {
		inner = inner.WithContext(tracing.Extract(inner.Context(), inner.Header))
	}
	e.next.ServeHTTP(rec, inner)
}

// startSpan starts the request's server span, child of the caller's
// traceparent when it sent one.
func (e *edge) startSpan(r *http.Request) (*http.Request, trace.Span) {
	ctx := tracing.Extract(r.Context(), r.Header)
	attrs := []attribute.KeyValue{tracing.AttrMethod.String(r.Method)}
	if id, ok := rollout.FromContext(ctx); ok {
		attrs = append(attrs, tracing.AttrCaptureKey.String(id.CaptureKey()))
	}
	ctx, span := e.tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
	return r.WithContext(ctx), span
}

// finish is deferred by ServeHTTP: it recovers a handler's panic (answered
// 500 and logged; http.ErrAbortHandler passes on once counted), ends the
// span and counts the request.
func (e *edge) finish(rec *statusRecorder, r *http.Request, start time.Time, span *trace.Span) {
	v := recover()
	if v != nil && v != http.ErrAbortHandler {
		e.log.ErrorContext(r.Context(), "handler panicked", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		e.writeError(rec, r, apierror.New(apierror.Internal, "internal error"))
	}
	route := "unmatched"
	if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
		route = rc.RoutePattern()
	}
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	if s := *span; s != nil {
		s.SetName(r.Method + " " + route)
		s.SetAttributes(tracing.AttrRoute.String(route), tracing.AttrStatus.Int(status))
		if status >= 500 {
			s.SetStatus(codes.Error, http.StatusText(status))
		}
		s.End()
	}
	e.metrics.inflight.Dec()
	e.metrics.requests.WithLabelValues(route, r.Method, strconv.Itoa(status)).Inc()
	e.metrics.duration.WithLabelValues(route, r.Method).Observe(time.Since(start).Seconds())
	if v == http.ErrAbortHandler {
		panic(v)
	}
}
