package inprocess_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
	"github.com/gymfleet/gymfleet/tests/fleettest"
)

// tracedFleet is an in-process fleet whose every server records spans into
// one in-memory exporter, as processes exporting to one collector would.
type tracedFleet struct {
	*fleettest.Fleet
	exp    *tracetest.InMemoryExporter
	tp     *sdktrace.TracerProvider
	client *http.Client
	root   string
}

const traceToken = "trace-token"

func startTracedFleet(t *testing.T, stack httpconf.Stack) *tracedFleet {
	t.Helper()
	return startTracedFleetIn(t, stack, t.TempDir())
}

// startTracedFleetIn starts a traced fleet whose checkpoint root is root.
func startTracedFleetIn(t *testing.T, stack httpconf.Stack, root string) *tracedFleet {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	// Synchronous export: a span is in the exporter once it has ended.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	hc := httpconf.Config{Stack: stack}
	client := httpclient.New(httpclient.Options{H2C: true, HTTP: hc})
	t.Cleanup(client.CloseIdleConnections)
	ck := ctlplane.DefaultConfig()
	ck.Enabled, ck.ControlAuthToken, ck.Root = true, traceToken, root
	fl := fleettest.Start(t, fleettest.Options{Client: client, Tracer: tp, Checkpoint: ck, HTTP: hc})
	return &tracedFleet{Fleet: fl, exp: exp, tp: tp, client: client, root: root}
}

// spanTree indexes ended spans by id.
type spanTree struct {
	spans []tracetest.SpanStub
	byID  map[trace.SpanID]tracetest.SpanStub
}

func newSpanTree(spans tracetest.SpanStubs) *spanTree {
	st := &spanTree{spans: spans, byID: map[trace.SpanID]tracetest.SpanStub{}}
	for _, s := range spans {
		st.byID[s.SpanContext.SpanID()] = s
	}
	return st
}

func attr(s tracetest.SpanStub, k attribute.Key) string {
	for _, a := range s.Attributes {
		if a.Key == k {
			return a.Value.String()
		}
	}
	return ""
}

// parent is s's parent span, if it was recorded.
func (st *spanTree) parent(s tracetest.SpanStub) (tracetest.SpanStub, bool) {
	p, ok := st.byID[s.Parent.SpanID()]
	return p, ok && s.Parent.IsValid()
}

// ancestor is the nearest ancestor of s named name.
func (st *spanTree) ancestor(s tracetest.SpanStub, name string) (tracetest.SpanStub, bool) {
	for p, ok := st.parent(s); ok; p, ok = st.parent(p) {
		if p.Name == name {
			return p, true
		}
	}
	return tracetest.SpanStub{}, false
}

func (st *spanTree) named(name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range st.spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// render draws the tree under root as indented span names (README's sample
// comes from it).
func (st *spanTree) render(root tracetest.SpanStub) string {
	children := map[trace.SpanID][]tracetest.SpanStub{}
	for _, s := range st.spans {
		children[s.Parent.SpanID()] = append(children[s.Parent.SpanID()], s)
	}
	var b strings.Builder
	var walk func(s tracetest.SpanStub, depth int)
	walk = func(s tracetest.SpanStub, depth int) {
		fmt.Fprintf(&b, "%s%s", strings.Repeat("  ", depth), s.Name)
		if k := attr(s, tracing.AttrParticipantKind); k != "" {
			fmt.Fprintf(&b, " [%s/%s]", k, attr(s, tracing.AttrInstance))
		}
		b.WriteString("\n")
		cs := children[s.SpanContext.SpanID()]
		sort.Slice(cs, func(i, j int) bool { return cs[i].StartTime.Before(cs[j].StartTime) })
		for _, c := range cs {
			walk(c, depth+1)
		}
	}
	walk(root, 0)
	return b.String()
}

// TestTrace_OneCheckpointIsOneTrace follows one checkpoint (prepare,
// commit, resume) of the in-process fleet, on each HTTP stack, and finds
// it as one trace: the controller's coordinate spans with a stage per
// kind, and under them, for every participant, its gym.checkpoint.<op>
// span with its wait_ready, export and write stages, each naming the
// checkpoint, the participant's kind and instance. A restore of it into a
// fresh fleet is one trace too, with read and install on every participant.
func TestTrace_OneCheckpointIsOneTrace(t *testing.T) {
	for _, stack := range []httpconf.Stack{httpconf.StackLean, httpconf.StackNetHTTP} {
		t.Run(string(stack), func(t *testing.T) {
			f := startTracedFleet(t, stack)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			coord, err := coordination.Discover(ctx, f.Endpoints(), coordination.Options{Token: traceToken, Client: f.client, Tracer: f.tp})
			if err != nil {
				t.Fatal(err)
			}
			members := coord.Members()
			if len(members) != 7 { // model, 2 resources, 2 agents, 2 environments
				t.Fatalf("participants: %+v", members)
			}
			f.exp.Reset() // discovery is not part of the checkpoint

			const id = "ckpt-trace-1"
			rootCtx, root := f.tp.Tracer("test").Start(ctx, "controller.checkpoint")
			deadline := time.Now().Add(30 * time.Second)
			prep, err := coord.Prepare(rootCtx, id, deadline)
			if err != nil || !prep.Prepared {
				t.Fatalf("prepare: %+v, %v", prep, err)
			}
			if _, err := coord.Commit(rootCtx, id, f.root+"/"+id, []rollout.EpisodeID{}, deadline, false); err != nil {
				t.Fatalf("commit: %v", err)
			}
			if err := coord.Resume(rootCtx, id, deadline); err != nil {
				t.Fatalf("resume: %v", err)
			}
			root.End()

			tree := newSpanTree(f.exp.GetSpans())
			traceID := root.SpanContext().TraceID()
			for _, s := range tree.spans {
				if s.SpanContext.TraceID() != traceID {
					t.Errorf("span %s [%s/%s] is in trace %s, not the checkpoint's", s.Name, attr(s, tracing.AttrParticipantKind), attr(s, tracing.AttrInstance), s.SpanContext.TraceID())
				}
			}

			// The controller: one coordinate span per operation, a stage
			// span per kind under prepare.
			for _, op := range []string{"prepare", "commit", "resume"} {
				spans := tree.named(tracing.SpanCoordinatePrefix + op)
				if len(spans) != 1 || attr(spans[0], tracing.AttrCheckpointID) != id || attr(spans[0], tracing.AttrParticipantKind) != "controller" ||
					attr(spans[0], tracing.AttrInstance) != "coordination" || attr(spans[0], tracing.AttrParticipants) != "7" {
					t.Errorf("coordinate.%s spans: %+v", op, spans)
				}
			}
			for _, kind := range coordination.PrepareOrder {
				if n := len(tree.named(tracing.SpanCoordinatePrefix + "prepare." + kind)); n != 1 {
					t.Errorf("%d prepare stage spans of %s, want 1", n, kind)
				}
			}

			// Every participant: its operations, each under the
			// controller's, and their stages under them.
			stages := map[string][]string{
				"prepare": {tracing.SpanWaitReady},
				"commit":  {tracing.SpanExport, tracing.SpanWrite},
				"resume":  nil,
			}
			for _, m := range members {
				for op, children := range stages {
					var opSpan *tracetest.SpanStub
					for _, s := range tree.named(tracing.SpanCheckpointPrefix + op) {
						if attr(s, tracing.AttrParticipantKind) == m.Kind && attr(s, tracing.AttrInstance) == m.Instance {
							if opSpan != nil {
								t.Errorf("%s: two %s spans", m.Name, op)
							}
							opSpan = &s
						}
					}
					if opSpan == nil {
						t.Errorf("%s (%s/%s): no gym.checkpoint.%s span", m.Name, m.Kind, m.Instance, op)
						continue
					}
					if attr(*opSpan, tracing.AttrCheckpointID) != id || attr(*opSpan, tracing.AttrPhase) == "" {
						t.Errorf("%s %s: attributes %v", m.Name, op, opSpan.Attributes)
					}
					want := tracing.SpanCoordinatePrefix + op
					if op == "prepare" {
						want = tracing.SpanCoordinatePrefix + "prepare." + m.Kind
					}
					if _, ok := tree.ancestor(*opSpan, want); !ok {
						t.Errorf("%s %s: not under %s", m.Name, op, want)
					}
					for _, child := range children {
						n := 0
						for _, s := range tree.named(child) {
							p, ok := tree.parent(s)
							if ok && p.SpanContext.SpanID() == opSpan.SpanContext.SpanID() {
								n++
								if attr(s, tracing.AttrCheckpointID) != id || attr(s, tracing.AttrParticipantKind) != m.Kind || attr(s, tracing.AttrInstance) != m.Instance {
									t.Errorf("%s %s: attributes %v", m.Name, child, s.Attributes)
								}
							}
						}
						if n != 1 {
							t.Errorf("%s: %d %s spans under its %s, want 1", m.Name, n, child, op)
						}
					}
				}
			}
			for _, s := range tree.named(tracing.SpanWrite) {
				if attr(s, tracing.AttrBytes) == "" || attr(s, tracing.AttrRecords) == "" {
					t.Errorf("write span without bytes and records: %v", s.Attributes)
				}
			}
			if t.Failed() || testing.Verbose() {
				t.Logf("the trace:\n%s", tree.render(tree.named("controller.checkpoint")[0]))
			}

			// A restore into fresh processes: read and install on every
			// participant, under the controller's restore.
			f2 := startTracedFleetIn(t, stack, f.root)
			coord2, err := coordination.Discover(ctx, f2.Endpoints(), coordination.Options{Token: traceToken, Client: f2.client, Tracer: f2.tp})
			if err != nil {
				t.Fatal(err)
			}
			f2.exp.Reset()
			if _, err := coord2.Restore(ctx, id, f.root+"/"+id, []rollout.EpisodeID{}, time.Now().Add(30*time.Second)); err != nil {
				t.Fatalf("restore: %v", err)
			}
			rtree := newSpanTree(f2.exp.GetSpans())
			coordRestore := rtree.named(tracing.SpanCoordinatePrefix + "restore")
			if len(coordRestore) != 1 {
				t.Fatalf("%d coordinate.restore spans", len(coordRestore))
			}
			for _, m := range coord2.Members() {
				var op *tracetest.SpanStub
				for _, s := range rtree.named(tracing.SpanCheckpointPrefix + "restore") {
					if attr(s, tracing.AttrInstance) == m.Instance && attr(s, tracing.AttrParticipantKind) == m.Kind {
						op = &s
					}
				}
				if op == nil || op.SpanContext.TraceID() != coordRestore[0].SpanContext.TraceID() {
					t.Errorf("%s: no restore span in the restore's trace", m.Name)
					continue
				}
				for _, child := range []string{tracing.SpanRead, tracing.SpanInstall} {
					n := 0
					for _, s := range rtree.named(child) {
						if p, ok := rtree.parent(s); ok && p.SpanContext.SpanID() == op.SpanContext.SpanID() {
							n++
						}
					}
					if n != 1 {
						t.Errorf("%s: %d %s spans under its restore", m.Name, n, child)
					}
				}
			}
		})
	}
}

// TestTrace_OneRolloutIsOneTrace runs one weather rollout through the
// traced fleet, on each HTTP stack, and finds one trace from its /run down
// to the inference calls: the environment's stages, the agent's turns with
// a model call each and a tool call per tool round, the model server's
// inference call under each model call, and the inference server's and the
// resources server's request spans under those.
func TestTrace_OneRolloutIsOneTrace(t *testing.T) {
	row := loadDataset(t, "weather.jsonl")[0]
	for _, stack := range []httpconf.Stack{httpconf.StackLean, httpconf.StackNetHTTP} {
		t.Run(string(stack), func(t *testing.T) {
			f := startTracedFleet(t, stack)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			key := "trace-" + string(stack)
			if _, err := httpclient.PostJSON(ctx, f.client, f.EnvURLs["single_agent_turn"]+"/run", nil, row.withID(key), nil); err != nil {
				t.Fatalf("/run: %v", err)
			}
			tree := newSpanTree(f.exp.GetSpans())

			var runs []tracetest.SpanStub
			for _, s := range tree.named("POST /run") {
				if !s.Parent.IsValid() {
					runs = append(runs, s)
				}
			}
			if len(runs) != 1 {
				t.Fatalf("%d root /run spans, want 1", len(runs))
			}
			run := runs[0]
			traceID := run.SpanContext.TraceID()
			// Every span naming the rollout is in the /run's trace.
			for _, s := range tree.spans {
				if attr(s, tracing.AttrCaptureKey) == key && s.SpanContext.TraceID() != traceID {
					t.Errorf("span %s of %s is in another trace", s.Name, key)
				}
			}
			inTrace := func(name string) []tracetest.SpanStub {
				var out []tracetest.SpanStub
				for _, s := range tree.named(name) {
					if s.SpanContext.TraceID() == traceID {
						out = append(out, s)
					}
				}
				return out
			}
			for _, stage := range []string{"seed", "invoke_agent", "close_agent", "verify"} {
				if n := len(inTrace("gym.env." + stage)); n != 1 {
					t.Errorf("%d gym.env.%s spans, want 1", n, stage)
				}
			}
			calls := row.modelCalls
			for name, want := range map[string]int{
				tracing.SpanTurn: calls, tracing.SpanModelCall: calls, tracing.SpanToolCall: calls - 1,
				tracing.SpanInference: calls, "POST /v1/chat/completions": calls,
			} {
				if n := len(inTrace(name)); n != want {
					t.Errorf("%d %s spans in the rollout's trace, want %d", n, name, want)
				}
			}
			for _, s := range inTrace(tracing.SpanModelCall) {
				if _, ok := tree.ancestor(s, tracing.SpanTurn); !ok {
					t.Errorf("a model call not under a turn")
				}
				if _, ok := tree.ancestor(s, "gym.env.invoke_agent"); !ok {
					t.Errorf("a model call not under the environment's invoke_agent")
				}
				if attr(s, tracing.AttrCaptureKey) != key {
					t.Errorf("model call span names %q", attr(s, tracing.AttrCaptureKey))
				}
			}
			// The model server's request span under each model call.
			var served int
			for _, s := range inTrace("POST /v1/responses") {
				if p, ok := tree.parent(s); ok && p.Name == tracing.SpanModelCall {
					served++
					if attr(s, tracing.AttrCaptureKey) != key {
						t.Errorf("the model server's span names %q", attr(s, tracing.AttrCaptureKey))
					}
				}
			}
			if served != calls {
				t.Errorf("%d model server spans under the agent's model calls, want %d", served, calls)
			}
			for _, s := range inTrace(tracing.SpanInference) {
				if _, ok := tree.ancestor(s, tracing.SpanModelCall); !ok {
					t.Errorf("an inference call not under the agent's model call")
				}
			}
			// The inference server's own span: the trace reached it.
			for _, s := range inTrace("POST /v1/chat/completions") {
				if p, ok := tree.parent(s); !ok || p.Name != tracing.SpanInference {
					t.Errorf("the inference server's span is not the inference call's child")
				}
			}
			tools := inTrace(tracing.SpanToolCall)
			for _, s := range tools {
				if attr(s, tracing.AttrTool) == "" {
					t.Errorf("tool call span without its tool")
				}
				if _, ok := tree.ancestor(s, tracing.SpanTurn); !ok {
					t.Errorf("a tool call not under a turn")
				}
			}
			var toolServed int
			for _, s := range tree.spans {
				if p, ok := tree.parent(s); ok && p.Name == tracing.SpanToolCall && strings.HasPrefix(s.Name, "POST /") {
					toolServed++
				}
			}
			if toolServed != len(tools) {
				t.Errorf("%d resources server spans under %d tool calls", toolServed, len(tools))
			}
			if t.Failed() || testing.Verbose() {
				t.Logf("the trace:\n%s", tree.render(run))
			}
			names := make([]string, 0)
			for _, s := range tree.spans {
				if s.SpanContext.TraceID() == traceID {
					names = append(names, s.Name)
				}
			}
			if !slices.Contains(names, "POST /seed_session") || !slices.Contains(names, "POST /verify") {
				t.Errorf("resources spans missing from %v", names)
			}
		})
	}
}
