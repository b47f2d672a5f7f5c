package codec

import (
	"bytes"
	stdjson "encoding/json"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
)

// The Append functions write JSON values onto a byte slice, byte for byte
// as encoding/json writes them (the fuzz tests check it). A MarshalJSON of
// ours that writes its fields with them, instead of calling Marshal on a
// wire struct, keeps goccy's encoder (a 3 KB stack frame) from nesting once
// per level: an OpenAI item nested four levels deep grew every goroutine
// that encoded one to a 32 KB stack, and at 100,000 rollouts in flight that
// is gigabytes.

const hexDigits = "0123456789abcdef"

// copiedAsIs holds the bytes AppendString copies as they are: ASCII but
// for control bytes, the quote, the backslash and what HTML escaping
// changes: one load a byte rather than a comparison with each of them,
// on every string of every record a commit encodes.
var copiedAsIs = func() (set [256]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		set[b] = b != '"' && b != '\\' && b != '<' && b != '>' && b != '&'
	}
	return set
}()

// AppendString appends s as a JSON string: HTML-safe (<, > and & as
// \u003c, \u003e, \u0026), invalid UTF-8 as \ufffd, U+2028 and U+2029
// escaped.
func AppendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		b := s[i]
		if copiedAsIs[b] {
			i++
			continue
		}
		if b < utf8.RuneSelf {
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// AppendFloat appends f as a JSON number; NaN and infinities are an error.
func AppendFloat(dst []byte, f float64) ([]byte, error) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return dst, fmt.Errorf("json: unsupported value: %s", strconv.FormatFloat(f, 'g', -1, 64))
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	dst = strconv.AppendFloat(dst, f, format, -1, 64)
	if format == 'e' {
		// e-09 is written e-9.
		if n := len(dst); n >= 4 && dst[n-4] == 'e' && dst[n-3] == '-' && dst[n-2] == '0' {
			dst[n-2] = dst[n-1]
			dst = dst[:n-1]
		}
	}
	return dst, nil
}

// AppendInts appends v as a JSON array of integers ([] for nil).
func AppendInts(dst []byte, v []int) []byte {
	dst = append(dst, '[')
	for i, n := range v {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendInt(dst, int64(n), 10)
	}
	return append(dst, ']')
}

// AppendFloats appends v as a JSON array of numbers ([] for nil).
func AppendFloats(dst []byte, v []float64) ([]byte, error) {
	dst = append(dst, '[')
	for i, f := range v {
		if i > 0 {
			dst = append(dst, ',')
		}
		var err error
		if dst, err = AppendFloat(dst, f); err != nil {
			return dst, err
		}
	}
	return append(dst, ']'), nil
}

// AppendRaw appends raw, a JSON value, compacted and HTML-safe as
// encoding/json writes a RawMessage; raw that is not one JSON value is an
// error.
func AppendRaw(dst []byte, raw []byte) ([]byte, error) {
	if !Valid(raw) {
		return dst, fmt.Errorf("json: invalid raw JSON value %.40q", raw)
	}
	if alreadyCompactAndSafe(raw) {
		return append(dst, raw...), nil
	}
	var compact bytes.Buffer
	if err := stdjson.Compact(&compact, raw); err != nil {
		return dst, err
	}
	out := bytes.NewBuffer(dst)
	stdjson.HTMLEscape(out, compact.Bytes())
	return out.Bytes(), nil
}

// alreadyCompactAndSafe reports that valid JSON raw has no whitespace and
// nothing HTML escaping changes (<, >, &, and U+2028/U+2029, which start
// with 0xE2), so AppendRaw may copy it as it is.
func alreadyCompactAndSafe(raw []byte) bool {
	for _, c := range raw {
		switch c {
		case ' ', '\t', '\n', '\r', '<', '>', '&', 0xE2:
			return false
		}
	}
	return true
}

// AppendRawMessage appends raw as both encoders write a RawMessage field:
// null when raw is nil, else as AppendRaw writes it. A valid value with no
// white space between its tokens and nothing HTML escaping changes, as
// nearly every stored value is, is copied after one scan that knows where
// its strings are: AppendRaw's own check gives up at the first space,
// which the strings of a request (instructions, prompts) are full of, and
// then compacts through two buffers.
func AppendRawMessage(dst, raw []byte) ([]byte, error) {
	if raw == nil {
		return append(dst, "null"...), nil
	}
	if Valid(raw) && compactAndSafeJSON(raw) {
		return append(dst, raw...), nil
	}
	return AppendRaw(dst, raw)
}

// compactAndSafeJSON reports that valid JSON raw has no white space
// outside its strings (inside them only a space can occur, which compacting
// keeps) and no <, >, &, U+2028 or U+2029: compacting and HTML escaping
// leave it as it is.
func compactAndSafeJSON(raw []byte) bool {
	inString := false
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; c {
		case '"':
			inString = !inString
		case '\\':
			// Only inside a string in valid JSON: the escaped byte cannot
			// end it.
			i++
		case ' ', '\t', '\n', '\r':
			if !inString {
				return false
			}
		case '<', '>', '&':
			return false
		case 0xE2:
			// U+2028 and U+2029 are E2 80 A8 and E2 80 A9; other characters
			// starting with E2 (’, …, —) are left alone.
			if i+2 < len(raw) && raw[i+1] == 0x80 && raw[i+2]&^1 == 0xA8 {
				return false
			}
		}
	}
	return true
}
