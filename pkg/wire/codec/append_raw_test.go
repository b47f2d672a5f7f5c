package codec_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// FuzzAppendRawMessage: AppendRawMessage writes a RawMessage field's value
// as codec.Marshal and encoding/json write it (null for nil, compacted and
// HTML-safe), and fails where they fail.
func FuzzAppendRawMessage(f *testing.F) {
	for _, s := range []string{
		`{"a":"spaces inside strings stay"}`, " {\n\t\"a\" : [1, \"<&>\"] } ", `"\u2028 escaped"`, "\"\u2028 raw\"", "\"’…—\"",
		`"\"\\"`, `"a\\" `, `{"a":"\xff"}`, `{`, ``, ` `, `null`, `[1,2.5e-7,true,false,null,{}]`, "\"\xe2\x80\"",
	} {
		f.Add([]byte(s), false)
	}
	f.Add([]byte(nil), true)
	type field struct {
		R codec.RawMessage `json:"r"`
	}
	f.Fuzz(func(t *testing.T, raw []byte, isNil bool) {
		if isNil {
			raw = nil
		} else if raw == nil {
			raw = []byte{}
		}
		got, gerr := codec.AppendRawMessage([]byte(`{"r":`), raw)
		for name, marshal := range map[string]func(any) ([]byte, error){"codec.Marshal": codec.Marshal, "encoding/json": json.Marshal} {
			want, werr := marshal(field{R: raw})
			if (gerr == nil) != (werr == nil) {
				t.Fatalf("%q: errors differ: AppendRawMessage %v, %s %v", raw, gerr, name, werr)
			}
			if werr == nil && !bytes.Equal(append(got, '}'), want) {
				t.Fatalf("%q: AppendRawMessage wrote %s}, %s %s", raw, got, name, want)
			}
		}
	})
}
