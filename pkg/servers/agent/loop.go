package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/infra/park"
	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/sessioncookie"
	"github.com/gymfleet/gymfleet/pkg/transport/sse"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// LoopState is the turn loop's state, as NeMo Gym's SimpleAgentLoopState:
// everything a loop needs to continue from a boundary. Its slices only grow,
// which is what lets Snapshot pin them by length.
type LoopState struct {
	// Step counts model calls started by this activation (the max_steps unit).
	Step int `json:"step"`
	// PendingTools is set between a model response with function calls and
	// the end of their tool round: a loop continued from such a state runs
	// those calls before calling the model again.
	PendingTools bool `json:"pending_tools"`
	// NewOutputs is every item the loop produced: model output items and
	// function_call_output items, in order. Not the original input.
	NewOutputs []openai.Item `json:"new_outputs"`
	// Usage is the sum of every model response's usage; nil until one has usage.
	Usage             *openai.ResponseUsage `json:"usage"`
	LastModelResponse *openai.Response      `json:"last_model_response"`
	Turns             []Turn                `json:"turns"`
	ToolRecords       []ToolRecord          `json:"tool_records"`
	ModelCalls        int                   `json:"model_calls"`
}

// Turn records one model call of the loop.
type Turn struct {
	Step          int    `json:"step"`
	ResponseID    string `json:"response_id"`
	Status        string `json:"status"`
	OutputItems   int    `json:"output_items"`
	FunctionCalls int    `json:"function_calls"`
}

// ToolRecord records one function call the loop ran.
type ToolRecord struct {
	Step   int    `json:"step"`
	CallID string `json:"call_id"`
	Name   string `json:"name"`
	// Status is the resources server's HTTP status; 0 when the call was not
	// sent because its arguments were not JSON.
	Status int `json:"status"`
}

// Snapshot returns a function that builds the state as it is now. It pins
// the scalars and the current lengths of the append-only slices, so the
// state it builds is exact even when called later, while the loop has moved
// on. Call Snapshot from the goroutine running the loop; the returned
// function may be called from any goroutine.
func (st *LoopState) Snapshot() func() LoopState {
	pinned := *st
	pinned.NewOutputs = st.NewOutputs[:len(st.NewOutputs):len(st.NewOutputs)]
	pinned.Turns = st.Turns[:len(st.Turns):len(st.Turns)]
	pinned.ToolRecords = st.ToolRecords[:len(st.ToolRecords):len(st.ToolRecords)]
	if st.Usage != nil {
		// Add mutates the accumulated usage in place; copy its value now.
		u := *st.Usage
		pinned.Usage = &u
	}
	return func() LoopState { return pinned }
}

// Boundary names the three points of the loop where it is at a boundary.
type Boundary int

const (
	// BoundaryBeforeModelCall is before each model call.
	BoundaryBeforeModelCall Boundary = iota
	// BoundaryPendingTools is after a model response whose function calls
	// have not run yet (PendingTools is set).
	BoundaryPendingTools
	// BoundaryAfterToolRound is after every function call of a response ran.
	BoundaryAfterToolRound
)

// String names the boundary.
func (b Boundary) String() string {
	switch b {
	case BoundaryBeforeModelCall:
		return "before_model_call"
	case BoundaryPendingTools:
		return "pending_tools"
	case BoundaryAfterToolRound:
		return "after_tool_round"
	}
	return fmt.Sprintf("boundary(%d)", int(b))
}

// activation is one run of the turn loop: one /v1/responses call on a
// session, a stateless /v1/responses, or the loop stage of a legacy /run.
type activation struct {
	srv     *Server
	episode rollout.EpisodeID
	// resources is the resources session tool calls run in.
	resources resourcesRef
	// unprefixed sends the loop's calls without the /ng-rollout prefix: a
	// stateless call that named no episode.
	unprefixed bool
	params     *openai.ResponsesRequest
	// input is the original input as items; every model call sends input
	// followed by the state's NewOutputs.
	input []openai.Item
	state *LoopState
	// hooks take the activation through checkpoints: directLoop for a
	// stateless call or with checkpointing off.
	hooks loopHooks
}

// loopHooks is what a checkpoint participant does at the loop's boundaries.
type loopHooks interface {
	// atBoundary records st's boundary b (for a native session, as the
	// encoding an export copies; for a legacy episode, as st.Snapshot(),
	// built only if a checkpoint exports it) and, while a checkpoint is
	// open, parks there until it reopens or ctx ends.
	atBoundary(ctx context.Context, b Boundary, st *LoopState) error
	// awaitModel makes a's next model call (a.callModel), right after a
	// before-model-call boundary, parked in t until done gets its reply.
	awaitModel(t *park.Task, ctx context.Context, a *activation, done func(*openai.Response, error))
}

// resourcesRef names a resources session as a call carries it: our
// header, and the cookies its /seed_session reply set, which is all a NeMo
// Gym resources server reads (nemo_gym/server_utils.py, Gym 07d6b0d07b22).
type resourcesRef struct {
	// id is sent in X-Ng-Session-Id; empty sends no header.
	id string
	// cookies is the Cookie header to send; empty sends none.
	cookies string
}

// header is the header a call in the session carries (nil for none).
func (r resourcesRef) header() http.Header {
	var h http.Header
	if r.id != "" {
		h = http.Header{ResourcesSessionHeader: {r.id}}
	}
	return sessioncookie.Header(h, r.cookies)
}

func (s *Server) newActivation(ep rollout.EpisodeID, resources resourcesRef, params *openai.ResponsesRequest, state *LoopState) *activation {
	if state == nil {
		state = &LoopState{}
	}
	return &activation{srv: s, episode: ep, resources: resources, params: params, input: params.Input.AsItems(), state: state, hooks: directLoop{}}
}

// RunLoop runs the turn loop of one activation outside any session: for
// episode ep, with tool calls in resources session resourcesSessionID (empty
// sends none), on params. A nil or zero state starts the loop afresh; a
// state rebuilt from a boundary (LoopState's JSON) continues it, running
// the pending tool calls first when PendingTools is set. state is updated
// in place. The result is the last model response with output = every new
// item and usage = the accumulated usage.
func (s *Server) RunLoop(ctx context.Context, ep rollout.EpisodeID, resourcesSessionID string, params *openai.ResponsesRequest, state *LoopState) (*openai.Response, error) {
	return s.runActivation(ctx, s.newActivation(ep, resourcesRef{id: resourcesSessionID}, params, state))
}

// runActivation runs a loop outside any session on the calling goroutine,
// counting its outcome.
func (s *Server) runActivation(ctx context.Context, act *activation) (resp *openai.Response, err error) {
	park.Run(func(t *park.Task) {
		s.startActivationLoop(t, ctx, act, func(r *openai.Response, e error) { resp, err = r, e })
	})
	return resp, err
}

// startActivationLoop runs a loop outside any session as a task's steps,
// counting its outcome, and calls done with its result.
func (s *Server) startActivationLoop(t *park.Task, ctx context.Context, act *activation, done func(*openai.Response, error)) {
	act.start(t, ctx, func(resp *openai.Response, err error) {
		if err != nil {
			s.metrics.activations.WithLabelValues("failed").Inc()
			done(nil, err)
			return
		}
		s.metrics.activations.WithLabelValues("completed").Inc()
		done(resp, nil)
	})
}

// boundary marks that the loop is at b: with checkpointing on the hooks
// record the state's snapshot and park while a checkpoint is open.
func (a *activation) boundary(ctx context.Context, b Boundary) error {
	return a.hooks.atBoundary(ctx, b, a.state)
}

// start runs the turn loop of gym-servers §3.2 from the activation's state
// as steps of t, parked while each model call is awaited, and calls done
// with the last model response with output = NewOutputs and usage = the
// accumulated usage. A state with PendingTools first runs the last
// response's function calls.
func (a *activation) start(t *park.Task, ctx context.Context, done func(*openai.Response, error)) {
	if !a.state.PendingTools {
		a.nextTurn(t, ctx, done)
		return
	}
	a.runPendingTools(t, ctx, func(err error) {
		switch {
		case err != nil:
			done(nil, err)
		case a.maxStepsReached():
			done(a.result())
		default:
			a.nextTurn(t, ctx, done)
		}
	})
}

// nextTurn makes the loop's next turn: a model call and the tool round it
// asks for, each call awaited parked; then the turn after it, or done.
func (a *activation) nextTurn(t *park.Task, ctx context.Context, done func(*openai.Response, error)) {
	if err := a.boundary(ctx, BoundaryBeforeModelCall); err != nil {
		done(nil, err)
		return
	}
	a.state.Step++
	// A turn is a model call and the tool round it asks for.
	tctx, turn := a.startTurnSpan(ctx)
	endTurn := func(finished bool, err error) {
		tracing.Fail(turn, err)
		turn.End()
		switch {
		case err != nil:
			done(nil, err)
		case finished || a.maxStepsReached():
			done(a.result())
		default:
			a.nextTurn(t, ctx, done)
		}
	}
	a.hooks.awaitModel(t, tctx, a, func(resp *openai.Response, err error) {
		if err != nil {
			endTurn(false, err)
			return
		}
		a.afterModel(t, tctx, resp, endTurn)
	})
}

// runPendingTools runs the tool calls of a state restored with them
// pending, then calls done.
func (a *activation) runPendingTools(t *park.Task, ctx context.Context, done func(error)) {
	st := a.state
	if st.LastModelResponse == nil {
		done(apierror.New(apierror.InvalidCheckpointState, "loop state has pending tools but no model response"))
		return
	}
	// A state restored at this boundary is at it again: an activation
	// continued while a checkpoint is open parks before any tool runs.
	if err := a.boundary(ctx, BoundaryPendingTools); err != nil {
		done(err)
		return
	}
	a.runTools(t, ctx, openai.FunctionCalls(st.lastOutput()), func(err error) {
		if err != nil {
			done(err)
			return
		}
		st.PendingTools = false
		done(a.boundary(ctx, BoundaryAfterToolRound))
	})
}

// startTurnSpan starts a turn's span.
func (a *activation) startTurnSpan(ctx context.Context) (context.Context, trace.Span) {
	ctx, span := a.srv.tracer.Start(ctx, tracing.SpanTurn)
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrStep.Int(a.state.Step))
	}
	return ctx, span
}

// afterModel records a model response in the loop state and runs the
// tool calls it asks for, each awaited parked; done gets whether the loop
// ends with it.
func (a *activation) afterModel(t *park.Task, ctx context.Context, resp *openai.Response, done func(finished bool, err error)) {
	st := a.state
	calls := openai.FunctionCalls(resp.Output)
	st.ModelCalls++
	st.NewOutputs = append(st.NewOutputs, resp.Output...)
	if resp.Usage != nil {
		if st.Usage == nil {
			u := *resp.Usage
			st.Usage = &u
		} else {
			st.Usage.Add(resp.Usage)
		}
	}
	// The response's items are in NewOutputs already; the state keeps
	// the rest of it (ids, model, echoed parameters) for the reply, so a
	// checkpoint does not carry every item twice.
	last := *resp
	last.Output = nil
	st.LastModelResponse = &last
	st.Turns = append(st.Turns, Turn{Step: st.Step, ResponseID: resp.ID, Status: resp.Status, OutputItems: len(resp.Output), FunctionCalls: len(calls)})
	switch {
	case resp.IncompleteDetails != nil:
		done(true, nil)
		return
	case len(calls) == 0 && openai.HasAssistantMessage(resp.Output):
		done(true, nil)
		return
	case len(calls) == 0:
		done(false, nil)
		return
	}
	st.PendingTools = true
	if err := a.boundary(ctx, BoundaryPendingTools); err != nil {
		done(false, err)
		return
	}
	a.runTools(t, ctx, calls, func(err error) {
		if err != nil {
			done(false, err)
			return
		}
		st.PendingTools = false
		done(false, a.boundary(ctx, BoundaryAfterToolRound))
	})
}

// lastOutput is the last model response's output: the items of the last
// turn, at the end of NewOutputs.
func (st *LoopState) lastOutput() []openai.Item {
	if len(st.Turns) == 0 {
		return nil
	}
	n := st.Turns[len(st.Turns)-1].OutputItems
	if n > len(st.NewOutputs) {
		n = len(st.NewOutputs)
	}
	return st.NewOutputs[len(st.NewOutputs)-n:]
}

func (a *activation) maxStepsReached() bool {
	return a.srv.cfg.MaxSteps > 0 && a.state.Step >= a.srv.cfg.MaxSteps
}

// result is the last model response with the loop's output and usage.
func (a *activation) result() (*openai.Response, error) {
	st := a.state
	if st.LastModelResponse == nil {
		return nil, apierror.New(apierror.Internal, "the loop ended without a model response")
	}
	out := *st.LastModelResponse
	out.Output = slices.Clone(st.NewOutputs)
	if out.Output == nil {
		out.Output = []openai.Item{}
	}
	out.Usage = nil
	if st.Usage != nil {
		u := *st.Usage
		out.Usage = &u
	}
	return &out, nil
}

// callModel sends the original input plus every new output to the model
// server, parked in t until the reply, which done gets; every other
// parameter passes through unchanged. A streamed call is read on the
// step's goroutine.
func (a *activation) callModel(t *park.Task, ctx context.Context, done func(*openai.Response, error)) {
	req, u := a.modelRequest()
	ctx, span := a.startModelSpan(ctx, req.Model)
	finish := func(resp *openai.Response, err error) {
		if err != nil {
			err = upstream(ctx, "model server", err)
			tracing.Fail(span, err)
			resp = nil
		}
		span.End()
		done(resp, err)
	}
	if a.srv.cfg.Stream {
		finish(a.srv.postStreaming(ctx, u, req))
		return
	}
	resp := new(openai.Response)
	w := t.Hold()
	httpclient.StartJSON(ctx, a.srv.client, u, nil, req, resp, func(_ *httpclient.Reply, err error) {
		w.ResumeHere(func() { finish(resp, err) })
	})
}

// modelRequest is the next model call's request and URL.
func (a *activation) modelRequest() (*openai.ResponsesRequest, string) {
	req := *a.params
	// The request refers to the input and the outputs so far, not a copy
	// of them: it is held for as long as the call is out, and encoded
	// again only to be sent again. NewOutputs only grows, so its first n
	// items stay as they are while the loop waits.
	n := len(a.state.NewOutputs)
	req.Input = openai.Input{Items: a.input, Then: a.state.NewOutputs[:n:n], IsItems: true}
	req.Stream = nil
	if a.srv.cfg.Stream {
		stream := true
		req.Stream = &stream
	}
	a.srv.metrics.modelCalls.Inc()
	return &req, baseURL(a.srv.cfg.modelURL(a.episode.RolloutID)) + a.path("/v1/responses")
}

// startModelSpan starts the model call's span.
func (a *activation) startModelSpan(ctx context.Context, model string) (context.Context, trace.Span) {
	ctx, span := a.srv.tracer.Start(ctx, tracing.SpanModelCall)
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrCaptureKey.String(a.episode.CaptureKey()), tracing.AttrModel.String(model))
	}
	return ctx, span
}

// runTools runs function calls one by one, in output order, each awaited
// parked, appending each one's function_call_output; then calls done.
func (a *activation) runTools(t *park.Task, ctx context.Context, calls []openai.Item, done func(error)) {
	if len(calls) == 0 {
		done(nil)
		return
	}
	call := calls[0]
	a.callTool(t, ctx, call, func(output string, status int, err error) {
		if err != nil {
			done(err)
			return
		}
		st := a.state
		st.NewOutputs = append(st.NewOutputs, openai.Item{Type: openai.ItemFunctionCallOutput, CallID: call.CallID, Output: openai.TextContent(output)})
		st.ToolRecords = append(st.ToolRecords, ToolRecord{Step: st.Step, CallID: call.CallID, Name: call.Name, Status: status})
		a.runTools(t, ctx, calls[1:], done)
	})
}

// path is p under the activation's /ng-rollout prefix, or p itself for an
// unprefixed activation.
func (a *activation) path(p string) string {
	if a.unprefixed {
		return p
	}
	return rollout.Path(a.episode, p)
}

// callTool posts a call's arguments to the resources server and returns the
// reply body whatever its status: a tool error is the model's to read, not
// a failure of the loop. Only a transport error fails it. The call carries
// the session's cookies as /seed_session set them; a tool reply's
// Set-Cookie is not followed: Gym's servers set the same session id on
// every reply (its value re-signed), and the environment verifies with the
// seed's cookies, which a checkpoint holds.
func (a *activation) callTool(t *park.Task, ctx context.Context, call openai.Item, done func(output string, status int, err error)) {
	a.srv.metrics.toolCalls.Inc()
	if !codec.Valid([]byte(call.Arguments)) {
		b, err := codec.Marshal(map[string]string{"error": "Invalid tool call arguments: " + call.Arguments})
		if err != nil {
			done("", 0, apierror.Wrap(apierror.Internal, err))
			return
		}
		done(string(b), 0, nil)
		return
	}
	u := baseURL(a.srv.cfg.resourcesURL(a.episode.RolloutID)) + a.path("/"+url.PathEscape(call.Name))
	ctx, span := a.srv.tracer.Start(ctx, tracing.SpanToolCall)
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrCaptureKey.String(a.episode.CaptureKey()), tracing.AttrTool.String(call.Name))
	}
	w := t.Hold()
	httpclient.Start(ctx, a.srv.client, http.MethodPost, u, a.resources.header(), []byte(call.Arguments), func(rep *httpclient.Reply, err error) {
		w.ResumeHere(func() {
			if err != nil {
				err = upstream(ctx, "resources server", err)
				tracing.Fail(span, err)
				span.End()
				done("", 0, err)
				return
			}
			if span.IsRecording() {
				span.SetAttributes(tracing.AttrStatus.Int(rep.Status))
			}
			span.End()
			// Our servers end a JSON reply with a newline; it is framing, not
			// part of the tool's output, and NeMo Gym's tool outputs carry
			// none.
			done(strings.TrimRight(string(rep.Body), "\r\n"), rep.Status, nil)
		})
	})
}

// upstream turns a failed call into upstream_error, unless the activation's
// own context ended, which is reported as its cause.
func upstream(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	var e *apierror.Error
	if errors.As(err, &e) {
		return &apierror.Error{Code: apierror.UpstreamError, Detail: fmt.Sprintf("%s answered %s: %s", what, e.Code, e.Detail)}
	}
	return &apierror.Error{Code: apierror.UpstreamError, Detail: fmt.Sprintf("%s: %v", what, err)}
}

// postStreaming posts a streaming Responses request and reads the SSE reply
// into the final Response.
func (s *Server) postStreaming(ctx context.Context, u string, req *openai.ResponsesRequest) (*openai.Response, error) {
	body, err := codec.Marshal(req)
	if err != nil {
		return nil, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	resp, err := s.client.Do(hreq)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		rep := &httpclient.Reply{Status: resp.StatusCode, Header: resp.Header, Body: b}
		return nil, rep.Err(u)
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/json" {
		// A server that ignores stream: true answers one JSON object.
		var out openai.Response
		b, err := httpclient.ReadReply(resp)
		if err != nil {
			return nil, err
		}
		if err := codec.Unmarshal(b, &out); err != nil {
			return nil, fmt.Errorf("decoding reply: %w", err)
		}
		return &out, nil
	}
	return readResponseStream(resp.Body)
}

// readResponseStream reads a Responses SSE stream to its terminal event and
// returns the response it carries. When that response lists no output, the
// items of the output_item.done events stand in, in output_index order.
func readResponseStream(r io.Reader) (*openai.Response, error) {
	rd := sse.NewReader(r)
	done := map[int]openai.Item{}
	for {
		ev, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the Responses stream ended without response.completed")
		}
		if err != nil {
			return nil, fmt.Errorf("reading the Responses stream: %w", err)
		}
		if len(bytes.TrimSpace(ev.Data)) == 0 || string(ev.Data) == sse.Done {
			continue
		}
		var e openai.StreamEvent
		if err := codec.Unmarshal(ev.Data, &e); err != nil {
			return nil, fmt.Errorf("decoding a Responses stream event: %w", err)
		}
		typ := e.Type
		if typ == "" {
			typ = ev.Name
		}
		switch typ {
		case openai.EventOutputItemDone:
			if e.Item != nil && e.OutputIndex != nil {
				done[*e.OutputIndex] = *e.Item
			}
		case openai.EventResponseCompleted, openai.EventResponseIncomplete:
			if e.Response == nil {
				return nil, fmt.Errorf("%s event carries no response", typ)
			}
			if len(e.Response.Output) == 0 && len(done) > 0 {
				idx := make([]int, 0, len(done))
				for i := range done {
					idx = append(idx, i)
				}
				slices.Sort(idx)
				for _, i := range idx {
					e.Response.Output = append(e.Response.Output, done[i])
				}
			}
			return e.Response, nil
		case openai.EventResponseFailed:
			detail := "response.failed"
			if e.Response != nil && len(e.Response.Error) > 0 {
				detail += ": " + string(e.Response.Error)
			}
			return nil, errors.New(detail)
		case openai.EventResponseErrorGeneric:
			return nil, fmt.Errorf("stream error %s: %s", e.Code, e.Message)
		}
	}
}
