package modelproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/infra/park"
	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

// Headers between the server and its upstream (docs/WIRE.md).
const (
	// HeaderCaptureKey and HeaderModelCallID name a captured call.
	HeaderCaptureKey  = "X-Ng-Capture-Key"
	HeaderModelCallID = "X-Ng-Model-Call-Id"
	// HeaderContinueCut asks the worker to continue a staged prefix.
	HeaderContinueCut = gencut.HeaderContinueCut
	// HeaderGenerationCut marks a reply a generation cut stopped: the
	// staging key of its prefix.
	HeaderGenerationCut = gencut.HeaderGenerationCut
)

// maxErrorText bounds the upstream text an error reply quotes.
const maxErrorText = 2048

// inferenceSpan starts the span of one call to the inference server, the
// leaf of a rollout's trace; the call carries it as its traceparent.
func (s *Server) inferenceSpan(ctx context.Context, t *ticket, stream bool) (context.Context, trace.Span) {
	ctx, span := s.tracer.Start(ctx, tracing.SpanInference)
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrModel.String(s.cfg.Upstream.Model), attribute.Bool("gym.model.stream", stream),
			attribute.String("gym.model.call_id", t.callID))
		if t.captureKey != "" {
			span.SetAttributes(tracing.AttrCaptureKey.String(t.captureKey))
		}
	}
	return ctx, span
}

// callUpstream posts a chat request and returns the upstream response, whose
// body the caller reads and closes (which ends the call on its worker). A
// non-2xx reply is read here and returned as upstreamStatus.
//
// With several workers a call the chosen worker provably never processed
// (httpclient.NeverProcessed) goes to the next one, and so does a
// continuation a worker refused (its staged prefix is on another worker, as
// after a restore): neither can have generated anything. A worker that
// failed otherwise is passed over for a while, but the call is not sent
// again: it may have been generated.
func (s *Server) callUpstream(ctx context.Context, t *ticket, body []byte, stream bool) (*http.Response, error) {
	client, err := s.upstream.client(ctx)
	if err != nil {
		// The upstream was never reached: nothing was sent.
		return nil, unsentError(transportError(ctx, err))
	}
	var tried []bool
	if len(s.workers) > 1 {
		tried = make([]bool, len(s.workers))
	}
	var lastErr error
	for {
		i, ok := s.acquire(t.captureKey, tried)
		if !ok {
			return nil, lastErr
		}
		t.worker.Store(int32(i))
		resp, err := s.sendChat(ctx, client, i, t, body, stream)
		if err == nil {
			s.holdUntilClosed(resp, i)
			return resp, nil
		}
		s.releaseWorker(i)
		if err = s.workerDidNotTake(ctx, t, i, err, tried); tried == nil || !tried[i] {
			return nil, err
		}
		lastErr = err
	}
}

// workerDidNotTake judges a call's failure on worker i: it returns the
// call's error, and marks the worker tried when the call is to go on to
// another one (tried is nil with a single worker): it provably never
// processed it, or refused a continuation. A worker that failed otherwise
// is passed over for a while, and the call does not go on to another
// worker; one whose connection was lost is sent again (resendLost).
func (s *Server) workerDidNotTake(ctx context.Context, t *ticket, i int, err error, tried []bool) error {
	var us *upstreamStatus
	if !errors.As(err, &us) {
		unsent := httpclient.NeverProcessed(err)
		err = transportError(ctx, s.upstream.callError(ctx, err))
		if ctx.Err() != nil {
			return err
		}
		s.workerFailed(i)
		if unsent {
			err = unsentError(err)
		}
		if tried == nil || !unsent {
			return err
		}
	} else {
		if us.status >= 500 {
			s.workerFailed(i)
		}
		refused := t.continueKey != "" && us.status >= 400 && us.status < 500 && !contextOverflow(err)
		if tried == nil || !refused {
			return err
		}
	}
	tried[i] = true
	s.workers[i].failovers.Inc()
	s.log.WarnContext(ctx, "an inference worker did not take the call; trying another", "model_call_id", t.callID, "worker", s.workers[i].chatURL, "err", err)
	return err
}

// callUpstreamWhole is callUpstream for a non-streaming call, parked in
// task until the reply has arrived whole: done gets its status and
// headers and its body read (the worker released).
func (s *Server) callUpstreamWhole(task *park.Task, ctx context.Context, t *ticket, body []byte, done func(*http.Response, []byte, error)) {
	client, err := s.upstream.client(ctx)
	if err != nil {
		done(nil, nil, unsentError(transportError(ctx, err)))
		return
	}
	var tried []bool
	if len(s.workers) > 1 {
		tried = make([]bool, len(s.workers))
	}
	s.tryWorker(task, ctx, client, t, body, tried, nil, done)
}

// tryWorker sends a call to the next worker callUpstreamWhole may try.
func (s *Server) tryWorker(task *park.Task, ctx context.Context, client *http.Client, t *ticket, body []byte, tried []bool, lastErr error, done func(*http.Response, []byte, error)) {
	i, ok := s.acquire(t.captureKey, tried)
	if !ok {
		done(nil, nil, lastErr)
		return
	}
	t.worker.Store(int32(i))
	req, err := s.chatRequest(ctx, i, t, body, false)
	if err != nil {
		s.releaseWorker(i)
		done(nil, nil, s.workerDidNotTake(ctx, t, i, err, nil))
		return
	}
	s.hooks.upstreamRunning(t, true)
	w := task.Hold()
	httpclient.StartSend(client, req, httpclient.MaxReplyBytes, func(resp *http.Response, err error) {
		var b []byte
		if err == nil {
			b, err = httpclient.ReadReply(resp)
			resp.Body.Close()
		}
		w.ResumeHere(func() {
			s.releaseWorker(i)
			if err == nil && (resp.StatusCode < 200 || resp.StatusCode > 299) {
				err = &upstreamStatus{status: resp.StatusCode, body: b[:min(len(b), 1<<20)]}
			}
			if err == nil {
				done(resp, b, nil)
				return
			}
			lost := connectionLost(ctx, err)
			if err = s.workerDidNotTake(ctx, t, i, err, tried); tried == nil || !tried[i] {
				if lost && t.lostSends < maxLostSends {
					s.resendLost(task, ctx, client, t, body, tried, err, done)
					return
				}
				done(nil, nil, err)
				return
			}
			s.tryWorker(task, ctx, client, t, body, tried, err, done)
		})
	})
}

// maxLostSends bounds the sends of one call lost with their connection: a
// worker that drops every attempt is failing the call, not a connection.
const maxLostSends = 3

// resendLost sends a call again whose connection to its worker was lost
// after it was sent and before its reply arrived, as NeMo Gym's own client
// does (nemo_gym/server_utils.py, request: ServerDisconnectedError and
// ClientOSError are retried; nemo-gym 0.7.0). The worker may have generated
// it, but the reply went with the connection: nothing of the call was
// captured or delivered, so the call is as if never answered, and a
// generation has no effect but its cost. A continuation goes with its
// staging key: a worker that no longer holds the prefix refuses it, and
// completeUpstream regenerates. While a checkpoint is open the call waits
// (parked) for admission to reopen, as a cut call does: it is then not
// generating, and no cut round lists it.
func (s *Server) resendLost(task *park.Task, ctx context.Context, client *http.Client, t *ticket, body []byte, tried []bool, err error, done func(*http.Response, []byte, error)) {
	t.lostSends++
	s.hooks.upstreamRunning(t, false)
	s.log.WarnContext(ctx, "the connection to the inference worker was lost with the call; sending it again",
		"model_call_id", t.callID, "send", t.lostSends+1, "err", err)
	s.hooks.awaitResume(task, ctx, t, func(werr error) {
		if werr != nil {
			done(nil, nil, transportError(ctx, werr))
			return
		}
		s.tryWorker(task, ctx, client, t, body, tried, err, done)
	})
}

// connectionLost reports whether err ended a call whose request went out
// because its connection to the worker was lost (closed, reset), rather
// than the worker answering, the client going away, or the request never
// leaving (which tryWorker sends again already).
func connectionLost(ctx context.Context, err error) bool {
	var us *upstreamStatus
	if ctx.Err() != nil || errors.As(err, &us) || httpclient.NeverProcessed(err) {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

// chatRequest is sendChat's request to worker i. Apart from sendChat,
// whose frame stays on the stack of a call held upstream.
func (s *Server) chatRequest(ctx context.Context, i int, t *ticket, body []byte, stream bool) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.workers[i].chatURL, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	h := req.Header
	h.Set("Content-Type", "application/json")
	if stream {
		h.Set("Accept", "text/event-stream")
	} else {
		h.Set("Accept", "application/json")
	}
	if s.cfg.Upstream.APIKey != "" {
		h.Set("Authorization", "Bearer "+s.cfg.Upstream.APIKey)
	}
	if t.captureKey != "" {
		h.Set(HeaderCaptureKey, t.captureKey)
		h.Set(HeaderModelCallID, t.callID)
	}
	if t.continueKey != "" {
		h.Set(HeaderContinueCut, t.continueKey)
	}
	return req, nil
}

// sendChat posts the call to worker i. A failure is an upstreamStatus or
// the transport's error as it is (callUpstream reads whether it was sent).
func (s *Server) sendChat(ctx context.Context, client *http.Client, i int, t *ticket, body []byte, stream bool) (*http.Response, error) {
	req, err := s.chatRequest(ctx, i, t, body, stream)
	if err != nil {
		return nil, err
	}
	s.hooks.upstreamRunning(t, true)
	// Not client.Do: its frames would stay on the stack of every call held
	// upstream (httpclient.Send).
	resp, err := httpclient.Send(client, req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, rerr := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if rerr != nil {
			return nil, rerr
		}
		return nil, &upstreamStatus{status: resp.StatusCode, body: b}
	}
	return resp, nil
}

// postChat makes a non-streaming upstream call, parked in task until its
// reply; done gets its body and, when a generation cut stopped it, the
// staging key of its prefix.
func (s *Server) postChat(task *park.Task, ctx context.Context, t *ticket, body []byte, done func(b []byte, cutKey string, err error)) {
	ctx, span := s.inferenceSpan(ctx, t, false)
	start := time.Now()
	s.callUpstreamWhole(task, ctx, t, body, func(resp *http.Response, b []byte, err error) {
		s.hooks.upstreamRunning(t, false)
		span.End()
		if err != nil {
			done(nil, "", err)
			return
		}
		s.metrics.upstreamSeconds.Observe(time.Since(start).Seconds())
		done(b, resp.Header.Get(HeaderGenerationCut), nil)
	})
}

// completeUpstream makes a non-streaming call until it has a complete
// reply, which done gets. A reply a generation cut stopped (finish_reason
// abort, with X-Ng-Generation-Cut) is not an answer: the call waits, parked,
// until admission reopens and is re-issued continuing the staged prefix, so
// the client gets the whole generation (prefix + rest) as one reply. A
// continuation the worker refuses (its prefix is gone) is retried once as a
// fresh call: a lost prefix only costs regeneration.
func (s *Server) completeUpstream(task *park.Task, ctx context.Context, t *ticket, body []byte, done func([]byte, error)) {
	s.postChat(task, ctx, t, body, func(b []byte, cutKey string, err error) {
		var us *upstreamStatus
		if err != nil && t.continueKey != "" && errors.As(err, &us) && us.status >= 400 && us.status < 500 && !contextOverflow(err) {
			s.log.WarnContext(ctx, "the worker refused to continue a generation cut; regenerating", "model_call_id", t.callID, "staging_key", t.continueKey, "err", err)
			t.continueKey = ""
			s.completeUpstream(task, ctx, t, body, done)
			return
		}
		if err != nil || cutKey == "" {
			done(b, err)
			return
		}
		t.continueKey = cutKey
		s.hooks.awaitResume(task, ctx, t, func(err error) {
			if err != nil {
				done(nil, transportError(ctx, err))
				return
			}
			s.completeUpstream(task, ctx, t, body, done)
		})
	})
}

// upstreamStatus is a non-2xx upstream reply, or an error event in the
// middle of an upstream stream (vLLM's data: {"error": {...}}, whose code is
// the status).
type upstreamStatus struct {
	status    int
	body      []byte
	midStream bool
}

func (e *upstreamStatus) Error() string {
	text := strings.TrimSpace(string(e.body))
	if len(text) > maxErrorText {
		text = text[:maxErrorText] + "..."
	}
	if e.midStream {
		return fmt.Sprintf("the upstream stream failed (%d): %s", e.status, text)
	}
	return fmt.Sprintf("upstream answered %d: %s", e.status, text)
}

// upstreamError is the error object of a vLLM error body: ErrorResponse
// {"error": {"message", "type", "param", "code"}} (vllm/entrypoints/openai/
// engine/protocol.py at 040a2cc2), or the flat shape of older vLLMs
// {"object": "error", "message", ...}.
type upstreamError struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   any    `json:"param"`
	Code    any    `json:"code"`
}

// parseUpstreamError reads the error object of an upstream error body; ok is
// false when the body is not one.
func parseUpstreamError(body []byte) (e upstreamError, ok bool) {
	var nested struct {
		Error codec.RawMessage `json:"error"`
	}
	if codec.Unmarshal(body, &nested) == nil && len(nested.Error) > 0 {
		if codec.Unmarshal(nested.Error, &e) == nil && e.Message != "" {
			return e, true
		}
		var text string
		if codec.Unmarshal(nested.Error, &text) == nil && text != "" {
			return upstreamError{Message: text}, true
		}
	}
	var flat struct {
		upstreamError
		Detail any `json:"detail"`
	}
	if codec.Unmarshal(body, &flat) == nil {
		if flat.Message != "" {
			return flat.upstreamError, true
		}
		switch d := flat.Detail.(type) {
		case string:
			if d != "" {
				return upstreamError{Message: d}, true
			}
		case []any:
			// FastAPI's request validation: [{"loc": [...], "msg": ...}].
			var msgs []string
			for _, it := range d {
				if m, isObj := it.(map[string]any); isObj {
					if text, isText := m["msg"].(string); isText {
						if loc, isList := m["loc"].([]any); isList && len(loc) > 0 {
							text = fmt.Sprint(loc[len(loc)-1]) + ": " + text
						}
						msgs = append(msgs, text)
					}
				}
			}
			if len(msgs) > 0 {
				return upstreamError{Message: strings.Join(msgs, "; ")}, true
			}
		}
	}
	return upstreamError{}, false
}

// eventError reports an upstream stream event that is vLLM's error object
// (create_streaming_error_response in vllm/entrypoints/openai/engine/
// serving.py at 00bd1493: data: {"error": {...}}, then data: [DONE]). The
// error's code is its HTTP status; anything else counts as 500.
func eventError(raw codec.RawMessage, data []byte) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	status := http.StatusInternalServerError
	if e, ok := parseUpstreamError(data); ok {
		if code, isNum := e.Code.(float64); isNum && code >= 400 && code < 600 {
			status = int(code)
		}
	}
	return &upstreamStatus{status: status, body: bytes.TrimSpace(data), midStream: true}
}

// contextOverflow reports vLLM refusing a prompt that leaves no room to
// generate. NeMo Gym answers it with an empty "length" completion, so the
// agent ends the episode as incomplete instead of failing.
func contextOverflow(err error) bool {
	var us *upstreamStatus
	if !errors.As(err, &us) || us.status != http.StatusBadRequest || us.midStream {
		return false
	}
	return bytes.Contains(us.body, []byte("maximum context length")) || bytes.Contains(us.body, []byte("max_tokens"))
}

// asAPIError turns an upstream failure into the reply's error. A 4xx keeps
// its status and vLLM's message, type and param (an SDK must not retry a
// request the backend refused), except 401 and 403, which say our own
// upstream.api_key is wrong and are the upstream's fault to the client.
// Everything else is 502 upstream_error.
func asAPIError(err error) error {
	var us *upstreamStatus
	if !errors.As(err, &us) {
		return err
	}
	if us.status >= 400 && us.status < 500 && us.status != http.StatusUnauthorized && us.status != http.StatusForbidden {
		ue, ok := parseUpstreamError(us.body)
		if !ok {
			ue.Message = us.Error()
		}
		code := apierror.InvalidRequest
		switch us.status {
		case http.StatusNotFound:
			code = apierror.NotFound
		case http.StatusRequestEntityTooLarge:
			code = apierror.BodyTooLarge
		case http.StatusRequestTimeout, http.StatusTooManyRequests:
			code = apierror.UpstreamError
		}
		e := &apierror.Error{Code: code, Detail: ue.Message, Status: us.status, Type: ue.Type, Retry: upstreamSaysRetry(us)}
		if p, isText := ue.Param.(string); isText {
			e.Param = p
		}
		return e
	}
	detail := us.Error()
	if ue, ok := parseUpstreamError(us.body); ok && !us.midStream {
		// vLLM's message, not its whole body: what an SDK shows as
		// e.message reads as a sentence.
		detail = fmt.Sprintf("upstream answered %d: %s", us.status, ue.Message)
	}
	return &apierror.Error{Code: apierror.UpstreamError, Detail: detail, Retry: upstreamSaysRetry(us)}
}

// upstreamSaysRetry reports an upstream reply that asks to be called again
// later without having generated: 408, 429 and 503 before any stream
// began. Any other failure may have generated, and the server never has
// its client send a call again that may have (x-should-retry: false), as
// it never sends one to a second worker.
func upstreamSaysRetry(us *upstreamStatus) bool {
	if us.midStream {
		return false
	}
	switch us.status {
	case http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return true
	}
	return false
}

// unsentError marks the failure of a call the upstream never received as
// one its client may send again.
func unsentError(err error) error {
	var e *apierror.Error
	if errors.As(err, &e) && e.Code == apierror.UpstreamError {
		c := *e
		c.Retry = true
		return &c
	}
	return err
}

func transportError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return apierror.New(apierror.ClientClosed, "the client went away: %v", context.Cause(ctx))
	}
	return apierror.New(apierror.UpstreamError, "calling the upstream: %v", err)
}

// syntheticOverflow is the empty completion that stands for a context
// overflow, shaped as NeMo Gym's vllm_model returns it
// (VLLMModel._create_empty_chat_completion, nemo-gym 0.7.0): no usage, so
// its Response's usage is null.
func syntheticOverflow(model string) *openai.ChatCompletion {
	return &openai.ChatCompletion{
		ID: "chtcmpl-123", Object: "chat.completion", Created: time.Now().Unix(), Model: model,
		Choices: []openai.ChatChoice{{Index: 0, FinishReason: openai.FinishLength, Message: openai.ChatMessage{Role: "assistant"}}},
	}
}

// errOverflowNoTokens is the capture failure of an overflowed call: the
// upstream generated nothing, so there are no token ids to stage.
var errOverflowNoTokens = errors.New("context length exceeded: the upstream refused the prompt and returned no token ids")

// handleModels forwards GET /v1/models. It is not a model call: no ticket,
// no gate, no capture.
func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	outcome := outcomeUpstreamError
	defer func() { s.metrics.calls.WithLabelValues(routeModels, outcome).Inc() }()
	fail := func(err error) {
		outcome = outcomeOf(err)
		apierror.WriteOpenAI(w, r, s.log, err)
	}
	i, _ := s.acquire("", nil)
	defer s.releaseWorker(i)
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, s.workers[i].modelsURL, nil)
	if err != nil {
		fail(apierror.Wrap(apierror.Internal, err))
		return
	}
	if s.cfg.Upstream.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+s.cfg.Upstream.APIKey)
	}
	client, err := s.upstream.client(r.Context())
	if err != nil {
		fail(transportError(r.Context(), err))
		return
	}
	resp, err := client.Do(req)
	if err != nil {
		fail(transportError(r.Context(), s.upstream.callError(r.Context(), err)))
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		fail(transportError(r.Context(), err))
		return
	}
	if resp.StatusCode != http.StatusOK {
		fail(asAPIError(&upstreamStatus{status: resp.StatusCode, body: b}))
		return
	}
	outcome = outcomeOK
	httpserver.WriteRawJSON(w, http.StatusOK, bytes.TrimSpace(b))
}
