package modelproxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/gymfleet/gymfleet/pkg/infra/freshstack"
	"github.com/gymfleet/gymfleet/pkg/infra/park"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/transport/sse"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

// knownResponsesField lists the top-level keys of a Responses request
// (NeMo Gym's NeMoGymResponseCreateParamsNonStreaming, plus stream). Any
// other key is refused, as NeMo Gym refuses it (extra="forbid").
func knownResponsesField(k string) bool {
	switch k {
	case "input", "instructions", "max_output_tokens", "max_tool_calls", "metadata", "model",
		"parallel_tool_calls", "previous_response_id", "prompt", "reasoning", "service_tier", "store",
		"temperature", "text", "tool_choice", "tools", "top_logprobs", "top_p", "truncation", "user",
		"background", "include", "stream":
		return true
	}
	return false
}

// decodeResponsesRequest reads a Responses request strictly at the top
// level: an unknown key is a 422 naming it.
func decodeResponsesRequest(body []byte) (*openai.ResponsesRequest, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, apierror.New(apierror.InvalidRequest, "request body is empty; expected a Responses request")
	}
	if !codec.Valid(body) {
		return nil, apierror.New(apierror.InvalidRequest, "request body is not valid JSON")
	}
	if err := checkResponsesFields(body); err != nil {
		return nil, err
	}
	var req openai.ResponsesRequest
	if err := codec.Unmarshal(body, &req); err != nil {
		return nil, apierror.New(apierror.InvalidRequest, "%s", codec.DescribeError(err)).WithStatus(http.StatusUnprocessableEntity)
	}
	if err := unsupported(&req); err != nil {
		return nil, err
	}
	return &req, nil
}

// checkResponsesFields refuses a valid JSON body that is not an object, has
// a field knownResponsesField does not know, or no input (absent or null).
// The fields are read where they are (objectMembers), not decoded into a
// map for their names alone; a body whose names objectMembers cannot read
// as they decode, or that it would refuse, goes to
// checkResponsesFieldsDecoded, and is refused as it always was.
// FuzzCheckResponsesFields checks the two against each other.
func checkResponsesFields(body []byte) error {
	var found [24]objectMember
	if members, ok := objectMembers(body, found[:0]); ok {
		known := true
		var input []byte // the last, as a map keeps it
		for _, m := range members {
			known = known && knownResponsesField(string(m.name))
			if string(m.name) == "input" {
				input = m.value
			}
		}
		if known && input != nil && string(input) != "null" {
			return nil
		}
	}
	return checkResponsesFieldsDecoded(body)
}

// checkResponsesFieldsDecoded is checkResponsesFields with the body
// decoded into a map.
func checkResponsesFieldsDecoded(body []byte) error {
	var top map[string]codec.RawMessage
	if err := codec.Unmarshal(body, &top); err != nil || top == nil {
		return apierror.New(apierror.InvalidRequest, "request body must be a JSON object")
	}
	var unknown []string
	for k := range top {
		if !knownResponsesField(k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		// param names the first, so an SDK's error.param names a field
		// as it does for every other refused parameter.
		e := apierror.New(apierror.InvalidRequest, "unknown request fields: %s", strings.Join(unknown, ", ")).WithStatus(http.StatusUnprocessableEntity)
		e.Param = unknown[0]
		return e
	}
	if in, ok := top["input"]; !ok || string(bytes.TrimSpace(in)) == "null" {
		return apierror.New(apierror.InvalidRequest, "input is required").WithStatus(http.StatusUnprocessableEntity)
	}
	return nil
}

// IncludeLogprobs is the one include entry the server implements: the
// output text's log-probs, as vLLM returns them.
const IncludeLogprobs = "message.output_text.logprobs"

// unsupported refuses the Responses parameters the server does not
// implement, naming them, rather than answering as if they had been
// honoured: stored and background responses, chaining by
// previous_response_id, prompt templates, structured text formats, automatic
// truncation and include entries other than the output text's log-probs.
// Their null, false or default values (what NeMo Gym's rows and agents
// send) pass.
func unsupported(req *openai.ResponsesRequest) error {
	refuse := func(param, format string, args ...any) error {
		e := apierror.New(apierror.InvalidRequest, format, args...)
		e.Param = param
		return e
	}
	if req.PreviousResponseID != nil && *req.PreviousResponseID != "" {
		return refuse("previous_response_id", "previous_response_id is not supported: this server stores no responses; send the whole conversation as input")
	}
	if req.Store != nil && *req.Store {
		return refuse("store", "store: true is not supported: this server stores no responses; send store: false or leave it out")
	}
	if req.Background != nil && *req.Background {
		return refuse("background", "background: true is not supported; responses are answered in the request")
	}
	if p := bytes.TrimSpace(req.Prompt); len(p) > 0 && string(p) != "null" {
		return refuse("prompt", "prompt templates are not supported; send the input itself")
	}
	if t := bytes.TrimSpace(req.Truncation); len(t) > 0 && string(t) != "null" && string(t) != `"disabled"` {
		return refuse("truncation", "truncation %s is not supported; only \"disabled\" (a prompt too long for the context ends the response as incomplete)", t)
	}
	if t := bytes.TrimSpace(req.Text); len(t) > 0 && string(t) != "null" {
		var text struct {
			Format *struct {
				Type string `json:"type"`
			} `json:"format"`
		}
		if err := codec.Unmarshal(t, &text); err != nil {
			return refuse("text", "text must be an object")
		}
		if text.Format != nil && text.Format.Type != "text" {
			return refuse("text.format", "text.format of type %q is not supported; only plain text", text.Format.Type)
		}
	}
	for _, inc := range req.Include {
		if inc != IncludeLogprobs {
			return refuse("include", "include %q is not supported; only %q", inc, IncludeLogprobs)
		}
	}
	return nil
}

// handleResponses serves POST /v1/responses: convert, call Chat Completions
// upstream, convert back. A non-streaming call waits parked
// (pkg/infra/park) for its upstream: a call in flight holds no goroutine.
func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	t, r, ok := s.admit(w, r, routeResponses)
	if !ok {
		return
	}
	httpserver.Park(w, r, func(task *park.Task) {
		task.Defer(func() { s.hooks.release(w, r, t) })
		s.serveResponses(task, w, r, t)
	})
}

// serveResponses is handleResponses's call once admitted.
func (s *Server) serveResponses(task *park.Task, w http.ResponseWriter, r *http.Request, t *ticket) {
	fail := func(err error) { s.finish(task, w, r, t, reply{err: err, outcome: outcomeOf(err)}) }
	body, err := httpserver.ReadBody(r)
	if err != nil {
		fail(err)
		return
	}
	req, err := decodeResponsesRequest(body)
	if err != nil {
		fail(err)
		return
	}
	chat, err := openai.ResponsesToChat(req, s.cfg.Upstream.Model)
	if err != nil {
		fail(apierror.New(apierror.InvalidRequest, "%v", err))
		return
	}
	if err := s.applyExtras(req, chat); err != nil {
		fail(err)
		return
	}
	s.setTokenParams(chat, wantsLogprobs(req))
	if req.Streaming() {
		chat.Stream, chat.StreamOptions = true, &openai.StreamOptions{IncludeUsage: true}
	}
	// On a goroutine of its own: goccy's encoder would grow the handler's
	// stack, deep by now, and the runtime copies a stack frame by frame
	// (freshstack).
	var up, messages, tools []byte
	freshstack.Run(func() { up, messages, tools, err = encodeUpstream(chat) })
	if err != nil {
		s.finish(task, w, r, t, reply{err: apierror.Wrap(apierror.Internal, err), outcome: outcomeUpstreamError})
		return
	}
	var digest string
	if t.captureKey != "" {
		if digest, err = s.digests.request(messages, tools); err != nil {
			fail(apierror.Wrap(apierror.Internal, err))
			return
		}
	}
	s.hooks.describeResponses(t, digest, req, chat)
	if req.Streaming() {
		s.streamResponses(task, w, r, t, req, up, digest)
		return
	}
	// The input is in up now; the reply echoes only the request's
	// parameters. Dropped, the input's items and token ids are not kept
	// while the call is held.
	req.Input = openai.Input{}
	s.completeUpstream(task, r.Context(), t, up, func(b []byte, err error) {
		s.finish(task, w, r, t, s.responsesReply(r.Context(), req, up, b, err, digest))
	})
}

// wantsLogprobs reports whether a Responses request asks for the output
// text's log-probs (vLLM honours top_logprobs only then).
func wantsLogprobs(req *openai.ResponsesRequest) bool {
	return slices.Contains(req.Include, IncludeLogprobs)
}

// setTokenParams asks the upstream for token ids, or, with return_token_ids
// off, keeps the history's token fields from going upstream. A client that
// asks for log-probs gets them as vLLM answers them (token strings, its
// top_logprobs), and the generated ids come from return_token_ids alone.
func (s *Server) setTokenParams(c *openai.ChatRequest, clientLogprobs bool) {
	yes, zero := true, 0
	if clientLogprobs {
		c.Logprobs = &yes
		if c.TopLogprobs == nil {
			c.TopLogprobs = &zero
		}
	} else {
		c.TopLogprobs = nil
	}
	if !s.cfg.ReturnTokenIDs {
		for i := range c.Messages {
			c.Messages[i].TokenFields = openai.TokenFields{}
		}
		return
	}
	c.ReturnTokenIDs = &yes
	if !clientLogprobs {
		c.Logprobs, c.TopLogprobs, c.ReturnTokensAsTokenIDs = &yes, &zero, &yes
	}
}

// applyExtras merges the request extras (extras.go) into a converted
// request.
func (s *Server) applyExtras(req *openai.ResponsesRequest, chat *openai.ChatRequest) error {
	if req.Metadata == nil && s.extraBody == nil && s.chatTemplateKwargs == nil {
		return nil
	}
	extra, kwargs, err := s.requestExtras(nil, req.Metadata[metaExtraBody], req.Metadata[metaChatTemplateKwargs])
	if err != nil {
		return err
	}
	if len(kwargs) > 0 {
		if chat.ChatTemplateKwargs, err = encodeKwargs(kwargs); err != nil {
			return err
		}
	}
	chat.ExtraBody = extra
	return nil
}

// applyTokens puts usable token fields on choices[0].message (where
// ChatToResponse takes them from) and clears anything partial there. The
// routing a vLLM returns on the choice (routed_experts) joins them, so it
// lands on the output item that carries the token ids.
func (s *Server) applyTokens(c *openai.ChatCompletion, tf openai.TokenFields, err error) {
	if len(c.Choices) == 0 {
		return
	}
	if ch := &c.Choices[0]; len(ch.Message.RoutedExperts) == 0 {
		ch.Message.RoutedExperts = ch.RoutedExperts
	}
	if s.cfg.ReturnTokenIDs && err == nil {
		c.Choices[0].Message.TokenFields = tf
	} else {
		c.Choices[0].Message.TokenFields = openai.TokenFields{}
	}
}

// encodeUpstream encodes the request the upstream is sent, and returns,
// in it, the messages and tools the request digest is taken over (tools
// nil when there are none). The extra body's fields the request does not
// have join it, all the fields then sorted by name.
//
// The request is encoded once: its members are found in the encoding
// (objectMembers), rather than decoded again to merge the extra
// body, and the digest is taken over them rather than over the messages
// and tools encoded once more. encodeUpstreamDecoded does it the long way
// if the encoding is not in that form, and TestEncodeUpstream and
// FuzzEncodeUpstream check that the two agree.
func encodeUpstream(chat *openai.ChatRequest) (up, messages, tools []byte, err error) {
	b, err := codec.Marshal(chat)
	if err != nil {
		return nil, nil, nil, err
	}
	var found [32]objectMember
	members, ok := objectMembers(b, found[:0])
	if !ok {
		return encodeUpstreamDecoded(chat)
	}
	for _, m := range members {
		switch string(m.name) {
		case "messages":
			messages = m.value
		case "tools":
			tools = m.value
		}
	}
	if len(chat.ExtraBody) == 0 {
		return b, messages, tools, nil
	}
	if up, ok = withExtraBody(members, chat.ExtraBody); !ok {
		return encodeUpstreamDecoded(chat)
	}
	return up, messages, tools, nil
}

// encodeUpstreamDecoded is encodeUpstream the long way: the request
// decoded again to merge the extra body, the messages and tools encoded
// again for the digest.
func encodeUpstreamDecoded(chat *openai.ChatRequest) (up, messages, tools []byte, err error) {
	if messages, err = codec.Marshal(chat.Messages); err != nil {
		return nil, nil, nil, err
	}
	if len(chat.Tools) > 0 {
		if tools, err = codec.Marshal(chat.Tools); err != nil {
			return nil, nil, nil, err
		}
	}
	up, err = codec.Marshal(chat)
	if err != nil || len(chat.ExtraBody) == 0 {
		return up, messages, tools, err
	}
	var f map[string]codec.RawMessage
	if err := codec.Unmarshal(up, &f); err != nil {
		return nil, nil, nil, err
	}
	underBody(f, chat.ExtraBody)
	if up, err = encodeObject(f); err != nil {
		return nil, nil, nil, err
	}
	return up, messages, tools, nil
}

// objectMember is a member of an object, in the object's bytes.
type objectMember struct {
	name, value []byte
}

// objectMembers appends the members of obj, one valid JSON value, to
// members, if it is an object whose names have no escapes and are valid
// UTF-8: each name is then its bytes between the quotes, and each value as
// codec.CutValue reads it. ok is false if obj is not such an object.
func objectMembers(obj []byte, members []objectMember) (_ []objectMember, ok bool) {
	rest := codec.SkipSpace(obj)
	if len(rest) == 0 || rest[0] != '{' {
		return nil, false
	}
	if rest = codec.SkipSpace(rest[1:]); len(rest) > 0 && rest[0] == '}' {
		return members, len(codec.SkipSpace(rest[1:])) == 0
	}
	for {
		var m objectMember
		if m.name, rest, ok = codec.CutString(rest); !ok {
			return nil, false
		}
		if rest = codec.SkipSpace(rest); len(rest) == 0 || rest[0] != ':' {
			return nil, false
		}
		if m.value, rest, ok = codec.CutValue(rest[1:]); !ok {
			return nil, false
		}
		members = append(members, m)
		if rest = codec.SkipSpace(rest); len(rest) == 0 {
			return nil, false
		}
		switch rest[0] {
		case '}':
			return members, len(codec.SkipSpace(rest[1:])) == 0
		case ',':
			rest = codec.SkipSpace(rest[1:])
		default:
			return nil, false
		}
	}
}

// withExtraBody writes members and the fields of extra they do not have as
// one object, the fields sorted by name: what encodeObject writes for
// them. ok is false if two members have the same name.
func withExtraBody(members []objectMember, extra map[string]codec.RawMessage) (_ []byte, ok bool) {
	fields := members
	size := 2
	for _, m := range members {
		size += len(m.name) + len(m.value) + 4
	}
	for k, v := range extra {
		if !slices.ContainsFunc(members, func(m objectMember) bool { return string(m.name) == k }) {
			fields = append(fields, objectMember{name: []byte(k), value: v})
			size += 2*len(k) + len(v) + 8
		}
	}
	slices.SortFunc(fields, func(a, b objectMember) int { return bytes.Compare(a.name, b.name) })
	out := make([]byte, 0, size)
	out = append(out, '{')
	for i, f := range fields {
		if i > 0 {
			if bytes.Equal(f.name, fields[i-1].name) {
				return nil, false
			}
			out = append(out, ',')
		}
		out = append(codec.AppendString(out, string(f.name)), ':')
		if len(f.value) == 0 {
			out = append(out, "null"...)
		} else {
			out = append(out, f.value...)
		}
	}
	return append(out, '}'), true
}

// responsesReply turns the upstream's reply (or error) into the Responses
// reply.
func (s *Server) responsesReply(ctx context.Context, req *openai.ResponsesRequest, up, b []byte, err error, digest string) reply {
	outcome := outcomeOK
	var c *openai.ChatCompletion
	var capt *captured
	switch {
	case contextOverflow(err):
		c = syntheticOverflow(s.cfg.Upstream.Model)
		capt = &captured{model: s.cfg.Upstream.Model, requestDigest: digest, finishReason: openai.FinishLength, err: errOverflowNoTokens}
		outcome = outcomeOverflow
	case err != nil:
		err = asAPIError(err)
		return reply{err: err, outcome: outcomeOf(err)}
	default:
		c = new(openai.ChatCompletion)
		if err := codec.Unmarshal(b, c); err != nil {
			return reply{err: apierror.New(apierror.UpstreamError, "the upstream reply is not a chat completion: %v", err), outcome: outcomeUpstreamError}
		}
		tf, terr := s.completeTokens(ctx, c, up)
		s.countTokens(c.Usage, tf)
		s.applyTokens(c, tf, terr)
		capt = &captured{model: s.cfg.Upstream.Model, requestDigest: digest, tokens: tf, finishReason: finishReason(c), err: terr}
		if err := callError(terr); err != nil {
			return reply{err: err, capture: capt, outcome: outcomeUpstreamError}
		}
	}
	resp, err := openai.ChatToResponse(req, c, openai.ResponseOptions{Model: s.cfg.Upstream.Model, Logprobs: wantsLogprobs(req)})
	if err != nil {
		return reply{err: apierror.New(apierror.UpstreamError, "converting the upstream reply: %v", err), outcome: outcomeUpstreamError}
	}
	body, err := codec.Marshal(resp)
	if err != nil {
		return reply{err: apierror.Wrap(apierror.Internal, err), outcome: outcomeUpstreamError}
	}
	return reply{body: body, capture: capt, outcome: outcome}
}

// streamResponses streams a Responses call: upstream chunks become
// Responses events as they arrive; the ledger row is staged before the
// closing events and response.completed.
func (s *Server) streamResponses(task *park.Task, w http.ResponseWriter, r *http.Request, t *ticket, req *openai.ResponsesRequest, up []byte, digest string) {
	ctx := r.Context()
	rs := newResponseStream(s, t, r, w, req)
	ctx, span := s.inferenceSpan(ctx, t, true)
	defer span.End()
	start := time.Now()
	defer s.hooks.upstreamRunning(t, false)
	resp, err := s.callUpstream(ctx, t, up, true)
	if err != nil {
		if !contextOverflow(err) {
			err = asAPIError(err)
			s.finish(task, w, r, t, reply{err: err, outcome: outcomeOf(err)})
			return
		}
		c := syntheticOverflow(s.cfg.Upstream.Model)
		s.endResponseStream(rs, c, &captured{model: s.cfg.Upstream.Model, requestDigest: digest, finishReason: openai.FinishLength, err: errOverflowNoTokens}, outcomeOverflow)
		return
	}
	defer resp.Body.Close()
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
		if err := codec.Unmarshal(ev.Data, &ch); err != nil {
			upErr = apierror.New(apierror.UpstreamError, "the upstream sent an undecodable chunk: %v", err)
			break
		}
		if upErr = eventError(ch.Error, ev.Data); upErr != nil {
			break
		}
		acc.Add(&ch)
		if err := rs.chunk(&ch); err != nil {
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
		if !rs.out.started() {
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
		s.log.WarnContext(ctx, "the upstream stream failed after the response started", "model_call_id", t.callID, "err", upErr)
		rs.fail(streamFailure(upErr))
		s.done(t, outcomeStreamError)
		return
	}
	s.countTokens(c.Usage, tf)
	s.applyTokens(c, tf, terr)
	s.endResponseStream(rs, c, &captured{model: s.cfg.Upstream.Model, requestDigest: digest, tokens: tf, finishReason: finishReason(c), err: terr}, outcomeOK)
}

// endResponseStream converts the finished completion, stages the row, and
// writes the closing events and response.completed.
func (s *Server) endResponseStream(rs *responseStream, c *openai.ChatCompletion, capt *captured, outcome string) {
	// The stream may not have begun yet (an empty or overflowed reply):
	// response.created goes first, through the delivery gate.
	if err := rs.begin(c.Created); err != nil {
		s.done(rs.t, outcomeCanceled)
		return
	}
	final, err := rs.final(c)
	if err != nil {
		err = apierror.New(apierror.UpstreamError, "converting the upstream reply: %v", err)
		if rs.t.captureKey != "" {
			s.captureFailed(rs.r.Context(), rs.t, err)
		}
		rs.fail(err)
		s.done(rs.t, outcomeStreamError)
		return
	}
	s.stage(rs.r.Context(), rs.t, capt)
	if err := rs.complete(final); err != nil {
		s.done(rs.t, outcomeCanceled)
		return
	}
	s.done(rs.t, outcome)
}
