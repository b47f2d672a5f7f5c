package gencut

import (
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
