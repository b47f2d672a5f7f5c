package httpserver

import (
	"net/http"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// traceRequests gives every request a server span, child of the caller's
// W3C traceparent when the request carries one, named by the route pattern
// once routing has matched. With tracing off it only carries a caller's
// trace context through (so a process that records nothing does not cut a
// trace in two) and costs a header lookup otherwise.
func traceRequests(tp trace.TracerProvider) func(http.Handler) http.Handler {
	if !tracing.Enabled(tp) {
		return func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if len(r.Header["Traceparent"]) > 0 {
					r = r.WithContext(tracing.Extract(r.Context(), r.Header))
				}
				next.ServeHTTP(w, r)
			})
		}
	}
	tracer := tracing.NewTracer(tp)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx := tracing.Extract(r.Context(), r.Header)
			attrs := []attribute.KeyValue{tracing.AttrMethod.String(r.Method)}
			if id, ok := rollout.FromContext(ctx); ok {
				attrs = append(attrs, tracing.AttrCaptureKey.String(id.CaptureKey()))
			}
			ctx, span := tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
			rec := &statusRecorder{ResponseWriter: w}
			defer func() {
				route := "unmatched"
				if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
					route = rc.RoutePattern()
				}
				status := rec.status
				if status == 0 {
					status = http.StatusOK
				}
				span.SetName(r.Method + " " + route)
				span.SetAttributes(tracing.AttrRoute.String(route), tracing.AttrStatus.Int(status))
				if status >= 500 {
					span.SetStatus(codes.Error, http.StatusText(status))
				}
				span.End()
			}()
			next.ServeHTTP(rec, r.WithContext(ctx))
		})
	}
}
