package openai

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// checkResponseAppendJSON checks Response.AppendJSON against codec.Marshal:
// the same bytes after what dst held, or an error where it has one.
func checkResponseAppendJSON(t *testing.T, r *Response) {
	t.Helper()
	want, werr := codec.Marshal(r)
	prefix := []byte("held:")
	got, gerr := r.AppendJSON(prefix)
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("errors differ: codec.Marshal %v, AppendJSON %v", werr, gerr)
	}
	if werr == nil && (!bytes.HasPrefix(got, prefix) || !bytes.Equal(got[len(prefix):], want)) {
		t.Fatalf("AppendJSON wrote\n %s\ncodec.Marshal\n %s", got, want)
	}
	if r.Usage != nil {
		want, _ := codec.Marshal(r.Usage)
		if got := r.Usage.AppendJSON(nil); !bytes.Equal(got, want) {
			t.Fatalf("usage: AppendJSON wrote %s, codec.Marshal %s", got, want)
		}
	}
}

func TestResponseAppendJSON_MatchesMarshal(t *testing.T) {
	tricky := "<a href=\"x\">&amp;</a> \u2028\u2029 \x01\b\f\n\r\t \\ \xff é😀"
	f, n, yes := 0.7, 256, true
	nan := math.NaN()
	for name, r := range map[string]*Response{
		"zero":              {},
		"empty collections": {Output: []Item{}, Tools: []Tool{}, Metadata: map[string]string{}},
		"everything": {
			ID: tricky, Object: "response", CreatedAt: -1, Model: tricky,
			Output:            []Item{{Role: "user", Content: TextContent(tricky)}, {Type: ItemFunctionCall, CallID: "c", Arguments: "{}", TokenFields: TokenFields{PromptTokenIDs: []int{1}, GenerationLogProbs: []float64{-1e-7}}}},
			ParallelToolCalls: true, ToolChoice: codec.RawMessage(` { "type" : "function" } `),
			Tools: []Tool{
				{Type: "function", Name: "f", Description: tricky, Parameters: codec.RawMessage("{\"a\": \"\u2028 <\"}"), Strict: &yes},
				{Type: "function", Name: "g", Parameters: codec.RawMessage{}},
			},
			Temperature: &f, TopP: &f, Status: tricky, IncompleteDetails: &IncompleteDetails{Reason: tricky},
			Usage: &ResponseUsage{InputTokens: 1, OutputTokens: 2, TotalTokens: 3, InputTokensDetails: InputTokensDetails{CachedTokens: &n}},
			Error: codec.RawMessage(`{"code":"x"}`), Instructions: &tricky,
			Metadata:        map[string]string{"b": tricky, "a": "1", tricky: "", "\xff": "x", "\u2028": "y"},
			MaxOutputTokens: &n, TopLogprobs: &n,
		},
		"invalid tool choice": {ToolChoice: codec.RawMessage(`{"type":`)},
		"empty error":         {Error: codec.RawMessage{}},
		"NaN top_p":           {TopP: &nan},
		"invalid parameters":  {Tools: []Tool{{Parameters: codec.RawMessage(`x`)}}},
	} {
		t.Run(name, func(t *testing.T) { checkResponseAppendJSON(t, r) })
	}
}

// TestResponseAppendJSON_KnowsEveryField: the appenders of response_encode.go
// and encode.go write each field of these structs by hand; one added to a
// struct must be added there too, or encodings lose it.
func TestResponseAppendJSON_KnowsEveryField(t *testing.T) {
	for _, c := range []struct {
		typ      reflect.Type
		fields   int
		appender string
	}{
		{reflect.TypeFor[Response](), 18, "Response.AppendJSON (response_encode.go)"},
		{reflect.TypeFor[Tool](), 5, "Tool.appendJSON (response_encode.go)"},
		{reflect.TypeFor[ResponseUsage](), 5, "ResponseUsage.AppendJSON (response_encode.go)"},
		{reflect.TypeFor[InputTokensDetails](), 1, "ResponseUsage.AppendJSON (response_encode.go)"},
		{reflect.TypeFor[OutputTokensDetails](), 1, "ResponseUsage.AppendJSON (response_encode.go)"},
		{reflect.TypeFor[IncompleteDetails](), 1, "IncompleteDetails.appendJSON (response_encode.go)"},
		{reflect.TypeFor[Item](), 14, "Item.appendJSON (encode.go)"},
		{reflect.TypeFor[TokenFields](), 3, "TokenFields.appendJSON (encode.go)"},
		{reflect.TypeFor[MessageContent](), 3, "MessageContent.appendJSON (encode.go)"},
		{reflect.TypeFor[ContentPart](), 7, "ContentPart.appendJSON (encode.go)"},
		{reflect.TypeFor[SummaryText](), 2, "Item.appendJSON (encode.go)"},
	} {
		if got := c.typ.NumField(); got != c.fields {
			t.Errorf("%v has %d fields but %s writes %d: write the new field there, check its bytes against codec.Marshal, then update this count",
				c.typ, got, c.appender, c.fields)
		}
	}
}

// FuzzResponseAppendJSON: any response a model server can send encodes as
// codec.Marshal encodes it.
func FuzzResponseAppendJSON(f *testing.F) {
	f.Add([]byte(`{"id":"resp_1","object":"response","created_at":1767225600,"model":"policy","output":[{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"<Paris>\"}","status":"completed","prompt_token_ids":[1,2,3],"generation_token_ids":[4,5],"generation_log_probs":[-0.25,-1e-7]}],"parallel_tool_calls":true,"tool_choice":"auto","tools":[{"type":"function","name":"get_weather","description":"d","strict":true,"parameters":{"type": "object"}}],"temperature":1.0,"top_p":null,"status":"completed","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":3,"input_tokens_details":{"cached_tokens":0},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":null},"total_tokens":5},"error":null,"instructions":"\u2028<>","metadata":{"z":"1","a":"\u0026"},"max_output_tokens":256}`))
	f.Add([]byte(`{"output":[],"tools":[],"metadata":{},"tool_choice":{ "type" : "none" },"error":{"message":"\ud800"}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var r Response
		if codec.Unmarshal(data, &r) != nil {
			return
		}
		checkResponseAppendJSON(t, &r)
	})
}

// A NeMo Gym model server's reply carries created_at as a float
// (NeMoGymResponse in nemo_gym/openai_utils.py at 07d6b0d07b22 inherits
// OpenAI's Response, whose created_at is a float), so an agent of ours
// behind one must read it; integral values encode as before.
func TestResponse_CreatedAtIsAFloat(t *testing.T) {
	var r Response
	if err := codec.Unmarshal([]byte(`{"id":"resp_1","object":"response","created_at":1700000000.0,"model":"m","output":[],"parallel_tool_calls":true,"tool_choice":"auto","tools":[]}`), &r); err != nil {
		t.Fatalf("a Gym reply's float created_at: %v", err)
	}
	if r.CreatedAt != 1700000000 {
		t.Fatalf("created_at = %v, want 1700000000", r.CreatedAt)
	}
	b, err := r.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"created_at":1700000000,`) {
		t.Fatalf("an integral created_at encodes as an integer: %s", b)
	}
}
