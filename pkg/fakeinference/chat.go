package fakeinference

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gymfleet/gymfleet/pkg/apierror"
	"github.com/gymfleet/gymfleet/pkg/codec"
	"github.com/gymfleet/gymfleet/pkg/gencut"
	"github.com/gymfleet/gymfleet/pkg/httpserver"
	"github.com/gymfleet/gymfleet/pkg/openai"
	"github.com/gymfleet/gymfleet/pkg/rollout"
	"github.com/gymfleet/gymfleet/pkg/sse"
)

// MaxTopLogprobs is the most alternatives a request may ask for.
const MaxTopLogprobs = 20

// VLLMError is the error shape vLLM's OpenAI server answers with. The
// OpenAI-compatible routes of this server imitate vLLM, so they use it; the
// server's own routes use the fleet's apierror envelope.
type VLLMError struct {
	Object  string  `json:"object"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// RequestError is a refused OpenAI-compatible request: its status and the
// message of the VLLMError it is answered with.
type RequestError struct {
	Status  int
	Message string
}

func (e *RequestError) Error() string { return e.Message }

func badRequest(format string, args ...any) *RequestError {
	return &RequestError{Status: http.StatusBadRequest, Message: fmt.Sprintf(format, args...)}
}

func writeVLLMError(w http.ResponseWriter, status int, msg string) {
	typ := "BadRequestError"
	switch {
	case status == http.StatusNotFound:
		typ = "NotFoundError"
	case status == http.StatusServiceUnavailable:
		typ = "ServiceUnavailableError"
	case status >= 500:
		typ = "InternalServerError"
	}
	httpserver.WriteJSON(w, status, VLLMError{Object: "error", Message: msg, Type: typ, Code: status})
}

// errorStatus maps a body-reading error (an apierror) onto a status.
func errorStatus(err error) int {
	if s := apierror.From(err).HTTPStatus(); s >= 400 && s < 500 {
		return s
	}
	return http.StatusBadRequest
}

// ChatInput is a decoded, validated chat request with the reply options it
// asks for.
type ChatInput struct {
	Request *openai.ChatRequest
	// Script is the request's own script (metadata.fake_script), if any.
	Script *Script
	opts   replyOptions
}

// ParseChatRequest decodes and validates a chat completions body. Its error
// is a *RequestError (always a 4xx).
func ParseChatRequest(body []byte) (*ChatInput, error) {
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil, badRequest("request body is empty; expected a JSON object")
	}
	var req openai.ChatRequest
	if err := codec.Unmarshal(body, &req); err != nil {
		return nil, badRequest("invalid request body: %s", codec.DescribeError(err))
	}
	if len(req.Messages) == 0 {
		return nil, badRequest("messages must be a non-empty list")
	}
	if req.N != nil && *req.N != 1 {
		return nil, badRequest("n must be 1, got %d", *req.N)
	}
	for _, mt := range []*int{req.MaxTokens, req.MaxCompletionTokens} {
		if mt != nil && *mt < 1 {
			return nil, badRequest("max_tokens must be at least 1, got %d", *mt)
		}
	}
	in := &ChatInput{Request: &req}
	in.opts.logprobs = req.Logprobs != nil && *req.Logprobs
	if req.TopLogprobs != nil {
		k := *req.TopLogprobs
		if k < 0 || k > MaxTopLogprobs {
			return nil, badRequest("top_logprobs must be between 0 and %d, got %d", MaxTopLogprobs, k)
		}
		if k > 0 && !in.opts.logprobs {
			return nil, badRequest("when using top_logprobs, logprobs must be set to true")
		}
		in.opts.topLogprobs = k
	}
	if req.StreamOptions != nil && !req.Stream {
		return nil, badRequest("stream_options can only be defined when stream=true")
	}
	in.opts.asTokenIDs = req.ReturnTokensAsTokenIDs != nil && *req.ReturnTokensAsTokenIDs
	in.opts.returnTokenIDs = req.ReturnTokenIDs != nil && *req.ReturnTokenIDs
	in.opts.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	if text, ok := req.Metadata[MetadataScriptKey]; ok {
		sc, err := ParseScript(text)
		if err != nil {
			return nil, badRequest("metadata.%s: %v", MetadataScriptKey, err)
		}
		if !sc.IsZero() {
			in.Script = sc
		}
	}
	return in, nil
}

// completionLimit is how many tokens the call may generate, or vLLM's
// context-length refusal.
func (s *Server) completionLimit(promptLen int, req *openai.ChatRequest) (int, *RequestError) {
	maxCtx := s.cfg.MaxContextTokens
	mt := req.MaxTokens
	if mt == nil {
		mt = req.MaxCompletionTokens
	}
	if mt == nil {
		if promptLen >= maxCtx {
			return 0, badRequest("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", maxCtx, promptLen)
		}
		return maxCtx - promptLen, nil
	}
	if promptLen+*mt > maxCtx {
		return 0, badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.", maxCtx, promptLen+*mt, promptLen, *mt)
	}
	return *mt, nil
}

func (s *Server) reject(w http.ResponseWriter, r *http.Request, e *RequestError) {
	s.metrics.calls.WithLabelValues("rejected").Inc()
	s.log.DebugContext(r.Context(), "chat request refused", "status", e.Status, "err", e.Message)
	writeVLLMError(w, e.Status, e.Message)
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	body, err := httpserver.ReadBody(r)
	if err != nil {
		s.reject(w, r, &RequestError{Status: errorStatus(err), Message: apierror.From(err).Detail})
		return
	}
	parsed, err := ParseChatRequest(body)
	if err != nil {
		var re *RequestError
		if !errors.As(err, &re) {
			re = badRequest("%v", err)
		}
		s.reject(w, r, re)
		return
	}
	c, rerr := s.newCall(r, parsed)
	if rerr != nil {
		s.reject(w, r, rerr)
		return
	}
	s.admit(c)
	defer s.dropPayload(c)
	s.log.DebugContext(r.Context(), "chat call admitted", "call_id", c.id, "call_index", c.index, "capture_key", c.captureKey(),
		"held", c.released != nil, "prompt_tokens", c.promptTokens, "completion_tokens", len(c.tokens), "continued_from", c.continuedFrom)

	if err := s.awaitRelease(r.Context(), c); err != nil {
		s.writeCallError(w, err)
		return
	}
	if c.stream {
		s.streamReply(w, r, c, parsed.opts)
		return
	}
	s.completeReply(w, r, c, parsed.opts)
}

// newCall plans a call: its prompt, the whole deterministic generation (after
// a continued prefix, if the request names one), and who it belongs to.
func (s *Server) newCall(r *http.Request, parsed *ChatInput) (*call, *RequestError) {
	req := parsed.Request
	script := parsed.Script
	if script == nil {
		script = s.currentScript()
	}
	promptIDs := s.tok.PromptIDs(req)
	digest := PrefixDigest(promptIDs)
	limit, rerr := s.completionLimit(len(promptIDs), req)
	if rerr != nil {
		return nil, rerr
	}
	tokens := s.tok.generation(digest, Decide(req, script))

	var reused []genToken
	var continuedFrom string
	if key := r.Header.Get(HeaderContinueCut); key != "" {
		st, rerr := s.lookupStaged(key, digest)
		if rerr != nil {
			return nil, rerr
		}
		reused, continuedFrom = st.tokens, st.sourceCallID
		rest := []genToken(nil)
		if len(reused) < len(tokens) {
			rest = tokens[len(reused):]
		}
		tokens = append(append(make([]genToken, 0, len(reused)+len(rest)), reused...), rest...)
	}
	truncated := len(tokens) > limit
	if truncated {
		tokens = tokens[:limit]
	}
	if len(reused) > len(tokens) {
		reused = reused[:len(tokens)]
	}

	c := &call{
		stream:        req.Stream,
		nMessages:     len(req.Messages),
		promptIDs:     promptIDs,
		promptTokens:  len(promptIDs),
		promptDigest:  digest,
		tokens:        tokens,
		truncated:     truncated,
		reused:        len(reused),
		continuedFrom: continuedFrom,
		sched:         schedule{m: len(tokens) - len(reused), tps: s.cfg.TokensPerSecond, minCall: s.cfg.MinCallSeconds},
	}
	if key := r.Header.Get(HeaderCaptureKey); key != "" {
		if id, err := rollout.ParseCaptureKey(key); err == nil {
			c.episode = &id
		}
	} else if id, ok := rollout.FromContext(r.Context()); ok {
		c.episode = &id
	}
	if id := r.Header.Get(HeaderModelCallID); gencut.ValidCallID(id) {
		c.id = id
	}
	return c, nil
}

// errClosing ends calls when the server closes.
var errClosing = errors.New("the server is shutting down")

func (s *Server) writeCallError(w http.ResponseWriter, err error) {
	if errors.Is(err, errClosing) {
		writeVLLMError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	// The client is gone; the reply is for the log of any proxy in between.
	writeVLLMError(w, 499, "client closed the request")
}

// completeReply generates a non-streaming reply. Only the end of the
// generation (or a cut, or a cancellation) wakes it: how many tokens were
// produced at any moment follows from the schedule.
func (s *Server) completeReply(w http.ResponseWriter, r *http.Request, c *call, opts replyOptions) {
	ctx := r.Context()
	timer := time.NewTimer(c.sched.total())
	defer timer.Stop()
	var why error
	select {
	case <-timer.C:
	case <-c.cutCh:
	case <-ctx.Done():
		why = context.Cause(ctx)
	case <-s.closing:
		why = errClosing
	}

	s.mu.Lock()
	var tokens []genToken
	finish, cutKey := "", ""
	switch {
	case c.cut != nil:
		tokens, finish, cutKey = c.cut.tokens, "abort", c.cut.key
	case why != nil:
		s.finishLocked(c, StatusFailed, "", c.produced(time.Now()))
		s.mu.Unlock()
		s.writeCallError(w, why)
		return
	default:
		tokens, finish = c.tokens, finishReason(c.tokens, c.truncated)
		s.finishLocked(c, StatusReturned, finish, len(tokens))
	}
	s.mu.Unlock()

	resp := openai.ChatCompletion{
		ID:      "chatcmpl-" + strconv.Itoa(c.seq),
		Object:  "chat.completion",
		Created: time.Now().Unix(),
		Model:   s.cfg.Model,
		Choices: []openai.ChatChoice{{Index: 0, Message: renderMessage(tokens), FinishReason: finish}},
		Usage:   &openai.Usage{PromptTokens: len(c.promptIDs), CompletionTokens: len(tokens), TotalTokens: len(c.promptIDs) + len(tokens)},
	}
	if opts.logprobs {
		resp.Choices[0].Logprobs = &openai.ChoiceLogprobs{Content: s.tok.logprobEntries(tokens, opts)}
	}
	if opts.returnTokenIDs {
		resp.PromptTokenIDs = c.promptIDs
		resp.Choices[0].TokenIDs = tokenIDs(tokens)
	}
	if cutKey != "" {
		w.Header().Set(HeaderGenerationCut, cutKey)
	}
	httpserver.WriteJSON(w, http.StatusOK, resp)
}

// streamReply streams a reply, one chunk per token as it is produced. A
// streaming call is never cut.
func (s *Server) streamReply(w http.ResponseWriter, r *http.Request, c *call, opts replyOptions) {
	ctx := r.Context()
	sw := sse.NewWriter(w)
	base := openai.ChatChunk{ID: "chatcmpl-" + strconv.Itoa(c.seq), Object: "chat.completion.chunk", Created: time.Now().Unix(), Model: s.cfg.Model}
	emitted := 0
	fail := func() {
		s.mu.Lock()
		s.finishLocked(c, StatusFailed, "", emitted)
		s.mu.Unlock()
	}
	write := func(ch openai.ChatChunk) error {
		b, err := codec.Marshal(ch)
		if err != nil {
			return err
		}
		return sw.Event("", b)
	}

	empty := ""
	first := base
	first.Choices = []openai.ChunkChoice{{Index: 0, Delta: openai.ChunkDelta{Role: "assistant", Content: &empty}}}
	if opts.returnTokenIDs {
		first.PromptTokenIDs = c.promptIDs
	}
	if err := write(first); err != nil {
		fail()
		return
	}
	var ds deltaState
	emit := func(g genToken) error {
		delta, ok := ds.delta(g)
		if !ok && !opts.logprobs && !opts.returnTokenIDs {
			return nil
		}
		ch := base
		ch.Choices = []openai.ChunkChoice{{Index: 0, Delta: delta}}
		if opts.logprobs {
			ch.Choices[0].Logprobs = &openai.ChoiceLogprobs{Content: []openai.TokenLogprob{s.tok.logprobEntry(g, opts)}}
		}
		if opts.returnTokenIDs {
			ch.Choices[0].TokenIDs = []int{g.id}
		}
		return write(ch)
	}
	// A continued prefix was generated before; it goes out at once.
	for ; emitted < c.reused; emitted++ {
		if err := emit(c.tokens[emitted]); err != nil {
			fail()
			return
		}
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for emitted < len(c.tokens) {
		produced := c.reused + c.sched.due(time.Since(c.genStart))
		if produced <= emitted {
			timer.Reset(c.sched.at(emitted-c.reused+1) - time.Since(c.genStart))
			select {
			case <-timer.C:
			case <-ctx.Done():
				fail()
				return
			case <-s.closing:
				fail()
				return
			}
			continue
		}
		if ctx.Err() != nil {
			fail()
			return
		}
		for ; emitted < produced && emitted < len(c.tokens); emitted++ {
			if err := emit(c.tokens[emitted]); err != nil {
				fail()
				return
			}
		}
	}
	finish := finishReason(c.tokens, c.truncated)
	last := base
	last.Choices = []openai.ChunkChoice{{Index: 0, Delta: openai.ChunkDelta{}, FinishReason: &finish}}
	if err := write(last); err != nil {
		fail()
		return
	}
	if opts.includeUsage {
		u := base
		u.Choices = []openai.ChunkChoice{}
		u.Usage = &openai.Usage{PromptTokens: len(c.promptIDs), CompletionTokens: len(c.tokens), TotalTokens: len(c.promptIDs) + len(c.tokens)}
		if err := write(u); err != nil {
			fail()
			return
		}
	}
	if err := sw.Event("", []byte(sse.Done)); err != nil {
		fail()
		return
	}
	s.mu.Lock()
	s.finishLocked(c, StatusReturned, finish, len(c.tokens))
	s.mu.Unlock()
}

// TokenizeRequest is the body of POST /tokenize: chat messages (with tools),
// or a plain prompt.
type TokenizeRequest struct {
	Model               string               `json:"model,omitempty"`
	Messages            []openai.ChatMessage `json:"messages,omitempty"`
	Tools               []openai.ChatTool    `json:"tools,omitempty"`
	Prompt              *string              `json:"prompt,omitempty"`
	AddGenerationPrompt *bool                `json:"add_generation_prompt,omitempty"`
}

// TokenizeReply is the reply of POST /tokenize.
type TokenizeReply struct {
	Tokens      []int `json:"tokens"`
	Count       int   `json:"count"`
	MaxModelLen int   `json:"max_model_len"`
}

// handleTokenize gives the prompt ids a chat request with these messages
// and tools would have (with the generation prompt, as vLLM's default), so
// NeMo Gym's /tokenize fallback agrees with prompt_token_ids.
func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	body, err := httpserver.ReadBody(r)
	if err != nil {
		writeVLLMError(w, errorStatus(err), apierror.From(err).Detail)
		return
	}
	var req TokenizeRequest
	if len(strings.TrimSpace(string(body))) == 0 {
		writeVLLMError(w, http.StatusBadRequest, "request body is empty; expected a JSON object")
		return
	}
	if err := codec.Unmarshal(body, &req); err != nil {
		writeVLLMError(w, http.StatusBadRequest, "invalid request body: "+codec.DescribeError(err))
		return
	}
	var ids []int
	switch {
	case req.Prompt != nil && req.Messages == nil:
		ids = s.tok.Tokenize(*req.Prompt)
	case req.Messages != nil && req.Prompt == nil:
		ids = s.tok.ChatPromptIDs(req.Messages, req.Tools, req.AddGenerationPrompt == nil || *req.AddGenerationPrompt)
	default:
		writeVLLMError(w, http.StatusBadRequest, "send either messages or prompt")
		return
	}
	if ids == nil {
		ids = []int{}
	}
	httpserver.WriteJSON(w, http.StatusOK, TokenizeReply{Tokens: ids, Count: len(ids), MaxModelLen: s.cfg.MaxContextTokens})
}
