package main

import (
	"context"
	"io"
	"os"
	"time"

	"golang.org/x/term"

	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
)

// newTracer is gymctl's tracer provider, from the OTEL_* variables as the
// servers' (off unless they ask): a controller's spans are the roots of
// its checkpoints' traces.
func newTracer(ctx context.Context, getenv func(string) string) (*tracing.Provider, error) {
	s, err := tracing.FromEnv(getenv, "gymctl")
	if err != nil {
		return nil, err
	}
	return tracing.New(ctx, s)
}

// shutdownTracer sends the spans still batched.
func shutdownTracer(tp *tracing.Provider) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = tp.Shutdown(ctx)
}

// isTerminal reports whether w is a terminal: only then does gymctl draw
// (a progress bar, a redrawn table); a log file or a pipe gets plain lines.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
