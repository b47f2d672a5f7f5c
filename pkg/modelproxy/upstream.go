package modelproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/gymfleet/gymfleet/pkg/apierror"
	"github.com/gymfleet/gymfleet/pkg/gencut"
	"github.com/gymfleet/gymfleet/pkg/httpclient"
	"github.com/gymfleet/gymfleet/pkg/httpserver"
	"github.com/gymfleet/gymfleet/pkg/openai"
)

// Headers between the server and its upstream (docs/ARCHITECTURE.md).
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

// callUpstream posts a chat request and returns the upstream response, whose
// body the caller reads and closes. A non-2xx reply is read here and returned
// as upstreamStatus.
func (s *Server) callUpstream(ctx context.Context, t *ticket, body []byte, stream bool) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.chatURL, bytes.NewReader(body))
	if err != nil {
		return nil, apierror.Wrap(apierror.Internal, err)
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
	s.upstreamRunning(t, true)
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, transportError(ctx, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, rerr := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if rerr != nil {
			return nil, transportError(ctx, rerr)
		}
		return nil, &upstreamStatus{status: resp.StatusCode, body: b}
	}
	return resp, nil
}

// postChat makes a non-streaming upstream call and returns its body and,
// when a generation cut stopped it, the staging key of its prefix.
func (s *Server) postChat(ctx context.Context, t *ticket, body []byte) ([]byte, string, error) {
	start := time.Now()
	defer s.upstreamRunning(t, false)
	resp, err := s.callUpstream(ctx, t, body, false)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := httpclient.ReadReply(resp)
	if err != nil {
		return nil, "", transportError(ctx, err)
	}
	s.metrics.upstreamSeconds.Observe(time.Since(start).Seconds())
	return b, resp.Header.Get(HeaderGenerationCut), nil
}

// completeUpstream makes a non-streaming call until it has a complete
// reply. A reply a generation cut stopped (finish_reason abort, with
// X-Ng-Generation-Cut) is not an answer: the call waits until admission
// reopens and is re-issued continuing the staged prefix, so the client gets
// the whole generation (prefix + rest) as one reply. A continuation the
// worker refuses (its prefix is gone) is retried once as a fresh call: a lost
// prefix only costs regeneration.
func (s *Server) completeUpstream(ctx context.Context, t *ticket, body []byte) ([]byte, error) {
	for {
		b, cutKey, err := s.postChat(ctx, t, body)
		var us *upstreamStatus
		if err != nil && t.continueKey != "" && errors.As(err, &us) && us.status >= 400 && us.status < 500 && !contextOverflow(err) {
			s.log.WarnContext(ctx, "the worker refused to continue a generation cut; regenerating", "model_call_id", t.callID, "staging_key", t.continueKey, "err", err)
			t.continueKey = ""
			continue
		}
		if err != nil || cutKey == "" {
			return b, err
		}
		t.continueKey = cutKey
		if err := s.awaitResume(ctx, t); err != nil {
			return nil, transportError(ctx, err)
		}
	}
}

// upstreamStatus is a non-2xx upstream reply.
type upstreamStatus struct {
	status int
	body   []byte
}

func (e *upstreamStatus) Error() string {
	text := strings.TrimSpace(string(e.body))
	if len(text) > maxErrorText {
		text = text[:maxErrorText] + "..."
	}
	return fmt.Sprintf("upstream answered %d: %s", e.status, text)
}

// contextOverflow reports vLLM refusing a prompt that leaves no room to
// generate. NeMo Gym answers it with an empty "length" completion, so the
// agent ends the episode as incomplete instead of failing.
func contextOverflow(err error) bool {
	var us *upstreamStatus
	if !errors.As(err, &us) || us.status != http.StatusBadRequest {
		return false
	}
	return bytes.Contains(us.body, []byte("maximum context length")) || bytes.Contains(us.body, []byte("max_tokens"))
}

// asAPIError turns an upstream failure into the reply's error.
func asAPIError(err error) error {
	var us *upstreamStatus
	if errors.As(err, &us) {
		return &apierror.Error{Code: apierror.UpstreamError, Detail: us.Error()}
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
// overflow, shaped as NeMo Gym's vllm_model returns it.
func syntheticOverflow(model string) *openai.ChatCompletion {
	return &openai.ChatCompletion{
		ID: "chtcmpl-123", Object: "chat.completion", Created: time.Now().Unix(), Model: model,
		Choices: []openai.ChatChoice{{Index: 0, FinishReason: openai.FinishLength, Message: openai.ChatMessage{Role: "assistant"}}},
		Usage:   &openai.Usage{},
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
		apierror.Write(w, r, s.log, err)
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, s.modelsURL, nil)
	if err != nil {
		fail(apierror.Wrap(apierror.Internal, err))
		return
	}
	if s.cfg.Upstream.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+s.cfg.Upstream.APIKey)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		fail(transportError(r.Context(), err))
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
