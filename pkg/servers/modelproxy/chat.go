package modelproxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/gymfleet/gymfleet/pkg/infra/park"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/transport/sse"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

// chatFields is a Chat Completions body decoded one level deep: fields the
// server does not know are forwarded byte for byte.
type chatFields map[string]codec.RawMessage

// decodeChatRequest reads a pass-through body: a JSON object with a
// messages array and, if present, a boolean stream.
func decodeChatRequest(body []byte) (chatFields, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, apierror.New(apierror.InvalidRequest, "request body is empty; expected a Chat Completions request")
	}
	// The fields are forwarded verbatim, so the whole body must be valid
	// JSON, not only what the lenient decoder looked at.
	if !codec.Valid(body) {
		return nil, apierror.New(apierror.InvalidRequest, "request body is not valid JSON")
	}
	var f chatFields
	if err := codec.Unmarshal(body, &f); err != nil || f == nil {
		return nil, apierror.New(apierror.InvalidRequest, "request body must be a JSON object")
	}
	msgs := bytes.TrimSpace(f["messages"])
	if len(msgs) == 0 || msgs[0] != '[' {
		return nil, apierror.New(apierror.InvalidRequest, "messages must be an array of chat messages")
	}
	if v, ok := f["stream"]; ok {
		switch string(bytes.TrimSpace(v)) {
		case "true", "false", "null":
		default:
			return nil, apierror.New(apierror.InvalidRequest, "stream must be a boolean")
		}
	}
	return f, nil
}

// streaming reports whether the body asks for SSE.
func (f chatFields) streaming() bool { return string(bytes.TrimSpace(f["stream"])) == "true" }

// wantsLogprobs reports whether the client asked for log-probs itself.
func (f chatFields) wantsLogprobs() bool { return string(bytes.TrimSpace(f["logprobs"])) == "true" }

// prepareChat sets the upstream model, the request extras (extras.go)
// and, with return_token_ids, vLLM's token-id parameters, and returns the
// body to send.
//
// A client that asks for logprobs gets them as vLLM answers them (token
// strings, its top_logprobs): the generated ids then come from
// return_token_ids alone, not from return_tokens_as_token_ids, which would
// turn its tokens into "token_id:N".
func (s *Server) prepareChat(f chatFields, clientLogprobs bool) ([]byte, error) {
	model, err := codec.MarshalStable(s.cfg.Upstream.Model)
	if err != nil {
		return nil, apierror.Wrap(apierror.Internal, err)
	}
	f["model"] = model
	// The request's own chat_template_kwargs never go up as sent: merged
	// when forwarded, dropped otherwise (extras.go).
	own, err := ownKwargs(f["chat_template_kwargs"])
	if err != nil {
		return nil, err
	}
	delete(f, "chat_template_kwargs")
	if own != nil && !s.cfg.Upstream.ForwardRequestChatTemplateKwargs {
		s.droppedKwargs.Do(func() {
			s.log.Warn("dropping chat requests' own chat_template_kwargs, as NeMo Gym's vllm_model does by default; " +
				"upstream.chat_template_kwargs and metadata.chat_template_kwargs still apply, and " +
				"upstream.forward_request_chat_template_kwargs forwards them (logged once)")
		})
		own = nil
	}
	var extra map[string]codec.RawMessage
	if md, ok := f["metadata"]; ok || own != nil || s.extraBody != nil || s.chatTemplateKwargs != nil {
		metaBody, metaKwargs, err := chatMetadataExtras(md)
		if err != nil {
			return nil, err
		}
		var kwargs map[string]codec.RawMessage
		if extra, kwargs, err = s.requestExtras(own, metaBody, metaKwargs); err != nil {
			return nil, err
		}
		if len(kwargs) > 0 {
			if f["chat_template_kwargs"], err = encodeKwargs(kwargs); err != nil {
				return nil, err
			}
		}
	}
	if s.cfg.ReturnTokenIDs {
		if n, ok := f["n"]; ok {
			switch string(bytes.TrimSpace(n)) {
			case "1", "null":
			default:
				e := apierror.New(apierror.InvalidRequest, "n must be 1: token ids are captured for one choice")
				e.Param = "n"
				return nil, e
			}
		}
		if clientLogprobs {
			// vLLM reads a null top_logprobs as no log-probs at all.
			if tl := string(bytes.TrimSpace(f["top_logprobs"])); tl == "" || tl == "null" {
				f["top_logprobs"] = codec.RawMessage("0")
			}
		} else {
			f["logprobs"] = codec.RawMessage("true")
			f["top_logprobs"] = codec.RawMessage("0")
			f["return_tokens_as_token_ids"] = codec.RawMessage("true")
		}
		f["return_token_ids"] = codec.RawMessage("true")
	}
	underBody(f, extra)
	return encodeObject(f)
}

// asGymSendsIt rewrites a chat request's history and tools as NeMo Gym's
// vllm_model rewrites them before each vLLM call (nemo-gym 0.7.0): the
// <think> blocks of assistant messages become their reasoning, and strict
// leaves the tools. It runs before the request digest, so a conversation
// digests the same through Chat Completions and Responses (whose
// conversion does the same).
func asGymSendsIt(f chatFields) error {
	if err := reasoningFromThinkInHistory(f); err != nil {
		return err
	}
	return stripHostedOnlyToolFields(f)
}

// reasoningFromThinkInHistory applies openai.ReasoningFromThink to every
// assistant message of the history, as Gym's vllm_model does with its
// reasoning parser on (_preprocess_chat_completion_create_params): a
// string content loses its <think> blocks and the first becomes the
// message's reasoning_content and reasoning; in a list content each text
// part does, and the last part that had a block names the reasoning. Other
// fields and messages go on as sent.
func reasoningFromThinkInHistory(f chatFields) error {
	raw := f["messages"]
	// "think", not "<think>": a client may escape the angle brackets.
	if !bytes.Contains(raw, []byte("think")) {
		return nil
	}
	var msgs []codec.RawMessage
	if err := codec.Unmarshal(raw, &msgs); err != nil {
		e := apierror.New(apierror.InvalidRequest, "messages must be an array of chat messages")
		e.Param = "messages"
		return e
	}
	changed := false
	for i, m := range msgs {
		if !bytes.Contains(m, []byte("think")) {
			continue
		}
		var msg map[string]codec.RawMessage
		if codec.Unmarshal(m, &msg) != nil || string(bytes.TrimSpace(msg["role"])) != `"assistant"` {
			continue
		}
		content, reasoning, ok := contentWithoutThink(msg["content"])
		if !ok {
			continue
		}
		msg["content"] = content
		if reasoning != nil {
			r, err := codec.MarshalStable(*reasoning)
			if err != nil {
				return apierror.Wrap(apierror.Internal, err)
			}
			msg["reasoning_content"], msg["reasoning"] = r, r
		}
		b, err := encodeObject(msg)
		if err != nil {
			return apierror.Wrap(apierror.Internal, err)
		}
		msgs[i], changed = b, true
	}
	if changed {
		f["messages"] = joinArray(msgs)
	}
	return nil
}

// contentWithoutThink is a message content with its <think> blocks taken
// out, and the reasoning they give; ok is false when nothing changes.
func contentWithoutThink(raw codec.RawMessage) (out codec.RawMessage, reasoning *string, ok bool) {
	var text string
	if codec.Unmarshal(raw, &text) == nil {
		rest, r := openai.ReasoningFromThink(text)
		if r == nil {
			return nil, nil, false
		}
		b, err := codec.MarshalStable(rest)
		return b, r, err == nil
	}
	var parts []map[string]codec.RawMessage
	if codec.Unmarshal(raw, &parts) != nil {
		return nil, nil, false
	}
	for _, p := range parts {
		if codec.Unmarshal(p["text"], &text) != nil {
			continue
		}
		rest, r := openai.ReasoningFromThink(text)
		if r == nil {
			continue
		}
		b, err := codec.MarshalStable(rest)
		if err != nil {
			return nil, nil, false
		}
		p["text"], reasoning, ok = b, r, true
	}
	if !ok {
		return nil, nil, false
	}
	encoded := make([]codec.RawMessage, len(parts))
	for i, p := range parts {
		b, err := encodeObject(p)
		if err != nil {
			return nil, nil, false
		}
		encoded[i] = b
	}
	return joinArray(encoded), reasoning, true
}

// joinArray writes raw values as one JSON array.
func joinArray(vals []codec.RawMessage) codec.RawMessage {
	out := []byte{'['}
	for i, v := range vals {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, v...)
	}
	return append(out, ']')
}

// stripHostedOnlyToolFields removes strict from every function tool's
// definition, as NeMo Gym's vllm_model does before each vLLM call
// (VLLMModel._strip_hosted_only_tool_fields, nemo-gym 0.7.0): it is an
// OpenAI-hosted flag, and a chat template that renders the definition
// would put it in the prompt. Every other byte of the tools goes on.
func stripHostedOnlyToolFields(f chatFields) error {
	raw := bytes.TrimSpace(f["tools"])
	if len(raw) == 0 || string(raw) == "null" || !bytes.Contains(raw, []byte(`"strict"`)) {
		return nil
	}
	var tools []codec.RawMessage
	if err := codec.Unmarshal(raw, &tools); err != nil {
		e := apierror.New(apierror.InvalidRequest, "tools must be an array of tools")
		e.Param = "tools"
		return e
	}
	for i, t := range tools {
		var tool map[string]codec.RawMessage
		if codec.Unmarshal(t, &tool) != nil || string(bytes.TrimSpace(tool["type"])) != `"function"` {
			continue
		}
		var fn map[string]codec.RawMessage
		if codec.Unmarshal(tool["function"], &fn) != nil || fn == nil {
			continue
		}
		if _, ok := fn["strict"]; !ok {
			continue
		}
		delete(fn, "strict")
		var err error
		if tool["function"], err = encodeObject(fn); err != nil {
			return apierror.Wrap(apierror.Internal, err)
		}
		if tools[i], err = encodeObject(tool); err != nil {
			return apierror.Wrap(apierror.Internal, err)
		}
	}
	f["tools"] = joinArray(tools)
	return nil
}

// encodeObject writes raw fields as one JSON object, keys sorted.
func encodeObject(f map[string]codec.RawMessage) ([]byte, error) {
	keys := make([]string, 0, len(f))
	size := 2
	for k, v := range f {
		keys = append(keys, k)
		size += len(k) + len(v) + 4
	}
	slices.Sort(keys)
	b := make([]byte, 0, size)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		kb, err := codec.MarshalStable(k)
		if err != nil {
			return nil, err
		}
		b = append(b, kb...)
		b = append(b, ':')
		v := f[k]
		if len(v) == 0 {
			v = codec.RawMessage("null")
		}
		b = append(b, v...)
	}
	return append(b, '}'), nil
}

// handleChat serves POST /v1/chat/completions as a pass-through. A
// non-streaming call waits parked (pkg/infra/park) for its upstream: a
// call in flight holds no goroutine.
func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	t, r, ok := s.admit(w, r, routeChat)
	if !ok {
		return
	}
	httpserver.Park(w, r, func(task *park.Task) {
		task.Defer(func() { s.hooks.release(w, r, t) })
		s.serveChat(task, w, r, t)
	})
}

// serveChat is handleChat's call once admitted.
func (s *Server) serveChat(task *park.Task, w http.ResponseWriter, r *http.Request, t *ticket) {
	fail := func(err error) { s.finish(task, w, r, t, reply{err: err, outcome: outcomeOf(err)}) }
	body, err := httpserver.ReadBody(r)
	if err != nil {
		fail(err)
		return
	}
	f, err := decodeChatRequest(body)
	if err != nil {
		fail(err)
		return
	}
	if err := asGymSendsIt(f); err != nil {
		fail(err)
		return
	}
	var digest string
	if t.captureKey != "" {
		if digest, err = s.digests.request(f["messages"], f["tools"]); err != nil {
			fail(apierror.New(apierror.InvalidRequest, "messages: %v", err))
			return
		}
	}
	stream := f.streaming()
	// Before prepareChat adds the token parameters: what the client asked.
	s.hooks.describeChat(t, digest, f)
	clientLogprobs := f.wantsLogprobs()
	up, err := s.prepareChat(f, clientLogprobs)
	if err != nil {
		fail(err)
		return
	}
	if stream {
		s.streamChat(task, w, r, t, up, digest, clientLogprobs)
		return
	}
	s.completeUpstream(task, r.Context(), t, up, func(b []byte, err error) {
		s.finish(task, w, r, t, s.chatReply(r.Context(), up, b, err, digest, clientLogprobs))
	})
}

// chatReply builds a non-streaming call's reply from the upstream's reply
// (or error).
func (s *Server) chatReply(ctx context.Context, up, b []byte, err error, digest string, clientLogprobs bool) reply {
	if err != nil {
		if contextOverflow(err) {
			body, merr := codec.Marshal(syntheticOverflow(s.cfg.Upstream.Model))
			if merr != nil {
				return reply{err: apierror.Wrap(apierror.Internal, merr), outcome: outcomeUpstreamError}
			}
			return reply{body: body, outcome: outcomeOverflow,
				capture: &captured{model: s.cfg.Upstream.Model, requestDigest: digest, finishReason: openai.FinishLength, err: errOverflowNoTokens}}
		}
		err = asAPIError(err)
		return reply{err: err, outcome: outcomeOf(err)}
	}
	c, err := decodeChatReply(b)
	if err != nil {
		return reply{err: apierror.New(apierror.UpstreamError, "the upstream reply is not a chat completion: %v", err), outcome: outcomeUpstreamError}
	}
	tf, terr := s.completeTokens(ctx, c, up)
	s.countTokens(c.Usage, tf)
	capt := &captured{model: s.cfg.Upstream.Model, requestDigest: digest, tokens: tf, finishReason: finishReason(c), err: terr}
	if err := callError(terr); err != nil {
		return reply{err: err, capture: capt, outcome: outcomeUpstreamError}
	}
	if !s.cfg.ReturnTokenIDs {
		return reply{body: bytes.TrimSpace(b), capture: capt, outcome: outcomeOK}
	}
	out, err := rewriteChatReply(b, tf, terr == nil, clientLogprobs)
	if err != nil {
		return reply{err: apierror.New(apierror.UpstreamError, "the upstream reply is not a chat completion: %v", err), outcome: outcomeUpstreamError}
	}
	return reply{body: out, capture: capt, outcome: outcomeOK}
}

// chatReplyRead is what chatOnce reads of an upstream chat completion: a
// generated token's log-probability without its bytes and alternatives,
// which the reply passes through as the upstream wrote them and which
// would be most of the decoding.
type chatReplyRead struct {
	Choices []struct {
		Index        int                `json:"index"`
		Message      openai.ChatMessage `json:"message"`
		FinishReason string             `json:"finish_reason"`
		Logprobs     *struct {
			Content []struct {
				Token   string  `json:"token"`
				Logprob float64 `json:"logprob"`
			} `json:"content"`
		} `json:"logprobs,omitempty"`
		TokenIDs codec.Ints `json:"token_ids,omitempty"`
	} `json:"choices"`
	Usage          *openai.Usage `json:"usage,omitempty"`
	PromptTokenIDs codec.Ints    `json:"prompt_token_ids,omitempty"`
}

// decodeChatReply decodes the parts of a chat completion chatOnce reads
// (chatReplyRead) into a ChatCompletion.
func decodeChatReply(b []byte) (*openai.ChatCompletion, error) {
	var r chatReplyRead
	if err := codec.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	c := &openai.ChatCompletion{Usage: r.Usage, PromptTokenIDs: r.PromptTokenIDs, Choices: make([]openai.ChatChoice, len(r.Choices))}
	for i, rc := range r.Choices {
		ch := &c.Choices[i]
		ch.Index, ch.Message, ch.FinishReason, ch.TokenIDs = rc.Index, rc.Message, rc.FinishReason, rc.TokenIDs
		if rc.Logprobs != nil {
			ch.Logprobs = &openai.ChoiceLogprobs{Content: make([]openai.TokenLogprob, len(rc.Logprobs.Content))}
			for j, e := range rc.Logprobs.Content {
				ch.Logprobs.Content[j] = openai.TokenLogprob{Token: e.Token, Logprob: e.Logprob}
			}
		}
	}
	return c, nil
}

func finishReason(c *openai.ChatCompletion) string {
	if len(c.Choices) == 0 {
		return ""
	}
	return c.Choices[0].FinishReason
}

// rewriteChatReply removes vLLM's transport fields (top-level
// prompt_token_ids, each choice's token_ids, and logprobs unless the client
// asked for them) and, when the tokens are usable, puts the training token
// fields on choices[0].message, with vLLM's choice-level routed_experts.
// Every other field passes through.
func rewriteChatReply(body []byte, tf openai.TokenFields, withTokens, keepLogprobs bool) ([]byte, error) {
	if out, ok := spliceChatReply(body, tf, withTokens, keepLogprobs); ok {
		return out, nil
	}
	return rewriteChatReplyMaps(body, tf, withTokens, keepLogprobs)
}

// rewriteChatReplyMaps is rewriteChatReply on decoded members, for a reply
// spliceChatReply does not read; its output's members are in key order.
func rewriteChatReplyMaps(body []byte, tf openai.TokenFields, withTokens, keepLogprobs bool) ([]byte, error) {
	var top map[string]codec.RawMessage
	if err := codec.Unmarshal(body, &top); err != nil || top == nil {
		return nil, errors.New("not a JSON object")
	}
	delete(top, "prompt_token_ids")
	var choices []map[string]codec.RawMessage
	if err := codec.Unmarshal(top["choices"], &choices); err != nil {
		return nil, errors.New("choices is not an array of objects")
	}
	for _, c := range choices {
		delete(c, "token_ids")
		if !keepLogprobs {
			delete(c, "logprobs")
		}
	}
	var routed codec.RawMessage
	if len(choices) > 0 && choices[0] != nil {
		if re := bytes.TrimSpace(choices[0]["routed_experts"]); len(re) > 0 && string(re) != "null" {
			routed = re
		}
	}
	if (withTokens || routed != nil) && len(choices) > 0 && choices[0] != nil {
		var msg map[string]codec.RawMessage
		if err := codec.Unmarshal(choices[0]["message"], &msg); err != nil || msg == nil {
			return nil, errors.New("choices[0].message is not an object")
		}
		var err error
		if withTokens {
			if msg["prompt_token_ids"], err = codec.Marshal(tf.PromptTokenIDs); err != nil {
				return nil, err
			}
			if msg["generation_token_ids"], err = codec.Marshal(tf.GenerationTokenIDs); err != nil {
				return nil, err
			}
			if msg["generation_log_probs"], err = codec.Marshal(tf.GenerationLogProbs); err != nil {
				return nil, err
			}
		}
		if routed != nil {
			// vLLM's choice-level routing moves to the message, beside the
			// token fields, where NeMo Gym's consumers read it.
			msg["routed_experts"] = routed
			delete(choices[0], "routed_experts")
		}
		if choices[0]["message"], err = encodeObject(msg); err != nil {
			return nil, err
		}
	}
	arr := []byte{'['}
	for i, c := range choices {
		if i > 0 {
			arr = append(arr, ',')
		}
		if c == nil {
			arr = append(arr, "null"...)
			continue
		}
		b, err := encodeObject(c)
		if err != nil {
			return nil, err
		}
		arr = append(arr, b...)
	}
	top["choices"] = append(arr, ']')
	return encodeObject(top)
}

// eventSink writes a call's SSE events; the first one passes the delivery
// gate.
type eventSink struct {
	s         *Server
	t         *ticket
	ctx       context.Context
	w         *sse.Writer
	seq       int
	delivered bool
}

func newEventSink(s *Server, t *ticket, r *http.Request, w http.ResponseWriter) *eventSink {
	return &eventSink{s: s, t: t, ctx: r.Context(), w: sse.NewWriter(w)}
}

// started reports whether the stream passed the delivery gate.
func (e *eventSink) started() bool { return e.delivered }

// open passes the delivery gate once, before the stream's first byte.
func (e *eventSink) open() error {
	if e.delivered {
		return nil
	}
	if err := e.s.deliverNow(e.ctx, e.t); err != nil {
		return err
	}
	e.delivered = true
	return nil
}

// raw writes one event as is.
func (e *eventSink) raw(name string, data []byte) error {
	if err := e.open(); err != nil {
		return err
	}
	return e.w.Event(name, data)
}

// send writes one Responses event with the next sequence number.
func (e *eventSink) send(ev *openai.StreamEvent) error {
	ev.SequenceNumber = e.seq
	e.seq++
	b, err := codec.Marshal(ev)
	if err != nil {
		return err
	}
	return e.raw(ev.Type, b)
}

// streamError is the data of the event that ends a chat stream the upstream
// broke: OpenAI's error object with our stable code, as vLLM ends a failed
// stream (data: {"error": {...}}, then data: [DONE]).
func streamError(err error) []byte {
	b, _ := codec.MarshalStable(apierror.OpenAIEnvelopeOf(apierror.From(streamFailure(err))))
	return b
}

// streamFailure is the error a stream that already started reports: an
// upstream error event keeps vLLM's message, type and param under our
// upstream_error code.
func streamFailure(err error) error {
	var us *upstreamStatus
	if !errors.As(err, &us) {
		return err
	}
	e := &apierror.Error{Code: apierror.UpstreamError, Detail: us.Error()}
	if ue, ok := parseUpstreamError(us.body); ok {
		e.Detail, e.Type = ue.Message, ue.Type
		if p, isText := ue.Param.(string); isText {
			e.Param = p
		}
	}
	return e
}

// unfinished is the failure of an upstream stream that ended, with [DONE]
// or without, before choice 0 had a finish_reason: the generation is
// truncated, and nothing downstream may score or train on it.
func unfinished(sawDone bool) error {
	if sawDone {
		return apierror.New(apierror.UpstreamError, "the upstream ended the stream with [DONE] before the completion had a finish_reason")
	}
	return apierror.New(apierror.UpstreamError, "the upstream stream ended before the completion finished")
}

// streamChat relays an upstream SSE stream chunk by chunk. The final
// [DONE] is held until the ledger row is staged. A stream that fails (an
// upstream error event, a [DONE] or EOF before a finish_reason, a broken
// connection, a failed /tokenize of its prompt) is a failed call: no ledger row, a capture failure recorded,
// and, once the client's stream started, an error event and [DONE].
//
// The log-probs the server asked for itself (return_token_ids without the
// client's logprobs) are taken out of each chunk, as rewriteChatReply
// takes them out of a complete reply: a client that did not ask for them
// reads logprobs: null, as OpenAI answers.
func (s *Server) streamChat(task *park.Task, w http.ResponseWriter, r *http.Request, t *ticket, up []byte, digest string, clientLogprobs bool) {
	ownLogprobs := s.cfg.ReturnTokenIDs && !clientLogprobs
	ctx, span := s.inferenceSpan(r.Context(), t, true)
	defer span.End()
	start := time.Now()
	defer s.hooks.upstreamRunning(t, false)
	resp, err := s.callUpstream(ctx, t, up, true)
	if err != nil {
		if contextOverflow(err) {
			s.overflowChatStream(task, w, r, t, digest)
			return
		}
		err = asAPIError(err)
		s.finish(task, w, r, t, reply{err: err, outcome: outcomeOf(err)})
		return
	}
	defer resp.Body.Close()
	out := newEventSink(s, t, r, w)
	var acc openai.ChatAccumulator
	rd := sse.NewReader(resp.Body)
	sawDone := false
	var upErr error
	for {
		ev, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			upErr = transportError(ctx, err)
			break
		}
		if string(bytes.TrimSpace(ev.Data)) == sse.Done {
			sawDone = true
			break
		}
		var ch openai.ChatChunk
		data := ev.Data
		if codec.Unmarshal(ev.Data, &ch) == nil {
			if upErr = eventError(ch.Error, ev.Data); upErr != nil {
				break
			}
			acc.Add(&ch)
			if ownLogprobs && chunkHasLogprobs(&ch) {
				data = withoutLogprobs(ev.Data)
			}
		}
		if err := out.raw(ev.Name, data); err != nil {
			s.done(t, outcomeCanceled)
			return
		}
	}
	s.metrics.upstreamSeconds.Observe(time.Since(start).Seconds())
	c := acc.Completion()
	if upErr == nil && finishReason(c) == "" {
		upErr = unfinished(sawDone)
	}
	var tf openai.TokenFields
	var terr error
	if upErr == nil {
		tf, terr = s.completeTokens(ctx, c, up)
		upErr = callError(terr)
	}
	if upErr != nil {
		if !out.started() {
			err := asAPIError(upErr)
			var capt *captured
			if terr != nil {
				// The generation ran: its failed capture is recorded.
				capt = &captured{err: terr}
			}
			s.finish(task, w, r, t, reply{err: err, capture: capt, outcome: outcomeOf(err)})
			return
		}
		if t.captureKey != "" {
			s.captureFailed(ctx, t, upErr)
		}
		s.log.WarnContext(ctx, "the upstream stream failed after the reply started", "model_call_id", t.callID, "err", upErr)
		if out.raw("", streamError(upErr)) == nil {
			_ = out.raw("", []byte(sse.Done))
		}
		s.done(t, outcomeStreamError)
		return
	}
	s.countTokens(c.Usage, tf)
	if err := out.open(); err != nil {
		s.done(t, outcomeCanceled)
		return
	}
	s.stage(ctx, t, &captured{model: s.cfg.Upstream.Model, requestDigest: digest, tokens: tf, finishReason: finishReason(c), err: terr})
	if err := out.raw("", []byte(sse.Done)); err != nil {
		s.done(t, outcomeCanceled)
		return
	}
	s.done(t, outcomeOK)
}

func chunkHasLogprobs(ch *openai.ChatChunk) bool {
	for i := range ch.Choices {
		if ch.Choices[i].Logprobs != nil {
			return true
		}
	}
	return false
}

// withoutLogprobs is a chunk without its choices' logprobs; a chunk that
// does not decode as an object with a choices array is returned as is.
func withoutLogprobs(data []byte) []byte {
	var top map[string]codec.RawMessage
	if codec.Unmarshal(data, &top) != nil || top == nil {
		return data
	}
	var choices []map[string]codec.RawMessage
	if codec.Unmarshal(top["choices"], &choices) != nil {
		return data
	}
	arr := []byte{'['}
	for i, c := range choices {
		if i > 0 {
			arr = append(arr, ',')
		}
		if c == nil {
			arr = append(arr, "null"...)
			continue
		}
		delete(c, "logprobs")
		b, err := encodeObject(c)
		if err != nil {
			return data
		}
		arr = append(arr, b...)
	}
	top["choices"] = append(arr, ']')
	out, err := encodeObject(top)
	if err != nil {
		return data
	}
	return out
}

// overflowChatStream answers a streaming call the upstream refused for its
// length with the synthetic empty completion as one chunk.
func (s *Server) overflowChatStream(task *park.Task, w http.ResponseWriter, r *http.Request, t *ticket, digest string) {
	c := syntheticOverflow(s.cfg.Upstream.Model)
	role, finish := "assistant", openai.FinishLength
	chunk := openai.ChatChunk{ID: c.ID, Object: "chat.completion.chunk", Created: c.Created, Model: c.Model,
		Choices: []openai.ChunkChoice{{Index: 0, Delta: openai.ChunkDelta{Role: role}, FinishReason: &finish}}}
	b, err := codec.Marshal(chunk)
	if err != nil {
		s.finish(task, w, r, t, reply{err: apierror.Wrap(apierror.Internal, err), outcome: outcomeUpstreamError})
		return
	}
	out := newEventSink(s, t, r, w)
	if err := out.open(); err != nil {
		s.done(t, outcomeCanceled)
		return
	}
	s.stage(r.Context(), t, &captured{model: s.cfg.Upstream.Model, requestDigest: digest, finishReason: openai.FinishLength, err: errOverflowNoTokens})
	if out.raw("", b) != nil || out.raw("", []byte(sse.Done)) != nil {
		s.done(t, outcomeCanceled)
		return
	}
	s.done(t, outcomeOverflow)
}
