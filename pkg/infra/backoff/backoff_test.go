package backoff_test

import (
	"math"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/infra/backoff"
)

func TestDelay_DoublesUpToTheCap(t *testing.T) {
	p := backoff.Policy{Initial: time.Second, Max: 30 * time.Second}
	want := []time.Duration{1, 2, 4, 8, 16, 30, 30}
	for i, w := range want {
		if got := p.Delay(i + 1); got != w*time.Second {
			t.Errorf("Delay(%d) = %v, want %v", i+1, got, w*time.Second)
		}
	}
	if got := p.Delay(0); got != time.Second {
		t.Errorf("Delay(0) = %v, want the first pause", got)
	}
	if got := p.Delay(math.MaxInt); got != 30*time.Second {
		t.Errorf("Delay(MaxInt) = %v, want the cap", got)
	}
}

func TestDelay_UncappedStopsShortOfOverflow(t *testing.T) {
	p := backoff.Policy{Initial: time.Millisecond}
	if got := p.Delay(4); got != 8*time.Millisecond {
		t.Errorf("Delay(4) = %v, want 8ms", got)
	}
	if got := p.Delay(1000); got <= 0 || got < p.Delay(40) {
		t.Errorf("Delay(1000) = %v: overflowed or shrank", got)
	}
}

func TestWait_SpreadsWithinTheJitter(t *testing.T) {
	p := backoff.Policy{Initial: 10 * time.Second, Jitter: 0.2}
	lo, hi := time.Duration(math.MaxInt64), time.Duration(0)
	for range 2000 {
		d := p.Wait(1)
		if d < 8*time.Second || d > 12*time.Second {
			t.Fatalf("Wait(1) = %v, outside 10s ±20%%", d)
		}
		lo, hi = min(lo, d), max(hi, d)
	}
	// 2,000 uniform draws cover most of the range: a spread that does not
	// spread fails here.
	if hi-lo < 3*time.Second {
		t.Errorf("2000 waits spanned only %v..%v", lo, hi)
	}
	if got := (backoff.Policy{Initial: time.Second}).Wait(3); got != 4*time.Second {
		t.Errorf("without jitter Wait(3) = %v, want 4s", got)
	}
}

func TestSpread_ZeroFractionIsExact(t *testing.T) {
	if got := backoff.Spread(time.Second, 0); got != time.Second {
		t.Errorf("Spread(1s, 0) = %v", got)
	}
}
