package fleet_test

import (
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
)

// A port block hands out each port once until it wraps, skips ports that
// something listens on, and says so when it has too few left.
func TestPortBlock_TakesInTurnAndSkipsBusy(t *testing.T) {
	const lo, hi = 14100, 14140 // below the ephemeral range, apart from e2e's blocks
	busy, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", lo+1))
	if err != nil {
		t.Skipf("port %d is taken on this machine: %v", lo+1, err)
	}
	defer busy.Close()

	b, err := fleet.ParsePortBlock(fmt.Sprintf("%d-%d", lo, hi-1))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for range 3 {
		ports, err := b.Take(10)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ports {
			if p < lo || p >= hi || seen[p] || p == lo+1 {
				t.Fatalf("port %d: outside [%d, %d), repeated or busy (seen %v)", p, lo, hi, seen)
			}
			seen[p] = true
		}
	}
	// 30 taken, 9 free left before the block wraps onto the first ones.
	if _, err := b.Take(9); err != nil {
		t.Fatal(err)
	}
	ports, err := b.Take(1)
	if err != nil || ports[0] != lo {
		t.Fatalf("after wrapping: %v, %v; want [%d]", ports, err, lo)
	}
	if _, err := b.Take(hi - lo); !errors.Is(err, fleet.ErrPortBlockFull) {
		t.Fatalf("Take(whole block with one busy) = %v, want ErrPortBlockFull", err)
	}
}

func TestParsePortBlock_Refuses(t *testing.T) {
	for _, s := range []string{"", "20000", "2-1", "0-10", "20000-70000", "a-b"} {
		if _, err := fleet.ParsePortBlock(s); err == nil {
			t.Errorf("ParsePortBlock(%q) = nil error", s)
		}
	}
}
