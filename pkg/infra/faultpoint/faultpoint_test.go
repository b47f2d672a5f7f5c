package faultpoint_test

import (
	"regexp"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/infra/faultpoint"
)

// TestAll_NamesAreStableAndUnique checks every point is listed once under
// a <package>.<step> name: the sweep and the documentation list them by it.
func TestAll_NamesAreStableAndUnique(t *testing.T) {
	name := regexp.MustCompile(`^[a-z]+\.[a-z]+(-[a-z]+)*$`)
	seen := map[faultpoint.Point]bool{}
	for _, p := range faultpoint.All() {
		if !name.MatchString(string(p)) {
			t.Errorf("point %q is not <package>.<step>", p)
		}
		if seen[p] {
			t.Errorf("point %q is listed twice", p)
		}
		seen[p] = true
	}
	if len(seen) == 0 {
		t.Fatal("no points")
	}
}

// TestAfterFirst_PassesCallsAndErrorsThrough checks the wrapper changes
// nothing but the hit (which no test here arms).
func TestAfterFirst_PassesCallsAndErrorsThrough(t *testing.T) {
	var got []int
	fn := faultpoint.AfterFirst(faultpoint.AgentExportPartial, func(v int) error {
		got = append(got, v)
		return nil
	})
	for i := range 3 {
		if err := fn(i); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 3 || got[2] != 2 {
		t.Fatalf("calls %v, want [0 1 2]", got)
	}
}
