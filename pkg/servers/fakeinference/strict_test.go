package fakeinference_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/transport/sse"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

// scripted is a one-turn request for "hi" (14 generated tokens) that
// carries script as its metadata.fake_script.
func scripted(script string, kv ...any) map[string]any {
	return with(map[string]any{"model": "fake-model", "messages": []any{userMsg("hi")}, "metadata": map[string]any{"fake_script": script}}, kv...)
}

// events splits an SSE body into its data payloads, [DONE] included.
func events(t *testing.T, body []byte) [][]byte {
	t.Helper()
	rd := sse.NewReader(bytes.NewReader(body))
	var out [][]byte
	for {
		ev, err := rd.Next()
		if err != nil {
			return out
		}
		out = append(out, ev.Data)
	}
}

// streamed accumulates the chunks of a stream: its content, token ids,
// finish reasons and whether any chunk carried usage.
type streamed struct {
	content string
	ids     []int
	finish  []string
	usage   bool
	last    openai.ChatChunk // the last chunk
	lastRaw map[string]any
}

func accumulate(t *testing.T, chunks [][]byte) streamed {
	t.Helper()
	var s streamed
	for _, data := range chunks {
		var ch openai.ChatChunk
		mustJSON(t, data, &ch)
		s.last = ch
		s.lastRaw = nil
		mustJSON(t, data, &s.lastRaw)
		if ch.Usage != nil {
			s.usage = true
		}
		for _, c := range ch.Choices {
			if c.Delta.Content != nil {
				s.content += *c.Delta.Content
			}
			s.ids = append(s.ids, c.TokenIDs...)
			if c.FinishReason != nil {
				s.finish = append(s.finish, *c.FinishReason)
			}
		}
	}
	return s
}

// vLLM answers 404 for a model it does not serve, and takes no name as its
// own; the served name is config model.
func TestChat_UnknownModel(t *testing.T) {
	f := start(t, func(c *fakeinference.Config) { c.Model = "policy" })
	msgs := []any{userMsg("hi")}
	for _, stream := range []bool{false, true} {
		r := f.chat(map[string]any{"model": "fake-model", "messages": msgs, "stream": stream}, nil)
		e := vllmError(t, r, 404)
		if e.Message != "The model `fake-model` does not exist. Valid aliases: policy." || e.Type != "NotFoundError" || deref(e.Param) != "model" {
			t.Errorf("stream=%v: %s", stream, r.body)
		}
	}
	for _, body := range []map[string]any{{"model": "policy", "messages": msgs}, {"messages": msgs}, {"model": "", "messages": msgs}} {
		if r := f.chat(body, nil); r.status != 200 || !strings.Contains(string(r.body), `"model":"policy"`) {
			t.Errorf("%v: %d %s", body, r.status, r.body)
		}
	}
	// The model is checked before the token limits, as vLLM checks it.
	vllmError(t, f.chat(map[string]any{"model": "x", "messages": msgs, "max_tokens": -5}, nil), 404)
	e := vllmError(t, f.post(context.Background(), "/tokenize", map[string]any{"model": "x", "prompt": "a"}, nil), 404)
	if e.Message != "The model `x` does not exist. Valid aliases: policy." {
		t.Errorf("/tokenize: %+v", e)
	}
	if r := f.post(context.Background(), "/tokenize", map[string]any{"model": "policy", "prompt": "a"}, nil); r.status != 200 {
		t.Errorf("/tokenize with the served model: %d %s", r.status, r.body)
	}
	if c := f.count(); c.Received != 3 {
		t.Errorf("call_count %+v, want the 3 served calls", c)
	}
}

// An OpenAI SDK reads the stand-in's errors as it reads vLLM's: status,
// message, type and param from the nested body, and a mid-stream error
// event as the stream's error.
func TestSDK_Errors(t *testing.T) {
	f := start(t, nil)
	client := oai.NewClient(option.WithBaseURL(f.url+"/v1"), option.WithAPIKey("x"), option.WithHTTPClient(f.hc), option.WithMaxRetries(0))
	ctx := context.Background()
	params := oai.ChatCompletionNewParams{Model: "gpt-4o", Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage("hi")}}
	_, err := client.Chat.Completions.New(ctx, params)
	var apiErr *oai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Message != "The model `gpt-4o` does not exist. Valid aliases: fake-model." ||
		apiErr.Type != "NotFoundError" || apiErr.Param != "model" {
		t.Fatalf("unknown model as the SDK reads it: %v %+v", err, apiErr)
	}

	params.Model = "fake-model"
	params.MaxTokens = oai.Int(-5)
	if _, err := client.Chat.Completions.New(ctx, params); !errors.As(err, &apiErr) || apiErr.StatusCode != 400 ||
		apiErr.Message != "max_tokens must be at least 1, got -5." || apiErr.Type != "BadRequestError" {
		t.Fatalf("max_tokens -5 as the SDK reads it: %v %+v", err, apiErr)
	}

	params.MaxTokens = oai.Int(100)
	params.Metadata = map[string]string{"fake_script": `{"stream_error": {"after_tokens": 3, "message": "engine died"}}`}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	n := 0
	for stream.Next() {
		n++
	}
	if err := stream.Err(); err == nil || !strings.Contains(err.Error(), "engine died") {
		t.Errorf("after %d chunks the stream's error is %v, want the scripted error", n, err)
	}
	_ = stream.Close()
	if _, err := client.Chat.Completions.New(ctx, params); !errors.As(err, &apiErr) || apiErr.StatusCode != 500 ||
		apiErr.Message != "engine died" || apiErr.Type != "InternalServerError" {
		t.Fatalf("a scripted error, non-streaming, as the SDK reads it: %v %+v", err, apiErr)
	}
}

// A scripted stream_error: the stream sends after_tokens tokens, vLLM's
// error event and [DONE], with no finish_reason and no usage; the same
// script answers a non-streaming call with the error's status and body.
func TestChat_ScriptedStreamError(t *testing.T) {
	f := start(t, nil)
	script := `{"final_text": "one two three four five", "stream_error": {"after_tokens": 3, "message": "CUDA error: an illegal memory access was encountered", "type": "EngineError", "param": "x", "code": 503}}`
	body := tokenRequest(scripted(script, "stream", true, "stream_options", map[string]any{"include_usage": true}))
	r := f.chat(body, nil)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	golden(t, "stream_error.golden.txt", normalize(r.body))
	evs := events(t, r.body)
	if len(evs) < 3 || string(evs[len(evs)-1]) != sse.Done {
		t.Fatalf("stream does not end with [DONE]: %s", r.body)
	}
	wantErr := `{"error": {"message": "CUDA error: an illegal memory access was encountered", "type": "EngineError", "param": "x", "code": 503}}`
	if got := string(evs[len(evs)-2]); got != wantErr {
		t.Errorf("error event %s, want %s", got, wantErr)
	}
	s := accumulate(t, evs[:len(evs)-2])
	if len(s.ids) != 3 || len(s.finish) != 0 || s.usage {
		t.Errorf("before the error: ids %v, finish reasons %v, usage %v; want 3 ids, no finish, no usage", s.ids, s.finish, s.usage)
	}
	calls := f.calls()
	if len(calls) != 1 || calls[0].Status != fakeinference.StatusFailed || calls[0].FinishReason == nil || *calls[0].FinishReason != "error" || calls[0].CompletionTokens != 3 {
		t.Errorf("call log %+v, want one failed call with finish reason error and 3 tokens", calls)
	}

	r = f.chat(scripted(script), nil)
	e := vllmError(t, r, 503)
	if e.Message != "CUDA error: an illegal memory access was encountered" || e.Type != "EngineError" || deref(e.Param) != "x" {
		t.Errorf("non-streaming: %s", r.body)
	}

	// The defaults: vLLM's generation error, 500, after the whole reply when
	// after_tokens is past it.
	r = f.chat(scripted(`{"stream_error": {"after_tokens": 1000}}`, "stream", true, "return_token_ids", true), nil)
	evs = events(t, r.body)
	if got, want := string(evs[len(evs)-2]), `{"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}`; got != want {
		t.Errorf("default error event %s, want %s", got, want)
	}
	if s := accumulate(t, evs[:len(evs)-2]); len(s.ids) != 14 || s.content != fakeinference.Greeting || len(s.finish) != 0 {
		t.Errorf("every token then the error: ids %v content %q finish %v", s.ids, s.content, s.finish)
	}
	e = vllmError(t, f.chat(scripted(`{"stream_error": {"after_tokens": 0}}`), nil), 500)
	if e.Message != "Internal server error" || e.Type != "InternalServerError" || e.Param != nil {
		t.Errorf("default non-streaming error: %+v", e)
	}
	if c := f.count(); c.Failed != 4 || c.Returned != 0 {
		t.Errorf("call_count %+v, want 4 failed", c)
	}
}

// A scripted truncate_stream ends a stream after after_tokens tokens with
// [DONE] and no finish_reason; non-streaming calls ignore it.
func TestChat_ScriptedTruncatedStream(t *testing.T) {
	f := start(t, nil)
	script := `{"truncate_stream": {"after_tokens": 2}}`
	r := f.chat(tokenRequest(scripted(script, "stream", true, "stream_options", map[string]any{"include_usage": true})), nil)
	evs := events(t, r.body)
	if r.status != 200 || len(evs) == 0 || string(evs[len(evs)-1]) != sse.Done {
		t.Fatalf("got %d %s", r.status, r.body)
	}
	s := accumulate(t, evs[:len(evs)-1])
	if len(s.ids) != 2 || s.content != "Hello!" || len(s.finish) != 0 || s.usage {
		t.Errorf("truncated stream: ids %v content %q finish %v usage %v", s.ids, s.content, s.finish, s.usage)
	}
	for _, ev := range evs {
		if bytes.Contains(ev, []byte(`"error"`)) {
			t.Errorf("a truncated stream has no error event: %s", ev)
		}
	}
	var whole openai.ChatCompletion
	r = f.chat(scripted(script), nil)
	mustJSON(t, r.body, &whole)
	if r.status != 200 || whole.Choices[0].FinishReason != "stop" || whole.Choices[0].Message.Content.String() != fakeinference.Greeting {
		t.Errorf("non-streaming with truncate_stream: %d %s", r.status, r.body)
	}
	if c := f.count(); c.Failed != 1 || c.Returned != 1 {
		t.Errorf("call_count %+v, want the truncated stream failed and the other returned", c)
	}
}

// routed_experts from the script, where NeMo RL's vLLM puts it (the
// message, the default) or upstream vLLM does (the choice), streaming and
// not.
func TestChat_RoutedExperts(t *testing.T) {
	f := start(t, nil)
	envelope := `"nrlre1:int16:3x1x2:AAABAAIAAwAEAAUA"`
	lists := `[[[0,1]],[[2,3]],[[4,5]]]`
	tests := []struct {
		name, script        string
		inMessage, inChoice bool
		want                string
	}{
		{"string in the message", `{"routed_experts": ` + envelope + `}`, true, false, envelope},
		{"lists in the choice", `{"routed_experts": [[[0, 1]], [[2, 3]], [[4, 5]]], "routed_experts_in": "choice"}`, false, true, lists},
		{"both", `{"routed_experts": ` + envelope + `, "routed_experts_in": "both"}`, true, true, envelope},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var whole map[string]any
			r := f.chat(scripted(tt.script), nil)
			mustJSON(t, r.body, &whole)
			choice := whole["choices"].([]any)[0].(map[string]any)
			checkRouted(t, "message", choice["message"].(map[string]any)["routed_experts"], tt.inMessage, tt.want)
			checkRouted(t, "choice", choice["routed_experts"], tt.inChoice, tt.want)

			evs := events(t, f.chat(scripted(tt.script, "stream", true), nil).body)
			s := accumulate(t, evs[:len(evs)-1])
			last := s.lastRaw["choices"].([]any)[0].(map[string]any)
			if len(s.finish) != 1 || last["finish_reason"] != "stop" {
				t.Fatalf("the last chunk is not the finish chunk: %v", s.lastRaw)
			}
			checkRouted(t, "finish chunk delta", last["delta"].(map[string]any)["routed_experts"], tt.inMessage, tt.want)
			checkRouted(t, "finish chunk choice", last["routed_experts"], tt.inChoice, tt.want)
			for _, ev := range evs[:len(evs)-2] {
				if bytes.Contains(ev, []byte("routed_experts")) {
					t.Errorf("routed_experts before the finish chunk: %s", ev)
				}
			}
		})
	}
	// Without the field, no reply carries it.
	if r := f.chat(scripted(`{"final_text": "x"}`), nil); bytes.Contains(r.body, []byte("routed_experts")) {
		t.Errorf("unscripted routed_experts: %s", r.body)
	}
	body := tokenRequest(scripted(`{"routed_experts": [[[0, 1]], [[2, 3]], [[4, 5]]]}`))
	r := f.chat(body, nil)
	golden(t, "chat_routed_experts.golden.json", normalize(r.body))
}

func checkRouted(t *testing.T, where string, got any, present bool, want string) {
	t.Helper()
	if !present {
		if got != nil {
			t.Errorf("%s carries routed_experts %v", where, got)
		}
		return
	}
	b, _ := json.Marshal(got)
	if string(b) != want {
		t.Errorf("%s routed_experts %s, want %s", where, b, want)
	}
}

// routed_experts {layers, topk, experts} generates one row per prompt and
// generated token, as NeMo RL's router replay needs: [tokens][layers][topk]
// distinct expert ids below experts, a function of the token id.
func TestChat_RoutedExpertsGenerated(t *testing.T) {
	f := start(t, nil)
	body := tokenRequest(scripted(`{"routed_experts": {"layers": 3, "topk": 2, "experts": 8}}`))
	var reply struct {
		PromptTokenIDs []int `json:"prompt_token_ids"`
		Choices        []struct {
			TokenIDs []int `json:"token_ids"`
			Message  struct {
				RoutedExperts [][][]int `json:"routed_experts"`
			} `json:"message"`
		} `json:"choices"`
	}
	mustJSON(t, f.chat(body, nil).body, &reply)
	ch := reply.Choices[0]
	ids := append(append([]int{}, reply.PromptTokenIDs...), ch.TokenIDs...)
	routes := ch.Message.RoutedExperts
	if len(routes) != len(ids) || len(ids) == 0 {
		t.Fatalf("%d route rows for %d prompt and generated tokens", len(routes), len(ids))
	}
	rowOf := map[int][][]int{}
	for i, row := range routes {
		if len(row) != 3 {
			t.Fatalf("row %d has %d layers", i, len(row))
		}
		for _, layer := range row {
			if len(layer) != 2 || layer[0] == layer[1] || min(layer[0], layer[1]) < 0 || max(layer[0], layer[1]) >= 8 {
				t.Fatalf("row %d layer %v is not 2 distinct experts below 8", i, layer)
			}
		}
		if prev, ok := rowOf[ids[i]]; ok && !slices.EqualFunc(prev, row, slices.Equal) {
			t.Fatalf("token %d routes %v and %v", ids[i], prev, row)
		}
		rowOf[ids[i]] = row
	}
	// The stream's finish chunk carries the same routes.
	evs := events(t, f.chat(with(body, "stream", true), nil).body)
	var last struct {
		Choices []struct {
			Delta struct {
				RoutedExperts [][][]int `json:"routed_experts"`
			} `json:"delta"`
		} `json:"choices"`
	}
	mustJSON(t, evs[len(evs)-2], &last)
	if got := last.Choices[0].Delta.RoutedExperts; !slices.EqualFunc(got, routes, func(a, b [][]int) bool { return slices.EqualFunc(a, b, slices.Equal) }) {
		t.Errorf("streamed routes %v, want %v", got, routes)
	}
}

func TestScript_FaultFieldsRefused(t *testing.T) {
	for _, text := range []string{
		`{"stream_error": {"after_tokens": -1}}`,
		`{"stream_error": {"after_tokens": 1, "code": 200}}`,
		`{"stream_error": {"after_tokens": 1, "code": 600}}`,
		`{"stream_error": {"after_tokens": 1, "colour": "red"}}`,
		`{"truncate_stream": {"after_tokens": -2}}`,
		`{"stream_error": {"after_tokens": 1}, "truncate_stream": {"after_tokens": 1}}`,
		`{"routed_experts": 5}`,
		`{"routed_experts": [[1, 2]]}`,
		`{"routed_experts": {"layers": 0, "topk": 1, "experts": 4}}`,
		`{"routed_experts": {"layers": 9, "topk": 8, "experts": 64}}`,
		`{"routed_experts": {"layers": 1, "topk": 4, "experts": 2}}`,
		`{"routed_experts": "x", "routed_experts_in": "delta"}`,
		`{"routed_experts_in": "choice"}`,
	} {
		if _, err := fakeinference.ParseScript(text); err == nil {
			t.Errorf("ParseScript(%s) accepted it", text)
		}
	}
	sc, err := fakeinference.ParseScript(`{"routed_experts": [ [ [1, 2] ] ], "stream_error": {"after_tokens": 0}}`)
	if err != nil || string(sc.RoutedExperts) != `[[[1,2]]]` || sc.IsZero() {
		t.Errorf("ParseScript = %+v, %v", sc, err)
	}
}
