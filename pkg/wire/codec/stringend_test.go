package codec

import (
	"strings"
	"testing"
)

// stringEndEachByte is stringEnd as it was, a byte at a time: the oracle
// FuzzStringEnd holds stringEnd to.
func stringEndEachByte(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '"':
			return i + 1
		case '\\':
			i++
		}
	}
	return -1
}

// FuzzStringEnd: for any bytes after an opening quote, stringEnd finds the
// same end as the byte-at-a-time scan (or none where it finds none).
func FuzzStringEnd(f *testing.F) {
	for _, s := range []string{
		`"`, `a"`, `\"`, `\\"`, `\\\"`, `\\\\"x`, `\"\\"`, `\`, `\\`, `ab\"cd"ef"`,
		`\u0022"`, `é\"\\\""`, strings.Repeat(`\\`, 40) + `"`, strings.Repeat("x", 300) + `\"` + `"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, rest []byte) {
		for _, lead := range []string{``, `{"k":`, `\\`} {
			b := append([]byte(lead+`"`), rest...)
			i := len(lead)
			if got, want := stringEnd(b, i), stringEndEachByte(b, i); got != want {
				t.Fatalf("stringEnd(%q, %d) = %d, want %d", b, i, got, want)
			}
		}
	})
}

// BenchmarkStringEnd: a record's text, a long string with a few escapes,
// quote to quote and a byte at a time.
func BenchmarkStringEnd(b *testing.B) {
	text := []byte(`"` + strings.Repeat(`The weather in Paris is mild today, 14 degrees and \"cloudy\".\n`, 40) + `",`)
	for _, scan := range []struct {
		name string
		end  func([]byte, int) int
	}{{"quotes", stringEnd}, {"bytes", stringEndEachByte}} {
		b.Run(scan.name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				if scan.end(text, 0) != len(text)-1 {
					b.Fatal("wrong end")
				}
			}
		})
	}
}
