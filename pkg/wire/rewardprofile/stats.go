package rewardprofile

import (
	"math"
	"math/big"
	"sort"
)

// The numerical routines below reproduce, to the bit where the library
// defines the rounding, what Gym's profiler calls: numpy's sum and
// percentile (pandas), Python's statistics module (perf_summary) and
// scipy's Student t quantile (confidence intervals).

// seriesStats are pandas' reductions of a Series without missing values:
// mean, median, std with ddof=1 (0 for one value, as Gym sets it), min, max
// and the 25th and 75th percentiles.
type seriesStats struct {
	n                                int
	mean, median, std, min, max, p25 float64
	p75                              float64
}

func describeSeries(vals []float64) seriesStats {
	s := seriesStats{n: len(vals)}
	if s.n == 0 {
		return s
	}
	s.mean = numpySum(vals) / float64(s.n)
	sorted := append([]float64(nil), vals...)
	sort.Float64s(sorted)
	s.min, s.max = sorted[0], sorted[s.n-1]
	if s.n%2 == 1 {
		s.median = sorted[s.n/2]
	} else {
		s.median = (sorted[s.n/2-1] + sorted[s.n/2]) / 2
	}
	if s.n > 1 {
		sq := make([]float64, s.n)
		for i, v := range vals {
			d := s.mean - v
			sq[i] = d * d
		}
		s.std = math.Sqrt(numpySum(sq) / float64(s.n-1))
	}
	s.p25 = numpyQuantile(sorted, 0.25)
	s.p75 = numpyQuantile(sorted, 0.75)
	return s
}

// numpyQuantile is numpy.percentile's default (linear) method over sorted
// values, with numpy's _lerp: a + (b-a)*t, or b - (b-a)*(1-t) for t >= 0.5.
func numpyQuantile(sorted []float64, q float64) float64 {
	n := len(sorted)
	h := float64(n-1) * q
	lo := math.Floor(h)
	t := h - lo
	i := int(lo)
	j := min(i+1, n-1)
	a, b := sorted[i], sorted[j]
	d := b - a
	if t >= 0.5 {
		return b - d*(1-t)
	}
	return a + d*t
}

// fsum is Python's math.fsum: the correctly rounded sum (Shewchuk's
// partials, as CPython's msum).
func fsum(vals []float64) float64 {
	var partials []float64
	for _, x := range vals {
		i := 0
		for _, y := range partials {
			if math.Abs(x) < math.Abs(y) {
				x, y = y, x
			}
			hi := x + y
			lo := y - (hi - x)
			if lo != 0 {
				partials[i] = lo
				i++
			}
			x = hi
		}
		partials = partials[:i]
		if x != 0 {
			partials = append(partials, x)
		}
	}
	// Sum the partials from the top, correcting the last rounding as
	// CPython does (half-way cases).
	n := len(partials)
	if n == 0 {
		return 0
	}
	hi := partials[n-1]
	lo := 0.0
	for n--; n > 0; {
		x := hi
		n--
		y := partials[n]
		hi = x + y
		yr := hi - x
		lo = y - yr
		if lo != 0 {
			break
		}
	}
	if n > 0 && ((lo < 0 && partials[n-1] < 0) || (lo > 0 && partials[n-1] > 0)) {
		y := lo * 2
		x := hi + y
		yr := x - hi
		if y == yr {
			hi = x
		}
	}
	return hi
}

// pstdev is Python's statistics.pstdev of floats: the exact population
// variance as a fraction, then its square root rounded once.
func pstdev(vals []float64) float64 {
	n := int64(len(vals))
	sum := new(big.Rat)
	for _, v := range vals {
		sum.Add(sum, new(big.Rat).SetFloat64(v))
	}
	mean := new(big.Rat).Quo(sum, big.NewRat(n, 1))
	ss := new(big.Rat)
	for _, v := range vals {
		d := new(big.Rat).Sub(new(big.Rat).SetFloat64(v), mean)
		ss.Add(ss, d.Mul(d, d))
	}
	variance := ss.Quo(ss, big.NewRat(n, 1))
	f := new(big.Float).SetPrec(256).SetRat(variance)
	f.Sqrt(f)
	out, _ := f.Float64()
	return out
}

// studentTQuantile is the p quantile (p > 0.5) of Student's t distribution
// with df degrees of freedom, as scipy.stats.t.ppf gives it: found by
// bisection on the distribution function, which is the regularized
// incomplete beta function.
func studentTQuantile(p, df float64) float64 {
	// 1 - F(t) = I_{df/(df+t²)}(df/2, 1/2) / 2 for t > 0.
	tail := func(t float64) float64 { return regIncBeta(df/(df+t*t), df/2, 0.5) / 2 }
	want := 1 - p
	lo, hi := 0.0, 1.0
	for tail(hi) > want {
		hi *= 2
	}
	for range 200 {
		mid := lo + (hi-lo)/2
		if mid == lo || mid == hi {
			break
		}
		if tail(mid) > want {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo + (hi-lo)/2
}

// regIncBeta is the regularized incomplete beta function I_x(a, b), by its
// continued fraction (modified Lentz).
func regIncBeta(x, a, b float64) float64 {
	if x <= 0 {
		return 0
	}
	if x >= 1 {
		return 1
	}
	la, _ := math.Lgamma(a)
	lb, _ := math.Lgamma(b)
	lab, _ := math.Lgamma(a + b)
	front := math.Exp(lab - la - lb + a*math.Log(x) + b*math.Log1p(-x))
	if x > (a+1)/(a+b+2) {
		return 1 - front*betaCF(1-x, b, a)/b
	}
	return front * betaCF(x, a, b) / a
}

func betaCF(x, a, b float64) float64 {
	const tiny = 1e-300
	c, d := 1.0, 1-(a+b)*x/(a+1)
	if math.Abs(d) < tiny {
		d = tiny
	}
	d = 1 / d
	h := d
	for m := 1; m < 10000; m++ {
		fm := float64(m)
		num := fm * (b - fm) * x / ((a + 2*fm - 1) * (a + 2*fm))
		d = 1 + num*d
		if math.Abs(d) < tiny {
			d = tiny
		}
		c = 1 + num/c
		if math.Abs(c) < tiny {
			c = tiny
		}
		d = 1 / d
		h *= d * c
		num = -(a + fm) * (a + b + fm) * x / ((a + 2*fm) * (a + 2*fm + 1))
		d = 1 + num*d
		if math.Abs(d) < tiny {
			d = tiny
		}
		c = 1 + num/c
		if math.Abs(c) < tiny {
			c = tiny
		}
		d = 1 / d
		del := d * c
		h *= del
		if math.Abs(del-1) < 1e-16 {
			break
		}
	}
	return h
}

// tQuantiles memoizes the 97.5% t quantile by sample size: one profile
// asks for few sizes, many times.
type tQuantiles map[int]float64

// confidenceInterval is RewardProfiler._confidence_interval: the 95% t
// interval around mean (scipy's t.interval: loc + scale*ppf), a point when
// sem is 0, none for one value.
func (tq tQuantiles) confidenceInterval(mean, sem float64, n int) (lo, hi float64, ok bool) {
	if n <= 1 {
		return 0, 0, false
	}
	if sem == 0 {
		return mean, mean, true
	}
	q, ok := tq[n]
	if !ok {
		q = studentTQuantile(0.975, float64(n-1))
		tq[n] = q
	}
	return -q*sem + mean, q*sem + mean, true
}
