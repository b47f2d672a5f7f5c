package rewardprofile

import "sort"

// num is a number as Python keeps it: an int or a float.
type num struct {
	isInt bool
	i     int64
	f     float64
}

func (n num) float() float64 {
	if n.isInt {
		return float64(n.i)
	}
	return n.f
}

func (n num) out() any {
	if n.isInt {
		return n.i
	}
	return n.f
}

// perfSummary is compute_perf_summary over every reply's ng_perf object:
// nil (null) when none carries one. Its statistics are Python's
// (statistics.fmean, median, pstdev, sum, min, max) and pandas' quantile.
func perfSummary(all []reply) *outObj {
	var records []*obj
	for _, r := range all {
		if r.perf != nil {
			records = append(records, r.perf)
		}
	}
	if len(records) == 0 {
		return nil
	}
	total := float64(len(all))
	values := func(key string) []num {
		var out []num
		for _, rec := range records {
			v, ok := rec.vals[key]
			if !ok {
				continue
			}
			switch v.kind {
			case kindInt, kindBool:
				out = append(out, num{isInt: true, i: v.i})
			case kindFloat:
				out = append(out, num{f: v.f})
			}
		}
		return out
	}
	o := &outObj{}
	o.add("overall_observability_coverage", float64(len(records))/total)
	covered := 0
	for _, v := range values("token_observability_coverage") {
		if v.float() > 0 {
			covered++
		}
	}
	o.add("token_observability_coverage", float64(covered)/total)

	for _, field := range []string{"prompt_tokens", "cached_prompt_tokens", "completion_tokens", "reasoning_tokens"} {
		vs := values(field)
		if len(vs) == 0 {
			continue
		}
		o.add("mean_"+field, pyMean(vs))
		o.add("median_"+field, pyMedian(vs))
		o.add("total_"+field, pySum(vs))
	}
	if turns := values("num_turns"); len(turns) > 0 {
		o.add("mean_num_turns", pyMean(turns))
		o.add("median_num_turns", pyMedian(turns))
		o.add("std_num_turns", pstdev(floats(turns)))
		lo, hi := pyMinMax(turns)
		o.add("min_num_turns", lo)
		o.add("p90_num_turns", pandasQuantile(turns, 0.9))
		o.add("max_num_turns", hi)
	}
	var perTurn []num
	for _, rec := range records {
		c, cok := numberOf(rec, "completion_tokens")
		t, tok := numberOf(rec, "num_turns")
		if cok && tok && t.float() > 0 {
			perTurn = append(perTurn, num{f: c.float() / t.float()})
		}
	}
	if len(perTurn) > 0 {
		o.add("mean_tokens_per_turn", pyMean(perTurn))
		o.add("median_tokens_per_turn", pyMedian(perTurn))
	}
	if lat := values("total_latency_ms"); len(lat) > 0 {
		o.add("total_latency_p50_ms", pandasQuantile(lat, 0.5))
		o.add("total_latency_p90_ms", pandasQuantile(lat, 0.9))
		o.add("total_latency_p99_ms", pandasQuantile(lat, 0.99))
		o.add("total_latency_mean_ms", pyMean(lat))
	}
	return o
}

func numberOf(rec *obj, key string) (num, bool) {
	v, ok := rec.vals[key]
	if !ok {
		return num{}, false
	}
	switch v.kind {
	case kindInt, kindBool:
		return num{isInt: true, i: v.i}, true
	case kindFloat:
		return num{f: v.f}, true
	}
	return num{}, false
}

func floats(vs []num) []float64 {
	out := make([]float64, len(vs))
	for i, v := range vs {
		out[i] = v.float()
	}
	return out
}

// pyMean is statistics.fmean: fsum(values) / n.
func pyMean(vs []num) float64 { return fsum(floats(vs)) / float64(len(vs)) }

// pyMedian is statistics.median: the middle value itself, or the mean of
// the two middle ones (a float).
func pyMedian(vs []num) any {
	s := append([]num(nil), vs...)
	sort.SliceStable(s, func(i, j int) bool { return s[i].float() < s[j].float() })
	n := len(s)
	if n%2 == 1 {
		return s[n/2].out()
	}
	a, b := s[n/2-1], s[n/2]
	if a.isInt && b.isInt {
		return float64(a.i+b.i) / 2
	}
	return (a.float() + b.float()) / 2
}

// pySum is sum(values): an int while every value is one.
func pySum(vs []num) any {
	var i int64
	k := 0
	for ; k < len(vs) && vs[k].isInt; k++ {
		i += vs[k].i
	}
	if k == len(vs) {
		return i
	}
	f := float64(i)
	for ; k < len(vs); k++ {
		f += vs[k].float()
	}
	return f
}

func pyMinMax(vs []num) (lo, hi any) {
	l, h := vs[0], vs[0]
	for _, v := range vs[1:] {
		if v.float() < l.float() {
			l = v
		}
		if v.float() > h.float() {
			h = v
		}
	}
	return l.out(), h.out()
}

// pandasQuantile is Series(values).quantile(q).
func pandasQuantile(vs []num, q float64) float64 {
	s := floats(vs)
	sort.Float64s(s)
	return numpyQuantile(s, q)
}
