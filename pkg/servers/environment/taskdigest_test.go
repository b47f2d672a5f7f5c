package environment

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	tracking "github.com/gymfleet/gymfleet/pkg/episode"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// decodedTask is the task as taskDigest used to build it before it
// canonicalised the raw JSON itself: each field decoded into an any. Its
// digest, tracking.TaskDigest, is what checkpoints already written hold, so
// taskDigest must give it for every row, and refuse what it refuses.
func decodedTask(row Row) (map[string]any, error) {
	task := make(map[string]any, len(row))
	for k, raw := range row {
		if strings.HasPrefix(k, "_ng_") {
			continue
		}
		var v any
		if err := codec.Unmarshal(raw, &v); err != nil {
			return nil, err
		}
		task[k] = v
	}
	return task, nil
}

// checkMatchesDecoded checks taskDigest against decodedTask for row: the
// same canonical bytes and digest, or both an error. It reports whether the
// row was accepted.
func checkMatchesDecoded(t *testing.T, row Row) bool {
	t.Helper()
	task, werr := decodedTask(row)
	var want []byte
	if werr == nil {
		// A decoded value always encodes: Unmarshal makes no NaN or infinity.
		var err error
		if want, err = codec.MarshalStable(task); err != nil {
			t.Fatalf("the decoded task does not encode: %v", err)
		}
	}
	got, gerr := canonicalTask(row)
	if (gerr == nil) != (werr == nil) {
		t.Fatalf("row %q: canonicalTask error %v, decoding error %v", row, gerr, werr)
	}
	if werr != nil {
		if _, err := taskDigest(row); err == nil {
			t.Fatalf("row %q: taskDigest accepted it, decoding refused it: %v", row, werr)
		}
		return false
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("row %q:\ncanonicalTask %s\ndecoded       %s", row, got, want)
	}
	gotDigest, err := taskDigest(row)
	if err != nil {
		t.Fatal(err)
	}
	wantDigest, err := tracking.TaskDigest(task)
	if err != nil {
		t.Fatal(err)
	}
	if gotDigest != wantDigest {
		t.Fatalf("row %q: taskDigest %s, tracking.TaskDigest %s", row, gotDigest, wantDigest)
	}
	return true
}

// weatherRow is a /run body as pkg/ops/scalebench sends it, plus the
// instructions and tool fields of the agent's benchmark rows.
const weatherRow = `{"responses_create_params":{"instructions":"You are a weather assistant. Use the get_weather tool, then answer in one short sentence.","input":[{"role":"developer","content":"You are a weather assistant."},{"role":"user","content":"What is the weather in City12345? Call get_weather with {\"city\": \"City12345\"}."}],"tools":[{"type":"function","name":"get_weather","description":"Get the current weather of a city.","strict":true,"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false}}],"max_output_tokens":256,"temperature":0.7},"city":"City12345","expected":{"temperature_c":21.5,"condition":"sunny"},"agent_ref":{"type":"responses_api_agents","name":"weather_agent"},"_ng_rollout_id":"w12345","_ng_task_index":12345,"_ng_rollout_index":0,"_ng_attempt_index":1}`

func decodeRow(t testing.TB, body string) Row {
	t.Helper()
	var row Row
	if err := codec.Unmarshal([]byte(body), &row); err != nil {
		t.Fatal(err)
	}
	return row
}

// nested is value inside depth arrays, or objects when object is set.
func nested(depth int, object bool, value string) string {
	open, close := "[", "]"
	if object {
		open, close = `{"k":`, "}"
	}
	return strings.Repeat(open, depth) + value + strings.Repeat(close, depth)
}

// trickyValues returns field values that exercise every part of the
// canonical form. Each is also a seed of FuzzTaskDigest.
func trickyValues() []string {
	return []string{
		// Objects: members sorted by their decoded names; of repeated names,
		// the last one kept; names equal once decoded are repeated names.
		`{"b":{"d":1,"c":[{"z":1,"y":2,"x":{}}]},"a":0,"":null}`,
		`{"a":1,"b":2,"a":3}`,
		`{"x":{"k":1,"k":{"k":2,"k":3}},"x":{"k":4}}`,
		`{"a":1,"\u0061":2}`,
		`{"\u00e9":1,"é":2,"\u00E9":3}`,
		"{\"\xff\":1,\"\xfe\":2,\"\\ufffd\":3}",
		`{"\u0062":1,"a":2,"<":3,";":4,"=":5,"\u2028":6,"é":7,"\ud83d\ude00":8,"\ud800":9}`,
		`{"a":{"b":{"c":{"d":[{"f":1,"e":2}]}}},"A":[]}`,
		// Strings: escapes decoded and written again as encoding/json writes.
		`"\ud83d\ude00 \ud800 \udc00 \ud800\u0041 \ude00\ud83d \ud800\ud800\udc00 \ud800"`,
		`"\u0000\u001f\u007f\b\f\n\r\t\/\"\\ \u00e9\u00E9 \ufffd"`,
		`"<b>&amp;</b> \u003c\u003e\u0026 \u2028\u2029"`,
		"\"raw \u2028\u2029 é 😀 \ufffd \x7f\"",
		"\"\xff\xfe \xed\xa0\x80 \xe2\x80 \xc3\"",
		"\"\xe2\x80\\u0041 \\u00e9\x80\"",
		`""`,
		`"` + strings.Repeat("long plain ascii ", 10) + `"`,
		`"` + strings.Repeat(`esc\"aped `, 10) + `"`,
		// Numbers: decoded to a float64 and written as encoding/json writes it.
		`[0,-0,-0.0,0e5,1.0,1,100,1.5e300,1e21,1e20,123456789012345678901234567890]`,
		`[1e-6,1e-7,0.000001,0.1,9007199254740993,-1e-400,1e-400,5e-324,1.7976931348623157e308]`,
		`[1E+2,1e-02,-12.50,3.14159265358979323846,2e-7,-7e22,1e+0]`,
		`12345`, `-0`, `1.0`,
		// Literals, empty containers and whitespace.
		`true`, `false`, `null`, `{}`, `[]`, `[[],{},[{}]]`,
		" { \"a\" :\t[ 1 ,\r\n2 ] , \"b\" : { } }\n ",
		nested(100, false, `{"b":1,"a":2}`),
		nested(100, true, `[3,2,1]`),
	}
}

func TestTaskDigest_MatchesDecoded(t *testing.T) {
	deepest := maxNestingForTest
	accepted := []Row{
		decodeRow(t, weatherRow),
		decodeRow(t, `{"responses_create_params":{"input":"hi"},"task":"t","_ng_rollout_id":"r","_ng_attempt_index":2}`),
		{},
		// _ng_ fields are not the task's, whatever they hold.
		{"_ng_rollout_id": codec.RawMessage(`"r"`), "_ng_bad": codec.RawMessage(`{`), "_ng_": nil},
		{"_ng": codec.RawMessage(`1`), "ng_x": codec.RawMessage(`2`), "_NG_x": codec.RawMessage(`3`)},
		// Top-level names are written as encoding/json writes map keys.
		{"<b>": codec.RawMessage(`1`), "\u2028": codec.RawMessage(`2`), "é": codec.RawMessage(`3`), "": codec.RawMessage(`4`), "\xff": codec.RawMessage(`5`), "\xfe": codec.RawMessage(`6`), "a\"b\\": codec.RawMessage(`7`)},
		{"arrays": codec.RawMessage(nested(deepest, false, "1"))},
		{"objects": codec.RawMessage(nested(deepest, true, "1"))},
	}
	for _, v := range trickyValues() {
		accepted = append(accepted, Row{"value": codec.RawMessage(v), "_ng_rollout_id": codec.RawMessage(`"r"`)})
	}
	for i, row := range accepted {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			if !checkMatchesDecoded(t, row) {
				t.Fatalf("row %q was refused", row)
			}
		})
	}

	refused := []string{
		// Beyond a float64: Unmarshal refuses it, even in a member that a
		// later one of the same name replaces.
		`1e400`, `-1e400`, `[1,1e400]`, `{"a":1e400,"a":1}`,
		// Not JSON.
		``, ` `, `{`, `[`, `[1,]`, `{"a":1,}`, `{"a" 1}`, `{1:2}`, `[1}`, `{"a":1]`, `1 2`, `"a"x`,
		`01`, `-01`, `1.`, `.5`, `+1`, `-`, `1e`, `1e+`, `0x10`, `NaN`, `Infinity`, `-Infinity`,
		`tru`, `nul`, `falsey`, `True`, `'a'`, `"abc`, "\"\x01\"", "\"\t\"", `"\q"`, `"\u12"`, `"\u12g4"`, `"\`, `"\u`,
		"1\x00", "{}\x00", "\x00", "\xef\xbb\xbf1",
		nested(deepest+1, false, "1"), nested(deepest+1, true, "1"), nested(deepest, false, "[1]"),
	}
	for i, v := range refused {
		t.Run(fmt.Sprint("refused", i), func(t *testing.T) {
			if checkMatchesDecoded(t, Row{"value": codec.RawMessage(v)}) {
				t.Fatalf("value %q was accepted", v)
			}
		})
	}
	t.Run("nil", func(t *testing.T) {
		if checkMatchesDecoded(t, Row{"value": nil}) {
			t.Fatal("a nil value was accepted")
		}
	})
}

// maxNestingForTest is how deeply Unmarshal lets values nest.
const maxNestingForTest = 10000

// FuzzTaskDigest checks taskDigest against decodedTask for arbitrary bytes
// as a field's value, alone and nested in an object and an array, and for
// an arbitrary member name.
func FuzzTaskDigest(f *testing.F) {
	for _, v := range trickyValues() {
		f.Add("value", []byte(v))
	}
	for _, name := range []string{"", "_ng_x", "<&>", "\xff", `\u00e9`, `\ud800`, `a"`, `\`, "\u2028"} {
		f.Add(name, []byte(`1`))
	}
	f.Add("x", []byte(`1e400`))
	f.Add("x", []byte("\"\xe2\x80\xa8\""))
	f.Fuzz(func(t *testing.T, name string, value []byte) {
		checkMatchesDecoded(t, Row{name: value, "_ng_rollout_id": codec.RawMessage(`"r"`)})
		wrapped := fmt.Sprintf(`{"b":%s,"a":[%s,{}],"b ":0}`, value, value)
		checkMatchesDecoded(t, Row{"wrapped": codec.RawMessage(wrapped)})
		named := fmt.Sprintf(`{"m":0,"%s":1,"%s":[2]}`, name, name)
		checkMatchesDecoded(t, Row{"named": codec.RawMessage(named)})
	})
}

// BenchmarkTaskDigest compares taskDigest with the decoding it replaced on
// a weather row.
func BenchmarkTaskDigest(b *testing.B) {
	row := decodeRow(b, weatherRow)
	b.Run("decoded", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			task, err := decodedTask(row)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tracking.TaskDigest(task); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("canonical", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := taskDigest(row); err != nil {
				b.Fatal(err)
			}
		}
	})
}
