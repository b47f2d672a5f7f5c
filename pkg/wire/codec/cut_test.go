package codec_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
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
			if err := codec.UnmarshalStrictFast(value, decoded); err != nil {
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
	if err := codec.UnmarshalStrictFast(value, decoded); err != nil {
		t.Fatalf("%s read %q, which the decoder refuses: %v", what, value, err)
	}
	g, _ := got.MarshalJSON()
	w, _ := decoded.MarshalJSON()
	if string(g) != string(w) || got.Len() != decoded.Len() {
		t.Fatalf("%s read %q as %s (%d), the decoder as %s (%d)", what, value, g, got.Len(), w, decoded.Len())
	}
}

func TestSkipSpace(t *testing.T) {
	for in, want := range map[string]string{
		"": "", " \t\r\n": "", " \n{} ": "{} ", "x ": "x ", "\v1": "\v1", "\u00a01": "\u00a01",
	} {
		if got := codec.SkipSpace([]byte(in)); string(got) != want {
			t.Errorf("SkipSpace(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCutValue(t *testing.T) {
	for _, tc := range []struct {
		in, value, rest string // value "" when it is not read
	}{
		{`"a"x`, `"a"`, `x`},
		{` "a\"}" ,1`, `"a\"}"`, ` ,1`},
		{`"\\"]`, `"\\"`, `]`},
		{"\"\x01\xff\\q\"", "\"\x01\xff\\q\"", ``},
		{`{"a":[1,"]}"]} ,`, `{"a":[1,"]}"]}`, ` ,`},
		{`[[],{}]]`, `[[],{}]`, `]`},
		{`{]`, `{]`, ``},
		{`[1 2 : ,]x`, `[1 2 : ,]`, `x`},
		{"\t\n12.5e3,", `12.5e3`, `,`},
		{`-0}`, `-0`, `}`},
		{`true]`, `true`, `]`},
		{"null\r", `null`, "\r"},
		{`tru"e x`, `tru"e`, ` x`},
		{`:`, `:`, ``},
		{`1:2`, `1:2`, ``},
		{``, ``, ``},
		{" \n", ``, ``},
		{`,1`, ``, ``},
		{`}`, ``, ``},
		{` ]`, ``, ``},
		{`"abc`, ``, ``},
		{`"ab\"`, ``, ``},
		{`{"a":1`, ``, ``},
		{`[[]`, ``, ``},
		{`["]"`, ``, ``},
	} {
		value, rest, ok := codec.CutValue([]byte(tc.in))
		if want := tc.value != ""; ok != want {
			t.Errorf("CutValue(%q): ok = %v, want %v", tc.in, ok, want)
			continue
		}
		if !ok {
			if value != nil || string(rest) != tc.in {
				t.Errorf("CutValue(%q) refused it as %q, %q; want nil and the input", tc.in, value, rest)
			}
			continue
		}
		if string(value) != tc.value || string(rest) != tc.rest {
			t.Errorf("CutValue(%q) = %q, %q; want %q, %q", tc.in, value, rest, tc.value, tc.rest)
		}
	}
}

// FuzzCutValue checks CutValue against encoding/json. For any input b,
// CutValue either refuses it (nil, b) or splits it into JSON whitespace,
// a value of at least one byte, and the rest, in that order and in b. And
// for v that json.Valid accepts (whitespace around it allowed) and any
// tail, CutValue(v+tail) reads v's value exactly (v without its leading
// and trailing whitespace, the rest being v's trailing whitespace and the
// tail) whenever the value ends by itself or the tail cannot continue it:
// v ends in '"', ']', '}' or whitespace, or the tail is empty or starts
// with ',', ']', '}' or whitespace. (A number or literal followed by
// another byte is read with it: CutValue does not look inside them.)
func FuzzCutValue(f *testing.F) {
	for _, s := range [][2]string{
		{`"a"`, `x`}, {`"a\"b\\"`, `"`}, {" \"\u00e9\\/\" ", `:`}, {`{}`, `}`}, {`[]`, `x`},
		{`{"a":[1,"]}",{"b":null}],"c":"{"}`, `,"d":2}`}, {`[[[["\\"]]]]`, ``}, {`12.5e-3`, `,`},
		{`-0`, `]`}, {`true`, ` `}, {`null `, `x`}, {`false`, `}`}, {`1`, `2`}, {`{"a" : 1 }`, `]`},
		{`"`, ``}, {`{]`, ``}, {`[1,`, ``},
	} {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, v, tail []byte) {
		b := append(append([]byte{}, v...), tail...)
		orig := string(b)
		value, rest, ok := codec.CutValue(b)
		if string(b) != orig {
			t.Fatal("CutValue changed its input")
		}
		if !ok {
			if value != nil || len(rest) != len(b) || (len(b) > 0 && &rest[0] != &b[0]) {
				t.Fatalf("CutValue refused %q as %q, %q; want nil and the input", b, value, rest)
			}
		} else {
			start := len(b) - len(value) - len(rest)
			if len(value) == 0 || start < 0 || len(codec.SkipSpace(b[:start])) != 0 ||
				&b[start] != &value[0] || (len(rest) > 0 && &b[len(b)-len(rest)] != &rest[0]) {
				t.Fatalf("CutValue split %q into %q, %q: not whitespace, a value and the rest of it", b, value, rest)
			}
		}

		if !json.Valid(v) {
			return
		}
		leading := len(v) - len(codec.SkipSpace(v))
		wantValue := bytes.TrimRight(v[leading:], " \t\r\n")
		// A string, array or object ends by itself, and so does anything
		// followed by whitespace in v.
		last := v[len(v)-1]
		ended := last == '"' || last == ']' || last == '}' || len(wantValue) < len(v)-leading
		if !ended && len(tail) > 0 && bytes.IndexByte([]byte(",]} \t\r\n"), tail[0]) < 0 {
			return
		}
		wantRest := b[leading+len(wantValue):]
		if !ok || !bytes.Equal(value, wantValue) || !bytes.Equal(rest, wantRest) {
			t.Fatalf("CutValue(%q) = %q, %q, %v; want the valid value %q, leaving %q", b, value, rest, ok, wantValue, wantRest)
		}
	})
}
