package openai

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// Item types of the Responses API the fleet understands.
const (
	ItemMessage            = "message"
	ItemFunctionCall       = "function_call"
	ItemFunctionCallOutput = "function_call_output"
	ItemReasoning          = "reasoning"
)

// ResponsesRequest is a Responses create request (NeMo Gym's
// responses_create_params). The model server decodes it strictly: unknown
// top-level keys are a 422, as in NeMo Gym.
type ResponsesRequest struct {
	Input              Input             `json:"input"`
	Instructions       *string           `json:"instructions,omitempty"`
	MaxOutputTokens    *int              `json:"max_output_tokens,omitempty"`
	MaxToolCalls       *int              `json:"max_tool_calls,omitempty"`
	Metadata           map[string]string `json:"metadata,omitempty"`
	Model              string            `json:"model,omitempty"`
	ParallelToolCalls  *bool             `json:"parallel_tool_calls,omitempty"`
	PreviousResponseID *string           `json:"previous_response_id,omitempty"`
	Prompt             codec.RawMessage  `json:"prompt,omitempty"`
	Reasoning          *Reasoning        `json:"reasoning,omitempty"`
	ServiceTier        *string           `json:"service_tier,omitempty"`
	Store              *bool             `json:"store,omitempty"`
	Temperature        *float64          `json:"temperature,omitempty"`
	Text               codec.RawMessage  `json:"text,omitempty"`
	ToolChoice         codec.RawMessage  `json:"tool_choice,omitempty"`
	Tools              []Tool            `json:"tools,omitempty"`
	TopLogprobs        *int              `json:"top_logprobs,omitempty"`
	TopP               *float64          `json:"top_p,omitempty"`
	Truncation         codec.RawMessage  `json:"truncation,omitempty"`
	User               *string           `json:"user,omitempty"`
	Background         *bool             `json:"background,omitempty"`
	Include            []string          `json:"include,omitempty"`
	Stream             *bool             `json:"stream,omitempty"`
}

// Streaming reports whether the request asks for SSE.
func (r *ResponsesRequest) Streaming() bool { return r.Stream != nil && *r.Stream }

// Reasoning configures reasoning.
type Reasoning struct {
	Effort  *string `json:"effort,omitempty"`
	Summary *string `json:"summary,omitempty"`
}

// Tool is a Responses function tool.
type Tool struct {
	Type        string           `json:"type"`
	Name        string           `json:"name"`
	Description string           `json:"description,omitempty"`
	Parameters  codec.RawMessage `json:"parameters,omitempty"`
	Strict      *bool            `json:"strict,omitempty"`
}

// Input is a request's input: a string or a list of items.
type Input struct {
	Text  string
	Items []Item
	// Then follows Items in the list: a sender whose list is two it holds
	// (the agent's input items, then its outputs so far) refers to both
	// rather than copying them into one for as long as the call is out.
	// Decoding never sets it.
	Then []Item
	// IsItems is set when the input is a list.
	IsItems bool
}

// AsItems returns the input as items; a string becomes one user message.
func (in Input) AsItems() []Item {
	if in.IsItems {
		if len(in.Then) > 0 {
			return slices.Concat(in.Items, in.Then)
		}
		return in.Items
	}
	return []Item{{Type: ItemMessage, Role: "user", Content: TextContent(in.Text)}}
}

// UnmarshalJSON reads a string or a list.
func (in *Input) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '[' {
		in.IsItems, in.Text, in.Then = true, "", nil
		return codec.Unmarshal(b, &in.Items)
	}
	in.IsItems, in.Items, in.Then = false, nil, nil
	return codec.Unmarshal(b, &in.Text)
}

// Item is one input or output item. Which fields apply depends on Type;
// MarshalJSON writes each type in its own wire shape.
type Item struct {
	Type string
	ID   string
	// Message fields. A message without Type ("easy message") reads as one.
	Role    string
	Status  string
	Content *MessageContent
	// function_call and function_call_output fields.
	CallID    string
	Name      string
	Arguments string
	Output    *MessageContent
	// reasoning fields.
	Summary          []SummaryText
	EncryptedContent *string
	// NeMo Gym's training token fields, on the last output item of a call.
	TokenFields
	// RoutedExperts rides with the token fields (NeMo Gym's routed_experts,
	// read by NeMo RL's router replay); opaque, and written only on output.
	RoutedExperts codec.RawMessage
	// encoded, set by Compact, is what MarshalJSON writes.
	encoded []byte
}

// Compact returns the item without its token fields and routed experts,
// with enc, the item as MarshalJSON writes it, written in their place from
// then on. It is for a holder that keeps the item's encoding anyway (the
// agent, in its boundary record) and reads the item again only for its
// kind, call and content: the token arrays, often most of an item, are
// then held once, as text. enc must not change afterwards.
func (it Item) Compact(enc []byte) Item {
	it.TokenFields = TokenFields{}
	it.RoutedExperts = nil
	it.encoded = enc
	return it
}

// SummaryText is one summary entry of a reasoning item.
type SummaryText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// wireItem is the union of every item field, for decoding.
type wireItem struct {
	Type               string          `json:"type"`
	ID                 string          `json:"id"`
	Role               string          `json:"role"`
	Status             string          `json:"status"`
	Content            *MessageContent `json:"content"`
	CallID             string          `json:"call_id"`
	Name               string          `json:"name"`
	Arguments          string          `json:"arguments"`
	Output             *MessageContent `json:"output"`
	Summary            []SummaryText   `json:"summary"`
	EncryptedContent   *string         `json:"encrypted_content"`
	PromptTokenIDs     codec.Ints      `json:"prompt_token_ids"`
	GenerationTokenIDs codec.Ints      `json:"generation_token_ids"`
	GenerationLogProbs codec.Floats    `json:"generation_log_probs"`
}

// UnmarshalJSON reads any item type.
func (it *Item) UnmarshalJSON(b []byte) error {
	var w wireItem
	if err := codec.Unmarshal(b, &w); err != nil {
		return err
	}
	if w.Type == "" {
		if w.Role == "" {
			return fmt.Errorf("input item has neither type nor role")
		}
		w.Type = ItemMessage
	}
	*it = Item{
		Type: w.Type, ID: w.ID, Role: w.Role, Status: w.Status, Content: w.Content,
		CallID: w.CallID, Name: w.Name, Arguments: w.Arguments, Output: w.Output,
		Summary: w.Summary, EncryptedContent: w.EncryptedContent,
		TokenFields: TokenFields{PromptTokenIDs: w.PromptTokenIDs, GenerationTokenIDs: w.GenerationTokenIDs, GenerationLogProbs: w.GenerationLogProbs},
	}
	return nil
}

// OutputText is the assistant's output_text part as NeMo Gym emits it.
func OutputText(text string) ContentPart {
	return ContentPart{Type: "output_text", Text: text, Annotations: []any{}}
}

// Response is a Responses object (NeMo Gym's NeMoGymResponse).
type Response struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	// CreatedAt is a float, as OpenAI's Response and NeMo Gym's
	// NeMoGymResponse declare it: a Gym model server sends 1700000000.0.
	CreatedAt         float64            `json:"created_at"`
	Model             string             `json:"model"`
	Output            []Item             `json:"output"`
	ParallelToolCalls bool               `json:"parallel_tool_calls"`
	ToolChoice        codec.RawMessage   `json:"tool_choice"`
	Tools             []Tool             `json:"tools"`
	Temperature       *float64           `json:"temperature"`
	TopP              *float64           `json:"top_p"`
	Status            string             `json:"status"`
	IncompleteDetails *IncompleteDetails `json:"incomplete_details"`
	Usage             *ResponseUsage     `json:"usage"`
	Error             codec.RawMessage   `json:"error"`
	Instructions      *string            `json:"instructions"`
	Metadata          map[string]string  `json:"metadata"`
	MaxOutputTokens   *int               `json:"max_output_tokens"`
	// TopLogprobs echoes the request's, as OpenAI's Response does; absent
	// when the request had none.
	TopLogprobs *int `json:"top_logprobs,omitempty"`
}

// IncompleteDetails says why a response stopped early.
type IncompleteDetails struct {
	Reason string `json:"reason"`
}

// ResponseUsage counts a response's tokens.
type ResponseUsage struct {
	InputTokens         int                 `json:"input_tokens"`
	InputTokensDetails  InputTokensDetails  `json:"input_tokens_details"`
	OutputTokens        int                 `json:"output_tokens"`
	OutputTokensDetails OutputTokensDetails `json:"output_tokens_details"`
	TotalTokens         int                 `json:"total_tokens"`
}

// InputTokensDetails breaks down input tokens.
type InputTokensDetails struct {
	CachedTokens *int `json:"cached_tokens"`
}

// OutputTokensDetails breaks down output tokens.
type OutputTokensDetails struct {
	ReasoningTokens *int `json:"reasoning_tokens"`
}

// Add accumulates other into u the way Simple Agent sums usage across turns:
// counts add, and a detail becomes null if either side is null.
func (u *ResponseUsage) Add(o *ResponseUsage) {
	if o == nil {
		return
	}
	u.InputTokens += o.InputTokens
	u.OutputTokens += o.OutputTokens
	u.TotalTokens += o.TotalTokens
	u.InputTokensDetails.CachedTokens = addNullable(u.InputTokensDetails.CachedTokens, o.InputTokensDetails.CachedTokens)
	u.OutputTokensDetails.ReasoningTokens = addNullable(u.OutputTokensDetails.ReasoningTokens, o.OutputTokensDetails.ReasoningTokens)
}

func addNullable(a, b *int) *int {
	if a == nil || b == nil {
		return nil
	}
	s := *a + *b
	return &s
}

// FunctionCalls returns the function_call items of an output.
func FunctionCalls(items []Item) []Item {
	var out []Item
	for _, it := range items {
		if it.Type == ItemFunctionCall {
			out = append(out, it)
		}
	}
	return out
}

// HasAssistantMessage reports whether an output has an assistant message.
func HasAssistantMessage(items []Item) bool {
	for _, it := range items {
		if it.Type == ItemMessage && it.Role == "assistant" {
			return true
		}
	}
	return false
}

// Responses SSE event types.
const (
	EventResponseCreated      = "response.created"
	EventResponseInProgress   = "response.in_progress"
	EventOutputItemAdded      = "response.output_item.added"
	EventContentPartAdded     = "response.content_part.added"
	EventOutputTextDelta      = "response.output_text.delta"
	EventOutputTextDone       = "response.output_text.done"
	EventContentPartDone      = "response.content_part.done"
	EventFunctionArgsDelta    = "response.function_call_arguments.delta"
	EventFunctionArgsDone     = "response.function_call_arguments.done"
	EventOutputItemDone       = "response.output_item.done"
	EventResponseCompleted    = "response.completed"
	EventResponseIncomplete   = "response.incomplete"
	EventResponseFailed       = "response.failed"
	EventResponseErrorGeneric = "error"
)

// StreamEvent is one Responses SSE event. Only the fields of its type are set.
type StreamEvent struct {
	Type           string       `json:"type"`
	SequenceNumber int          `json:"sequence_number"`
	Response       *Response    `json:"response,omitempty"`
	OutputIndex    *int         `json:"output_index,omitempty"`
	ContentIndex   *int         `json:"content_index,omitempty"`
	ItemID         string       `json:"item_id,omitempty"`
	Item           *Item        `json:"item,omitempty"`
	Part           *ContentPart `json:"part,omitempty"`
	Delta          *string      `json:"delta,omitempty"`
	Text           *string      `json:"text,omitempty"`
	Arguments      *string      `json:"arguments,omitempty"`
	// Logprobs is a JSON list on text delta and done events (OpenAI sends
	// one on each, [] when none were asked for); absent on the others.
	Logprobs codec.RawMessage `json:"logprobs,omitempty"`
	Code     string           `json:"code,omitempty"`
	Message  string           `json:"message,omitempty"`
}
