package modelproxy

import (
	"net/http"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

// responseStream turns Chat Completions chunks into Responses SSE events as
// they arrive:
//
//	response.created, response.in_progress
//	per item: output_item.added, then for a message content_part.added,
//	  output_text.delta…, output_text.done, content_part.done; for a call
//	  function_call_arguments.delta…, function_call_arguments.done; then
//	  output_item.done
//	response.completed with the full Response (response.incomplete when
//	  it stopped early)
//
// Items open one at a time, in the order the final Response lists them
// (reasoning, message, calls) as long as the model produces them in that
// order, which is how models answer. Text that arrives after a later item
// opened is not streamed but is in response.completed, which is
// authoritative. Reasoning (reasoning deltas, <think> blocks) is not streamed
// as deltas: the reasoning item is announced and closed with its summary.
type responseStream struct {
	s   *Server
	t   *ticket
	r   *http.Request
	w   http.ResponseWriter
	out *eventSink
	req *openai.ResponsesRequest

	id      string
	created int64
	begun   bool
	next    int
	err     error

	think   thinkFilter
	summary []string
	// logprobs are the current chunk's log-probs, given to its first text
	// delta when the client asked for them (they are all in the final
	// Response either way).
	logprobs  []openai.TokenLogprob
	reasoning *streamItem
	message   *streamItem
	calls     []*streamItem
	open      *streamItem
}

// streamItem is one output item as streamed so far.
type streamItem struct {
	typ    string
	index  int
	id     string
	name   string
	text   strings.Builder // message text, or a call's arguments
	closed bool
}

func newResponseStream(s *Server, t *ticket, r *http.Request, w http.ResponseWriter, req *openai.ResponsesRequest) *responseStream {
	return &responseStream{s: s, t: t, r: r, w: w, out: newEventSink(s, t, r, w), req: req, id: openai.NewID("resp_")}
}

func intp(i int) *int { return &i }

func (rs *responseStream) emit(ev *openai.StreamEvent) {
	if rs.err != nil {
		return
	}
	rs.err = rs.out.send(ev)
}

// skeleton is the Response before it has output, echoing the request.
func (rs *responseStream) skeleton(created int64, status string) *openai.Response {
	resp, err := openai.ChatToResponse(rs.req, &openai.ChatCompletion{Created: created, Choices: []openai.ChatChoice{{}}},
		openai.ResponseOptions{Model: rs.s.cfg.Upstream.Model, ID: rs.id})
	if err != nil {
		// Unreachable: the completion has a choice.
		resp = &openai.Response{ID: rs.id, Object: "response", CreatedAt: float64(created), Model: rs.s.cfg.Upstream.Model}
	}
	resp.Output, resp.Status, resp.Usage, resp.IncompleteDetails = []openai.Item{}, status, nil, nil
	return resp
}

// begin sends response.created and response.in_progress, once. The first
// event passes the delivery gate.
func (rs *responseStream) begin(created int64) error {
	if rs.begun {
		return rs.err
	}
	rs.begun, rs.created = true, created
	rs.emit(&openai.StreamEvent{Type: openai.EventResponseCreated, Response: rs.skeleton(created, openai.StatusInProgress)})
	rs.emit(&openai.StreamEvent{Type: openai.EventResponseInProgress, Response: rs.skeleton(created, openai.StatusInProgress)})
	return rs.err
}

// chunk streams one upstream chunk.
func (rs *responseStream) chunk(ch *openai.ChatChunk) error {
	if err := rs.begin(ch.Created); err != nil {
		return err
	}
	for i := range ch.Choices {
		cc := &ch.Choices[i]
		if cc.Index != 0 {
			continue
		}
		d := &cc.Delta
		if cc.Logprobs != nil && wantsLogprobs(rs.req) {
			rs.logprobs = cc.Logprobs.Content
		}
		if d.ReasoningContent != nil {
			rs.reasoningText(*d.ReasoningContent, false)
		} else if d.Reasoning != nil {
			rs.reasoningText(*d.Reasoning, false)
		}
		if d.Content != nil {
			for _, seg := range rs.think.feed(*d.Content) {
				if seg.think {
					rs.reasoningText(seg.text, true)
				} else {
					rs.visibleText(seg.text)
				}
			}
		}
		for _, tc := range d.ToolCalls {
			rs.toolCall(tc)
		}
		rs.logprobs = nil
	}
	return rs.err
}

// reasoningText adds reasoning: a reasoning delta continues the first
// summary entry, a <think> block is an entry of its own.
func (rs *responseStream) reasoningText(text string, block bool) {
	if block {
		rs.summary = append(rs.summary, text)
	} else if text != "" {
		if len(rs.summary) == 0 {
			rs.summary = append(rs.summary, "")
		}
		rs.summary[0] += text
	}
	if rs.reasoning != nil || rs.message != nil || len(rs.calls) > 0 || (text == "" && !block) {
		return
	}
	rs.reasoning = rs.openItem(openai.Item{Type: openai.ItemReasoning, ID: openai.NewID("rs_")})
}

func (rs *responseStream) visibleText(text string) {
	if text == "" || len(rs.calls) > 0 {
		return
	}
	if rs.message == nil {
		rs.message = rs.openItem(openai.Item{Type: openai.ItemMessage, ID: openai.NewID("msg_"), Role: "assistant",
			Status: openai.StatusInProgress, Content: &openai.MessageContent{IsParts: true, Parts: []openai.ContentPart{}}})
		part := openai.OutputText("")
		rs.emit(&openai.StreamEvent{Type: openai.EventContentPartAdded, ItemID: rs.message.id, OutputIndex: intp(rs.message.index), ContentIndex: intp(0), Part: &part})
	}
	if rs.message.closed {
		return
	}
	rs.message.text.WriteString(text)
	ev := &openai.StreamEvent{Type: openai.EventOutputTextDelta, ItemID: rs.message.id, OutputIndex: intp(rs.message.index), ContentIndex: intp(0), Delta: &text,
		Logprobs: noLogprobs}
	if len(rs.logprobs) > 0 {
		if b, err := codec.Marshal(openai.ResponseLogprobs(rs.logprobs)); err == nil {
			ev.Logprobs = b
		}
		rs.logprobs = nil
	}
	rs.emit(ev)
}

// noLogprobs is the logprobs of a text event without any: OpenAI's text
// delta and done events always carry the list (ResponseTextDeltaEvent's
// logprobs is required in the openai SDK 3.63.0), so an SDK user iterates
// it rather than meeting None.
var noLogprobs = codec.RawMessage("[]")

// partLogprobs is the logprobs of a finished output_text part, for its
// done event.
func partLogprobs(item *openai.Item) codec.RawMessage {
	if item.Content != nil && len(item.Content.Parts) > 0 {
		if lp := item.Content.Parts[0].Logprobs; len(lp) > 0 && string(lp) != "null" {
			return lp
		}
	}
	return noLogprobs
}

// maxToolCalls bounds the tool calls one reply may open.
const maxToolCalls = 1024

func (rs *responseStream) toolCall(tc openai.ToolCall) {
	i := openai.ToolCallIndex(tc, len(rs.calls))
	if i >= maxToolCalls {
		return
	}
	for len(rs.calls) <= i {
		rs.calls = append(rs.calls, nil)
	}
	it := rs.calls[i]
	if it == nil {
		id := tc.ID
		if id == "" {
			id = openai.NewID("call_")
		}
		it = rs.openItem(openai.Item{Type: openai.ItemFunctionCall, ID: id, CallID: id, Name: tc.Function.Name, Status: openai.StatusInProgress})
		it.name = tc.Function.Name
		rs.calls[i] = it
	}
	if tc.Function.Arguments == "" || it.closed {
		return
	}
	it.text.WriteString(tc.Function.Arguments)
	delta := tc.Function.Arguments
	rs.emit(&openai.StreamEvent{Type: openai.EventFunctionArgsDelta, ItemID: it.id, OutputIndex: intp(it.index), Delta: &delta})
}

// openItem closes the open item and announces a new one.
func (rs *responseStream) openItem(item openai.Item) *streamItem {
	if rs.open != nil {
		rs.closeItem(rs.open, nil)
	}
	it := &streamItem{typ: item.Type, index: rs.next, id: item.ID}
	rs.next++
	rs.open = it
	rs.emit(&openai.StreamEvent{Type: openai.EventOutputItemAdded, OutputIndex: intp(it.index), Item: &item})
	return it
}

// closeItem sends an item's closing events, with final as its content (nil:
// what was streamed).
func (rs *responseStream) closeItem(it *streamItem, final *openai.Item) {
	if it.closed {
		return
	}
	it.closed = true
	if rs.open == it {
		rs.open = nil
	}
	if final == nil {
		final = rs.streamedItem(it)
	}
	switch it.typ {
	case openai.ItemMessage:
		text := final.Content.String()
		part := openai.OutputText(text)
		rs.emit(&openai.StreamEvent{Type: openai.EventOutputTextDone, ItemID: it.id, OutputIndex: intp(it.index), ContentIndex: intp(0), Text: &text,
			Logprobs: partLogprobs(final)})
		rs.emit(&openai.StreamEvent{Type: openai.EventContentPartDone, ItemID: it.id, OutputIndex: intp(it.index), ContentIndex: intp(0), Part: &part})
	case openai.ItemFunctionCall:
		args := final.Arguments
		rs.emit(&openai.StreamEvent{Type: openai.EventFunctionArgsDone, ItemID: it.id, OutputIndex: intp(it.index), Arguments: &args})
	}
	rs.emit(&openai.StreamEvent{Type: openai.EventOutputItemDone, OutputIndex: intp(it.index), Item: final})
}

// streamedItem is an item as far as it was streamed.
func (rs *responseStream) streamedItem(it *streamItem) *openai.Item {
	switch it.typ {
	case openai.ItemReasoning:
		summary := make([]openai.SummaryText, len(rs.summary))
		for i, s := range rs.summary {
			summary[i] = openai.SummaryText{Type: "summary_text", Text: s}
		}
		return &openai.Item{Type: it.typ, ID: it.id, Summary: summary}
	case openai.ItemMessage:
		return &openai.Item{Type: it.typ, ID: it.id, Role: "assistant", Status: openai.StatusCompleted,
			Content: &openai.MessageContent{IsParts: true, Parts: []openai.ContentPart{openai.OutputText(it.text.String())}}}
	default:
		return &openai.Item{Type: it.typ, ID: it.id, CallID: it.id, Name: it.name, Arguments: it.text.String(), Status: openai.StatusCompleted}
	}
}

// final converts the finished completion into the Response, naming the
// items with the ids already streamed.
func (rs *responseStream) final(c *openai.ChatCompletion) (*openai.Response, error) {
	if rest := rs.think.flush(); rest != "" {
		rs.visibleText(rest)
	}
	opts := openai.ResponseOptions{Model: rs.s.cfg.Upstream.Model, ID: rs.id, Logprobs: wantsLogprobs(rs.req)}
	if rs.reasoning != nil {
		opts.ReasoningID = rs.reasoning.id
	}
	if rs.message != nil {
		opts.MessageID = rs.message.id
	}
	if len(c.Choices) > 0 {
		calls := c.Choices[0].Message.ToolCalls
		for i := range calls {
			if calls[i].ID == "" && i < len(rs.calls) && rs.calls[i] != nil {
				calls[i].ID = rs.calls[i].id
			}
		}
	}
	return openai.ChatToResponse(rs.req, c, opts)
}

// complete closes every item with its final content, announces the items
// that were never streamed (an empty reply's message), and sends
// response.completed.
func (rs *responseStream) complete(final *openai.Response) error {
	for i := range final.Output {
		item := &final.Output[i]
		var it *streamItem
		switch item.Type {
		case openai.ItemReasoning:
			it = rs.reasoning
		case openai.ItemMessage:
			it = rs.message
		case openai.ItemFunctionCall:
			for _, c := range rs.calls {
				if c != nil && c.id == item.ID {
					it = c
				}
			}
		}
		if it == nil {
			announced := *item
			announced.TokenFields = openai.TokenFields{}
			if announced.Type == openai.ItemMessage {
				announced.Status = openai.StatusInProgress
				announced.Content = &openai.MessageContent{IsParts: true, Parts: []openai.ContentPart{}}
			}
			it = rs.openItem(announced)
			if item.Type == openai.ItemMessage {
				part := openai.OutputText("")
				rs.emit(&openai.StreamEvent{Type: openai.EventContentPartAdded, ItemID: it.id, OutputIndex: intp(it.index), ContentIndex: intp(0), Part: &part})
				if text := item.Content.String(); text != "" {
					rs.emit(&openai.StreamEvent{Type: openai.EventOutputTextDelta, ItemID: it.id, OutputIndex: intp(it.index), ContentIndex: intp(0), Delta: &text,
						Logprobs: noLogprobs})
				}
			}
		}
		rs.closeItem(it, item)
	}
	// OpenAI ends a response that stopped early (max_output_tokens, a
	// context overflow) with response.incomplete, not response.completed.
	end := openai.EventResponseCompleted
	if final.Status == openai.StatusIncomplete {
		end = openai.EventResponseIncomplete
	}
	rs.emit(&openai.StreamEvent{Type: end, Response: final})
	return rs.err
}

// fail ends a started stream with response.failed.
func (rs *responseStream) fail(err error) {
	e := apierror.From(err)
	resp := rs.skeleton(rs.created, "failed")
	resp.Error, _ = codec.MarshalStable(map[string]string{"code": string(e.Code), "message": e.Detail})
	rs.emit(&openai.StreamEvent{Type: openai.EventResponseFailed, Response: resp})
}

// thinkFilter splits streamed content into visible text and <think>
// blocks, with the semantics of openai.SplitThink: a block ends at the first
// </think>, and an unclosed <think> is text.
type thinkFilter struct {
	buf     string
	inThink bool
	// scanned is how much of buf (in a block) was searched for </think>.
	scanned int
}

type segment struct {
	think bool
	text  string
}

const (
	openTag  = "<think>"
	closeTag = "</think>"
)

func (f *thinkFilter) feed(s string) []segment {
	f.buf += s
	var out []segment
	for {
		if !f.inThink {
			if i := strings.Index(f.buf, openTag); i >= 0 {
				if i > 0 {
					out = append(out, segment{text: f.buf[:i]})
				}
				f.buf, f.inThink, f.scanned = f.buf[i+len(openTag):], true, 0
				continue
			}
			// Hold back what could be the start of a tag.
			keep := partialSuffix(f.buf, openTag)
			if n := len(f.buf) - keep; n > 0 {
				out = append(out, segment{text: f.buf[:n]})
				f.buf = f.buf[n:]
			}
			return out
		}
		from := max(0, f.scanned-len(closeTag)+1)
		if i := strings.Index(f.buf[from:], closeTag); i >= 0 {
			i += from
			out = append(out, segment{think: true, text: f.buf[:i]})
			f.buf, f.inThink, f.scanned = f.buf[i+len(closeTag):], false, 0
			continue
		}
		f.scanned = len(f.buf)
		return out
	}
}

// flush returns what is left at the end of the stream: held-back text, or
// an unclosed block, which is text.
func (f *thinkFilter) flush() string {
	rest := f.buf
	if f.inThink {
		rest = openTag + rest
	}
	f.buf, f.inThink, f.scanned = "", false, 0
	return rest
}

// partialSuffix is the length of the longest proper prefix of tag that s
// ends with.
func partialSuffix(s, tag string) int {
	for k := min(len(tag)-1, len(s)); k > 0; k-- {
		if strings.HasSuffix(s, tag[:k]) {
			return k
		}
	}
	return 0
}
