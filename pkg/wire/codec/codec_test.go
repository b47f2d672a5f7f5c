package codec_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

type strictBody struct {
	Name  string `json:"name"`
	Count int    `json:"count"`
	Inner struct {
		Flag bool `json:"flag"`
	} `json:"inner"`
}

func TestUnmarshalStrict(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    strictBody
		wantErr string // substring; "" means success
		isTrail bool   // the error is ErrTrailingData
	}{
		{name: "exact", in: `{"name":"a","count":2,"inner":{"flag":true}}`, want: strictBody{Name: "a", Count: 2, Inner: struct {
			Flag bool `json:"flag"`
		}{Flag: true}}},
		{name: "surrounding whitespace", in: " \n{\"name\":\"a\"}\n\t ", want: strictBody{Name: "a"}},
		{name: "unknown top-level field", in: `{"name":"a","nmae":"b"}`, wantErr: `unknown field "nmae"`},
		{name: "unknown nested field", in: `{"inner":{"flag":true,"flg":1}}`, wantErr: `unknown field "flg"`},
		{name: "second value", in: `{"name":"a"}{"name":"b"}`, isTrail: true},
		{name: "trailing garbage", in: `{"name":"a"} x`, isTrail: true},
		{name: "trailing close brace", in: `{"name":"a"}}`, isTrail: true},
		{name: "trailing scalar", in: `{} 1`, isTrail: true},
		{name: "empty", in: ``, wantErr: "EOF"},
		{name: "truncated", in: `{"name":`, wantErr: "unexpected EOF"},
		{name: "wrong type", in: `{"count":"2"}`, wantErr: "cannot unmarshal string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got strictBody
			err := codec.UnmarshalStrict([]byte(tt.in), &got)
			switch {
			case tt.isTrail:
				if !errors.Is(err, codec.ErrTrailingData) {
					t.Fatalf("err = %v, want ErrTrailingData", err)
				}
			case tt.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
			default:
				if err != nil {
					t.Fatalf("UnmarshalStrict: %v", err)
				}
				if got != tt.want {
					t.Fatalf("got %+v, want %+v", got, tt.want)
				}
			}
		})
	}
}

// Unmarshal is the lenient data-path decoder: unknown fields pass.
func TestUnmarshal_IgnoresUnknownFields(t *testing.T) {
	var got strictBody
	if err := codec.Unmarshal([]byte(`{"name":"a","extra":{"deep":[1]},"count":3}`), &got); err != nil {
		t.Fatal(err)
	}
	if got.Name != "a" || got.Count != 3 {
		t.Fatalf("got %+v", got)
	}
}

// recordingWriter records each Write call separately.
type recordingWriter struct{ writes [][]byte }

func (w *recordingWriter) Write(b []byte) (int, error) {
	w.writes = append(w.writes, bytes.Clone(b))
	return len(b), nil
}

func TestEncoder_OneLinePerValueInOneWrite(t *testing.T) {
	w := &recordingWriter{}
	enc := codec.NewEncoder(w)
	values := []any{
		map[string]int{"b": 2, "a": 1},
		strictBody{Name: "<x>"},
		"a much longer value than the first two, so the reused buffer must grow",
		1,
	}
	for _, v := range values {
		if err := enc.Encode(v); err != nil {
			t.Fatalf("Encode(%v): %v", v, err)
		}
	}
	want := []string{
		`{"a":1,"b":2}` + "\n",
		`{"name":"\u003cx\u003e","count":0,"inner":{"flag":false}}` + "\n",
		`"a much longer value than the first two, so the reused buffer must grow"` + "\n",
		"1\n",
	}
	if len(w.writes) != len(want) {
		t.Fatalf("got %d writes, want %d: %q", len(w.writes), len(want), w.writes)
	}
	for i := range want {
		if got := string(w.writes[i]); got != want[i] {
			t.Errorf("write %d = %q, want %q", i, got, want[i])
		}
	}
}

type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }

func TestEncoder_Errors(t *testing.T) {
	var buf bytes.Buffer
	if err := codec.NewEncoder(&buf).Encode(math.NaN()); err == nil {
		t.Fatal("encoding NaN succeeded")
	}
	if buf.Len() != 0 {
		t.Fatalf("a failed encode wrote %q", buf.String())
	}
	wantErr := errors.New("disk full")
	if err := codec.NewEncoder(failingWriter{wantErr}).Encode(1); !errors.Is(err, wantErr) {
		t.Fatalf("err = %v, want the writer's error", err)
	}
}

func TestDescribeError(t *testing.T) {
	decodeStd := func(in string) error {
		var v strictBody
		return json.Unmarshal([]byte(in), &v)
	}
	decodeGoccy := func(in string) error {
		var v strictBody
		return codec.Unmarshal([]byte(in), &v)
	}
	decodeStrict := func(in string) error {
		var v strictBody
		return codec.UnmarshalStrict([]byte(in), &v)
	}
	var scalar int
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"std syntax", decodeStd(`{"name":}`), "malformed JSON at byte 9: invalid character '}' looking for beginning of value"},
		{"goccy syntax", decodeGoccy(`{"name":}`), "malformed JSON at byte "},
		{"std field type", decodeStd(`{"count":"x"}`), `field "count": expected int, got JSON string`},
		{"goccy field type", decodeGoccy(`{"count":"x"}`), `field "count": expected int, got JSON string`},
		{"std nested field type", decodeStd(`{"inner":{"flag":1}}`), `field "inner.flag": expected bool, got JSON number`},
		{"goccy nested field type", decodeGoccy(`{"inner":{"flag":1}}`), `field "inner.flag": expected bool, got JSON number`},
		{"std top-level type", json.Unmarshal([]byte(`"x"`), &scalar), "expected int, got JSON string"},
		{"goccy top-level type", codec.Unmarshal([]byte(`"x"`), &scalar), "expected int, got JSON string"},
		{"strict empty", decodeStrict(``), "empty or truncated JSON body"},
		{"strict truncated", decodeStrict(`{"name":"a"`), "empty or truncated JSON body"},
		{"wrapped EOF", errors.Join(errors.New("reading"), io.ErrUnexpectedEOF), "empty or truncated JSON body"},
		{"trailing data", decodeStrict(`{} {}`), codec.ErrTrailingData.Error()},
		{"unknown field", decodeStrict(`{"x":1}`), `json: unknown field "x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.err == nil {
				t.Fatal("the decode under test succeeded")
			}
			if got := codec.DescribeError(tt.err); !strings.HasPrefix(got, tt.want) {
				t.Fatalf("DescribeError(%v) = %q, want prefix %q", tt.err, got, tt.want)
			}
		})
	}
}

func TestValidAndStableEncodings(t *testing.T) {
	if !codec.Valid([]byte(`{"a":[1,2]}`)) || codec.Valid([]byte(`{"a":}`)) || codec.Valid([]byte(`{} {}`)) {
		t.Fatal("Valid disagrees with the JSON grammar")
	}
	v := map[string]any{"b": []int{1}, "a": "<&>"}
	stable, err := codec.MarshalStable(v)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(stable), `{"a":"\u003c\u0026\u003e","b":[1]}`; got != want {
		t.Fatalf("MarshalStable = %s, want %s", got, want)
	}
	indented, err := codec.MarshalIndent(v)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(indented), "{\n \"a\": \"\\u003c\\u0026\\u003e\",\n \"b\": [\n  1\n ]\n}"; got != want {
		t.Fatalf("MarshalIndent = %q, want %q", got, want)
	}
}
