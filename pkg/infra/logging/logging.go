// Package logging builds the fleet's structured loggers. Every line logged with
// a request's context names the rollout attempt it is about (capture_key) and
// the trace it belongs to (trace_id, span_id), so one grep follows a rollout
// across all servers.
package logging

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// ParseLevel reads debug, info, warn or error.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.TrimSpace(s))); err != nil {
		return 0, fmt.Errorf("log level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

// New returns a JSON logger on w that tags every line with the server's kind
// and instance name, and with the capture key of the context's rollout.
func New(w io.Writer, level slog.Level, kind, instance string) *slog.Logger {
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})
	return slog.New(captureKeyHandler{h}).With("server", kind, "instance", instance)
}

// Discard returns a logger that drops everything, for tests and benchmarks.
func Discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

type captureKeyHandler struct{ slog.Handler }

func (h captureKeyHandler) Handle(ctx context.Context, r slog.Record) error {
	if id, ok := rollout.FromContext(ctx); ok {
		r.AddAttrs(slog.String("capture_key", id.CaptureKey()))
	}
	// The trace the line belongs to, when the request carries one (its
	// caller's traceparent, or this server's span with tracing on).
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h captureKeyHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return captureKeyHandler{h.Handler.WithAttrs(as)}
}

func (h captureKeyHandler) WithGroup(name string) slog.Handler {
	return captureKeyHandler{h.Handler.WithGroup(name)}
}
