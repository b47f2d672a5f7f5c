// Package codec is the one place the fleet encodes and decodes JSON.
//
// The data path (model payloads, records, replies) goes through goccy/go-json,
// which is measurably faster on the large OpenAI-shaped bodies the fleet
// proxies. Strict decoding of control bodies, manifests and configuration goes
// through encoding/json: those are small, must reject unknown fields exactly,
// and are where a codec bug would cost the most. codec_fuzz_test.go checks the
// two agree on our own types, so a goccy regression on a Go upgrade shows up
// as a failing test rather than a corrupt checkpoint.
package codec

import (
	"bytes"
	stdjson "encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"

	gojson "github.com/goccy/go-json"
	gojsonv2 "github.com/goccy/go-json/v2"
)

// RawMessage is a raw encoded JSON value, shared by both codecs.
type RawMessage = stdjson.RawMessage

// Number is a JSON number literal kept as text.
type Number = stdjson.Number

// Marshal encodes v as compact JSON.
func Marshal(v any) ([]byte, error) { return gojson.Marshal(v) }

// Unmarshal decodes data into v, ignoring unknown object fields.
func Unmarshal(data []byte, v any) error { return gojson.Unmarshal(data, v) }

// Valid reports whether data is one valid JSON value. It is goccy's
// validator, which accepts exactly what encoding/json.Valid accepts
// (FuzzValid checks it) at several times its speed.
func Valid(data []byte) bool { return gojson.Valid(data) }

// ErrTrailingData reports bytes after the one JSON value a strict decode expects.
var ErrTrailingData = errors.New("unexpected data after the JSON value")

// UnmarshalStrict decodes exactly one JSON value from data into v and refuses
// unknown object fields and trailing data.
func UnmarshalStrict(data []byte, v any) error {
	dec := stdjson.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return ErrTrailingData
	}
	return nil
}

// strictOptions make goccy's v2 decoder decode as encoding/json does, with
// unknown fields refused: UnmarshalStrict's semantics. Its errors are not
// reported as encoding/json's (ReportErrorsWithLegacySemantics off): a
// refused input is decoded again by UnmarshalStrict, whose error is the
// one returned, while reporting encoding/json's errors makes goccy check
// the whole input in a pass of its own before decoding it, which reads
// every byte of a large body once more.
var strictOptions = gojsonv2.JoinOptions(gojson.DefaultOptionsV1(), gojsonv2.RejectUnknownMembers(true), gojson.ReportErrorsWithLegacySemantics(false))

// UnmarshalStrictFast decodes strictly, as UnmarshalStrict does (unknown
// fields and trailing data refused), several times faster: a restore decodes
// 100,000 records and more, and each participant decodes a commit or restore
// body naming every episode in scope. v must point to a zero value.
// The decode goes through goccy's v2 decoder with the options of
// encoding/json; if that refuses the data, v is zeroed and UnmarshalStrict
// decodes it again, so what is refused is refused exactly as UnmarshalStrict
// refuses it, error included. The FuzzUnmarshalStrictFast* targets check that
// what the fast decoder accepts UnmarshalStrict accepts too, as the same
// value.
func UnmarshalStrictFast(data []byte, v any) error {
	if gojsonv2.Unmarshal(data, v, strictOptions) == nil {
		return nil
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv.Elem().SetZero()
	}
	return UnmarshalStrict(data, v)
}

// MarshalStable encodes v with encoding/json. Used for the bytes a digest is
// taken over (manifests, task digests), where the encoding must not change
// with the data-path codec.
func MarshalStable(v any) ([]byte, error) { return stdjson.Marshal(v) }

// Compact appends src, a JSON value, to dst without its insignificant white
// space.
func Compact(dst *bytes.Buffer, src []byte) error { return stdjson.Compact(dst, src) }

// MarshalIndent encodes v indented, for files people read.
func MarshalIndent(v any) ([]byte, error) { return stdjson.MarshalIndent(v, "", " ") }

// Encoder writes a stream of JSON values, one per line.
type Encoder struct {
	w   io.Writer
	buf []byte
}

// NewEncoder returns an encoder of JSON lines on w.
func NewEncoder(w io.Writer) *Encoder { return &Encoder{w: w} }

// Encode writes v and a newline in one Write.
func (e *Encoder) Encode(v any) error {
	b, err := gojson.Marshal(v)
	if err != nil {
		return err
	}
	e.buf = append(append(e.buf[:0], b...), '\n')
	_, err = e.w.Write(e.buf)
	return err
}

// DescribeError turns a decode error into a short text for an error reply,
// naming the field when the codec knows it. Errors of both codecs (Unmarshal's
// goccy and UnmarshalStrict's encoding/json) get the same wording.
func DescribeError(err error) string {
	var syn *stdjson.SyntaxError
	var typ *stdjson.UnmarshalTypeError
	var gsyn *gojson.SyntaxError
	var gtyp *gojson.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("malformed JSON at byte %d: %v", syn.Offset, syn)
	case errors.As(err, &gsyn):
		return fmt.Sprintf("malformed JSON at byte %d: %v", gsyn.Offset, gsyn)
	case errors.As(err, &typ):
		return describeTypeError(typ.Field, typ.Type, typ.Value)
	case errors.As(err, &gtyp):
		return describeTypeError(gtyp.Field, gtyp.Type, gtyp.Value)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "empty or truncated JSON body"
	}
	return err.Error()
}

func describeTypeError(field string, typ reflect.Type, value string) string {
	if field != "" {
		return fmt.Sprintf("field %q: expected %v, got JSON %s", field, typ, value)
	}
	return fmt.Sprintf("expected %v, got JSON %s", typ, value)
}
