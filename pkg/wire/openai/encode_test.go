package openai

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// The reference encoding of the item family: the wire structs the
// appenders replaced, encoded by encoding/json. Each Append-based
// MarshalJSON must write the same bytes.

type refContent MessageContent

func (c refContent) MarshalJSON() ([]byte, error) {
	if !c.IsParts {
		return json.Marshal(c.Text)
	}
	parts := make([]refPart, len(c.Parts))
	for i, p := range c.Parts {
		parts[i] = refPart(p)
	}
	return json.Marshal(parts)
}

type refPart ContentPart

func (p refPart) MarshalJSON() ([]byte, error) {
	if p.Type == "output_text" {
		w := struct {
			Type        string           `json:"type"`
			Text        string           `json:"text"`
			Annotations []any            `json:"annotations"`
			Logprobs    codec.RawMessage `json:"logprobs"`
		}{p.Type, p.Text, p.Annotations, p.Logprobs}
		if w.Annotations == nil {
			w.Annotations = []any{}
		}
		if len(w.Logprobs) == 0 {
			w.Logprobs = codec.RawMessage("null")
		}
		return json.Marshal(w)
	}
	type plain struct {
		Type        string           `json:"type"`
		Text        string           `json:"text"`
		Annotations []any            `json:"annotations,omitempty"`
		Logprobs    codec.RawMessage `json:"logprobs,omitempty"`
		ImageURL    codec.RawMessage `json:"image_url,omitempty"`
		Detail      string           `json:"detail,omitempty"`
		VideoURL    codec.RawMessage `json:"video_url,omitempty"`
	}
	pl := plain(p)
	if p.Text == "" && p.Type != "text" && p.Type != "input_text" {
		type media struct {
			plain
			Text string `json:"text,omitempty"`
		}
		return json.Marshal(media{plain: pl})
	}
	return json.Marshal(pl)
}

type refTokens struct {
	PromptTokenIDs     []int     `json:"prompt_token_ids,omitempty"`
	GenerationTokenIDs []int     `json:"generation_token_ids,omitempty"`
	GenerationLogProbs []float64 `json:"generation_log_probs,omitempty"`
}

func refItem(it Item) any {
	tf := refTokens{it.PromptTokenIDs, it.GenerationTokenIDs, it.GenerationLogProbs}
	content := func(c *MessageContent) *refContent {
		if c == nil {
			return (*refContent)(TextContent(""))
		}
		return (*refContent)(c)
	}
	switch it.Type {
	case ItemFunctionCall:
		return struct {
			Type      string `json:"type"`
			ID        string `json:"id,omitempty"`
			CallID    string `json:"call_id"`
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
			Status    string `json:"status,omitempty"`
			refTokens
		}{it.Type, it.ID, it.CallID, it.Name, it.Arguments, it.Status, tf}
	case ItemFunctionCallOutput:
		return struct {
			Type   string      `json:"type"`
			ID     string      `json:"id,omitempty"`
			CallID string      `json:"call_id"`
			Output *refContent `json:"output"`
			Status string      `json:"status,omitempty"`
		}{it.Type, it.ID, it.CallID, content(it.Output), it.Status}
	case ItemReasoning:
		s := it.Summary
		if s == nil {
			s = []SummaryText{}
		}
		return struct {
			ID               string        `json:"id,omitempty"`
			Type             string        `json:"type"`
			Summary          []SummaryText `json:"summary"`
			EncryptedContent *string       `json:"encrypted_content"`
			Content          any           `json:"content"`
			refTokens
		}{it.ID, it.Type, s, it.EncryptedContent, nil, tf}
	default:
		typ := it.Type
		if typ == "" {
			typ = ItemMessage
		}
		return struct {
			ID      string      `json:"id,omitempty"`
			Type    string      `json:"type"`
			Role    string      `json:"role"`
			Status  string      `json:"status,omitempty"`
			Content *refContent `json:"content"`
			refTokens
		}{it.ID, typ, it.Role, it.Status, content(it.Content), tf}
	}
}

// sameAsReference checks it's encoding, alone and inside an Input, against
// the reference.
func sameAsReference(t *testing.T, it Item) {
	t.Helper()
	want, werr := json.Marshal(refItem(it))
	got, gerr := it.MarshalJSON()
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("errors differ for %#v: reference %v, appender %v", it, werr, gerr)
	}
	if werr != nil {
		return
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("encodings differ for %#v:\n appender:  %s\n reference: %s", it, got, want)
	}
	in, err := Input{IsItems: true, Items: []Item{it, it}}.MarshalJSON()
	if err != nil || !bytes.Equal(in, []byte("["+string(want)+","+string(want)+"]")) {
		t.Fatalf("Input of the item = %s, %v", in, err)
	}
	// Through either encoder as a field, as the data path sends it.
	viaGoccy, err1 := codec.Marshal(struct{ Output []Item }{[]Item{it}})
	viaStd, err2 := json.Marshal(struct{ Output []Item }{[]Item{it}})
	if err1 != nil || err2 != nil || !bytes.Equal(viaGoccy, viaStd) {
		t.Fatalf("as a field: goccy %s (%v), encoding/json %s (%v)", viaGoccy, err1, viaStd, err2)
	}
}

func strPtr(s string) *string { return &s }

func TestItemEncoding_MatchesTheWireStructs(t *testing.T) {
	tricky := "<a href=\"x\">&amp;</a> \u2028\u2029 \x01\b\f\n\r\t \\ \xff é😀"
	tokens := TokenFields{PromptTokenIDs: []int{1, -2, 1 << 40}, GenerationTokenIDs: []int{3, 4, 5, 6, 7},
		GenerationLogProbs: []float64{-0.5, 0, -1e-7, -1e21, -123456789.125}}
	items := []Item{
		{Role: "user", Content: TextContent("hi")},
		{Type: ItemMessage, Role: "assistant", ID: "msg_1", Status: "completed", Content: TextContent(tricky), TokenFields: tokens},
		{Role: "user"},
		{Type: ItemMessage, Role: "assistant", Content: &MessageContent{IsParts: true}},
		{Type: ItemMessage, Role: "assistant", Content: &MessageContent{IsParts: true, Parts: []ContentPart{
			OutputText("Let me check."),
			{Type: "output_text", Text: tricky, Annotations: []any{map[string]any{"type": "url", "url": "<x>"}}, Logprobs: codec.RawMessage(` [ {"token" : "<" } ] `)},
			{Type: "output_text", Text: "", Annotations: []any{}},
			{Type: "input_text", Text: ""},
			{Type: "text", Text: "t"},
			{Type: "input_image", ImageURL: codec.RawMessage(`"data:x"`), Detail: "low"},
			{Type: "image_url", ImageURL: codec.RawMessage(`{"url": "u&v"}`)},
			{Type: "video_url", VideoURL: codec.RawMessage(`{"url":"v"}`), Text: "caption"},
			{Type: "x", Logprobs: codec.RawMessage(`null`), Annotations: []any{1.5, "a", nil}},
		}}},
		{Type: ItemFunctionCall, CallID: "c1", Name: "get_weather", Arguments: `{"city": "Paris"}`},
		{Type: ItemFunctionCall, ID: "fc_1", CallID: "c1", Name: "f", Arguments: tricky, Status: "completed", TokenFields: tokens},
		{Type: ItemFunctionCallOutput, CallID: "c1"},
		{Type: ItemFunctionCallOutput, ID: "o", CallID: "c1", Output: TextContent(`{"w":"sunny"}`), Status: "completed"},
		{Type: ItemFunctionCallOutput, CallID: "c2", Output: &MessageContent{IsParts: true, Parts: []ContentPart{{Type: "input_text", Text: "rainy"}}}},
		{Type: ItemReasoning},
		{Type: ItemReasoning, ID: "rs_1", Summary: []SummaryText{{"summary_text", "A"}, {"summary_text", ""}}, EncryptedContent: strPtr(tricky), TokenFields: tokens},
		{Type: ItemReasoning, Summary: []SummaryText{}, EncryptedContent: strPtr("")},
		{Type: "mcp_call", ID: "x", Role: "", Content: TextContent("")},
	}
	for _, it := range items {
		sameAsReference(t, it)
	}
	if got, _ := (Input{Text: tricky}).MarshalJSON(); !bytes.Equal(got, mustJSON(t, tricky)) {
		t.Errorf("text input = %s", got)
	}
	if got, _ := (Input{IsItems: true}).MarshalJSON(); string(got) != "[]" {
		t.Errorf("no items = %s, want []", got)
	}
}

// TestInputThen: an input whose list goes on in Then encodes, converts and
// reads as the one list of both.
func TestInputThen(t *testing.T) {
	a := []Item{{Role: "developer", Content: TextContent("be brief")}, {Role: "user", Content: TextContent("weather?")}}
	b := []Item{
		{Type: ItemFunctionCall, ID: "fc_1", CallID: "c1", Name: "get_weather", Arguments: `{"city":"Paris"}`, Status: "completed",
			TokenFields: TokenFields{PromptTokenIDs: []int{1, 2}, GenerationTokenIDs: []int{3}, GenerationLogProbs: []float64{-0.5}}},
		{Type: ItemFunctionCallOutput, CallID: "c1", Output: TextContent(`{"w":"sunny"}`)},
	}
	for name, tc := range map[string]struct{ items, then []Item }{
		"both":       {a, b},
		"then only":  {nil, b},
		"items only": {a, nil},
		"empty then": {a, []Item{}},
		"neither":    {nil, nil},
	} {
		split := Input{Items: tc.items, Then: tc.then, IsItems: true}
		whole := Input{Items: slices.Concat(tc.items, tc.then), IsItems: true}
		got, err := split.MarshalJSON()
		want, _ := whole.MarshalJSON()
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: encoded %s (%v), want %s", name, got, err, want)
		}
		var back Input
		if err := json.Unmarshal(got, &back); err != nil || back.Then != nil || len(back.Items) != len(tc.items)+len(tc.then) {
			t.Errorf("%s: decoded %+v (%v)", name, back, err)
		}
		if n := len(split.AsItems()); n != len(tc.items)+len(tc.then) {
			t.Errorf("%s: AsItems has %d items", name, n)
		}
		gotChat, err1 := ResponsesToChat(&ResponsesRequest{Input: split}, "m")
		wantChat, err2 := ResponsesToChat(&ResponsesRequest{Input: whole}, "m")
		if (err1 == nil) != (err2 == nil) || !reflect.DeepEqual(gotChat, wantChat) {
			t.Errorf("%s: converted %+v (%v), want %+v (%v)", name, gotChat, err1, wantChat, err2)
		}
	}
	bad := Input{Items: a, Then: []Item{{Type: ItemFunctionCall, TokenFields: TokenFields{GenerationLogProbs: []float64{nanValue()}}}}, IsItems: true}
	if got, err := bad.MarshalJSON(); err == nil {
		t.Errorf("a NaN in Then encoded as %s, want an error", got)
	}
}

// TestItemCompact: a compacted item keeps what the agent reads of it and
// encodes as the encoding it was given, token fields included.
func TestItemCompact(t *testing.T) {
	it := Item{Type: ItemFunctionCall, ID: "fc_1", CallID: "c1", Name: "f", Arguments: `{"a":1}`, Status: "completed",
		TokenFields:   TokenFields{PromptTokenIDs: []int{1, 2}, GenerationTokenIDs: []int{3}, GenerationLogProbs: []float64{-0.5}},
		RoutedExperts: codec.RawMessage(`"AAEC"`)}
	enc, err := it.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	c := it.Compact(enc)
	if c.PromptTokenIDs != nil || c.GenerationTokenIDs != nil || c.GenerationLogProbs != nil || c.RoutedExperts != nil {
		t.Errorf("compacted item still holds its token fields: %+v", c)
	}
	if c.Type != it.Type || c.CallID != it.CallID || c.Name != it.Name || c.Arguments != it.Arguments || c.Status != it.Status {
		t.Errorf("compacted item lost what is read of it: %+v", c)
	}
	got, err := c.MarshalJSON()
	if err != nil || !bytes.Equal(got, enc) {
		t.Errorf("compacted item encodes as %s (%v), want %s", got, err, enc)
	}
	list, _ := Input{Items: []Item{c}, Then: []Item{c}, IsItems: true}.MarshalJSON()
	if want := "[" + string(enc) + "," + string(enc) + "]"; string(list) != want {
		t.Errorf("in a list: %s, want %s", list, want)
	}
}

func TestItemEncoding_Refusals(t *testing.T) {
	for name, it := range map[string]Item{
		"log-prob NaN":     {Type: ItemFunctionCall, TokenFields: TokenFields{GenerationLogProbs: []float64{nanValue()}}},
		"invalid logprobs": {Role: "assistant", Content: &MessageContent{IsParts: true, Parts: []ContentPart{{Type: "output_text", Logprobs: codec.RawMessage(`{`)}}}},
		"invalid image":    {Role: "user", Content: &MessageContent{IsParts: true, Parts: []ContentPart{{Type: "input_image", ImageURL: codec.RawMessage(`x`)}}}},
	} {
		if b, err := it.MarshalJSON(); err == nil {
			t.Errorf("%s: encoded as %s, want an error", name, b)
		}
	}
}

func nanValue() float64 {
	var zero float64
	return zero / zero
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzItemEncoding: any item a client can send encodes as the wire structs
// encode.
func FuzzItemEncoding(f *testing.F) {
	for _, s := range []string{
		`{"role":"user","content":"hi <&>"}`,
		`{"type":"message","role":"assistant","id":"m","status":"completed","content":[{"type":"output_text","text":"x","annotations":[],"logprobs":[{"t":1}]}],"prompt_token_ids":[1],"generation_token_ids":[2],"generation_log_probs":[-0.000001]}`,
		`{"type":"function_call","call_id":"c","name":"f","arguments":"{}","generation_log_probs":[1e-7,1e21,-0]}`,
		`{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"\u2028"},{"type":"input_image","image_url":"u","detail":"low"}]}`,
		`{"type":"reasoning","id":"rs","summary":[{"type":"summary_text","text":"s"}],"encrypted_content":"e"}`,
		`{"type":"mcp_call","id":"x","content":[{"type":"video_url","video_url":{"url":"v"},"annotations":[{"a":"<"}]}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var it Item
		if codec.Unmarshal(data, &it) != nil {
			return
		}
		sameAsReference(t, it)
	})
}
