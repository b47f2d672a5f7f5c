package modelproxy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/gymfleet/gymfleet/pkg/apierror"
	"github.com/gymfleet/gymfleet/pkg/httpserver"
	"github.com/gymfleet/gymfleet/pkg/openai"
	"github.com/gymfleet/gymfleet/pkg/rollout"
	"github.com/gymfleet/gymfleet/pkg/tokencapture"
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
)

// ticket is one admitted model call. It stays small: the server is meant to
// carry 100,000 of them at once, each on its handler goroutine alone (no
// per-call goroutine or timer).
type ticket struct {
	// captureKey is the attempt the call belongs to; "" for a call outside
	// /ng-rollout/<capture_key>/, which is never captured.
	captureKey string
	// callID is the model call id: the ledger row's call_id, sent upstream
	// as X-Ng-Model-Call-Id.
	callID     string
	route      string
	admittedAt time.Time
	// started is set once the response's first byte may be written. A
	// checkpoint counts calls not started as undelivered (their rows are
	// left out and the restored agent re-issues them) and waits only for
	// started ones.
	started atomic.Bool
}

// newCallID returns a random 32-hex-digit model call id.
func newCallID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// admit starts a call: it names it and notes which attempt it belongs to.
func (s *Server) admit(r *http.Request, route string) *ticket {
	t := &ticket{callID: newCallID(), route: route, admittedAt: time.Now()}
	if id, ok := rollout.FromContext(r.Context()); ok {
		t.captureKey = id.CaptureKey()
	}
	s.metrics.inFlight.Inc()
	return t
}

// done ends a call in the metrics.
func (s *Server) done(t *ticket, outcome string) {
	s.metrics.inFlight.Dec()
	s.metrics.calls.WithLabelValues(t.route, outcome).Inc()
}

// deliver is the single point every response passes right before its first
// byte is written: JSON replies, error replies and the first event of a
// stream. A checkpoint gate will hold undelivered responses here until
// resume; nothing past this point may be undone. It fails only when the
// client is gone.
func (s *Server) deliver(ctx context.Context, t *ticket) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t.started.Store(true)
	return nil
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
func (s *Server) finish(w http.ResponseWriter, r *http.Request, t *ticket, rep reply) {
	ctx := r.Context()
	if err := s.deliver(ctx, t); err != nil {
		s.done(t, outcomeCanceled)
		return
	}
	s.stage(ctx, t, rep.capture)
	if rep.err != nil {
		apierror.Write(w, r, s.log, rep.err)
	} else {
		httpserver.WriteRawJSON(w, http.StatusOK, rep.body)
	}
	s.done(t, rep.outcome)
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
	}
	return outcomeUpstreamError
}
