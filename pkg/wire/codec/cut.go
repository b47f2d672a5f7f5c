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
// not: the caller then decodes the record with UnmarshalStrictFast, which knows
// every form, and words every error. Where ok is true, the value is the one
// UnmarshalStrictFast decodes.

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

// SkipSpace returns b after its leading JSON whitespace. Unlike the Cut
// functions, which read a value where it starts, it lets a caller walk
// JSON laid out by others, spaces and newlines included.
func SkipSpace(b []byte) []byte {
	i := 0
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return b[i:]
}

// CutValue skips b's leading JSON whitespace and reads the one JSON value
// there only as far as it takes to find where it ends: it returns the
// value's bytes (in b) for a decoder or Valid to check, without validating
// them itself, which would scan them twice. All it checks is:
//
//   - a string starts with '"' and ends at the next '"' that no backslash
//     escapes (a backslash escapes the byte after it, whatever that is);
//   - an array or object starts with '[' or '{' and ends at the first ']'
//     or '}' that closes as many brackets as have opened, those in strings
//     aside; the two kinds are counted as one, so "{]" is a value, and
//     nothing else between the brackets is looked at;
//   - anything else (a number, true, false, null, or none of these) is
//     the bytes up to the next ',', '}', ']', JSON whitespace or the end
//     of b, at least one.
//
// So ok is false, with rest b, only where b holds no more than whitespace,
// starts (after it) with ',', '}' or ']', or ends inside a string, array
// or object. A valid JSON value is read exactly when it is a string,
// array or object, whatever follows it, and otherwise when what follows
// it is whitespace, ',', '}', ']' or nothing (FuzzCutValue checks it
// against encoding/json).
func CutValue(b []byte) (value, rest []byte, ok bool) {
	start := len(b) - len(SkipSpace(b))
	end := valueEnd(b, start)
	if end < 0 {
		return nil, b, false
	}
	return b[start:end], b[end:], true
}

// valueEnd returns the index after the value at b[i] as CutValue reads it,
// or -1.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				end := stringEnd(b, i)
				if end < 0 {
					return -1
				}
				i = end
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return -1
	}
	end := i
	for end < len(b) && !endsScalar(b[end]) {
		end++
	}
	if end == i {
		return -1
	}
	return end
}

// endsScalar reports that c cannot be part of a number or literal: what
// may follow one in JSON but a ':' (which follows only a string).
func endsScalar(c byte) bool { return c == ',' || c == '}' || c == ']' || isSpace(c) }

// stringEnd returns the index after the string that starts at b[i], a
// '"', or -1 if it does not end in b. It jumps from quote to quote
// (bytes.IndexByte) instead of looking at every byte: a quote ends the
// string unless the backslashes right before it, within the string, are
// an odd run (the last one escapes it).
func stringEnd(b []byte, i int) int {
	start := i + 1
	for from := start; ; {
		q := bytes.IndexByte(b[from:], '"')
		if q < 0 {
			return -1
		}
		q += from
		k := q
		for k > start && b[k-1] == '\\' {
			k--
		}
		if (q-k)%2 == 0 {
			return q + 1
		}
		from = q + 1
	}
}
