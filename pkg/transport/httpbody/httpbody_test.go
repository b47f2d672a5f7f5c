package httpbody_test

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/gymfleet/gymfleet/pkg/transport/httpbody"
)

// A body is read whole whatever length its sender declared, into one
// allocation of that length when it is honest and within presizeMax, and
// never into more than presizeMax before its bytes arrive.
func TestRead(t *testing.T) {
	const presizeMax = 1 << 20
	body := func(n int) string { return strings.Repeat("b", n) }
	for _, tc := range []struct {
		name     string
		body     string
		declared int64
	}{
		{"honest", body(600_000), 600_000},
		{"none declared", body(600_000), -1},
		{"empty", "", 0},
		{"longer than declared", body(5000), 10},
		{"shorter than declared", body(10), 5000},
		{"past the presized megabyte", body(4<<20 + 3), 4<<20 + 3},
		{"declared far past what is sent", body(3), 1 << 40},
		{"declared 4 times what is sent", body(4<<20 + 1), 16 << 20},
		{"declared 16 times what is sent", body(1<<20 + 1), 16 << 20},
		{"past the megabyte, none declared", body(3<<20 + 5), -1},
	} {
		for _, rd := range []struct {
			name string
			r    func(string) io.Reader
		}{
			{"whole", func(s string) io.Reader { return strings.NewReader(s) }},
			{"a byte a read", func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) }},
		} {
			if rd.name != "whole" && len(tc.body) > 1<<20 {
				continue
			}
			got, err := httpbody.Read(rd.r(tc.body), tc.declared, presizeMax)
			if err != nil || string(got) != tc.body {
				t.Errorf("%s, %s: read %d bytes, %v; want the %d sent", tc.name, rd.name, len(got), err, len(tc.body))
			}
			if tc.declared == int64(len(tc.body)) && tc.declared <= presizeMax && cap(got) != len(tc.body)+1 {
				t.Errorf("%s, %s: a buffer of %d bytes for a body of %d declared", tc.name, rd.name, cap(got), len(tc.body))
			}
			if tc.declared > 1<<30 && cap(got) > presizeMax+1 {
				t.Errorf("%s, %s: %d bytes allocated for a body that sent %d", tc.name, rd.name, cap(got), len(tc.body))
			}
			// Whatever it declared, a sender makes the reader hold at most
			// eight times what it sent (twice, without a declared length).
			if bound := max(presizeMax+1, 8*len(tc.body)+1); tc.declared >= 0 && cap(got) > bound || tc.declared < 0 && cap(got) > max(512, 2*len(tc.body)) {
				t.Errorf("%s, %s: %d bytes allocated for a body that sent %d", tc.name, rd.name, cap(got), len(tc.body))
			}
		}
	}
}

// An honest body past presizeMax is read into few buffers: doubling from
// presizeMax until an eighth of it has arrived, then one of its length.
func TestRead_GrowsToTheDeclaredLength(t *testing.T) {
	const presizeMax, n = 1 << 20, 40 << 20
	body := strings.Repeat("b", n)
	var got []byte
	r := strings.NewReader(body)
	allocs := testing.AllocsPerRun(3, func() {
		r.Reset(body)
		var err error
		if got, err = httpbody.Read(r, n, presizeMax); err != nil {
			t.Fatal(err)
		}
	})
	// 1, 2, 4 and 8 MiB, then 40 MiB and a byte.
	if allocs > 5 || cap(got) != n+1 || string(got) != body {
		t.Fatalf("%v allocations, a buffer of %d bytes, %d read; want 5, %d, %d", allocs, cap(got), len(got), n+1, n)
	}
}

// A read error ends the read with the bytes read so far and the error.
func TestRead_Error(t *testing.T) {
	boom := errors.New("connection reset")
	got, err := httpbody.Read(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(boom)), 10, 1<<20)
	if !errors.Is(err, boom) || string(got) != "abc" {
		t.Fatalf("Read = %q, %v; want \"abc\", %v", got, err, boom)
	}
}

// BenchmarkRead: a generation-cut receipt of 100,000 calls (about 65 MB)
// read in the 16 KiB pieces HTTP/2 delivers, with its length declared and
// without.
func BenchmarkRead(b *testing.B) {
	const presizeMax, n = 1 << 20, 65_000_000
	body := strings.Repeat("b", n)
	for _, declared := range []int64{n, -1} {
		b.Run(fmt.Sprintf("declared=%d", declared), func(b *testing.B) {
			b.SetBytes(n)
			r := strings.NewReader(body)
			for b.Loop() {
				r.Reset(body)
				if got, err := httpbody.Read(pieces{r}, declared, presizeMax); err != nil || len(got) != n {
					b.Fatal(len(got), err)
				}
			}
		})
	}
}

// pieces reads at most 16 KiB at a time, as a reply body hands over
// HTTP/2 DATA frames.
type pieces struct{ r io.Reader }

func (p pieces) Read(b []byte) (int, error) { return p.r.Read(b[:min(len(b), 16<<10)]) }
