package modelproxy

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

// checkEncodeUpstream: encodeUpstream writes what encodeUpstreamDecoded
// writes, and its messages and tools digest alike.
func checkEncodeUpstream(t *testing.T, d *requestDigests, chat *openai.ChatRequest) {
	t.Helper()
	up, messages, tools, err := encodeUpstream(chat)
	wantUp, wantMessages, wantTools, werr := encodeUpstreamDecoded(chat)
	if errorText(err) != errorText(werr) {
		t.Fatalf("error %v, decoded %v", err, werr)
	}
	if err != nil {
		return
	}
	if !bytes.Equal(up, wantUp) {
		t.Fatalf("upstream request\n%s\ndecoded\n%s", up, wantUp)
	}
	got, gerr := d.request(messages, tools)
	want, werr := d.request(wantMessages, wantTools)
	if got != want || errorText(gerr) != errorText(werr) {
		t.Fatalf("digest %s, %v; decoded %s, %v\nmessages %s\ntools %s", got, gerr, want, werr, messages, tools)
	}
}

// responsesChat is body converted as serveResponses converts it, with the
// token parameters it adds.
func responsesChat(t testing.TB, body string) *openai.ChatRequest {
	req, err := decodeResponsesRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	chat, err := openai.ResponsesToChat(req, "m")
	if err != nil {
		t.Fatal(err)
	}
	yes, zero := true, 0
	chat.ReturnTokenIDs, chat.Logprobs, chat.TopLogprobs, chat.ReturnTokensAsTokenIDs = &yes, &yes, &zero, &yes
	return chat
}

const secondWeatherCall = `{"input":[{"role":"developer","content":"You are a weather assistant."},` +
	`{"role":"user","content":"What is the weather in City7? Call get_weather with {\"city\": \"City7\"}."},` +
	`{"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\": \"City7\"}","id":"fc_1","status":"completed",` +
	`"prompt_token_ids":[1,2,3],"generation_token_ids":[4,5],"generation_log_probs":[-0.5,-1.25e-7]},` +
	`{"type":"function_call_output","call_id":"call_1","output":"{\"city\": \"City7\", \"temperature_c\": 21}"}],` +
	`"tools":[{"type":"function","name":"get_weather","description":"Get the <current> weather & more.","strict":true,` +
	`"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}],` +
	`"metadata":{"extra_body":"{\"seed\": 7}"},"temperature":1.0,"max_output_tokens":64}`

func TestEncodeUpstream(t *testing.T) {
	var d requestDigests
	for _, tc := range []struct {
		name  string
		body  string
		extra map[string]codec.RawMessage
	}{
		{"no tools, no extra", `{"input":"hi"}`, nil},
		{"weather, no extra", secondWeatherCall, nil},
		{"weather, extra", secondWeatherCall, map[string]codec.RawMessage{"seed": codec.RawMessage("7"), "top_k": codec.RawMessage(" 20 ")}},
		{"extra the request has", secondWeatherCall, map[string]codec.RawMessage{
			"messages": codec.RawMessage("[]"), "model": codec.RawMessage(`"other"`), "temperature": codec.RawMessage("0"), "logprobs": codec.RawMessage("false"),
		}},
		{"extra tools, request without", `{"input":"hi"}`, map[string]codec.RawMessage{"tools": codec.RawMessage(`[{"type":"function","function":{"name":"f"}}]`)}},
		{"extra names to escape", `{"input":"hi"}`, map[string]codec.RawMessage{"<a&b>": codec.RawMessage("1"), "é": codec.RawMessage("2"), "a\u2028": codec.RawMessage("3"), "": codec.RawMessage("4")}},
		{"extra empty and null values", `{"input":"hi"}`, map[string]codec.RawMessage{"a": nil, "b": codec.RawMessage("null"), "c": codec.RawMessage("{}")}},
		{"extra nested", `{"input":"hi"}`, map[string]codec.RawMessage{"structured_outputs": codec.RawMessage(`{"json": {"type": "object"}}`)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chat := responsesChat(t, tc.body)
			chat.ExtraBody = tc.extra
			checkEncodeUpstream(t, &d, chat)
			chat.Stream, chat.StreamOptions = true, &openai.StreamOptions{IncludeUsage: true}
			checkEncodeUpstream(t, &d, chat)
		})
	}
}

// TestObjectMembers: objectMembers reads an object whose names need no
// decoding, white space and all, and nothing else.
func TestObjectMembers(t *testing.T) {
	for _, tc := range []struct {
		obj  string
		want []string
	}{
		{`{}`, []string{}},
		{" \t{ \n} \r", []string{}},
		{`{"a":1}`, []string{"a", "1"}},
		{`{"a":"x,}\"","b":[1,{"c":"]"}],"c":null,"d":{}}`, []string{"a", `"x,}\""`, "b", `[1,{"c":"]"}]`, "c", "null", "d", "{}"}},
		{" { \"a\" : 1 , \"b\"\t:\n[ 2 ] } ", []string{"a", "1", "b", "[ 2 ]"}},
		{`{"é":true,"a":1,"a":2}`, []string{"é", "true", "a", "1", "a", "2"}},
		{`{"a\n":1}`, nil},
		{`{"\u0061":1}`, nil},
		{"{\"\xff\":1}", nil},
		{`[]`, nil},
		{`"{}"`, nil},
		{`null`, nil},
		{``, nil},
		// Not valid JSON: read or not, no matter.
		{`{"a":1,}`, nil},
		{`{"a":}`, nil},
		{`{"a"1}`, nil},
		{`{"a":1`, nil},
		{`{"a":1}x`, nil},
		{`{`, nil},
	} {
		members, ok := objectMembers([]byte(tc.obj), nil)
		if ok != (tc.want != nil) {
			t.Errorf("%q: ok %v", tc.obj, ok)
			continue
		}
		got := []string{}
		for _, m := range members {
			got = append(got, string(m.name), string(m.value))
		}
		if ok && !slices.Equal(got, tc.want) {
			t.Errorf("%q: %q, want %q", tc.obj, got, tc.want)
		}
	}
}

// FuzzCheckResponsesFields: for any valid JSON body, checkResponsesFields
// refuses what checkResponsesFieldsDecoded refuses, with the same error.
func FuzzCheckResponsesFields(f *testing.F) {
	for _, s := range []string{
		secondWeatherCall, `{"input":"hi"}`, ` { "input" : [ ] , "model" : "m" } `, `{"input":null}`, `{"input":"x","input":null}`,
		`{"input":null,"input":"x"}`, `{"model":"m"}`, `{"input":"x","bogus":1,"other":2}`, `{"\u0069nput":"x"}`, `{"INPUT":"x"}`,
		`[]`, `null`, `"x"`, `{}`, `{"input":"x","metadata":{"bogus":1}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !codec.Valid(body) {
			return
		}
		got, want := checkResponsesFields(body), checkResponsesFieldsDecoded(body)
		if (got == nil) != (want == nil) {
			t.Fatalf("%q: %v, decoded %v", body, got, want)
		}
		if got == nil {
			return
		}
		var g, w *apierror.Error
		if !errors.As(got, &g) || !errors.As(want, &w) || *g != *w {
			t.Fatalf("%q: %#v, decoded %#v", body, got, want)
		}
	})
}

// FuzzEncodeUpstream: for any Responses request the conversion accepts
// and any extra body, encodeUpstream writes what encodeUpstreamDecoded
// writes, and its messages and tools digest alike.
func FuzzEncodeUpstream(f *testing.F) {
	f.Add([]byte(secondWeatherCall), []byte(`{"seed": 7, "top_k": 20}`))
	f.Add([]byte(`{"input":"hi"}`), []byte(`{"tools":[],"messages":1,"<":{"a":[1,2]}}`))
	f.Add([]byte(`{"input":[{"role":"user","content":[{"type":"input_text","text":"\u00e9 \ud83d\ude00 <&>"}]}],"tools":[{"type":"function","name":"f","parameters":{"b":1.50,"a":-0}}]}`), []byte(``))
	var d requestDigests
	f.Fuzz(func(t *testing.T, body, extra []byte) {
		req, err := decodeResponsesRequest(body)
		if err != nil {
			return
		}
		chat, err := openai.ResponsesToChat(req, "m")
		if err != nil {
			return
		}
		if chat.ExtraBody, err = parseObject(string(extra)); err != nil {
			return
		}
		checkEncodeUpstream(t, &d, chat)
	})
}
