package vllmcut

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Reasons of durable_failure entries.
const (
	ReasonUnknownCall = "unknown_call"
	ReasonCaptureKey  = "capture_key_mismatch"
	ReasonNoTokens    = "no_tokens"
	ReasonFinished    = "finished"
	ReasonFailed      = "failed"
	ReasonBusy        = "cut_in_progress"
	ReasonAbort       = "abort_refused"
	ReasonTimeout     = "timeout"
	// Calls that are never cut (see the package comment).
	ReasonStreaming   = "streaming"
	ReasonTools       = "tools"
	ReasonConstrained = "structured_outputs"
	ReasonNoTokenIDs  = "no_token_ids"
	ReasonSeveral     = "n_above_1"
)

var errReplyTooLarge = errors.New("the vLLM reply is larger than the sidecar reads")

// call is one tracked chat call.
type call struct {
	id, captureKey string
	// uncuttable is why the call cannot be cut ("" when it can).
	uncuttable string
	admitted   time.Time
	// limit is the call's max_tokens (0: the request set none).
	limit int

	// Guarded by Server.mu.
	abortID  string // vLLM's external request id of the running request
	cutAsked bool
	// settled is closed once the outcome of an asked cut is known.
	settled chan struct{}
	outcome cutOutcome
}

// cutOutcome is what an asked cut came to.
type cutOutcome struct {
	staged *staged
	reason string
}

// chatFields are a chat request's top-level fields.
type chatFields map[string]codec.RawMessage

func (f chatFields) isTrue(k string) bool { return string(bytes.TrimSpace(f[k])) == "true" }

func (f chatFields) present(k string) bool {
	v := bytes.TrimSpace(f[k])
	return len(v) > 0 && string(v) != "null"
}

func (f chatFields) int(k string) (int, bool) {
	if !f.present(k) {
		return 0, false
	}
	n, err := strconv.Atoi(string(bytes.TrimSpace(f[k])))
	return n, err == nil
}

// uncuttable says why a call cannot be cut, or "".
func uncuttable(f chatFields) string {
	switch {
	case f.isTrue("stream"):
		return ReasonStreaming
	case hasTools(f):
		return ReasonTools
	case constrained(f):
		return ReasonConstrained
	case !f.isTrue("return_token_ids"):
		return ReasonNoTokenIDs
	}
	if n, ok := f.int("n"); ok && n > 1 {
		return ReasonSeveral
	}
	return ""
}

// maxTokens is the request's token limit, 0 when it sets none.
func maxTokens(f chatFields) int {
	if n, ok := f.int("max_completion_tokens"); ok {
		return n
	}
	n, _ := f.int("max_tokens")
	return n
}

func hasTools(f chatFields) bool {
	var tools []codec.RawMessage
	if !f.present("tools") || codec.Unmarshal(f["tools"], &tools) != nil || len(tools) == 0 {
		return false
	}
	return string(bytes.TrimSpace(f["tool_choice"])) != `"none"`
}

func constrained(f chatFields) bool {
	for _, k := range []string{"structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structural_tag"} {
		if f.present(k) {
			return true
		}
	}
	if f.present("response_format") {
		var rf struct {
			Type string `json:"type"`
		}
		if codec.Unmarshal(f["response_format"], &rf) != nil || rf.Type != "text" {
			return true
		}
	}
	return false
}

// handleChat proxies a chat call; a named non-streaming call is tracked so
// a cut can abort it, and a call naming a staged prefix continues it.
func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	body, err := httpserver.ReadBody(r)
	if err != nil {
		writeVLLMError(w, http.StatusBadRequest, err.Error())
		return
	}
	var f chatFields
	if err := codec.Unmarshal(body, &f); err != nil {
		// vLLM answers what it cannot read; pass it on.
		s.passThrough(w, r, body)
		return
	}
	if key := r.Header.Get(gencut.HeaderContinueCut); key != "" {
		s.continueCut(w, r, f, key)
		return
	}
	id, captureKey := r.Header.Get(HeaderModelCallID), r.Header.Get(HeaderCaptureKey)
	if f.isTrue("stream") {
		s.passThrough(w, r, body)
		return
	}
	c := &call{id: id, captureKey: captureKey, uncuttable: uncuttable(f), admitted: time.Now(), limit: maxTokens(f)}
	if !gencut.ValidCallID(id) || !rollout.ValidCaptureKey(captureKey) || !s.track(c) {
		if _, spliced := modelPrefix(f); !spliced {
			s.passThrough(w, r, body)
			return
		}
		// Untracked, but its history must be spliced all the same.
		if up, ok := s.chatUpstream(r.Context(), w, f, body); ok {
			s.runTracked(w, r, &call{id: "untracked", uncuttable: ReasonUnknownCall}, up)
		}
		return
	}
	defer s.untrack(c)
	if up, ok := s.chatUpstream(r.Context(), w, f, body); ok {
		s.runTracked(w, r, c, up)
	}
}

// passThrough sends the request to vLLM as it came.
func (s *Server) passThrough(w http.ResponseWriter, r *http.Request, body []byte) {
	r.Body = readCloser{bytes.NewReader(body)}
	r.ContentLength = int64(len(body))
	s.proxy.ServeHTTP(w, r)
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

func (s *Server) track(c *call) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.active) >= s.cfg.MaxInFlight {
		return false
	}
	if _, dup := s.active[c.id]; dup {
		return false
	}
	s.active[c.id] = c
	return true
}

func (s *Server) untrack(c *call) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.active[c.id] == c {
		delete(s.active, c.id)
	}
	s.settleLocked(c, cutOutcome{reason: ReasonFinished})
}

// settleLocked records the outcome of an asked cut, once.
func (s *Server) settleLocked(c *call, o cutOutcome) {
	if !c.cutAsked || c.settled == nil {
		return
	}
	select {
	case <-c.settled:
		return
	default:
	}
	c.outcome = o
	close(c.settled)
}

// upstreamCall is how a tracked call is sent to vLLM: to path, whose
// external request ids vLLM prefixes with idPrefix (the ids
// /inference/v1/abort_requests takes); body, or bodyFor the request id when
// the id travels in the body; finish turns a complete vLLM reply into the
// client's (nil: as it is).
type upstreamCall struct {
	path, idPrefix string
	body           []byte
	bodyFor        func(reqID string) []byte
	finish         func(ctx context.Context, reqID string, reply []byte) (int, []byte, error)
}

// runTracked sends a tracked call's vLLM request and answers it. A reply an asked cut
// aborted is staged and answered marked X-Ng-Generation-Cut; one aborted
// before its first token is sent again, as if never cut.
func (s *Server) runTracked(w http.ResponseWriter, r *http.Request, c *call, up upstreamCall) {
	ctx := r.Context()
	for {
		reqID := newRequestID()
		s.mu.Lock()
		c.abortID = up.idPrefix + reqID
		c.cutAsked, c.settled = false, nil
		s.mu.Unlock()
		body := up.body
		if up.bodyFor != nil {
			body = up.bodyFor(reqID)
		}
		status, hdr, reply, err := s.postVLLM(ctx, up.path, http.Header{HeaderRequestID: {reqID}}, body)
		if err != nil {
			s.mu.Lock()
			s.settleLocked(c, cutOutcome{reason: ReasonFailed})
			s.mu.Unlock()
			s.log.WarnContext(ctx, "vLLM did not answer", "model_call_id", c.id, "err", err)
			writeVLLMError(w, http.StatusBadGateway, "vLLM did not answer: "+err.Error())
			return
		}
		s.mu.Lock()
		asked := c.cutAsked
		s.mu.Unlock()
		if status == http.StatusOK && up.finish != nil {
			if status, reply, err = up.finish(ctx, reqID, reply); err != nil {
				s.mu.Lock()
				s.settleLocked(c, cutOutcome{reason: ReasonFailed})
				s.mu.Unlock()
				writeVLLMError(w, http.StatusInternalServerError, err.Error())
				return
			}
		}
		if asked && status == http.StatusOK {
			st, n, aborted := stageFrom(c, reply)
			switch {
			case aborted && n == 0:
				// Nothing to keep: the call runs again, as it would
				// have had it never been cut.
				s.mu.Lock()
				s.settleLocked(c, cutOutcome{reason: ReasonNoTokens})
				s.mu.Unlock()
				s.log.InfoContext(ctx, "a cut call had no tokens yet; sending it again", "model_call_id", c.id)
				continue
			case aborted && st != nil:
				s.store.put(st)
				s.mu.Lock()
				s.settleLocked(c, cutOutcome{staged: st})
				s.mu.Unlock()
				s.log.InfoContext(ctx, "generation cut staged", "model_call_id", c.id, "staging_key", st.key, "prefix_tokens", n)
				w.Header().Set(gencut.HeaderGenerationCut, st.key)
			}
		}
		copyReplyHeaders(w.Header(), hdr)
		httpserver.WriteRawJSON(w, status, bytes.TrimRight(reply, "\n"))
		return
	}
}

func copyReplyHeaders(dst, src http.Header) {
	for _, k := range []string{"X-Request-Id"} {
		if v := src.Get(k); v != "" {
			dst.Set(k, v)
		}
	}
}

// chatReply is the part of a vLLM chat completion a cut reads.
type chatReply struct {
	PromptTokenIDs []int `json:"prompt_token_ids"`
	Choices        []struct {
		FinishReason string `json:"finish_reason"`
		TokenIDs     []int  `json:"token_ids"`
		Message      struct {
			Content *string `json:"content"`
		} `json:"message"`
		Logprobs *struct {
			Content []codec.RawMessage `json:"content"`
		} `json:"logprobs"`
	} `json:"choices"`
}

// stageFrom reads an aborted reply: whether it was aborted, how many tokens
// it holds and, when it holds any, the prefix to stage.
func stageFrom(c *call, reply []byte) (*staged, int, bool) {
	var cr chatReply
	if codec.Unmarshal(reply, &cr) != nil || len(cr.Choices) != 1 {
		return nil, 0, false
	}
	ch := cr.Choices[0]
	if ch.FinishReason != "abort" {
		return nil, 0, false
	}
	if len(ch.TokenIDs) == 0 {
		return nil, 0, true
	}
	st := &staged{
		key: StagingKey(c.captureKey, c.id), callID: c.id, captureKey: c.captureKey,
		promptIDs: cr.PromptTokenIDs, tokenIDs: ch.TokenIDs, reply: reply, limit: c.limit,
	}
	if ch.Message.Content != nil {
		st.content = *ch.Message.Content
	}
	if ch.Logprobs != nil {
		st.logprobs = ch.Logprobs.Content
	}
	return st, len(ch.TokenIDs), true
}

// writeVLLMError writes vLLM's error body {"error": {message, type, param,
// code}} (vllm/entrypoints/openai/engine/protocol.py ErrorResponse).
func writeVLLMError(w http.ResponseWriter, status int, msg string) {
	httpserver.WriteRawJSON(w, status, vllmErrorBody(status, msg))
}

func vllmErrorBody(status int, msg string) []byte {
	typ := "BadRequestError"
	switch {
	case status == http.StatusNotFound:
		typ = "NotFoundError"
	case status >= 500:
		typ = "InternalServerError"
	}
	b, _ := codec.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": status}})
	return b
}

// errorf is a refused continuation.
func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// deadline bounds a cut round's wait.
func (s *Server) cutContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.cfg.CutWait)
}
