package codec_test

import (
	"reflect"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/codec"
)

// FuzzCut: what a Cut function reads off the front of any input, the
// decoders read as the same value, and it leaves the rest as it was.
func FuzzCut(f *testing.F) {
	for _, s := range append([]string{
		`"plain",`, `"é\u2028"`, "\"\xff\"", `"a\"b"`, `"tab	"`, `""`, `"`, `-0,`, `123456789012345678}`, `1234567890123456789`,
		`01`, `1.5`, `1e3`, `-`, `-1.25e-7]`, `1e400`, `null,`, `nul`, `[1,2]x`, `[1,[2]]`, `[`, `[-0.5,1E2]`,
	}, numberJSONSeeds...) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		orig := string(b)
		check := func(what string, rest []byte, ok bool, got, decoded any) {
			t.Helper()
			if string(b) != orig {
				t.Fatalf("%s changed its input", what)
			}
			if !ok {
				return
			}
			value := b[:len(b)-len(rest)]
			if err := codec.UnmarshalRecord(value, decoded); err != nil {
				t.Fatalf("%s read %q, which the decoder refuses: %v", what, value, err)
			}
			if want := reflect.ValueOf(decoded).Elem().Interface(); !reflect.DeepEqual(got, want) {
				t.Fatalf("%s read %q as %#v, the decoder as %#v", what, value, got, want)
			}
		}
		s, rest, ok := codec.CutString(b)
		check("CutString", rest, ok, string(s), new(string))
		n, rest, ok := codec.CutInt64(b)
		check("CutInt64", rest, ok, n, new(int64))
		x, rest, ok := codec.CutFloat64(b)
		check("CutFloat64", rest, ok, x, new(float64))
		ints, rest, ok := codec.CutIntsJSON(b)
		checkKeptCut(t, "CutIntsJSON", b, rest, ok, ints, new(codec.IntsJSON))
		floats, rest, ok := codec.CutFloatsJSON(b)
		checkKeptCut(t, "CutFloatsJSON", b, rest, ok, floats, new(codec.FloatsJSON))
	})
}

// keptArray is IntsJSON or FloatsJSON.
type keptArray interface {
	MarshalJSON() ([]byte, error)
	Len() int
}

// checkKeptCut compares a kept array a Cut function read off the front of b
// with what the decoder reads there into decoded: the same array, of the
// same length. (A kept array may refer to b, or be a copy: only what it
// holds counts.)
func checkKeptCut(t *testing.T, what string, b, rest []byte, ok bool, got, decoded keptArray) {
	t.Helper()
	if !ok {
		return
	}
	value := b[:len(b)-len(rest)]
	if err := codec.UnmarshalRecord(value, decoded); err != nil {
		t.Fatalf("%s read %q, which the decoder refuses: %v", what, value, err)
	}
	g, _ := got.MarshalJSON()
	w, _ := decoded.MarshalJSON()
	if string(g) != string(w) || got.Len() != decoded.Len() {
		t.Fatalf("%s read %q as %s (%d), the decoder as %s (%d)", what, value, g, got.Len(), w, decoded.Len())
	}
}
