package httpbody_test

import (
	"errors"
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
		}
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
