package codec_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// decodedCanonical is what a Canonicalizer must write for raw: the value
// Unmarshal decodes into an any, encoded by MarshalStable.
func decodedCanonical(raw []byte) ([]byte, error) {
	var v any
	if err := codec.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	return codec.MarshalStable(v)
}

// FuzzCanonicalizer: a Canonicalizer writes what Unmarshal into an any
// and MarshalStable write, and refuses what they refuse; it appends to
// dst, leaves dst as it was on an error, and keeps nothing of one value
// into the next.
func FuzzCanonicalizer(f *testing.F) {
	for _, seed := range []string{
		`{"b":{"d":1,"c":[{"z":1,"y":2}]},"a":0,"a":{"x":[]}}`,
		`{"a":1,"\u0061":2,"é":3,"\u00e9":4,"<":5,";":6}`,
		"{\"\xff\":1,\"\xfe\":2}",
		`"\ud83d\ude00 \ud800 \udc00 \ud800\u0041 \u0000 \/ \" \b\f\n\r\t <&> \u2028"`,
		"\"\xff \xed\xa0\x80 \xe2\x80\xa8 é\"",
		`[0,-0,1.0,1e21,1e-7,123456789012345678,0.1,-1e-400,5e-324]`,
		`1e400`, `[1,]`, `{"a" 1}`, `01`, `"\u12"`, "\"\x01\"", `tru`, ``, " \t\n{ } ",
		`true`, `false`, `null`, `[]`, `{}`,
	} {
		f.Add([]byte(seed))
	}
	var c codec.Canonicalizer
	f.Fuzz(func(t *testing.T, raw []byte) {
		want, werr := decodedCanonical(raw)
		prefix := []byte("prefix:")
		got, gerr := c.Append(prefix, raw)
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("%q: Canonicalizer error %v, Unmarshal/MarshalStable error %v", raw, gerr, werr)
		}
		if gerr != nil {
			if string(got) != "prefix:" {
				t.Fatalf("%q: refused, yet dst became %q", raw, got)
			}
			return
		}
		if !bytes.HasPrefix(got, prefix) || !bytes.Equal(got[len(prefix):], want) {
			t.Fatalf("%q:\nCanonicalizer %s\nMarshalStable %s", raw, got, want)
		}
		// Again, after another value, into the buffers of both.
		if _, err := c.Append(nil, []byte(`{"z":"<\u00e9>","a":[1.5,{"y":0,"x":1}]}`)); err != nil {
			t.Fatal(err)
		}
		again, err := c.Append(nil, raw)
		if err != nil || !bytes.Equal(again, want) {
			t.Fatalf("%q: the second time, %s, %v", raw, again, err)
		}
	})
}

func TestCanonicalizer_Nesting(t *testing.T) {
	for _, tc := range []struct {
		open, close string
		depth       int
		ok          bool
	}{
		{"[", "]", 10000, true},
		{"[", "]", 10001, false},
		{`{"b":0,"a":`, "}", 10000, true},
		{`{"b":0,"a":`, "}", 10001, false},
	} {
		raw := []byte(strings.Repeat(tc.open, tc.depth) + "1" + strings.Repeat(tc.close, tc.depth))
		var c codec.Canonicalizer
		got, err := c.Append(nil, raw)
		if (err == nil) != tc.ok {
			t.Fatalf("%s nested %d deep: error %v", tc.open, tc.depth, err)
		}
		if !tc.ok {
			continue
		}
		want, err := decodedCanonical(raw)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s nested %d deep: written otherwise than MarshalStable writes it", tc.open, tc.depth)
		}
	}
}

// numberCanonical is what a Canonicalizer with UseNumber must write for
// raw: the one value a json.Decoder with UseNumber decodes from it (and
// nothing after it but white space), encoded by MarshalStable.
func numberCanonical(raw []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, codec.ErrTrailingData
	}
	return codec.MarshalStable(v)
}

// FuzzCanonicalizerUseNumber: with UseNumber and RefuseReplacement, a
// Canonicalizer writes what a json.Decoder with UseNumber decodes and
// MarshalStable writes, refuses what they refuse, and refuses with
// ErrReplacement only a value with invalid UTF-8 or a surrogate escape.
func FuzzCanonicalizerUseNumber(f *testing.F) {
	for _, seed := range []string{
		`{"b":{"d":1,"c":[{"z":1,"y":2}]},"a":0,"a":{"x":[]}}`,
		`{"a":1,"\u0061":2,"é":3,"\u00e9":4,"<":5,";":6}`,
		"{\"\xff\":1,\"\xfe\":2}",
		`"\ud83d\ude00 \ud800 \udc00 \ud800\u0041 \u0000 \/ \" \b\f\n\r\t <&> \u2028"`,
		"\"\xff \xed\xa0\x80 \xe2\x80\xa8 é\"",
		`[0,-0,1.0,1e21,1E+05,1e-7,123456789012345678,0.1,-1e-400,5e-324,1e400,-0.0]`,
		`1e400`, `[1,]`, `{"a" 1}`, `01`, `"\u12"`, "\"\x01\"", `tru`, ``, " \t\n{ } ",
		`true`, `false`, `null`, `[]`, `{}`, `[] []`, `1x`,
	} {
		f.Add([]byte(seed))
	}
	var c codec.Canonicalizer
	c.UseNumber()
	c.RefuseReplacement()
	f.Fuzz(func(t *testing.T, raw []byte) {
		want, werr := numberCanonical(raw)
		got, gerr := c.Append([]byte("prefix:"), raw)
		if errors.Is(gerr, codec.ErrReplacement) {
			if utf8.Valid(raw) && !bytes.Contains(bytes.ToLower(raw), []byte(`\ud`)) {
				t.Fatalf("%q: refused with %v, yet it has neither invalid UTF-8 nor a surrogate escape", raw, gerr)
			}
			return
		}
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("%q: Canonicalizer error %v, Decoder/MarshalStable error %v", raw, gerr, werr)
		}
		if gerr != nil {
			if string(got) != "prefix:" {
				t.Fatalf("%q: refused, yet dst became %q", raw, got)
			}
			return
		}
		if !bytes.Equal(got, append([]byte("prefix:"), want...)) {
			t.Fatalf("%q:\nCanonicalizer %s\nMarshalStable %s", raw, got[len("prefix:"):], want)
		}
	})
}
