// Package tracing is the fleet's OpenTelemetry seam: the tracer provider a
// process builds from the standard OTEL_* variables, W3C trace context on
// every call between servers (client and server side), and the span and
// attribute names the checkpoint reference uses.
//
// Tracing is off unless the environment asks for it: every server then holds
// the no-op provider, the server middleware passes requests through untouched
// and the client adds no header, so the hot path pays a type check per
// request and nothing else.
package tracing

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdkresource "go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of every span the fleet starts.
const ScopeName = "github.com/gymfleet/gymfleet"

// Attribute keys. Checkpoint keys are the reference's (protocol.md §9):
// nemo.gym.checkpoint.<x>; names avoid "key" and "token", which the
// reference's span helpers redact.
const (
	AttrCheckpointID    = attribute.Key("nemo.gym.checkpoint.id")
	AttrParticipantKind = attribute.Key("nemo.gym.checkpoint.participant_kind")
	AttrInstance        = attribute.Key("nemo.gym.checkpoint.instance")
	AttrRecords         = attribute.Key("nemo.gym.checkpoint.records")
	AttrBytes           = attribute.Key("nemo.gym.checkpoint.bytes")
	AttrPhase           = attribute.Key("nemo.gym.checkpoint.phase")
	AttrBlockers        = attribute.Key("nemo.gym.checkpoint.blockers")
	AttrEpisodes        = attribute.Key("nemo.gym.checkpoint.episodes")
	AttrRollouts        = attribute.Key("nemo.gym.checkpoint.rollouts")
	AttrParticipants    = attribute.Key("nemo.gym.checkpoint.participants")
	AttrCalls           = attribute.Key("nemo.gym.checkpoint.calls")
	AttrInFlight        = attribute.Key("nemo.gym.checkpoint.in_flight")
	AttrStop            = attribute.Key("nemo.gym.checkpoint.stop")
	AttrPublished       = attribute.Key("nemo.gym.checkpoint.published")
	AttrRows            = attribute.Key("nemo.gym.checkpoint.rows")
	AttrRestarts        = attribute.Key("nemo.gym.checkpoint.restarts")

	// AttrCaptureKey names the rollout attempt a span works for (not a
	// secret: the reference's redaction is of "key" in checkpoint
	// attributes, and this one is ours).
	AttrCaptureKey = attribute.Key("gym.capture_key")
	AttrStep       = attribute.Key("gym.agent.step")
	AttrTool       = attribute.Key("gym.tool.name")
	AttrModel      = attribute.Key("gen_ai.request.model")
	AttrRoute      = attribute.Key("http.route")
	AttrMethod     = attribute.Key("http.request.method")
	AttrStatus     = attribute.Key("http.response.status_code")
)

// Checkpoint span names (protocol.md §9).
const (
	SpanCheckpointPrefix = "gym.checkpoint."
	SpanWaitReady        = "gym.checkpoint.wait_ready"
	SpanExport           = "gym.checkpoint.export"
	SpanWrite            = "gym.checkpoint.write"
	SpanRead             = "gym.checkpoint.read"
	SpanInstall          = "gym.checkpoint.install"
	SpanCoordinatePrefix = "gym.checkpoint.coordinate."
	SpanGenerationCut    = "gym.checkpoint.generation_cut"
	SpanCollectionCkpt   = "gym.checkpoint.collection.checkpoint"
	SpanCollectionRest   = "gym.checkpoint.collection.restore"
)

// Rollout span names.
const (
	SpanRollout   = "gym.rollout"
	SpanTurn      = "gym.agent.turn"
	SpanModelCall = "gym.agent.model_call"
	SpanToolCall  = "gym.agent.tool_call"
	SpanInference = "gym.model.inference"
)

// Tracer starts the fleet's spans. Its zero value, and the one built from
// nil or the no-op provider, records nothing and allocates nothing: Start
// returns the context unchanged, where the no-op SDK tracer would wrap it.
type Tracer struct{ t trace.Tracer }

// NewTracer returns the fleet's tracer from tp.
func NewTracer(tp trace.TracerProvider) Tracer {
	if !Enabled(tp) {
		return Tracer{}
	}
	return Tracer{tp.Tracer(ScopeName)}
}

// On reports whether spans are recorded.
func (t Tracer) On() bool { return t.t != nil }

// Start starts a span as trace.Tracer.Start does, when t records. Hot
// paths pass no options and set attributes only on a recording span:
// building options allocates even when nothing records.
func (t Tracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if t.t == nil {
		return ctx, noop.Span{}
	}
	return t.t.Start(ctx, name, opts...)
}

// Enabled reports whether tp records anything: nil, the no-op provider
// and a Provider New built with tracing off do not.
func Enabled(tp trace.TracerProvider) bool {
	switch p := tp.(type) {
	case nil:
		return false
	case noop.TracerProvider:
		return false
	case *Provider:
		return p != nil && p.sdk != nil
	}
	return true
}

// Inject writes the context's span as a W3C traceparent header, if it has
// one (baggage is not carried).
// A context without a span (tracing off, no caller's trace) adds nothing.
func Inject(ctx context.Context, h http.Header) {
	if trace.SpanContextFromContext(ctx).IsValid() {
		propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(h))
	}
}

// Extract returns ctx with the request's remote span context, if its
// headers carry one.
func Extract(ctx context.Context, h http.Header) context.Context {
	if len(h["Traceparent"]) == 0 {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.HeaderCarrier(h))
}

// Fail marks span as failed with err (no-op for a nil err).
func Fail(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
}

// Settings are what the OTEL_* variables ask for.
type Settings struct {
	// Exporter is "otlp" or "none".
	Exporter string
	// Endpoint is the OTLP endpoint URL (empty: the exporter's default,
	// or the OTEL_EXPORTER_OTLP_* variables it reads itself).
	Endpoint string
	// ServiceName is OTEL_SERVICE_NAME, else the process's name.
	ServiceName string
}

// FromEnv reads the standard variables: OTEL_SDK_DISABLED,
// OTEL_TRACES_EXPORTER (otlp or none), OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
// or OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL (only
// http/protobuf is built in) and OTEL_SERVICE_NAME. With neither an
// exporter nor an endpoint named, tracing is off.
func FromEnv(getenv func(string) string, service string) (Settings, error) {
	s := Settings{Exporter: "none", ServiceName: service}
	if v := strings.TrimSpace(getenv("OTEL_SERVICE_NAME")); v != "" {
		s.ServiceName = v
	}
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return s, nil
	}
	s.Endpoint = strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
	if s.Endpoint == "" {
		if base := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_ENDPOINT")); base != "" {
			s.Endpoint = strings.TrimRight(base, "/") + "/v1/traces"
		}
	}
	exp := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")))
	switch exp {
	case "":
		if s.Endpoint != "" {
			s.Exporter = "otlp"
		}
	case "none", "otlp":
		s.Exporter = exp
	default:
		return s, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: want otlp or none", exp)
	}
	if s.Exporter == "otlp" {
		switch p := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")); p {
		case "", "http/protobuf":
		default:
			return s, fmt.Errorf("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=%q: only http/protobuf is built in", p)
		}
		switch p := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_PROTOCOL")); p {
		case "", "http/protobuf":
		default:
			return s, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: only http/protobuf is built in", p)
		}
	}
	return s, nil
}

// Provider is a process's tracer provider and how to flush it.
type Provider struct {
	trace.TracerProvider
	sdk *sdktrace.TracerProvider
}

// Shutdown flushes and stops the exporter (nothing when tracing is off).
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	return p.sdk.Shutdown(ctx)
}

// New builds the provider settings ask for: the no-op provider when off,
// else an SDK provider batching spans to the OTLP/HTTP exporter.
func New(ctx context.Context, s Settings) (*Provider, error) {
	if s.Exporter != "otlp" {
		return &Provider{TracerProvider: noop.NewTracerProvider()}, nil
	}
	var opts []otlptracehttp.Option
	if s.Endpoint != "" {
		opts = append(opts, otlptracehttp.WithEndpointURL(s.Endpoint))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res := sdkresource.NewSchemaless(attribute.String("service.name", s.ServiceName))
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Provider{TracerProvider: sdk, sdk: sdk}, nil
}
