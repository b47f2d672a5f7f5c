package fakeinference_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
)

// The official Go SDK accepts the fake's replies, streaming and not, with
// vLLM's extra fields readable (reliability.md §4).
func TestSDK_OpenAIGo(t *testing.T) {
	f := start(t, nil)
	client := oai.NewClient(option.WithBaseURL(f.url+"/v1"), option.WithAPIKey("x"), option.WithHTTPClient(f.hc),
		option.WithMaxRetries(0), option.WithJSONSet("return_token_ids", true), option.WithJSONSet("return_tokens_as_token_ids", true))
	params := oai.ChatCompletionNewParams{
		Model:       "fake-model",
		Messages:    []oai.ChatCompletionMessageParamUnion{oai.UserMessage(weatherText)},
		Tools:       []oai.ChatCompletionToolUnionParam{oai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: "get_weather"})},
		Logprobs:    oai.Bool(true),
		TopLogprobs: oai.Int(0),
	}
	ctx := context.Background()
	resp, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ch := resp.Choices[0]
	if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 ||
		ch.Message.ToolCalls[0].Function.Name != "get_weather" || ch.Message.ToolCalls[0].Function.Arguments != `{"city":"Paris"}` {
		t.Errorf("non-streaming reply as the SDK reads it: %+v", ch)
	}
	var ids, prompt []int
	if err := json.Unmarshal([]byte(ch.JSON.ExtraFields["token_ids"].Raw()), &ids); err != nil {
		t.Fatalf("token_ids: %v", err)
	}
	if err := json.Unmarshal([]byte(resp.JSON.ExtraFields["prompt_token_ids"].Raw()), &prompt); err != nil {
		t.Fatalf("prompt_token_ids: %v", err)
	}
	if len(ids) != int(resp.Usage.CompletionTokens) || len(prompt) != int(resp.Usage.PromptTokens) || len(ch.Logprobs.Content) != len(ids) {
		t.Errorf("%d ids, %d prompt ids, %d logprobs; usage %+v", len(ids), len(prompt), len(ch.Logprobs.Content), resp.Usage)
	}

	params.StreamOptions = oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc oai.ChatCompletionAccumulator
	var streamIDs []int
	chunks := 0
	for stream.Next() {
		chunk := stream.Current()
		chunks++
		if !acc.AddChunk(chunk) {
			t.Fatalf("the accumulator rejected chunk %d: %s", chunks, chunk.RawJSON())
		}
		if len(chunk.Choices) > 0 {
			if raw := chunk.Choices[0].JSON.ExtraFields["token_ids"].Raw(); raw != "" {
				var part []int
				if err := json.Unmarshal([]byte(raw), &part); err != nil {
					t.Fatalf("chunk token_ids %s: %v", raw, err)
				}
				streamIDs = append(streamIDs, part...)
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if err := stream.Close(); err != nil {
		t.Fatalf("close stream: %v", err)
	}
	sc := acc.Choices[0]
	if sc.FinishReason != "tool_calls" || len(sc.Message.ToolCalls) != 1 || sc.Message.ToolCalls[0].ID != ch.Message.ToolCalls[0].ID ||
		sc.Message.ToolCalls[0].Function.Arguments != `{"city":"Paris"}` || sc.Message.ToolCalls[0].Function.Name != "get_weather" {
		t.Errorf("accumulated stream: %+v", sc)
	}
	if !slices.Equal(streamIDs, ids) || acc.Usage.CompletionTokens != resp.Usage.CompletionTokens || len(sc.Logprobs.Content) != len(ids) {
		t.Errorf("stream ids %v (usage %+v, %d logprobs), non-streaming %v", streamIDs, acc.Usage, len(sc.Logprobs.Content), ids)
	}

	models, err := client.Models.List(ctx)
	if err != nil || len(models.Data) != 1 || models.Data[0].ID != fakeinference.DefaultModel {
		t.Errorf("models: %+v %v", models, err)
	}
}
