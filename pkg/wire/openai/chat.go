// Package openai holds the OpenAI-compatible wire types the fleet speaks
// (Chat Completions, with vLLM's token-id extensions, and Responses, with
// NeMo Gym's training token fields) and the conversion between them.
package openai

import (
	"bytes"
	"fmt"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// ChatRequest is a Chat Completions request. Fields the fleet does not act on
// still decode so a proxy can forward them; Extra keeps the rest.
type ChatRequest struct {
	Model               string            `json:"model"`
	Messages            []ChatMessage     `json:"messages"`
	Tools               []ChatTool        `json:"tools,omitempty"`
	ToolChoice          codec.RawMessage  `json:"tool_choice,omitempty"`
	ParallelToolCalls   *bool             `json:"parallel_tool_calls,omitempty"`
	Temperature         *float64          `json:"temperature,omitempty"`
	TopP                *float64          `json:"top_p,omitempty"`
	MaxTokens           *int              `json:"max_tokens,omitempty"`
	MaxCompletionTokens *int              `json:"max_completion_tokens,omitempty"`
	N                   *int              `json:"n,omitempty"`
	Stop                codec.RawMessage  `json:"stop,omitempty"`
	Seed                *int64            `json:"seed,omitempty"`
	User                string            `json:"user,omitempty"`
	Metadata            map[string]string `json:"metadata,omitempty"`
	ResponseFormat      codec.RawMessage  `json:"response_format,omitempty"`
	ReasoningEffort     string            `json:"reasoning_effort,omitempty"`
	Store               *bool             `json:"store,omitempty"`
	ServiceTier         *string           `json:"service_tier,omitempty"`
	Stream              bool              `json:"stream,omitempty"`
	StreamOptions       *StreamOptions    `json:"stream_options,omitempty"`
	Logprobs            *bool             `json:"logprobs,omitempty"`
	TopLogprobs         *int              `json:"top_logprobs,omitempty"`
	// vLLM extensions.
	ReturnTokenIDs         *bool            `json:"return_token_ids,omitempty"`
	ReturnTokensAsTokenIDs *bool            `json:"return_tokens_as_token_ids,omitempty"`
	ChatTemplateKwargs     codec.RawMessage `json:"chat_template_kwargs,omitempty"`
	// ExtraBody are top-level fields a proxy merges under the encoded
	// request (a field the request has wins); never encoded itself.
	ExtraBody map[string]codec.RawMessage `json:"-"`
}

// StreamOptions is stream_options of a streaming request.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage,omitempty"`
}

// ChatTool is a function tool offered to the model.
type ChatTool struct {
	Type     string       `json:"type"`
	Function ChatFunction `json:"function"`
}

// ChatFunction describes a function tool.
type ChatFunction struct {
	Name        string           `json:"name"`
	Description string           `json:"description,omitempty"`
	Parameters  codec.RawMessage `json:"parameters,omitempty"`
	// Strict is read from a request (vLLM's FunctionDefinition takes
	// it); the model server never sends it (ResponsesToChat).
	Strict *bool `json:"strict,omitempty"`
}

// ChatMessage is one message of a conversation or a choice's reply.
type ChatMessage struct {
	Role             string          `json:"role"`
	Content          *MessageContent `json:"content"`
	Name             string          `json:"name,omitempty"`
	ToolCalls        []ToolCall      `json:"tool_calls,omitempty"`
	ToolCallID       string          `json:"tool_call_id,omitempty"`
	ReasoningContent *string         `json:"reasoning_content,omitempty"`
	Reasoning        *string         `json:"reasoning,omitempty"`
	TokenFields
	// RoutedExperts is a reply's per-token MoE routing (NeMo Gym's
	// routed_experts: a string or [[[int]]]), kept opaque.
	RoutedExperts codec.RawMessage `json:"routed_experts,omitempty"`
}

// TokenFields are NeMo Gym's training token fields: all three or none.
type TokenFields struct {
	PromptTokenIDs     codec.Ints   `json:"prompt_token_ids,omitempty"`
	GenerationTokenIDs codec.Ints   `json:"generation_token_ids,omitempty"`
	GenerationLogProbs codec.Floats `json:"generation_log_probs,omitempty"`
}

// HasTokens reports whether any token field is set.
func (t TokenFields) HasTokens() bool {
	return t.PromptTokenIDs != nil || t.GenerationTokenIDs != nil || t.GenerationLogProbs != nil
}

// Validate checks the all-or-nothing rule and matching lengths.
func (t TokenFields) Validate() error {
	if !t.HasTokens() {
		return nil
	}
	if t.PromptTokenIDs == nil || t.GenerationTokenIDs == nil || t.GenerationLogProbs == nil {
		return fmt.Errorf("token fields are all-or-nothing: prompt_token_ids, generation_token_ids and generation_log_probs")
	}
	if len(t.GenerationTokenIDs) != len(t.GenerationLogProbs) {
		return fmt.Errorf("generation_token_ids has %d entries but generation_log_probs has %d", len(t.GenerationTokenIDs), len(t.GenerationLogProbs))
	}
	return nil
}

// MessageContent is a message's content: a string, or a list of parts.
type MessageContent struct {
	Text  string
	Parts []ContentPart
	// IsParts is set when the content is a list (possibly empty).
	IsParts bool
}

// TextContent returns string content.
func TextContent(s string) *MessageContent { return &MessageContent{Text: s} }

// String joins the text of every part, or returns the string content.
func (c *MessageContent) String() string {
	if c == nil {
		return ""
	}
	if !c.IsParts {
		return c.Text
	}
	var b bytes.Buffer
	for _, p := range c.Parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

// UnmarshalJSON reads a string or a list.
func (c *MessageContent) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '[' {
		c.IsParts = true
		c.Text = ""
		return codec.Unmarshal(b, &c.Parts)
	}
	c.IsParts = false
	c.Parts = nil
	return codec.Unmarshal(b, &c.Text)
}

// ContentPart is one part of a message's content.
type ContentPart struct {
	Type        string           `json:"type"`
	Text        string           `json:"text"`
	Annotations []any            `json:"annotations,omitempty"`
	Logprobs    codec.RawMessage `json:"logprobs,omitempty"`
	ImageURL    codec.RawMessage `json:"image_url,omitempty"`
	// Detail is input_image's detail ("auto", "low", "high").
	Detail   string           `json:"detail,omitempty"`
	VideoURL codec.RawMessage `json:"video_url,omitempty"`
}

// ToolCall is a function call the model made.
type ToolCall struct {
	// Index is set on streaming deltas only.
	Index    *int         `json:"index,omitempty"`
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function FunctionCall `json:"function"`
}

// FunctionCall names the function and its JSON arguments text.
type FunctionCall struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// ChatCompletion is a non-streaming Chat Completions reply.
type ChatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []ChatChoice `json:"choices"`
	Usage   *Usage       `json:"usage,omitempty"`
	// PromptTokenIDs is vLLM's return_token_ids field.
	PromptTokenIDs codec.Ints `json:"prompt_token_ids,omitempty"`
}

// ChatChoice is one choice of a reply.
type ChatChoice struct {
	Index        int             `json:"index"`
	Message      ChatMessage     `json:"message"`
	FinishReason string          `json:"finish_reason"`
	Logprobs     *ChoiceLogprobs `json:"logprobs,omitempty"`
	// TokenIDs is vLLM's return_token_ids field: the generated ids.
	TokenIDs codec.Ints `json:"token_ids,omitempty"`
	// RoutedExperts is vLLM's per-choice routed_experts, kept opaque.
	RoutedExperts codec.RawMessage `json:"routed_experts,omitempty"`
}

// ChoiceLogprobs holds one entry per generated token.
type ChoiceLogprobs struct {
	Content []TokenLogprob `json:"content"`
}

// TokenLogprob is one generated token's log-probability. With
// return_tokens_as_token_ids the token is "token_id:<id>".
type TokenLogprob struct {
	Token       string       `json:"token"`
	Logprob     float64      `json:"logprob"`
	Bytes       []int        `json:"bytes,omitempty"`
	TopLogprobs []TopLogprob `json:"top_logprobs"`
}

// TopLogprob is one alternative token.
type TopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes,omitempty"`
}

// Usage counts tokens of a call.
type Usage struct {
	PromptTokens            int                      `json:"prompt_tokens"`
	CompletionTokens        int                      `json:"completion_tokens"`
	TotalTokens             int                      `json:"total_tokens"`
	PromptTokensDetails     *PromptTokensDetails     `json:"prompt_tokens_details,omitempty"`
	CompletionTokensDetails *CompletionTokensDetails `json:"completion_tokens_details,omitempty"`
}

// PromptTokensDetails breaks down prompt tokens.
type PromptTokensDetails struct {
	CachedTokens *int `json:"cached_tokens"`
}

// CompletionTokensDetails breaks down completion tokens.
type CompletionTokensDetails struct {
	ReasoningTokens *int `json:"reasoning_tokens"`
}

// ChatChunk is one SSE event of a streaming Chat Completions reply.
type ChatChunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []ChunkChoice `json:"choices"`
	Usage   *Usage        `json:"usage,omitempty"`
	// PromptTokenIDs comes on the first chunk only (vLLM return_token_ids).
	PromptTokenIDs codec.Ints `json:"prompt_token_ids,omitempty"`
	// Error is set on the event a vLLM stream fails with instead of a
	// chunk: data: {"error": {...}}, then data: [DONE].
	Error codec.RawMessage `json:"error,omitempty"`
}

// ChunkChoice is one choice's delta.
type ChunkChoice struct {
	Index        int             `json:"index"`
	Delta        ChunkDelta      `json:"delta"`
	FinishReason *string         `json:"finish_reason"`
	Logprobs     *ChoiceLogprobs `json:"logprobs,omitempty"`
	TokenIDs     codec.Ints      `json:"token_ids,omitempty"`
	// RoutedExperts, when a chunk carries it, is the choice's routing.
	RoutedExperts codec.RawMessage `json:"routed_experts,omitempty"`
}

// ChunkDelta is what a chunk adds to the message.
type ChunkDelta struct {
	Role             string     `json:"role,omitempty"`
	Content          *string    `json:"content,omitempty"`
	ToolCalls        []ToolCall `json:"tool_calls,omitempty"`
	ReasoningContent *string    `json:"reasoning_content,omitempty"`
	Reasoning        *string    `json:"reasoning,omitempty"`
	// RoutedExperts, on a stream's last delta, is the message's routing
	// (the stand-in's placement: no upstream streams it).
	RoutedExperts codec.RawMessage `json:"routed_experts,omitempty"`
}

// Model is one entry of GET /v1/models.
type Model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// ModelList is the reply of GET /v1/models.
type ModelList struct {
	Object string  `json:"object"`
	Data   []Model `json:"data"`
}
