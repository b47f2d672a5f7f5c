package modelproxy_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/respjson"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
	"github.com/gymfleet/gymfleet/pkg/tokencapture"
)

// The conformance suite drives the model server with the official Go SDK,
// against the real fakeinference over h2c: both APIs, streaming and not,
// tool calls, token fields read through the SDK's extra fields, and the
// capture ledger behind them.

const weatherPrompt = `Call get_weather with {"city": "Paris"}`

type fleet struct {
	proxy   *modelproxy.Server
	control *fakeinference.Control
}

func startFleet(t *testing.T) *fleet {
	t.Helper()
	fcfg := fakeinference.DefaultConfig()
	fcfg.Listen = "127.0.0.1:0"
	fi, err := fakeinference.New(fcfg, fakeinference.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := fi.Listen(); err != nil {
		t.Fatal(err)
	}
	fiDone := make(chan error, 1)
	go func() { fiDone <- fi.Serve() }()

	cfg := modelproxy.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Upstream.BaseURL = fi.URL() + "/v1"
	cfg.Upstream.H2C = true
	cfg.Capture.Dir = t.TempDir()
	p, err := modelproxy.New(cfg, modelproxy.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Listen(); err != nil {
		t.Fatal(err)
	}
	pDone := make(chan error, 1)
	go func() { pDone <- p.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			t.Errorf("close model server: %v", err)
		}
		if err := <-pDone; err != nil {
			t.Errorf("model server: %v", err)
		}
		if err := fi.Close(ctx); err != nil {
			t.Errorf("close fakeinference: %v", err)
		}
		if err := <-fiDone; err != nil {
			t.Errorf("fakeinference: %v", err)
		}
	})
	hc := &http.Client{}
	t.Cleanup(hc.CloseIdleConnections)
	return &fleet{proxy: p, control: fakeinference.NewControl(fi.URL(), hc)}
}

func (f *fleet) client(key string) oai.Client {
	base := f.proxy.URL() + "/v1"
	if key != "" {
		base = f.proxy.URL() + "/ng-rollout/" + key + "/v1"
	}
	return oai.NewClient(option.WithBaseURL(base), option.WithAPIKey("unused"), option.WithMaxRetries(0),
		option.WithHTTPClient(&http.Client{Timeout: 30 * time.Second}))
}

// tokenFields reads the training token fields from an SDK object's extra fields.
func tokenFields(t *testing.T, extra map[string]respjson.Field) (prompt, gen []int, logprobs []float64) {
	t.Helper()
	for name, dst := range map[string]any{"prompt_token_ids": &prompt, "generation_token_ids": &gen, "generation_log_probs": &logprobs} {
		f, ok := extra[name]
		if !ok {
			t.Fatalf("no %s among the extra fields %v", name, keys(extra))
		}
		if err := json.Unmarshal([]byte(f.Raw()), dst); err != nil {
			t.Fatalf("%s = %s: %v", name, f.Raw(), err)
		}
	}
	if len(prompt) == 0 || len(gen) == 0 || len(gen) != len(logprobs) {
		t.Fatalf("token fields: %d prompt ids, %d generation ids, %d log-probs", len(prompt), len(gen), len(logprobs))
	}
	return prompt, gen, logprobs
}

func keys(m map[string]respjson.Field) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func weatherChatTool() oai.ChatCompletionToolUnionParam {
	return oai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
		Name:        "get_weather",
		Description: oai.String("Get the weather of a city"),
		Parameters:  shared.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}},
	})
}

func weatherResponsesTool() responses.ToolUnionParam {
	return responses.ToolUnionParam{OfFunction: &responses.FunctionToolParam{
		Name:       "get_weather",
		Parameters: map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}},
	}}
}

// checkLedger asserts a capture key's manifest: one row per call, each the
// child of the one before, with the token ids the client saw.
func checkLedger(t *testing.T, f *fleet, key string, gens ...[]int) []tokencapture.Row {
	t.Helper()
	rows, err := f.proxy.Ledger().Rows(key)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(gens) {
		t.Fatalf("%s: %d ledger rows, want %d", key, len(rows), len(gens))
	}
	for i, r := range rows {
		wantParent := ""
		if i > 0 {
			wantParent = rows[i-1].CallID
		}
		if r.ParentCallID != wantParent || r.Seq != int64(i+1) || r.CaptureKey != key || !hex32.MatchString(r.CallID) || len(r.RequestDigest) != 64 {
			t.Fatalf("%s row %d = %+v", key, i, r)
		}
		if gens[i] != nil && !slices.Equal(r.GenerationTokenIDs, gens[i]) {
			t.Fatalf("%s row %d generation ids %v, the client saw %v", key, i, r.GenerationTokenIDs, gens[i])
		}
	}
	if failures, err := f.proxy.Ledger().Failures(key); err != nil || len(failures) != 0 {
		t.Fatalf("%s failures: %+v %v", key, failures, err)
	}
	// The inference server saw each call under the id the ledger names
	// (X-Ng-Model-Call-Id) and the attempt's capture key (X-Ng-Capture-Key).
	calls, err := f.control.Calls(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, c := range calls {
		if c.CaptureKey != nil {
			seen[c.CallID] = *c.CaptureKey
		}
	}
	for _, r := range rows {
		if seen[r.CallID] != key {
			t.Fatalf("%s: the upstream did not see call %s under the capture key (calls: %+v)", key, r.CallID, calls)
		}
	}
	return rows
}

func TestSDK_ChatCompletions(t *testing.T) {
	f := startFleet(t)
	ctx := context.Background()
	const key = "sdk-chat"
	c := f.client(key)
	params := oai.ChatCompletionNewParams{
		Model:    "anything",
		Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage(weatherPrompt)},
		Tools:    []oai.ChatCompletionToolUnionParam{weatherChatTool()},
	}
	resp, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("first turn: %v", err)
	}
	ch := resp.Choices[0]
	if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 || ch.Message.ToolCalls[0].Function.Name != "get_weather" {
		t.Fatalf("first turn: %+v", ch)
	}
	var args map[string]string
	if err := json.Unmarshal([]byte(ch.Message.ToolCalls[0].Function.Arguments), &args); err != nil || args["city"] != "Paris" {
		t.Fatalf("arguments %q: %v", ch.Message.ToolCalls[0].Function.Arguments, err)
	}
	prompt, gen1, _ := tokenFields(t, ch.Message.JSON.ExtraFields)
	if len(prompt) != int(resp.Usage.PromptTokens) || len(gen1) != int(resp.Usage.CompletionTokens) || resp.Model != fakeinference.DefaultModel {
		t.Fatalf("%d prompt ids, %d generated; usage %+v, model %s", len(prompt), len(gen1), resp.Usage, resp.Model)
	}
	// vLLM's transport fields are gone from the reply.
	if _, ok := resp.JSON.ExtraFields["prompt_token_ids"]; ok {
		t.Error("top-level prompt_token_ids reached the client")
	}
	if _, ok := ch.JSON.ExtraFields["token_ids"]; ok || ch.JSON.Logprobs.Valid() {
		t.Error("choice token_ids or logprobs reached the client")
	}

	// Second turn: the tool result; the policy answers quoting it.
	const output = `{"city":"Paris","weather_description":"sunny, 21C"}`
	params.Messages = append(params.Messages, ch.Message.ToParam(), oai.ToolMessage(output, ch.Message.ToolCalls[0].ID))
	resp2, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("second turn: %v", err)
	}
	if got := resp2.Choices[0].Message.Content; !strings.Contains(got, "The answer is:") || !strings.Contains(got, "sunny, 21C") {
		t.Fatalf("final answer %q", got)
	}
	_, gen2, _ := tokenFields(t, resp2.Choices[0].Message.JSON.ExtraFields)

	// Streaming, under another attempt: chunks relayed as vLLM sent them.
	const streamKey = "sdk-chat-a1"
	sc1 := f.client(streamKey)
	stream := sc1.Chat.Completions.NewStreaming(ctx, oai.ChatCompletionNewParams{
		Model:    "anything",
		Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage(weatherPrompt)},
		Tools:    []oai.ChatCompletionToolUnionParam{weatherChatTool()},
	})
	var acc oai.ChatCompletionAccumulator
	var streamIDs, streamPrompt []int
	for stream.Next() {
		chunk := stream.Current()
		if !acc.AddChunk(chunk) {
			t.Fatalf("the accumulator rejected %s", chunk.RawJSON())
		}
		if raw := chunk.JSON.ExtraFields["prompt_token_ids"].Raw(); raw != "" && streamPrompt == nil {
			if err := json.Unmarshal([]byte(raw), &streamPrompt); err != nil {
				t.Fatal(err)
			}
		}
		if len(chunk.Choices) > 0 {
			if raw := chunk.Choices[0].JSON.ExtraFields["token_ids"].Raw(); raw != "" {
				var part []int
				if err := json.Unmarshal([]byte(raw), &part); err != nil {
					t.Fatal(err)
				}
				streamIDs = append(streamIDs, part...)
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if err := stream.Close(); err != nil {
		t.Fatal(err)
	}
	sc := acc.Choices[0]
	if sc.FinishReason != "tool_calls" || len(sc.Message.ToolCalls) != 1 || sc.Message.ToolCalls[0].Function.Name != "get_weather" ||
		sc.Message.ToolCalls[0].Function.Arguments != ch.Message.ToolCalls[0].Function.Arguments {
		t.Fatalf("accumulated stream: %+v", sc)
	}
	if !slices.Equal(streamIDs, gen1) || !slices.Equal(streamPrompt, prompt) {
		t.Fatalf("streamed ids %v / prompt %d ids; non-streaming %v / %d (the fake is deterministic)", streamIDs, len(streamPrompt), gen1, len(prompt))
	}

	rows := checkLedger(t, f, key, gen1, gen2)
	if rows[0].RequestDigest == rows[1].RequestDigest || !slices.Equal(rows[0].PromptTokenIDs, prompt) {
		t.Fatalf("rows = %+v", rows)
	}
	streamRows := checkLedger(t, f, streamKey, gen1)
	if streamRows[0].RequestDigest != rows[0].RequestDigest {
		t.Error("the same conversation digests differently when streamed")
	}

	// An unprefixed call is answered with token fields and captured nowhere.
	pc := f.client("")
	plain, err := pc.Chat.Completions.New(ctx, oai.ChatCompletionNewParams{
		Model: "x", Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("hello")},
	})
	if err != nil {
		t.Fatal(err)
	}
	tokenFields(t, plain.Choices[0].Message.JSON.ExtraFields)
	if got := f.proxy.Ledger().Keys(); !slices.Equal(got, []string{key, streamKey}) {
		t.Fatalf("ledger keys %v", got)
	}
}

func TestSDK_Responses(t *testing.T) {
	f := startFleet(t)
	ctx := context.Background()
	const key = "sdk-resp"
	c := f.client(key)
	input := responses.ResponseInputParam{responses.ResponseInputItemParamOfMessage(weatherPrompt, responses.EasyInputMessageRoleUser)}
	params := responses.ResponseNewParams{
		Model:        "anything",
		Instructions: oai.String("You are a weather assistant."),
		Input:        responses.ResponseNewParamsInputUnion{OfInputItemList: input},
		Tools:        []responses.ToolUnionParam{weatherResponsesTool()},
	}
	r1, err := c.Responses.New(ctx, params)
	if err != nil {
		t.Fatalf("first turn: %v", err)
	}
	if r1.Status != "completed" || len(r1.Output) != 1 || r1.Output[0].Type != "function_call" {
		t.Fatalf("first turn output: %s", r1.RawJSON())
	}
	call := r1.Output[0].AsFunctionCall()
	if call.Name != "get_weather" || call.CallID == "" || !strings.Contains(call.Arguments, "Paris") {
		t.Fatalf("function call %+v", call)
	}
	prompt, gen1, _ := tokenFields(t, call.JSON.ExtraFields)
	if int64(len(prompt)) != r1.Usage.InputTokens || int64(len(gen1)) != r1.Usage.OutputTokens {
		t.Fatalf("usage %+v vs %d/%d token ids", r1.Usage, len(prompt), len(gen1))
	}

	// Second turn, streamed: the tool output goes back; the answer streams as deltas.
	const output = `{"city":"Paris","weather_description":"cloudy, 14C"}`
	callParam := call.ToParam()
	params.Input.OfInputItemList = append(input,
		responses.ResponseInputItemUnionParam{OfFunctionCall: &callParam},
		responses.ResponseInputItemUnionParam{OfFunctionCallOutput: &responses.ResponseInputItemFunctionCallOutputParam{
			CallID: oai.String(call.CallID),
			Output: responses.ResponseInputItemFunctionCallOutputOutputUnionParam{OfString: oai.String(output)},
		}})
	stream := c.Responses.NewStreaming(ctx, params)
	var types []string
	var deltas strings.Builder
	var completed *responses.Response
	var lastSeq int64 = -1
	for stream.Next() {
		ev := stream.Current()
		if ev.SequenceNumber != lastSeq+1 {
			t.Fatalf("sequence %d after %d", ev.SequenceNumber, lastSeq)
		}
		lastSeq = ev.SequenceNumber
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			deltas.WriteString(ev.Delta)
		case "response.completed":
			r := ev.Response
			completed = &r
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if err := stream.Close(); err != nil {
		t.Fatal(err)
	}
	if completed == nil || types[0] != "response.created" || types[1] != "response.in_progress" {
		t.Fatalf("events %v", types)
	}
	text := completed.OutputText()
	if !strings.Contains(text, "The answer is:") || !strings.Contains(text, "cloudy, 14C") || deltas.String() != text {
		t.Fatalf("final text %q, streamed deltas %q", text, deltas.String())
	}
	if n := strings.Count(strings.Join(types, " "), "response.output_text.delta"); n < 2 {
		t.Errorf("the answer arrived in %d deltas; the fake generates token by token", n)
	}
	msg := completed.Output[len(completed.Output)-1].AsMessage()
	_, gen2, _ := tokenFields(t, msg.JSON.ExtraFields)

	// The first turn, streamed under the next attempt: a function call as events.
	const streamKey = "sdk-resp-a1"
	params.Input.OfInputItemList = input
	c2 := f.client(streamKey)
	s2 := c2.Responses.NewStreaming(ctx, params)
	var args strings.Builder
	var final *responses.Response
	for s2.Next() {
		ev := s2.Current()
		switch ev.Type {
		case "response.function_call_arguments.delta":
			args.WriteString(ev.Delta)
		case "response.completed":
			r := ev.Response
			final = &r
		}
	}
	if err := s2.Err(); err != nil {
		t.Fatal(err)
	}
	s2.Close()
	if final == nil || len(final.Output) != 1 {
		t.Fatalf("streamed call: %+v", final)
	}
	scall := final.Output[0].AsFunctionCall()
	if scall.Arguments != call.Arguments || args.String() != call.Arguments || scall.Name != "get_weather" {
		t.Fatalf("streamed call %+v, argument deltas %q", scall, args.String())
	}
	_, sgen, _ := tokenFields(t, scall.JSON.ExtraFields)
	if !slices.Equal(sgen, gen1) {
		t.Fatalf("streamed generation %v, non-streaming %v", sgen, gen1)
	}

	checkLedger(t, f, key, gen1, gen2)
	checkLedger(t, f, streamKey, gen1)

	// The manifest route serves the same ledger.
	status, body := (&proxy{url: f.proxy.URL()}).get(t, "/capture/rollouts/"+key+"/manifest")
	var m modelproxy.Manifest
	if err := json.Unmarshal(body, &m); status != 200 || err != nil || len(m.Records) != 2 || m.Records[1].ParentCallID != m.Records[0].CallID {
		t.Fatalf("manifest %d %s", status, body)
	}

	// Unprefixed: token fields on the last item, nothing captured.
	pc := f.client("")
	plain, err := pc.Responses.New(ctx, responses.ResponseNewParams{
		Model: "x", Input: responses.ResponseNewParamsInputUnion{OfString: oai.String("hello")},
	})
	if err != nil {
		t.Fatal(err)
	}
	tokenFields(t, plain.Output[len(plain.Output)-1].AsMessage().JSON.ExtraFields)
	if got := f.proxy.Ledger().Keys(); !slices.Equal(got, []string{key, streamKey}) {
		t.Fatalf("ledger keys %v", got)
	}
	if _, err := pc.Models.List(ctx); err != nil {
		t.Fatalf("models: %v", err)
	}
}

// TestSDK_BackendRefusal: a 400 from the backend (vLLM's bytes, see
// vllm_wire_test.go) reaches the SDK as a 400 with vLLM's message, and the
// SDK, at its default retry policy, calls once: a 4xx is not retryable.
func TestSDK_BackendRefusal(t *testing.T) {
	up := newStub(t)
	up.script(replyJSON(http.StatusBadRequest, vllmBadTemperature))
	p := newProxy(t, up, nil)
	client := oai.NewClient(option.WithBaseURL(p.url+"/v1"), option.WithAPIKey("unused"),
		option.WithHTTPClient(&http.Client{Timeout: 30 * time.Second}))
	ctx := context.Background()
	check := func(what string, err error) {
		t.Helper()
		var apiErr *oai.Error
		if !errors.As(err, &apiErr) {
			t.Fatalf("%s: %v is not an API error", what, err)
		}
		if apiErr.StatusCode != http.StatusBadRequest || apiErr.Message != "temperature must be non-negative, got -1.0." ||
			apiErr.Type != "BadRequestError" || apiErr.Param != "temperature" || apiErr.Code != "invalid_request" {
			t.Fatalf("%s: status %d, message %q, type %q, param %q, code %q", what, apiErr.StatusCode, apiErr.Message, apiErr.Type, apiErr.Param, apiErr.Code)
		}
	}
	before := chatCalls(up)
	_, err := client.Chat.Completions.New(ctx, oai.ChatCompletionNewParams{
		Model: "anything", Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("q")}, Temperature: oai.Float(-1),
	})
	check("chat", err)
	_, err = client.Responses.New(ctx, responses.ResponseNewParams{
		Input: responses.ResponseNewParamsInputUnion{OfString: oai.String("q")}, Temperature: oai.Float(-1),
	})
	check("responses", err)
	if n := chatCalls(up) - before; n != 2 {
		t.Fatalf("the backend got %d calls for 2 SDK calls: the SDK retried a 4xx", n)
	}
}

// chatCalls counts the model calls the stub upstream got.
func chatCalls(up *stub) int {
	n := 0
	for _, r := range up.requests() {
		if r.Path == "/v1/chat/completions" {
			n++
		}
	}
	return n
}

// TestSDK_ClientLogprobs: a client's logprobs and top_logprobs come back as
// token strings with alternatives, while the ledger still gets the ids.
func TestSDK_ClientLogprobs(t *testing.T) {
	f := startFleet(t)
	ctx := context.Background()
	const key = "sdk-logprobs"
	c := f.client(key)
	resp, err := c.Chat.Completions.New(ctx, oai.ChatCompletionNewParams{
		Model: "anything", Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("Say hello")},
		Logprobs: oai.Bool(true), TopLogprobs: oai.Int(2),
	})
	if err != nil {
		t.Fatal(err)
	}
	content := resp.Choices[0].Logprobs.Content
	if len(content) == 0 {
		t.Fatalf("no logprobs in %s", resp.RawJSON())
	}
	for _, e := range content {
		if strings.HasPrefix(e.Token, "token_id:") || len(e.TopLogprobs) != 2 {
			t.Fatalf("logprob entry %+v, want a token string with 2 alternatives", e)
		}
	}
	_, gen, _ := tokenFields(t, resp.Choices[0].Message.JSON.ExtraFields)
	if len(gen) != len(content) {
		t.Fatalf("%d generation ids for %d logprobs", len(gen), len(content))
	}
	checkLedger(t, f, key, gen)
}
