package openai

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// This file converts a Responses request into the Chat Completions request a
// vLLM endpoint serves, and the Chat Completions reply back into a Response,
// the way NeMo Gym's vllm_model does (gym-servers.md §4.3):
//
//   - instructions become one system message at index 0; leading system and
//     developer messages are folded into it, joined with "\n\n";
//   - consecutive assistant-side items (assistant message text, reasoning
//     summaries wrapped as <think>…</think>, function calls) merge into one
//     assistant message; token fields on those items ride on it;
//   - function_call_output becomes a "tool" message;
//   - on the way back, reasoning (the reasoning fields and <think> blocks)
//     becomes one reasoning item, remaining text a message item, and each tool
//     call a function_call item; the last item carries the token fields.

// Finish reasons of Chat Completions the conversion acts on.
const (
	FinishStop          = "stop"
	FinishLength        = "length"
	FinishToolCalls     = "tool_calls"
	FinishContentFilter = "content_filter"
)

// Response statuses and incomplete reasons.
const (
	StatusCompleted  = "completed"
	StatusIncomplete = "incomplete"
	StatusInProgress = "in_progress"

	IncompleteMaxOutputTokens = "max_output_tokens"
	IncompleteContentFilter   = "content_filter"
)

// NewID returns prefix followed by 32 random hex digits, the shape of
// NeMo Gym's ids ("resp_<uuid4 hex>").
func NewID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms.
	return prefix + hex.EncodeToString(b[:])
}

// ResponsesToChat converts a Responses request into the Chat Completions
// request sent upstream, with model set to model. Fields Chat does not declare
// (include, background, previous_response_id, text, truncation, prompt,
// max_tool_calls) are dropped, as NeMo Gym does; the model server refuses
// the values it cannot honour before converting (modelproxy's unsupported). It fails on input it cannot
// express in Chat: unknown item types or content parts, non-function tools,
// partial token fields, or a tool_choice that needs tools when none are offered.
func ResponsesToChat(req *ResponsesRequest, model string) (*ChatRequest, error) {
	if req == nil {
		return nil, errors.New("no request")
	}
	var c chatBuilder
	if req.Input.IsItems {
		items := req.Input.AsItems()
		for i := range items {
			if err := c.add(&items[i]); err != nil {
				return nil, fmt.Errorf("input[%d]: %w", i, err)
			}
		}
	} else {
		// A string input is one user message with one text part.
		c.messages = append(c.messages, ChatMessage{Role: "user", Content: &MessageContent{
			IsParts: true, Parts: []ContentPart{{Type: "text", Text: req.Input.Text}},
		}})
	}
	c.flush()

	out := &ChatRequest{
		Model:       model,
		Messages:    foldInstructions(req.Instructions, c.messages),
		Temperature: req.Temperature,
		TopP:        req.TopP,
		MaxTokens:   req.MaxOutputTokens,
		Metadata:    req.Metadata,
		TopLogprobs: req.TopLogprobs,
		Store:       req.Store,
		ServiceTier: req.ServiceTier,
	}
	if req.User != nil {
		out.User = *req.User
	}
	if req.Reasoning != nil && req.Reasoning.Effort != nil {
		out.ReasoningEffort = *req.Reasoning.Effort
	}
	if len(req.Tools) == 0 {
		// Without tools vLLM refuses tool_choice and parallel_tool_calls, so
		// both are dropped, unless the choice demands a tool.
		if needsTool(req.ToolChoice) {
			return nil, fmt.Errorf("tool_choice %s requires at least one tool", req.ToolChoice)
		}
		return out, nil
	}
	for i, t := range req.Tools {
		if t.Type != "function" {
			return nil, fmt.Errorf("tools[%d]: tool type %q is not supported; only function tools convert to Chat Completions", i, t.Type)
		}
		if t.Name == "" {
			return nil, fmt.Errorf("tools[%d]: a function tool needs a name", i)
		}
		// strict stays behind, as NeMo Gym's vllm_model drops it at the
		// vLLM boundary (VLLMModel._strip_hosted_only_tool_fields,
		// nemo-gym 0.7.0): a chat template that renders the function
		// definition would put it in the prompt. A vLLM serving forced tool
		// calls holds their arguments to the parameters with
		// --tool-strict-level parameter instead.
		out.Tools = append(out.Tools, ChatTool{Type: "function", Function: ChatFunction{
			Name: t.Name, Description: t.Description, Parameters: t.Parameters,
		}})
	}
	tc, err := chatToolChoice(req.ToolChoice)
	if err != nil {
		return nil, err
	}
	out.ToolChoice = tc
	out.ParallelToolCalls = req.ParallelToolCalls
	return out, nil
}

// chatBuilder accumulates chat messages, merging runs of assistant items.
type chatBuilder struct {
	messages []ChatMessage
	// The assistant message being merged.
	content   strings.Builder
	toolCalls []ToolCall
	tokens    TokenFields
}

func (c *chatBuilder) add(it *Item) error {
	switch it.Type {
	case ItemMessage:
		return c.addMessage(it)
	case ItemReasoning:
		for _, s := range it.Summary {
			if s.Text != "" {
				c.content.WriteString("<think>")
				c.content.WriteString(s.Text)
				c.content.WriteString("</think>")
			}
		}
		return c.noteTokens(it)
	case ItemFunctionCall:
		if it.CallID == "" {
			return errors.New("function_call needs call_id")
		}
		c.toolCalls = append(c.toolCalls, ToolCall{ID: it.CallID, Type: "function", Function: FunctionCall{Name: it.Name, Arguments: it.Arguments}})
		return c.noteTokens(it)
	case ItemFunctionCallOutput:
		if it.CallID == "" {
			return errors.New("function_call_output needs call_id")
		}
		out, err := chatContent(it.Output)
		if err != nil {
			return fmt.Errorf("function_call_output: %w", err)
		}
		c.flush()
		c.messages = append(c.messages, ChatMessage{Role: "tool", ToolCallID: it.CallID, Content: out})
		return nil
	default:
		return fmt.Errorf("input item type %q is not supported", it.Type)
	}
}

func (c *chatBuilder) addMessage(it *Item) error {
	switch it.Role {
	case "assistant":
		// Text of any part kind (output_text, refusal, …) joins the buffer.
		c.content.WriteString(it.Content.String())
		return c.noteTokens(it)
	case "user", "system", "developer":
		content, err := chatContent(it.Content)
		if err != nil {
			return fmt.Errorf("%s message: %w", it.Role, err)
		}
		c.flush()
		c.messages = append(c.messages, ChatMessage{Role: it.Role, Content: content})
		return nil
	default:
		return fmt.Errorf("message role %q is not supported", it.Role)
	}
}

// noteTokens keeps the token fields of an assistant-side item for the merged
// message; the last item that carries them wins.
func (c *chatBuilder) noteTokens(it *Item) error {
	if !it.HasTokens() {
		return nil
	}
	if err := it.TokenFields.Validate(); err != nil {
		return err
	}
	c.tokens = it.TokenFields
	return nil
}

// flush ends the assistant message being merged, if it has anything.
func (c *chatBuilder) flush() {
	if c.content.Len() == 0 && len(c.toolCalls) == 0 {
		c.tokens = TokenFields{}
		return
	}
	m := ChatMessage{Role: "assistant", ToolCalls: c.toolCalls, TokenFields: c.tokens}
	if c.content.Len() > 0 {
		text, reasoning := ReasoningFromThink(c.content.String())
		m.Content = TextContent(text)
		m.ReasoningContent, m.Reasoning = reasoning, reasoning
	}
	c.messages = append(c.messages, m)
	c.content.Reset()
	c.toolCalls = nil
	c.tokens = TokenFields{}
}

// chatContent converts Responses content (a string, or input parts) into Chat
// content. Missing content is the empty string.
func chatContent(in *MessageContent) (*MessageContent, error) {
	if in == nil {
		return TextContent(""), nil
	}
	if !in.IsParts {
		return TextContent(in.Text), nil
	}
	parts := make([]ContentPart, 0, len(in.Parts))
	for i, p := range in.Parts {
		switch p.Type {
		case "input_text", "output_text", "text":
			parts = append(parts, ContentPart{Type: "text", Text: p.Text})
		case "input_image":
			u, err := mediaURL(p.ImageURL, p.Detail, true)
			if err != nil {
				return nil, fmt.Errorf("content[%d]: input_image: %w", i, err)
			}
			parts = append(parts, ContentPart{Type: "image_url", ImageURL: u})
		case "input_video":
			u, err := mediaURL(p.VideoURL, "", false)
			if err != nil {
				return nil, fmt.Errorf("content[%d]: input_video: %w", i, err)
			}
			parts = append(parts, ContentPart{Type: "video_url", VideoURL: u})
		default:
			return nil, fmt.Errorf("content[%d]: part type %q is not supported", i, p.Type)
		}
	}
	return &MessageContent{IsParts: true, Parts: parts}, nil
}

// mediaURL turns Responses' "image_url": "<url>" into Chat's
// {"url": "<url>", "detail": …}; an object is taken as already Chat-shaped.
func mediaURL(raw codec.RawMessage, detail string, withDetail bool) (codec.RawMessage, error) {
	if len(raw) == 0 {
		return nil, errors.New("missing url")
	}
	var s string
	if err := codec.Unmarshal(raw, &s); err != nil {
		var obj map[string]any
		if err := codec.Unmarshal(raw, &obj); err != nil {
			return nil, errors.New("url must be a string or an object")
		}
		return raw, nil
	}
	v := map[string]string{"url": s}
	if withDetail {
		if detail == "" {
			detail = "auto"
		}
		v["detail"] = detail
	}
	return codec.MarshalStable(v)
}

// foldInstructions puts instructions first as one system message, folding in
// the system and developer messages that lead the conversation.
func foldInstructions(instructions *string, msgs []ChatMessage) []ChatMessage {
	if instructions == nil || *instructions == "" {
		return msgs
	}
	texts := []string{*instructions}
	i := 0
	for ; i < len(msgs) && (msgs[i].Role == "system" || msgs[i].Role == "developer"); i++ {
		if t := msgs[i].Content.String(); t != "" {
			texts = append(texts, t)
		}
	}
	out := make([]ChatMessage, 0, len(msgs)-i+1)
	out = append(out, ChatMessage{Role: "system", Content: TextContent(strings.Join(texts, "\n\n"))})
	return append(out, msgs[i:]...)
}

// needsTool reports whether a tool_choice demands a tool call.
func needsTool(choice codec.RawMessage) bool {
	if len(choice) == 0 || string(choice) == "null" {
		return false
	}
	var s string
	if err := codec.Unmarshal(choice, &s); err == nil {
		return s != "auto" && s != "none"
	}
	return true
}

// chatToolChoice rewrites Responses' named-function choice
// {"type":"function","name":X} into Chat's {"type":"function","function":{"name":X}};
// strings and other objects pass through.
func chatToolChoice(choice codec.RawMessage) (codec.RawMessage, error) {
	if len(choice) == 0 || string(choice) == "null" {
		return nil, nil
	}
	var named struct {
		Type     string           `json:"type"`
		Name     string           `json:"name"`
		Function codec.RawMessage `json:"function"`
	}
	if err := codec.Unmarshal(choice, &named); err != nil {
		// A string ("auto", "none", "required") or another shape.
		return choice, nil
	}
	if named.Type == "function" && named.Name != "" && len(named.Function) == 0 {
		return codec.MarshalStable(map[string]any{"type": "function", "function": map[string]string{"name": named.Name}})
	}
	return choice, nil
}

// ResponseOptions are the parts of a converted Response the caller chooses.
type ResponseOptions struct {
	// Model is echoed as the response's model (the configured upstream
	// model); empty means the completion's own.
	Model string
	// ID, ReasoningID and MessageID name the response and its items; empty
	// means a fresh random id ("resp_…", "rs_…", "msg_…"). A streaming
	// converter passes the ids it already announced.
	ID, ReasoningID, MessageID string
	// Logprobs puts the choice's log-probs on the message's output_text
	// part (include "message.output_text.logprobs").
	Logprobs bool
}

// ResponseLogprob is one token's log-probability on an output_text part
// (OpenAI's Responses Logprob: token, bytes, logprob, top_logprobs).
type ResponseLogprob struct {
	Token       string               `json:"token"`
	Bytes       []int                `json:"bytes"`
	Logprob     float64              `json:"logprob"`
	TopLogprobs []ResponseTopLogprob `json:"top_logprobs"`
}

// ResponseTopLogprob is one alternative token of a ResponseLogprob.
type ResponseTopLogprob struct {
	Token   string  `json:"token"`
	Bytes   []int   `json:"bytes"`
	Logprob float64 `json:"logprob"`
}

// ResponseLogprobs converts Chat Completions log-prob entries into the
// Responses shape; a token without bytes gets its UTF-8 bytes.
func ResponseLogprobs(entries []TokenLogprob) []ResponseLogprob {
	out := make([]ResponseLogprob, len(entries))
	for i, e := range entries {
		top := make([]ResponseTopLogprob, len(e.TopLogprobs))
		for j, t := range e.TopLogprobs {
			top[j] = ResponseTopLogprob{Token: t.Token, Bytes: tokenBytes(t.Token, t.Bytes), Logprob: t.Logprob}
		}
		out[i] = ResponseLogprob{Token: e.Token, Bytes: tokenBytes(e.Token, e.Bytes), Logprob: e.Logprob, TopLogprobs: top}
	}
	return out
}

func tokenBytes(token string, b []int) []int {
	if b != nil {
		return b
	}
	out := make([]int, len(token))
	for i := 0; i < len(token); i++ {
		out[i] = int(token[i])
	}
	return out
}

var thinkBlock = regexp.MustCompile(`(?s)<think>(.*?)</think>`)

// SplitThink splits <think>…</think> blocks out of text: it returns each
// block's inside, in order, and the text without them. An unclosed <think>
// stays in the text.
func SplitThink(text string) (blocks []string, rest string) {
	if !strings.Contains(text, "<think>") {
		return nil, text
	}
	for _, m := range thinkBlock.FindAllStringSubmatch(text, -1) {
		blocks = append(blocks, m[1])
	}
	return blocks, thinkBlock.ReplaceAllLiteralString(text, "")
}

// ReasoningFromThink takes the <think>…</think> blocks out of the text of
// an assistant message of the history, as NeMo Gym's vllm_model does before
// every vLLM call with its reasoning parser on
// (VLLMModel._preprocess_chat_completion_create_params, nemo-gym 0.7.0, with
// uses_reasoning_parser, uses_interleaved_reasoning and reasoning_field
// "both", preserve_reasoning_in_assistant_content off): every block leaves
// the text, and the first block's inside, when there is a block, is the
// message's reasoning, sent under both reasoning_content (vLLM before 0.16)
// and reasoning (from 0.16). The chat template then renders the history as
// the model's reasoning parser split it.
func ReasoningFromThink(text string) (rest string, reasoning *string) {
	blocks, rest := SplitThink(text)
	if len(blocks) == 0 {
		return text, nil
	}
	return rest, &blocks[0]
}

// ReasoningText returns the reasoning a reply message carries in
// reasoning_content (vLLM's reasoning parser) or reasoning (newer vLLM).
func ReasoningText(m *ChatMessage) string {
	if m.ReasoningContent != nil && *m.ReasoningContent != "" {
		return *m.ReasoningContent
	}
	if m.Reasoning != nil {
		return *m.Reasoning
	}
	return ""
}

// ChatToResponse converts a Chat Completions reply to req (converted by
// ResponsesToChat) into a Response. Only choices[0] is read. Token fields on
// the choice's message move to the last output item.
func ChatToResponse(req *ResponsesRequest, c *ChatCompletion, opts ResponseOptions) (*Response, error) {
	if req == nil || c == nil {
		return nil, errors.New("no request or completion")
	}
	if len(c.Choices) == 0 {
		return nil, errors.New("the completion has no choices")
	}
	choice := &c.Choices[0]
	msg := &choice.Message

	content := msg.Content.String()
	if r := ReasoningText(msg); r != "" {
		content = "<think>" + r + "</think>" + content
	}
	blocks, text := SplitThink(content)

	var output []Item
	if len(blocks) > 0 {
		summary := make([]SummaryText, len(blocks))
		for i, b := range blocks {
			summary[i] = SummaryText{Type: "summary_text", Text: b}
		}
		output = append(output, Item{Type: ItemReasoning, ID: idOr(opts.ReasoningID, "rs_"), Summary: summary})
	}
	// An empty reply still becomes a message, with text "".
	if text != "" || (len(output) == 0 && len(msg.ToolCalls) == 0) {
		role := msg.Role
		if role == "" {
			role = "assistant"
		}
		part := OutputText(text)
		if opts.Logprobs {
			var entries []TokenLogprob
			if choice.Logprobs != nil {
				entries = choice.Logprobs.Content
			}
			b, err := codec.Marshal(ResponseLogprobs(entries))
			if err != nil {
				return nil, err
			}
			part.Logprobs = b
		}
		output = append(output, Item{
			Type: ItemMessage, ID: idOr(opts.MessageID, "msg_"), Role: role, Status: StatusCompleted,
			Content: &MessageContent{IsParts: true, Parts: []ContentPart{part}},
		})
	}
	for _, tc := range msg.ToolCalls {
		id := tc.ID
		if id == "" {
			id = NewID("call_")
		}
		output = append(output, Item{
			Type: ItemFunctionCall, ID: id, CallID: id, Name: tc.Function.Name,
			Arguments: tc.Function.Arguments, Status: StatusCompleted,
		})
	}
	if msg.HasTokens() {
		output[len(output)-1].TokenFields = msg.TokenFields
	}
	if re := msg.RoutedExperts; len(re) > 0 && string(re) != "null" {
		output[len(output)-1].RoutedExperts = re
	}

	resp := &Response{
		ID:                idOr(opts.ID, "resp_"),
		Object:            "response",
		CreatedAt:         float64(c.Created),
		Model:             opts.Model,
		Output:            output,
		ParallelToolCalls: req.ParallelToolCalls == nil || *req.ParallelToolCalls,
		ToolChoice:        req.ToolChoice,
		Tools:             req.Tools,
		Temperature:       req.Temperature,
		TopP:              req.TopP,
		Status:            StatusCompleted,
		Usage:             ResponseUsageFromChat(c.Usage),
		Instructions:      req.Instructions,
		Metadata:          req.Metadata,
		MaxOutputTokens:   req.MaxOutputTokens,
		TopLogprobs:       req.TopLogprobs,
	}
	if resp.Model == "" {
		resp.Model = c.Model
	}
	if len(resp.ToolChoice) == 0 || string(resp.ToolChoice) == "null" {
		resp.ToolChoice = codec.RawMessage(`"auto"`)
	}
	if resp.Tools == nil {
		resp.Tools = []Tool{}
	}
	switch choice.FinishReason {
	case FinishLength:
		resp.Status = StatusIncomplete
		resp.IncompleteDetails = &IncompleteDetails{Reason: IncompleteMaxOutputTokens}
	case FinishContentFilter:
		resp.Status = StatusIncomplete
		resp.IncompleteDetails = &IncompleteDetails{Reason: IncompleteContentFilter}
	}
	return resp, nil
}

// ResponseUsageFromChat maps Chat usage to Responses usage; the cached and
// reasoning details stay null when the upstream did not report them.
func ResponseUsageFromChat(u *Usage) *ResponseUsage {
	if u == nil {
		return nil
	}
	out := &ResponseUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
	if u.PromptTokensDetails != nil {
		out.InputTokensDetails.CachedTokens = u.PromptTokensDetails.CachedTokens
	}
	if u.CompletionTokensDetails != nil {
		out.OutputTokensDetails.ReasoningTokens = u.CompletionTokensDetails.ReasoningTokens
	}
	return out
}

func idOr(id, prefix string) string {
	if id != "" {
		return id
	}
	return NewID(prefix)
}
