package codec_test

import (
	"bytes"
	stdjson "encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strconv"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/tokencapture"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// Number arrays as log-probabilities and token ids come, and the forms a
// re-encode rewrites (exponents, trailing zeros, -0, nulls, whitespace).
var numberJSONSeeds = append([]string{
	`[-0.7936,-2.0686,-1e-7,0,-0.25,-0.0001234,-12.5]`, `[1,3,9,151643,-1,9223372036854775807]`,
	`[-0.00093075251579284668,-1.2345678901234567,-0.1]`, `[1E-7,1e-07,1e+21,1e21,1.5e300,2e-300,1e-400]`,
	`[0.0,-0.0,1.0,100,1e2,0.000001,0.0000001,123456789012345678901,1234567890123456789012]`,
	`[ -0.5 , null, 3 ]`, "[\n1,\t2\r]", `[null]`, `[-0]`, `[5e-324,1.7976931348623157e308,2.2250738585072014e-308]`,
	`[999999999999999000000,999999999999999900000,1e-6,9.99999999999999e-7,0.1,0.30000000000000004]`,
}, numberSeeds...)

// FuzzIntsJSON: IntsJSON accepts exactly what Ints accepts, with the same
// error, and holds what encoding the decoded Ints writes (codec.Marshal, the
// ledger's old encoder, and AppendInts), with its length.
func FuzzIntsJSON(f *testing.F) {
	for _, s := range numberJSONSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var want codec.Ints
		wantErr := want.UnmarshalJSON(b)
		var got codec.IntsJSON
		gotErr := got.UnmarshalJSON(b)
		if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			t.Fatalf("%q: codec.Ints err %v, codec.IntsJSON err %v", b, wantErr, gotErr)
		}
		if wantErr != nil {
			return
		}
		checkKept(t, b, got, []int(want), got.Len(), got.IsNull(), codec.AppendIntsJSON(nil, got), codec.AppendInts(nil, want))
		back, err := got.Ints()
		if err != nil || !reflect.DeepEqual(back, want) {
			t.Fatalf("%q: Ints() = %v, %v; want %v", b, back, err, want)
		}
	})
}

// FuzzFloatsJSON does the same for FloatsJSON against Floats.
func FuzzFloatsJSON(f *testing.F) {
	for _, s := range numberJSONSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var want codec.Floats
		wantErr := want.UnmarshalJSON(b)
		var got codec.FloatsJSON
		gotErr := got.UnmarshalJSON(b)
		if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			t.Fatalf("%q: codec.Floats err %v, codec.FloatsJSON err %v", b, wantErr, gotErr)
		}
		if wantErr != nil {
			return
		}
		appended, err := codec.AppendFloats(nil, want)
		if err != nil {
			t.Fatal(err)
		}
		checkKept(t, b, got, []float64(want), got.Len(), got.IsNull(), codec.AppendFloatsJSON(nil, got), appended)
		back, err := got.Floats()
		if err != nil || !reflect.DeepEqual(back, want) {
			t.Fatalf("%q: Floats() = %v, %v; want %v", b, back, err, want)
		}
	})
}

// checkKept compares a kept array with what the encoders write for the
// decoded one: MarshalJSON with codec.Marshal (null for nil), the Append
// form with the Append function of the slice ([] for nil).
func checkKept[T any](t *testing.T, in []byte, kept stdjson.Marshaler, decoded []T, n int, null bool, appended, wantAppended []byte) {
	t.Helper()
	want, err := codec.Marshal(decoded)
	if err != nil {
		t.Fatal(err)
	}
	got, err := kept.MarshalJSON()
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%q: MarshalJSON = %s, %v; codec.Marshal of the decoded array writes %s", in, got, err, want)
	}
	if !bytes.Equal(appended, wantAppended) {
		t.Fatalf("%q: appended %s, the Append function of the decoded array writes %s", in, appended, wantAppended)
	}
	if n != len(decoded) || null != (decoded == nil) {
		t.Fatalf("%q: Len %d, IsNull %v; decoded %d elements, nil %v", in, n, null, len(decoded), decoded == nil)
	}
}

// TestFloatsJSON_KeepsWhatMarshalWrites checks the shortcut that keeps a
// number as written without parsing it, on numbers as a fuzzer rarely makes
// them: random decimals of 1 to 17 significant digits across the whole
// exponent range, in every form JSON allows (fixed, exponent, trailing
// zeros), each kept exactly as codec.Marshal writes its float64.
func TestFloatsJSON_KeepsWhatMarshalWrites(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	n := 200_000
	if testing.Short() {
		n = 20_000
	}
	for range n {
		digits := 1 + rng.IntN(17)
		mant := strconv.FormatUint(rng.Uint64N(uint64(math.Pow10(digits))), 10)
		exp := rng.IntN(640) - 330
		var tok string
		switch rng.IntN(4) {
		case 0: // d.ddde±X
			tok = mant[:1]
			if len(mant) > 1 {
				tok += "." + mant[1:]
			}
			tok += "e"
			if exp >= 0 && rng.IntN(2) == 0 {
				tok += "+"
			}
			tok += strconv.Itoa(exp)
		case 1: // fixed, near 1
			e := rng.IntN(30) - 10
			tok = fixed(mant, e)
		case 2: // trailing zeros
			tok = mant + ".000e" + strconv.Itoa(exp)
		default: // integer
			tok = mant + "000"[:rng.IntN(4)]
		}
		if rng.IntN(2) == 0 {
			tok = "-" + tok
		}
		in := []byte("[" + tok + "]")
		var want codec.Floats
		wantErr := want.UnmarshalJSON(in)
		var got codec.FloatsJSON
		gotErr := got.UnmarshalJSON(in)
		if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			t.Fatalf("%s: codec.Floats err %v, codec.FloatsJSON err %v", in, wantErr, gotErr)
		}
		if wantErr != nil {
			continue
		}
		wantJSON, _ := codec.Marshal(want)
		if gotJSON, _ := got.MarshalJSON(); !bytes.Equal(gotJSON, wantJSON) {
			t.Fatalf("%s: kept %s, codec.Marshal writes %s", in, gotJSON, wantJSON)
		}
	}
}

// fixed writes the digits mant times 10^e without an exponent.
func fixed(mant string, e int) string {
	switch {
	case e >= 0:
		return mant + string(bytes.Repeat([]byte("0"), e))
	case -e < len(mant):
		return mant[:len(mant)+e] + "." + mant[len(mant)+e:]
	default:
		return "0." + string(bytes.Repeat([]byte("0"), -e-len(mant))) + mant
	}
}

// TestIntsJSON_InARecordThroughBothDecoders: in a record, the kept arrays
// decode the same through UnmarshalStrictFast (goccy) and UnmarshalStrict
// (encoding/json), null included, and encode as the decoded slices do.
func TestIntsJSON_InARecordThroughBothDecoders(t *testing.T) {
	type kept struct {
		IDs  codec.IntsJSON   `json:"ids"`
		LP   codec.FloatsJSON `json:"lp"`
		None codec.IntsJSON   `json:"none"`
	}
	type decoded struct {
		IDs  codec.Ints   `json:"ids"`
		LP   codec.Floats `json:"lp"`
		None codec.Ints   `json:"none"`
	}
	in := []byte(`{"ids":[3, 1,-0,null],"lp":[-0.5,-1.250,1E-7,-0.0],"none":null}`)
	var fast, strict kept
	if err := codec.UnmarshalStrictFast(in, &fast); err != nil {
		t.Fatal(err)
	}
	if err := codec.UnmarshalStrict(in, &strict); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fast, strict) {
		t.Fatalf("UnmarshalStrictFast %+v, UnmarshalStrict %+v", fast, strict)
	}
	var ref decoded
	if err := codec.UnmarshalStrictFast(in, &ref); err != nil {
		t.Fatal(err)
	}
	got, err := codec.Marshal(fast)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := codec.Marshal(ref)
	if !bytes.Equal(got, want) {
		t.Fatalf("kept arrays encode as %s, decoded ones as %s", got, want)
	}
	if fast.IDs.Len() != 4 || fast.LP.Len() != 4 || !fast.None.IsNull() {
		t.Fatalf("lengths %d %d, null %v", fast.IDs.Len(), fast.LP.Len(), fast.None.IsNull())
	}
	for _, bad := range []string{`{"ids":[1.5]}`, `{"ids":[99999999999999999999]}`, `{"lp":[1e400]}`, `{"lp":["x"]}`, `{"ids":{}}`} {
		var k kept
		var d decoded
		errKept, errDecoded := codec.UnmarshalStrictFast([]byte(bad), &k), codec.UnmarshalStrictFast([]byte(bad), &d)
		if errKept == nil || fmt.Sprint(errKept) != fmt.Sprint(errDecoded) {
			t.Errorf("%s: kept arrays refused with %v, decoded ones with %v", bad, errKept, errDecoded)
		}
	}
}

func TestIntsJSONOf(t *testing.T) {
	if v := codec.IntsJSONOf(nil); !v.IsNull() || string(codec.AppendIntsJSON(nil, v)) != "[]" {
		t.Errorf("IntsJSONOf(nil) = %v", v)
	}
	if v := codec.IntsJSONOf([]int{1, -2}); v.Len() != 2 || string(codec.AppendIntsJSON(nil, v)) != "[1,-2]" {
		t.Errorf("IntsJSONOf([1 -2]) = %v", v)
	}
	if _, err := codec.FloatsJSONOf([]float64{math.NaN()}); err == nil {
		t.Error("FloatsJSONOf accepted NaN")
	}
	if v, err := codec.FloatsJSONOf([]float64{-1e-7, 0.5}); err != nil || v.Len() != 2 || string(codec.AppendFloatsJSON(nil, v)) != "[-1e-7,0.5]" {
		t.Errorf("FloatsJSONOf = %v, %v", v, err)
	}
}

// BenchmarkUnmarshalNumbers compares keeping a ledger row's arrays (IntsJSON,
// FloatsJSON) with decoding them (Ints, Floats): 60 prompt token ids, 20
// generated, 20 log-probs as the fake inference server writes them and as a
// float32-valued model writes them (17 digits).
func BenchmarkUnmarshalNumbers(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	ints := make([]int, 80)
	short, long := make([]float64, 20), make([]float64, 20)
	for i := range ints {
		ints[i] = rng.IntN(151000)
	}
	for i := range short {
		short[i] = -float64(rng.IntN(30000)) / 10000
		long[i] = float64(float32(-rng.Float64() * 3))
	}
	intsJSON := codec.AppendInts(nil, ints)
	shortJSON, _ := codec.AppendFloats(nil, short)
	longJSON, _ := codec.AppendFloats(nil, long)
	run := func(name string, data []byte, v stdjson.Unmarshaler) {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if err := v.UnmarshalJSON(data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	run("ints/decoded", intsJSON, new(codec.Ints))
	run("ints/kept", intsJSON, new(codec.IntsJSON))
	run("floats-short/decoded", shortJSON, new(codec.Floats))
	run("floats-short/kept", shortJSON, new(codec.FloatsJSON))
	run("floats-17-digits/decoded", longJSON, new(codec.Floats))
	run("floats-17-digits/kept", longJSON, new(codec.FloatsJSON))
}

// FuzzUnmarshalStrictFastImportRow: a ledger row with its arrays kept decodes
// the same through UnmarshalStrictFast (goccy) and UnmarshalStrict
// (encoding/json), as the other record types do (record_fuzz_test.go).
func FuzzUnmarshalStrictFastImportRow(f *testing.F) {
	addSeeds(f, append([]string{
		`{"call_id":"c1","parent_call_id":"","capture_key":"r","seq":1,"created_at":1796018333.510503,"model":"m","request_digest":"d","prompt_token_ids":[1,3,9],"generation_token_ids":[11,3182],"generation_log_probs":[-0.7936,-2.0686],"finish_reason":"length"}`,
		`{"call_id":"c2","prompt_token_ids":[ -0 , null ],"generation_token_ids":null,"generation_log_probs":[1E-7,-0.0,1.50]}`,
		`{"PROMPT_TOKEN_IDS":[1],"prompt_token_ids":[2],"Generation_Log_Probs":[0.5]}`, `{"prompt_token_ids":"1"}`, `{"generation_log_probs":[1e400]}`,
	}, append(strictSeeds, numberJSONSeeds...)...), "")
	f.Fuzz(func(t *testing.T, data []byte) { strictDifferential[tokencapture.ImportRow](t, data) })
}
