package codec

import (
	"bytes"
	"strconv"

	"github.com/goccy/go-json/jsontext"
)

// IntsJSON is a JSON array of integers kept as its encoding instead of
// decoded. It accepts what Ints accepts and refuses the rest with the same
// errors, and it holds the array as encoding the decoded Ints writes it:
// compact, -0 as 0, a null element as 0. So a type that copies it into JSON
// of its own writes the bytes that decoding and encoding again would have
// written. A restore installs every ledger row of a checkpoint this way:
// decoding the token arrays into slices only to encode them again was most
// of its CPU and of its garbage.
//
// The zero value is null. Only UnmarshalJSON, CutIntsJSON and IntsJSONOf
// make another, so a value holds one valid array.
type IntsJSON struct {
	raw []byte // nil for null
	n   int
}

// FloatsJSON is a JSON array of numbers (log-probabilities) kept as its
// encoding, as IntsJSON keeps integers: it accepts what Floats accepts and
// holds each number as encoding its float64 writes it.
type FloatsJSON struct {
	raw []byte // nil for null
	n   int
}

// IntsJSONOf encodes v; nil is null.
func IntsJSONOf(v []int) IntsJSON {
	if v == nil {
		return IntsJSON{}
	}
	return IntsJSON{raw: AppendInts(nil, v), n: len(v)}
}

// FloatsJSONOf encodes v; nil is null, NaN and infinities are an error.
func FloatsJSONOf(v []float64) (FloatsJSON, error) {
	if v == nil {
		return FloatsJSON{}, nil
	}
	raw, err := AppendFloats(nil, v)
	if err != nil {
		return FloatsJSON{}, err
	}
	return FloatsJSON{raw: raw, n: len(v)}, nil
}

// Len is the number of elements (0 for null).
func (v IntsJSON) Len() int { return v.n }

// Len is the number of elements (0 for null).
func (v FloatsJSON) Len() int { return v.n }

// IsNull reports whether v is null.
func (v IntsJSON) IsNull() bool { return v.raw == nil }

// IsNull reports whether v is null.
func (v FloatsJSON) IsNull() bool { return v.raw == nil }

// MarshalJSON writes the array, or null.
func (v IntsJSON) MarshalJSON() ([]byte, error) { return orNull(v.raw), nil }

// MarshalJSON writes the array, or null.
func (v FloatsJSON) MarshalJSON() ([]byte, error) { return orNull(v.raw), nil }

func orNull(raw []byte) []byte {
	if raw == nil {
		return []byte("null")
	}
	return raw
}

// AppendIntsJSON appends v as AppendInts appends the decoded array ([] for
// null).
func AppendIntsJSON(dst []byte, v IntsJSON) []byte { return appendArray(dst, v.raw) }

// AppendFloatsJSON appends v as AppendFloats appends the decoded array ([]
// for null).
func AppendFloatsJSON(dst []byte, v FloatsJSON) []byte { return appendArray(dst, v.raw) }

func appendArray(dst, raw []byte) []byte {
	if raw == nil {
		return append(dst, "[]"...)
	}
	return append(dst, raw...)
}

// Ints decodes v (nil for null).
func (v IntsJSON) Ints() (Ints, error) {
	if v.raw == nil {
		return nil, nil
	}
	var out Ints
	err := out.UnmarshalJSON(v.raw)
	return out, err
}

// Floats decodes v (nil for null).
func (v FloatsJSON) Floats() (Floats, error) {
	if v.raw == nil {
		return nil, nil
	}
	var out Floats
	err := out.UnmarshalJSON(v.raw)
	return out, err
}

// UnmarshalJSON validates b as Ints.UnmarshalJSON does and keeps a copy of
// it, rewritten only where encoding the decoded array would differ.
func (v *IntsJSON) UnmarshalJSON(b []byte) error {
	if n, ok := compactInts(b); ok {
		*v = IntsJSON{raw: bytes.Clone(b), n: n}
		return nil
	}
	var scan arrayScan
	err := decodeNumbers(b, nil, func(tok []byte) error {
		if _, err := parseInt(tok); err != nil {
			return err
		}
		// -0 is the one integer whose encoding is not its token.
		scan.add(tok, len(tok) != 2 || tok[0] != '-' || tok[1] != '0')
		return nil
	}, scan.setNull)
	if err != nil {
		return err
	}
	raw, err := scan.keep(b, func(dst, tok []byte) ([]byte, error) {
		n, err := parseInt(tok)
		return strconv.AppendInt(dst, int64(n), 10), err
	})
	if err != nil {
		return err
	}
	*v = IntsJSON{raw: raw, n: scan.n}
	return nil
}

// UnmarshalJSON validates b as Floats.UnmarshalJSON does and keeps a copy
// of it, rewritten only where encoding the decoded array would differ.
func (v *FloatsJSON) UnmarshalJSON(b []byte) error {
	if n, ok := compactFloats(b); ok {
		*v = FloatsJSON{raw: bytes.Clone(b), n: n}
		return nil
	}
	var scan arrayScan
	var encoded [32]byte
	err := decodeNumbers(b, nil, func(tok []byte) error {
		if isShortestFloat(tok) {
			scan.add(tok, true)
			return nil
		}
		f, err := parseFloat(tok)
		if err != nil {
			return err
		}
		scan.add(tok, bytes.Equal(appendFloat64(encoded[:0], f), tok))
		return nil
	}, scan.setNull)
	if err != nil {
		return err
	}
	raw, err := scan.keep(b, func(dst, tok []byte) ([]byte, error) {
		if isShortestFloat(tok) {
			return append(dst, tok...), nil
		}
		f, err := parseFloat(tok)
		return appendFloat64(dst, f), err
	})
	if err != nil {
		return err
	}
	*v = FloatsJSON{raw: raw, n: scan.n}
	return nil
}

// appendFloat64 appends finite f as Marshal writes a float64: with goccy's
// own formatter, so a kept array is, by construction, what Marshal writes
// for the decoded one (AppendFloat writes the same bytes, more slowly).
func appendFloat64(dst []byte, f float64) []byte { return jsontext.AppendFloat(dst, f, 64) }

// intDigits is how many digits an integer may have and surely fit an int.
const intDigits = strconv.IntSize*3/10 - 1

// compactInts is the common case of IntsJSON.UnmarshalJSON, as the ledger
// writes arrays, in one tight loop: b is an array of integers, with no
// whitespace, no null, no -0, none of more than intDigits digits. ok is
// false for anything else, valid or not: the general scan decides.
func compactInts(b []byte) (n int, ok bool) {
	if len(b) < 2 || b[0] != '[' {
		return 0, false
	}
	if b[1] == ']' {
		return 0, len(b) == 2
	}
	for i := 1; ; {
		neg := i < len(b) && b[i] == '-'
		if neg {
			i++
		}
		start := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		switch digits := i - start; {
		case digits == 0 || digits > intDigits:
			return 0, false
		case b[start] == '0' && (digits > 1 || neg):
			return 0, false
		}
		n++
		if i >= len(b) {
			return 0, false
		}
		switch b[i] {
		case ',':
			i++
		case ']':
			return n, i == len(b)-1
		default:
			return 0, false
		}
	}
}

// compactFloats is compactInts for FloatsJSON: b is an array of numbers
// with no whitespace and no null, each written as AppendFloat writes its
// float64.
func compactFloats(b []byte) (n int, ok bool) {
	if len(b) < 2 || b[0] != '[' {
		return 0, false
	}
	if b[1] == ']' {
		return 0, len(b) == 2
	}
	var encoded [32]byte
	for i := 1; ; {
		end := scanNumber(b, i)
		if end == i {
			return 0, false
		}
		if tok := b[i:end]; !isShortestFloat(tok) {
			// More than 15 significant digits (a float32 written as a
			// float64 has up to 17) or an unusual form: parse it and
			// compare it with its encoding.
			f, err := parseFloat(tok)
			if err != nil {
				return 0, false
			}
			if !bytes.Equal(appendFloat64(encoded[:0], f), tok) {
				return 0, false
			}
		}
		n++
		if end >= len(b) {
			return 0, false
		}
		switch b[end] {
		case ',':
			i = end + 1
		case ']':
			return n, end == len(b)-1
		default:
			return 0, false
		}
	}
}

// arrayScan is what a validating scan of an array of numbers learns: null,
// how many numbers, how many bytes their tokens take, and whether every
// token is already written as encoding its number writes it.
type arrayScan struct {
	null     bool
	n        int
	tokBytes int
	rewrite  bool
}

func (s *arrayScan) setNull() { s.null = true }

func (s *arrayScan) add(tok []byte, asEncoded bool) {
	s.n++
	s.tokBytes += len(tok)
	s.rewrite = s.rewrite || !asEncoded
}

// keep returns what an array value holds for the scanned b: nil for null;
// a copy of b when it is the compact array of tokens written as encoded
// (a null element, given as "0", or any whitespace makes b longer than
// that); else the array rebuilt from each token through encode.
func (s *arrayScan) keep(b []byte, encode func(dst, tok []byte) ([]byte, error)) ([]byte, error) {
	if s.null {
		return nil, nil
	}
	compact := 2 + s.tokBytes + max(s.n-1, 0)
	if !s.rewrite && len(b) == compact {
		return bytes.Clone(b), nil
	}
	out := make([]byte, 0, compact+8)
	out = append(out, '[')
	err := decodeNumbers(b, nil, func(tok []byte) error {
		if len(out) > 1 {
			out = append(out, ',')
		}
		var err error
		out, err = encode(out, tok)
		return err
	}, func() {})
	if err != nil {
		return nil, err
	}
	return append(out, ']'), nil
}

// isShortestFloat reports that tok, a JSON number token, is already what
// AppendFloat writes for the float64 it denotes, when its digits tell: it
// has at most 15 significant digits (any two decimals of 15 digits or fewer
// round to different float64s, so its digits are the float's shortest),
// is a normal float64 far from overflow, and has the form AppendFloat gives
// a number of its size. False means only that it takes parsing to know.
func isShortestFloat(tok []byte) bool {
	const maxDigits = 15
	i := 0
	if tok[0] == '-' {
		i++
	}
	start := i
	for i < len(tok) && '0' <= tok[i] && tok[i] <= '9' {
		i++
	}
	whole := tok[start:i]
	var frac []byte
	if i < len(tok) && tok[i] == '.' {
		j := i + 1
		for j < len(tok) && '0' <= tok[j] && tok[j] <= '9' {
			j++
		}
		frac, i = tok[i+1:j], j
		if len(frac) == 0 || frac[len(frac)-1] == '0' {
			return false
		}
	}
	if i == len(tok) {
		// Written without an exponent from 1e-6 up to 1e21.
		if len(whole) == 1 && whole[0] == '0' {
			if frac == nil {
				return true // 0 or -0
			}
			zeros := 0
			for zeros < len(frac) && frac[zeros] == '0' {
				zeros++
			}
			return zeros <= 5 && len(frac)-zeros <= maxDigits
		}
		if len(whole) > 21 {
			return false
		}
		if frac == nil {
			return len(bytes.TrimRight(whole, "0")) <= maxDigits
		}
		return len(whole)+len(frac) <= maxDigits
	}
	// Below 1e-6 and from 1e21: d[.ddd]e-X (X from 7) or d[.ddd]e+X (X
	// from 21), X without leading zeros; up to e±300 is far from overflow
	// and from the subnormals.
	if len(whole) != 1 || whole[0] == '0' || 1+len(frac) > maxDigits || tok[i] != 'e' || i+2 >= len(tok) {
		return false
	}
	sign, exp := tok[i+1], tok[i+2:]
	if exp[0] == '0' || len(exp) > 3 {
		return false
	}
	x := 0
	for _, c := range exp {
		if c < '0' || c > '9' {
			return false
		}
		x = x*10 + int(c-'0')
	}
	switch sign {
	case '+':
		return x >= 21 && x <= 300
	case '-':
		return x >= 7 && x <= 300
	}
	return false
}
