package gencut

import (
	"math"
	"strconv"
	"strings"
	"testing"
)

// appendPyStringByRune is appendPyString as it was written before its
// ASCII fast path, a rune at a time: the fast path's oracle.
func appendPyStringByRune(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	u := func(b []byte, r rune) []byte {
		return append(b, '\\', 'u', hexDigits[r>>12&0xf], hexDigits[r>>8&0xf], hexDigits[r>>4&0xf], hexDigits[r&0xf])
	}
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b = append(b, '\\', byte(r))
		case r == '\n':
			b = append(b, `\n`...)
		case r == '\r':
			b = append(b, `\r`...)
		case r == '\t':
			b = append(b, `\t`...)
		case r == '\b':
			b = append(b, `\b`...)
		case r == '\f':
			b = append(b, `\f`...)
		case r < 0x20 || (r > 0x7e && r <= 0xffff):
			b = u(b, r)
		case r > 0xffff:
			r -= 0x10000
			b = u(u(b, 0xd800+(r>>10)), 0xdc00+(r&0x3ff))
		default:
			b = append(b, byte(r))
		}
	}
	return append(b, '"')
}

// FuzzAppendPyString: the fast path writes every string as the rune loop
// did (printable ASCII, escapes, DEL, non-ASCII, astral characters,
// invalid and truncated UTF-8), after whatever the buffer held.
func FuzzAppendPyString(f *testing.F) {
	for _, s := range []string{
		"", "0123456789abcdef0123456789abcdef", "w000001", `q"b\s`, "\x00\x01\x1f\x7f\t\n\r\b\f", "<a&b>~ ",
		"é\u2028\uffff\U0001F600\U0010FFFF", "\xff\xc3", "ab\xe2\x80", "\xed\xa0\x80", "mixed é and \"quotes\" and \x7f",
	} {
		f.Add(s, "prefix")
	}
	f.Fuzz(func(t *testing.T, s, before string) {
		got := appendPyString([]byte(before), s)
		want := appendPyStringByRune([]byte(before), s)
		if string(got) != string(want) {
			t.Fatalf("appendPyString(%q) = %s, the rune loop wrote %s", s, got, want)
		}
	})
}

// BenchmarkAppendPyString: an inventory's strings, nearly all printable
// ASCII ids.
func BenchmarkAppendPyString(b *testing.B) {
	for _, s := range []struct{ name, s string }{
		{"call id", "0123456789abcdef0123456789abcdef"},
		{"non-ASCII", "pol\u00e9\U0001F600-model"},
	} {
		b.Run(s.name, func(b *testing.B) {
			buf := make([]byte, 0, 256)
			b.SetBytes(int64(len(s.s)))
			for b.Loop() {
				buf = appendPyString(buf[:0], s.s)
			}
		})
	}
}

// appendPyFloatByStrings is appendPyFloat as it was written before it
// stopped allocating, through strings: its oracle.
func appendPyFloatByStrings(b []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(b, "NaN"...)
	case math.IsInf(f, 1):
		return append(b, "Infinity"...)
	case math.IsInf(f, -1):
		return append(b, "-Infinity"...)
	case f == 0:
		if math.Signbit(f) {
			return append(b, "-0.0"...)
		}
		return append(b, "0.0"...)
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // [-]d[.ddd]e±XX
	mant, exps, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(exps)
	neg := strings.HasPrefix(mant, "-")
	digits := strings.Replace(strings.TrimPrefix(mant, "-"), ".", "", 1)
	if neg {
		b = append(b, '-')
	}
	if exp < -4 || exp >= 16 {
		b = append(b, digits[0])
		if len(digits) > 1 {
			b = append(b, '.')
			b = append(b, digits[1:]...)
		}
		b = append(b, 'e')
		if exp < 0 {
			b, exp = append(b, '-'), -exp
		} else {
			b = append(b, '+')
		}
		if exp < 10 {
			b = append(b, '0')
		}
		return strconv.AppendInt(b, int64(exp), 10)
	}
	if exp < 0 {
		b = append(b, "0."...)
		b = append(b, strings.Repeat("0", -exp-1)...)
		return append(b, digits...)
	}
	if len(digits) <= exp+1 {
		b = append(b, digits...)
		b = append(b, strings.Repeat("0", exp+1-len(digits))...)
		return append(b, ".0"...)
	}
	b = append(b, digits[:exp+1]...)
	b = append(b, '.')
	return append(b, digits[exp+1:]...)
}

// TestAppendPyFloat: floats as Python's repr writes them (json.dumps of
// these values, run in a session), at the edges of fixed notation and of
// the float64 range.
func TestAppendPyFloat(t *testing.T) {
	for f, want := range map[float64]string{
		5e-324: "5e-324", 2.2250738585072014e-308: "2.2250738585072014e-308", math.MaxFloat64: "1.7976931348623157e+308",
		0.1: "0.1", 100: "100.0", 1e-05: "1e-05", 0.0001: "0.0001", 0.00012345678901234567: "0.00012345678901234567",
		1e16: "1e+16", 9999999999999998: "9999999999999998.0", 12345678901234567890: "1.2345678901234567e+19", 1e22: "1e+22",
		-1.5e-7: "-1.5e-07", 1765000000.123456: "1765000000.123456", 123.456e5: "12345600.0", -0.5: "-0.5",
		1e15: "1000000000000000.0", 123456789012345678: "1.2345678901234568e+17", math.Copysign(0, -1): "-0.0", 0: "0.0",
		math.Inf(1): "Infinity", math.Inf(-1): "-Infinity", math.NaN(): "NaN",
	} {
		if got := string(appendPyFloat(nil, f)); got != want {
			t.Errorf("appendPyFloat(%v) = %s, Python's %s", f, got, want)
		}
	}
}

// FuzzAppendPyFloat: appendPyFloat writes every float as the string
// version did, after whatever the buffer held.
func FuzzAppendPyFloat(f *testing.F) {
	for _, v := range []float64{0, 1, -1, 0.1, 1e16, 1e-5, 1e-4, 9.999e15, 5e-324, math.MaxFloat64, 1765000000.123456, math.Inf(1)} {
		f.Add(v, "x")
	}
	f.Fuzz(func(t *testing.T, v float64, before string) {
		if got, want := appendPyFloat([]byte(before), v), appendPyFloatByStrings([]byte(before), v); string(got) != string(want) {
			t.Fatalf("appendPyFloat(%v) = %s, the string version wrote %s", v, got, want)
		}
	})
}
