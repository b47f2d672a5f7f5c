package tracing_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestFromEnv(t *testing.T) {
	for _, tc := range []struct {
		env      map[string]string
		exporter string
		endpoint string
		err      string
	}{
		{env: nil, exporter: "none"},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, exporter: "otlp", endpoint: "http://c:4318/v1/traces"},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/x", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://d"}, exporter: "otlp", endpoint: "http://c:4318/x"},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, exporter: "otlp"},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, exporter: "none", endpoint: "http://c/v1/traces"},
		{env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, exporter: "none"},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "jaeger"}, err: "OTEL_TRACES_EXPORTER"},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, err: "OTEL_EXPORTER_OTLP_PROTOCOL"},
	} {
		s, err := tracing.FromEnv(envOf(tc.env), "svc")
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: err = %v, want it to name %s", tc.env, err, tc.err)
			}
			continue
		}
		if err != nil || s.Exporter != tc.exporter || s.Endpoint != tc.endpoint || s.ServiceName != "svc" {
			t.Errorf("%v: %+v, %v; want exporter %s endpoint %q", tc.env, s, err, tc.exporter, tc.endpoint)
		}
	}
}

// Ensure spans reach an OTLP/HTTP endpoint, and that off is the no-op
// provider.
func TestNew_ExportsByOTLP(t *testing.T) {
	var posts atomic.Int64
	var path atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		path.Store(r.URL.Path)
		posts.Add(1)
	}))
	defer srv.Close()
	s, err := tracing.FromEnv(envOf(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL}), "svc")
	if err != nil {
		t.Fatal(err)
	}
	p, err := tracing.New(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if !tracing.Enabled(p) {
		t.Fatal("an OTLP provider is not enabled")
	}
	_, span := tracing.NewTracer(p).Start(context.Background(), "x")
	span.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if posts.Load() == 0 || path.Load() != "/v1/traces" {
		t.Errorf("%d posts to %v", posts.Load(), path.Load())
	}

	off, err := tracing.New(context.Background(), tracing.Settings{Exporter: "none"})
	if err != nil || tracing.Enabled(off) || tracing.Enabled(nil) || tracing.Enabled(noop.NewTracerProvider()) {
		t.Errorf("off: %v, %v", off, err)
	}
}

// Ensure a tracer that records nothing allocates nothing and leaves the
// context as it is; one that records starts real spans.
func TestTracer_OffCostsNothing(t *testing.T) {
	ctx := context.Background()
	off := tracing.NewTracer(nil)
	allocs := testing.AllocsPerRun(100, func() {
		c, span := off.Start(ctx, "x")
		if span.IsRecording() || c != ctx {
			t.Fatal("an off tracer recorded")
		}
		span.End()
	})
	if allocs != 0 {
		t.Errorf("an off tracer allocated %v times per span", allocs)
	}
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(ctx)
	_, span := tracing.NewTracer(tp).Start(ctx, "x")
	if !span.IsRecording() || !trace.SpanContextFromContext(trace.ContextWithSpan(ctx, span)).IsValid() {
		t.Error("an SDK tracer did not record")
	}
	span.End()
}

func TestInjectExtract(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("t").Start(context.Background(), "x")
	defer span.End()
	h := http.Header{}
	tracing.Inject(context.Background(), h)
	if len(h) != 0 {
		t.Errorf("a context without a span added %v", h)
	}
	tracing.Inject(ctx, h)
	if !strings.HasPrefix(h.Get("Traceparent"), "00-"+span.SpanContext().TraceID().String()) {
		t.Fatalf("traceparent = %q", h.Get("Traceparent"))
	}
	got := trace.SpanContextFromContext(tracing.Extract(context.Background(), h))
	if got.TraceID() != span.SpanContext().TraceID() || !got.IsRemote() {
		t.Errorf("extracted %v", got)
	}
}
