package httpserver

import (
	"context"
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

	"github.com/gymfleet/gymfleet/pkg/infra/park"
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
// unless its handler parks without its goroutine (Park).
//
// It runs in front of the router, and gives each request a routing
// context of its own: chi's router otherwise takes one from a pool and
// puts it back when its handler returns, which for a parked request is
// long before the request ends.
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

func (e *edge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ex, _ := w.(*exchange)
	if ex == nil { // a router called directly, not through a Server
		ex = &exchange{ResponseWriter: w}
	}
	start := time.Now()
	e.metrics.inflight.Inc()
	var span trace.Span
	returned := false
	defer func() {
		if !returned {
			e.finish(ex, r, start, span, recover(), true)
		}
	}()
	if r.Body != nil {
		r.Body = http.MaxBytesReader(ex, r.Body, e.maxBody)
	}
	inner, err := rollout.UnprefixIn(context.WithValue(r.Context(), chi.RouteCtxKey, chi.NewRouteContext()), r)
	if err != nil {
		e.writeError(ex, r, apierror.Wrap(apierror.InvalidRequest, err))
		returned = true
		e.finish(ex, r, start, span, nil, false)
		return
	}
	r = inner
	if e.tracer.On() {
		r, span = e.startSpan(r)
	} else if len(r.Header["Traceparent"]) > 0 {
		r = r.WithContext(tracing.Extract(r.Context(), r.Header))
	}
	e.next.ServeHTTP(ex, r)
	returned = true
	if ex.afterHandler(func(panicked any) { e.finish(ex, r, start, span, panicked, false) }) {
		return
	}
	e.finish(ex, r, start, span, nil, false)
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

// finish answers a handler's panic (500, logged; http.ErrAbortHandler
// passes on once counted, when onHandler: on the handler's own goroutine),
// ends the span and counts the request. panicked is what the handler, or
// a step of its parked task (a *park.Panic), panicked with.
func (e *edge) finish(ex *exchange, r *http.Request, start time.Time, span trace.Span, panicked any, onHandler bool) {
	value, stack := panicked, []byte(nil)
	if p, ok := panicked.(*park.Panic); ok {
		value, stack = p.Value, p.Stack
	} else if panicked != nil {
		stack = debug.Stack()
	}
	if value != nil && value != http.ErrAbortHandler {
		e.log.ErrorContext(r.Context(), "handler panicked", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(value), "stack", string(stack))
		e.writeError(ex, r, apierror.New(apierror.Internal, "internal error"))
	}
	route := "unmatched"
	if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
		route = rc.RoutePattern()
	}
	status := ex.status
	if status == 0 {
		status = http.StatusOK
	}
	if span != nil {
		span.SetName(r.Method + " " + route)
		span.SetAttributes(tracing.AttrRoute.String(route), tracing.AttrStatus.Int(status))
		if status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(status))
		}
		span.End()
	}
	e.metrics.inflight.Dec()
	e.metrics.requests.WithLabelValues(route, r.Method, strconv.Itoa(status)).Inc()
	e.metrics.duration.WithLabelValues(route, r.Method).Observe(time.Since(start).Seconds())
	if onHandler && value == http.ErrAbortHandler {
		panic(value)
	}
}
