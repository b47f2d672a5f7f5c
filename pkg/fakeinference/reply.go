package fakeinference

import (
	"github.com/gymfleet/gymfleet/pkg/codec"
	"github.com/gymfleet/gymfleet/pkg/openai"
)

// The reply shapes below are pkg/openai's chat completion and chunk with
// routed_experts beside them, where a scripted reply carries it
// (Script.RoutedExpertsIn). The fields are those of the openai types, in
// their order, so a reply without routed_experts is byte for byte what the
// openai types encode.

type chatCompletion struct {
	ID             string        `json:"id"`
	Object         string        `json:"object"`
	Created        int64         `json:"created"`
	Model          string        `json:"model"`
	Choices        []chatChoice  `json:"choices"`
	Usage          *openai.Usage `json:"usage,omitempty"`
	PromptTokenIDs codec.Ints    `json:"prompt_token_ids,omitempty"`
}

type chatChoice struct {
	Index         int                    `json:"index"`
	Message       replyMessage           `json:"message"`
	FinishReason  string                 `json:"finish_reason"`
	Logprobs      *openai.ChoiceLogprobs `json:"logprobs,omitempty"`
	TokenIDs      codec.Ints             `json:"token_ids,omitempty"`
	RoutedExperts codec.RawMessage       `json:"routed_experts,omitempty"`
}

// replyMessage is the assistant message; RoutedExperts, at the outer
// level, wins over any field of that name openai.ChatMessage may gain.
type replyMessage struct {
	openai.ChatMessage
	RoutedExperts codec.RawMessage `json:"routed_experts,omitempty"`
}

type chatChunk struct {
	ID             string        `json:"id"`
	Object         string        `json:"object"`
	Created        int64         `json:"created"`
	Model          string        `json:"model"`
	Choices        []chunkChoice `json:"choices"`
	Usage          *openai.Usage `json:"usage,omitempty"`
	PromptTokenIDs codec.Ints    `json:"prompt_token_ids,omitempty"`
}

type chunkChoice struct {
	Index         int                    `json:"index"`
	Delta         chunkDelta             `json:"delta"`
	FinishReason  *string                `json:"finish_reason"`
	Logprobs      *openai.ChoiceLogprobs `json:"logprobs,omitempty"`
	TokenIDs      codec.Ints             `json:"token_ids,omitempty"`
	RoutedExperts codec.RawMessage       `json:"routed_experts,omitempty"`
}

type chunkDelta struct {
	openai.ChunkDelta
	RoutedExperts codec.RawMessage `json:"routed_experts,omitempty"`
}
