package modelproxy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/gymfleet/gymfleet/pkg/infra/park"
	"github.com/gymfleet/gymfleet/pkg/tokencapture"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Routes, as the calls metric labels them.
const (
	routeChat      = "chat"
	routeResponses = "responses"
	routeModels    = "models"
)

// Call outcomes, as the calls metric labels them.
const (
	outcomeOK             = "ok"
	outcomeOverflow       = "context_overflow"
	outcomeInvalidRequest = "invalid_request"
	outcomeUpstreamError  = "upstream_error"
	outcomeCanceled       = "canceled"
	outcomeStreamError    = "stream_error"
	outcomeStaleAttempt   = "stale_attempt"
)

// ticket is one admitted model call. It stays small: the server is meant to
// carry 100,000 of them at once, each parked (pkg/infra/park) while it
// waits: no goroutine or timer of its own.
type ticket struct {
	// captureKey is the attempt the call belongs to; "" for a call outside
	// /ng-rollout/<capture_key>/, which is never captured.
	captureKey string
	episode    rollout.EpisodeID
	// callID is the model call id: the ledger row's call_id, sent upstream
	// as X-Ng-Model-Call-Id.
	callID     string
	route      string
	admittedAt time.Time
	// worker is the index of the inference worker its upstream call went
	// to last (a cut round asks that worker).
	worker atomic.Int32
	// started is set once the response's first byte may be written. A
	// checkpoint counts calls not started as undelivered (their rows are
	// left out and the restored agent re-issues them) and waits only for
	// started ones.
	started atomic.Bool
	// running: the upstream call is in flight. Not under a shard's
	// lock: every call sets it twice, and a prepare's cut round only
	// reads it once per call, as it would have read it under the lock
	// either before or after the call set it.
	running atomic.Bool
	// continueKey is the staging key of a cut prefix the next upstream call
	// continues (X-Ng-Continue-Cut). Only the call's steps use it.
	continueKey string
	// lostSends counts the sends whose connection to the worker was lost
	// before the reply arrived (resendLost). Only the call's steps use it.
	lostSends int

	// Checkpoint bookkeeping, guarded by the lock of the participant's
	// shard the call lies in, and unused with checkpointing off.
	shard  *callShard
	cancel context.CancelCauseFunc
	// done is closed when the handler returns (retire waits on it).
	done        chan struct{}
	digest      string
	stream      bool
	constrained bool
	// held: waiting for admission to reopen (at delivery, or after a cut).
	held bool
	// unsettled: started, and its ledger row not staged yet.
	unsettled bool
	// cut is the prefix the worker staged when a checkpoint cut this call.
	cut *cutPrefix
}

// newCallID returns a random 32-hex-digit model call id.
func newCallID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// admit starts a call: it names it, notes which attempt it belongs to and
// registers it with the hooks, whose context the call's work then derives
// from; ok is false when the call was refused and answered.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, route string) (t *ticket, _ *http.Request, ok bool) {
	t = &ticket{callID: newCallID(), route: route, admittedAt: time.Now()}
	if id, ok := rollout.FromContext(r.Context()); ok {
		t.captureKey, t.episode = id.CaptureKey(), id
	}
	tracked, err := s.hooks.admit(r, t)
	if err != nil {
		apierror.WriteOpenAI(w, r, s.log, err)
		s.metrics.calls.WithLabelValues(route, outcomeOf(err)).Inc()
		return nil, r, false
	}
	s.metrics.inFlight.Inc()
	return t, tracked, true
}

// done ends a call in the metrics.
func (s *Server) done(t *ticket, outcome string) {
	s.metrics.inFlight.Dec()
	s.metrics.calls.WithLabelValues(t.route, outcome).Inc()
}

// deliver is the single point every response passes right before its first
// byte is written: JSON replies, error replies and the first event of a
// stream. The hooks may hold a response that has not started here (while a
// checkpoint holds admission closed), parked in task; done is then called.
// Nothing past this point may be undone. It fails only when the call is
// cancelled (client gone, retire, shutdown).
func (s *Server) deliver(task *park.Task, ctx context.Context, t *ticket, done func(error)) {
	if err := ctx.Err(); err != nil {
		done(err)
		return
	}
	s.hooks.deliver(task, ctx, t, done)
}

// deliverNow is deliver on the calling goroutine, which waits while the
// response is held: for a stream, whose handler's goroutine writes it.
func (s *Server) deliverNow(ctx context.Context, t *ticket) (err error) {
	park.Run(func(task *park.Task) {
		s.deliver(task, ctx, t, func(e error) { err = e })
	})
	return err
}

// captured is what a call stages in the ledger once its reply is complete.
type captured struct {
	model         string
	requestDigest string
	tokens        openai.TokenFields
	finishReason  string
	// err is why the call has no usable tokens; it becomes a failure.
	err error
}

// stage appends the call's ledger row (or records why it cannot), after the
// reply is complete and before it is delivered to the client: a row is in
// the kernel before the agent can act on the reply. A capture failure never
// fails the call.
func (s *Server) stage(ctx context.Context, t *ticket, c *captured) {
	// The response is delivered: a checkpoint may capture it now.
	defer s.hooks.settle(t, c != nil)
	if t.captureKey == "" || c == nil {
		return
	}
	if c.err != nil {
		s.captureFailed(ctx, t, c.err)
		return
	}
	_, err := s.ledger.Append(t.captureKey, tokencapture.Row{
		CallID:             t.callID,
		Model:              c.model,
		RequestDigest:      c.requestDigest,
		PromptTokenIDs:     c.tokens.PromptTokenIDs,
		GenerationTokenIDs: c.tokens.GenerationTokenIDs,
		GenerationLogProbs: c.tokens.GenerationLogProbs,
		FinishReason:       c.finishReason,
		ContinuedFrom:      t.continueKey,
	})
	if err != nil {
		s.captureFailed(ctx, t, err)
	}
}

// captureFailed counts a capture failure and records it in the key's
// manifest (unless the key is retired, when there is no manifest to keep).
func (s *Server) captureFailed(ctx context.Context, t *ticket, cause error) {
	s.metrics.captureFailures.Inc()
	s.log.WarnContext(ctx, "token capture failed; the call is answered without a ledger row", "model_call_id", t.callID, "err", cause)
	if errors.Is(cause, tokencapture.ErrRetired) {
		return
	}
	if err := s.ledger.Fail(t.captureKey, tokencapture.Failure{CallID: t.callID, Reason: cause.Error()}); err != nil {
		s.log.ErrorContext(ctx, "recording a capture failure", "model_call_id", t.callID, "err", err)
	}
}

// reply is a complete non-streaming answer, built before anything is written.
type reply struct {
	body    []byte
	err     error
	capture *captured
	outcome string
}

// finish delivers a complete reply: gate, ledger row, then the bytes.
func (s *Server) finish(task *park.Task, w http.ResponseWriter, r *http.Request, t *ticket, rep reply) {
	ctx := r.Context()
	s.deliver(task, ctx, t, func(err error) {
		if err != nil {
			s.done(t, outcomeCanceled)
			return
		}
		s.stage(ctx, t, rep.capture)
		if rep.err != nil {
			apierror.WriteOpenAI(w, r, s.log, rep.err)
		} else {
			httpserver.WriteRawJSON(w, http.StatusOK, rep.body)
		}
		s.done(t, rep.outcome)
	})
}

// countTokens adds a reply's tokens to the metrics, from usage when the
// upstream reported it, else from the token ids.
func (s *Server) countTokens(u *openai.Usage, tf openai.TokenFields) {
	prompt, gen := len(tf.PromptTokenIDs), len(tf.GenerationTokenIDs)
	if u != nil {
		prompt, gen = u.PromptTokens, u.CompletionTokens
	}
	s.metrics.tokens.WithLabelValues("prompt").Add(float64(max(prompt, 0)))
	s.metrics.tokens.WithLabelValues("generation").Add(float64(max(gen, 0)))
}

// outcomeOf maps a call's error to its outcome label.
func outcomeOf(err error) string {
	switch apierror.CodeOf(err) {
	case apierror.InvalidRequest, apierror.BodyTooLarge:
		return outcomeInvalidRequest
	case apierror.ClientClosed:
		return outcomeCanceled
	case apierror.StaleAttempt:
		return outcomeStaleAttempt
	}
	return outcomeUpstreamError
}
