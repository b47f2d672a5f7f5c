package codec

import (
	"bytes"
	"unicode/utf8"
)

// The Cut functions read one JSON value off the front of b in the form our
// encoder writes it, for the fast path of a decoder of records we wrote
// ourselves, laid out field by field as we write them (a restore reads
// 100,000 of them, and a generic decoder first validates each whole record,
// then walks it by reflection). They return the value and the rest of b.
// ok false means only that the value is not in that form, valid JSON or
// not: the caller then decodes the record with UnmarshalRecord, which knows
// every form, and words every error. Where ok is true, the value is the one
// UnmarshalRecord decodes.

// CutString reads a string without escape sequences or control characters
// whose bytes are valid UTF-8, and returns its bytes (in b), which are the
// string.
func CutString(b []byte) (s, rest []byte, ok bool) {
	if len(b) == 0 || b[0] != '"' {
		return nil, b, false
	}
	ascii := true
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			raw := b[1:i]
			if !ascii && !utf8.Valid(raw) {
				// A decoder replaces invalid bytes with U+FFFD.
				return nil, b, false
			}
			return raw, b[i+1:], true
		case c == '\\' || c < 0x20:
			return nil, b, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, b, false
}

// CutInt64 reads an integer of at most 18 digits (any of which fits an
// int64), with no fraction or exponent.
func CutInt64(b []byte) (n int64, rest []byte, ok bool) {
	i := 0
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		i++
	}
	start := i
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		n = n*10 + int64(b[i]-'0')
		i++
	}
	digits := i - start
	if digits == 0 || digits > 18 || (b[start] == '0' && digits > 1) {
		return 0, b, false
	}
	if i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E') {
		return 0, b, false
	}
	if neg {
		n = -n
	}
	return n, b[i:], true
}

// CutFloat64 reads a number that fits a float64.
func CutFloat64(b []byte) (f float64, rest []byte, ok bool) {
	end := scanNumber(b, 0)
	if end == 0 {
		return 0, b, false
	}
	f, err := parseFloat(b[:end])
	if err != nil {
		return 0, b, false
	}
	return f, b[end:], true
}

// CutIntsJSON reads null or an array of integers as IntsJSON.UnmarshalJSON
// accepts it. Unlike UnmarshalJSON, it does not copy an array it keeps as
// it is: v refers to b's bytes, and is good only as long as they are. (A
// restore copies its rows' arrays once, into the ledger's write batch.)
func CutIntsJSON(b []byte) (v IntsJSON, rest []byte, ok bool) {
	raw, rest, ok := cutNumberArray(b)
	if !ok {
		return IntsJSON{}, b, false
	}
	if n, ok := compactInts(raw); ok {
		return IntsJSON{raw: raw[:len(raw):len(raw)], n: n}, rest, true
	}
	if v.UnmarshalJSON(raw) != nil {
		return IntsJSON{}, b, false
	}
	return v, rest, true
}

// CutFloatsJSON reads null or an array of numbers as
// FloatsJSON.UnmarshalJSON accepts it; v refers to b's bytes, as with
// CutIntsJSON.
func CutFloatsJSON(b []byte) (v FloatsJSON, rest []byte, ok bool) {
	raw, rest, ok := cutNumberArray(b)
	if !ok {
		return FloatsJSON{}, b, false
	}
	if n, ok := compactFloats(raw); ok {
		return FloatsJSON{raw: raw[:len(raw):len(raw)], n: n}, rest, true
	}
	if v.UnmarshalJSON(raw) != nil {
		return FloatsJSON{}, b, false
	}
	return v, rest, true
}

// cutNumberArray splits null, or what may be an array of numbers, off the
// front of b: up to its first ']', as such an array holds no other.
func cutNumberArray(b []byte) (raw, rest []byte, ok bool) {
	if bytes.HasPrefix(b, []byte("null")) {
		return b[:4], b[4:], true
	}
	if len(b) == 0 || b[0] != '[' {
		return nil, b, false
	}
	end := bytes.IndexByte(b, ']')
	if end < 0 {
		return nil, b, false
	}
	return b[:end+1], b[end+1:], true
}
