package codec_test

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// FuzzAppend: the Append functions write what encoding/json writes for a
// string, a float64, an []int, a []float64 and a RawMessage, and refuse
// what it refuses.
func FuzzAppend(f *testing.F) {
	for _, s := range []string{"", "plain", "<a href=\"x\">&amp;</a>", "\u2028\u2029", "\x00\x01\b\f\n\r\t\x1f\x7f", "\xff\xfe", "é😀\\\"", "\xe2\x80"} {
		f.Add(s, 0.0, int64(0), []byte(`{"a" : [1, "<&>"] }`))
	}
	for _, v := range []float64{1e-6, 9.99e-7, 1e21, 1e20, -0.5, 123456789.125, math.SmallestNonzeroFloat64, math.MaxFloat64, math.Copysign(0, -1)} {
		f.Add("x", v, int64(-1)<<62, []byte(`null`))
	}
	f.Add("", 1.0, int64(7), []byte(`{`))
	f.Add("", 1.0, int64(7), []byte("\"\u2028\""))
	f.Add("", 1.0, int64(7), []byte(` `))
	f.Fuzz(func(t *testing.T, s string, v float64, n int64, raw []byte) {
		check := func(what string, got []byte, gerr error, want []byte, werr error) {
			t.Helper()
			if (gerr == nil) != (werr == nil) {
				t.Fatalf("%s: errors differ: Append %v, encoding/json %v", what, gerr, werr)
			}
			if werr == nil && !bytes.Equal(got, want) {
				t.Fatalf("%s: Append wrote %s, encoding/json %s", what, got, want)
			}
		}
		prefix := []byte("p:")
		want, werr := json.Marshal(s)
		got := codec.AppendString(prefix, s)
		check("string", got[2:], nil, want, werr)

		want, werr = json.Marshal(v)
		got, gerr := codec.AppendFloat(prefix, v)
		if gerr == nil {
			got = got[2:]
		}
		check("float", got, gerr, want, werr)

		ints := []int{int(n), 0, -int(n / 3)}
		want, werr = json.Marshal(ints)
		check("ints", codec.AppendInts(nil, ints), nil, want, werr)
		floats := []float64{v, -v / 3}
		want, werr = json.Marshal(floats)
		got, gerr = codec.AppendFloats(nil, floats)
		check("floats", got, gerr, want, werr)

		want, werr = json.Marshal(json.RawMessage(raw))
		got, gerr = codec.AppendRaw(nil, raw)
		check("raw", got, gerr, want, werr)
	})
}

func TestAppendEmpty(t *testing.T) {
	if got := string(codec.AppendInts(nil, nil)); got != "[]" {
		t.Errorf("AppendInts(nil) = %s", got)
	}
	if got, err := codec.AppendFloats(nil, nil); string(got) != "[]" || err != nil {
		t.Errorf("AppendFloats(nil) = %s, %v", got, err)
	}
}

// BenchmarkAppendString encodes the strings of an agent's session record
// at a rollout's second model call: a prompt with a JSON example in it,
// ids, a tool's name and description, a tool's output.
func BenchmarkAppendString(b *testing.B) {
	strs := []string{
		"What is the weather in City0? Call get_weather with {\"city\": \"City0\"}.",
		"call_b4e29b32d0d8c3484f7f84bf", "get_weather", "Get the current weather of a city.",
		"{\"city\":\"City0\",\"weather_description\":\"The weather in City0 is foggy.\"}",
		"resources-session-f30725e65dca3c1450b534990f71931e", "You are a weather assistant.",
	}
	n := 0
	for _, s := range strs {
		n += len(s)
	}
	b.SetBytes(int64(n))
	var buf []byte
	for range b.N {
		for _, s := range strs {
			buf = codec.AppendString(buf[:0], s)
		}
	}
}
