// Package backoff is the one retry pause of the fleet: exponential, capped,
// optionally spread by jitter. Each retry loop (a request resent because no
// connection carried it, a late cleanup step, a row refused while an outside
// checkpoint held admission, a GET retried by retryablehttp) keeps its own
// reasons to retry and its bound on retries; this package only says how
// long to wait before the next one.
package backoff

import (
	"math"
	"math/rand/v2"
	"time"
)

// Policy is an exponential backoff: the pause before retry n (n >= 1) is
// Initial doubled n-1 times, at most Max.
type Policy struct {
	// Initial is the pause before the first retry; it must be positive.
	Initial time.Duration
	// Max caps every pause; 0 means no cap (short of overflow).
	Max time.Duration
	// Jitter spreads each pause Wait returns uniformly over ±Jitter of it
	// (0.2: ±20%), so retries of calls that failed together do not come
	// back together. 0 means none; it must be below 1.
	Jitter float64
}

// Delay is the pause before retry n (n >= 1; below 1 counts as 1), without
// jitter.
func (p Policy) Delay(n int) time.Duration {
	d := p.Initial
	for i := 1; i < n; i++ {
		if p.Max > 0 && d >= p.Max {
			break
		}
		if d > math.MaxInt64/2 {
			break // doubling again would overflow
		}
		d *= 2
	}
	if p.Max > 0 && d > p.Max {
		d = p.Max
	}
	return d
}

// Wait is Delay(n) spread by the policy's jitter.
func (p Policy) Wait(n int) time.Duration { return Spread(p.Delay(n), p.Jitter) }

// Spread returns d moved uniformly at random within ±frac of itself.
func Spread(d time.Duration, frac float64) time.Duration {
	if frac <= 0 {
		return d
	}
	return d + time.Duration((rand.Float64()*2*frac-frac)*float64(d))
}
