package codec_test

import (
	stdjson "encoding/json"
	"reflect"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

var numberSeeds = []string{
	`[]`, `null`, ` [ 1 , 2,3 ] `, `[0,-1,9223372036854775807,-9223372036854775808]`,
	`[9223372036854775808]`, `[1.5]`, `[1e2]`, `[-0]`, `[01]`, `[1,]`, `[,1]`, `[1 2]`, `["1"]`,
	`[1.25e-3, -0.5, 3E+2, 0.0]`, `[1e400]`, `[-]`, `[.5]`, `[1.]`, `nul`, `[null]`, `[1]x`, `{}`, `[`,
}

// FuzzInts checks the direct decoder of integer arrays against encoding/json
// on []int: both accept or both refuse, with equal values.
func FuzzInts(f *testing.F) {
	for _, s := range numberSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var want []int
		wantErr := stdjson.Unmarshal(b, &want)
		var got codec.Ints
		gotErr := got.UnmarshalJSON(b)
		if (wantErr == nil) != (gotErr == nil) {
			t.Fatalf("%q: encoding/json err %v, codec.Ints err %v", b, wantErr, gotErr)
		}
		if wantErr == nil && !reflect.DeepEqual([]int(got), want) {
			t.Fatalf("%q: encoding/json %v, codec.Ints %v", b, want, got)
		}
	})
}

// FuzzFloats does the same for float arrays.
func FuzzFloats(f *testing.F) {
	for _, s := range numberSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var want []float64
		wantErr := stdjson.Unmarshal(b, &want)
		var got codec.Floats
		gotErr := got.UnmarshalJSON(b)
		if (wantErr == nil) != (gotErr == nil) {
			t.Fatalf("%q: encoding/json err %v, codec.Floats err %v", b, wantErr, gotErr)
		}
		if wantErr == nil && !reflect.DeepEqual([]float64(got), want) {
			t.Fatalf("%q: encoding/json %v, codec.Floats %v", b, want, got)
		}
	})
}

func TestInts_InAStructThroughBothCodecs(t *testing.T) {
	type row struct {
		IDs codec.Ints   `json:"ids"`
		LP  codec.Floats `json:"lp"`
	}
	in := []byte(`{"ids":[3,1,2],"lp":[-0.5,-1.25]}`)
	var a, b row
	if err := codec.Unmarshal(in, &a); err != nil {
		t.Fatal(err)
	}
	if err := stdjson.Unmarshal(in, &b); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) || len(a.IDs) != 3 || a.LP[1] != -1.25 {
		t.Fatalf("goccy %v, encoding/json %v", a, b)
	}
	out, _ := codec.Marshal(a)
	if string(out) != string(in) {
		t.Fatalf("marshal %s, want %s", out, in)
	}
}
