package rewardprofile

import (
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// frame is RewardProfiler.profile_from_data's DataFrame without its index
// columns: one row per reply in (task, rollout) order, one column per
// numeric field in order of first appearance, NaN where a reply lacks it.
type frame struct {
	columns []string
	// cells[c][r] is column c of row r; present[c][r] whether it is set.
	cells   [][]float64
	present [][]bool
	// allInt is whether every column is an int64 column in pandas (set in
	// every row, every value an int or a bool): then df.max() and
	// df.min() keep integers, otherwise pandas upcasts both to float64.
	allInt bool
}

func buildFrame(replies []reply) frame {
	var f frame
	index := map[string]int{}
	isInt := []bool{}
	for r, rep := range replies {
		rep.numericFields(func(name string, v float64, vInt bool) {
			if name == agentNameColumn {
				return
			}
			c, ok := index[name]
			if !ok {
				c = len(f.columns)
				index[name] = c
				f.columns = append(f.columns, name)
				f.cells = append(f.cells, make([]float64, len(replies)))
				f.present = append(f.present, make([]bool, len(replies)))
				isInt = append(isInt, true)
			}
			f.cells[c][r], f.present[c][r] = v, true
			isInt[c] = isInt[c] && vInt
		})
	}
	f.allInt = true
	for c := range f.columns {
		for r := range replies {
			if !f.present[c][r] {
				isInt[c] = false
			}
		}
		f.allInt = f.allInt && isInt[c]
	}
	return f
}

// describe is RewardProfiler.describe_dataframe over the rows [lo, hi) of
// the frame, then calculate_metrics_single_df's filter: "<stat>/<column>"
// entries, stat-major, NaN ones left out.
func (f *frame) describe(dst *outObj, lo, hi int) {
	n := len(f.columns)
	type colStats struct{ mean, max, min, median, std float64 }
	cs := make([]colStats, n)
	allStdNaN := true
	for c := range f.columns {
		cs[c] = columnStats(f.cells[c][lo:hi], f.present[c][lo:hi])
		if !math.IsNaN(cs[c].std) {
			allStdNaN = false
		}
	}
	// "Std is more interpretable using 0 rather than NaN for no std": when
	// no column has one, columns with no NaN in these rows get 0.
	if allStdNaN {
		for c := range f.columns {
			full := true
			for _, p := range f.present[c][lo:hi] {
				full = full && p
			}
			if full {
				cs[c].std = 0
			}
		}
	}
	for s, stat := range statNames() {
		for c, name := range f.columns {
			var v float64
			switch s {
			case 0:
				v = cs[c].mean
			case 1:
				v = cs[c].max
			case 2:
				v = cs[c].min
			case 3:
				v = cs[c].median
			case 4:
				v = cs[c].std
			}
			if math.IsNaN(v) {
				continue
			}
			key := stat + "/" + name
			if (s == 1 || s == 2) && f.allInt {
				dst.add(key, int64(v))
			} else {
				dst.add(key, v)
			}
		}
	}
}

// columnStats are pandas' skipna reductions of one column (nanops: mean,
// max, min, median, std with ddof=1).
func columnStats(cells []float64, present []bool) (s struct{ mean, max, min, median, std float64 }) {
	nan := math.NaN()
	s.mean, s.max, s.min, s.median, s.std = nan, nan, nan, nan, nan
	// nanops fills missing values with 0 and sums the whole column, so
	// the sum's rounding follows the column's length, not the count.
	filled := make([]float64, len(cells))
	var vals []float64
	for i, v := range cells {
		if present[i] {
			filled[i] = v
			vals = append(vals, v)
		}
	}
	count := len(vals)
	if count == 0 {
		return s
	}
	s.mean = numpySum(filled) / float64(count)
	s.max, s.min = vals[0], vals[0]
	for _, v := range vals[1:] {
		s.max = math.Max(s.max, v)
		s.min = math.Min(s.min, v)
	}
	sorted := append([]float64(nil), vals...)
	sort.Float64s(sorted)
	if count%2 == 1 {
		s.median = sorted[count/2]
	} else {
		s.median = (sorted[count/2-1] + sorted[count/2]) / 2
	}
	if count > 1 {
		// nanvar: the squared deviations from the mean, 0 where missing,
		// summed and divided by count - 1.
		sq := make([]float64, len(cells))
		for i, v := range cells {
			if present[i] {
				d := s.mean - v
				sq[i] = d * d
			}
		}
		s.std = math.Sqrt(numpySum(sq) / float64(count-1))
	}
	return s
}

// numpySum is numpy's add.reduce over a contiguous float64 array, the
// pairwise sum (sequential below 8 elements, 8 accumulators up to 128,
// halves above), so that means and deviations round as pandas' do.
func numpySum(a []float64) float64 { return pairwiseSum(a) }

func pairwiseSum(a []float64) float64 {
	n := len(a)
	switch {
	case n < 8:
		res := math.Copysign(0, -1)
		for _, v := range a {
			res += v
		}
		return res
	case n <= 128:
		var r [8]float64
		copy(r[:], a[:8])
		i := 8
		for ; i < n-n%8; i += 8 {
			for j := range r {
				r[j] += a[i+j]
			}
		}
		res := ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
		for ; i < n; i++ {
			res += a[i]
		}
		return res
	default:
		n2 := n / 2
		n2 -= n2 % 8
		return pairwiseSum(a[:n2]) + pairwiseSum(a[n2:])
	}
}

// metrics is AggregateMetrics.
type metrics struct {
	groups  []*outObj
	agent   *outObj
	key     *outObj
	perf    *outObj // nil: null (no reply carried ng_perf)
	repeats []*outObj
}

func compute(raws []codec.RawMessage) (*metrics, error) {
	m := &metrics{agent: &outObj{}, key: &outObj{}}
	if len(raws) == 0 {
		return m, nil
	}
	all := make([]reply, len(raws))
	for i, raw := range raws {
		r, err := parseReply(raw, i)
		if err != nil {
			return nil, err
		}
		all[i] = r
	}
	// _partition_on_mask: masked samples leave the quality metrics and are
	// counted as coverage.
	var replies []reply
	masked := 0
	for _, r := range all {
		if r.masked {
			masked++
			continue
		}
		replies = append(replies, r)
	}
	coverage := coverageMetrics(all, replies, masked)
	// Observability covers every rollout that ran, masked or not.
	m.perf = perfSummary(all)
	if len(replies) == 0 {
		m.agent.keys, m.agent.vals = coverage.keys, coverage.vals
		m.key = &outObj{keys: slices.Clone(coverage.keys), vals: slices.Clone(coverage.vals)}
		return m, nil
	}
	// align_rows_and_results: sorted by (task, rollout), each key once.
	sort.SliceStable(replies, func(i, j int) bool {
		if replies[i].task != replies[j].task {
			return replies[i].task < replies[j].task
		}
		return replies[i].rollout < replies[j].rollout
	})
	for i := 1; i < len(replies); i++ {
		if replies[i].task == replies[i-1].task && replies[i].rollout == replies[i-1].rollout {
			return nil, errorf("two verify replies share _ng_task_index %d and _ng_rollout_index %d", replies[i].task, replies[i].rollout)
		}
	}
	f := buildFrame(replies)

	for lo := 0; lo < len(replies); {
		hi := lo
		for hi < len(replies) && replies[hi].task == replies[lo].task {
			hi++
		}
		g := &outObj{}
		g.add(fieldTaskIndex, replies[lo].task)
		f.describe(g, lo, hi)
		sample := &outObj{}
		sample.add("agent_ref", &outObj{keys: []string{"name"}, vals: []any{"agent"}})
		g.add("sample", sample)
		g.add("num_rollouts", int64(hi-lo))
		g.add("expected_num_rollouts", int64(hi-lo))
		g.add("missing_num_rollouts", int64(0))
		g.add("reward_profile_completion_pct", 100.0)
		infos := make([]any, 0, hi-lo)
		for _, r := range replies[lo:hi] {
			infos = append(infos, rolloutInfo(r))
		}
		g.add("rollout_infos", infos)
		m.groups = append(m.groups, g)
		lo = hi
	}

	f.describe(m.agent, 0, len(replies))
	tq := tQuantiles{}
	m.repeats = repeatLevel(replies, f, tq)
	acrossRepeats(m.agent, m.repeats, tq)
	for i, k := range coverage.keys {
		m.agent.add(k, coverage.vals[i])
	}
	// num_repeats counts the rollout indexes of every reply, masked or not.
	rollouts := map[int64]bool{}
	for _, r := range all {
		rollouts[r.rollout] = true
	}
	m.agent.add("num_repeats", int64(len(rollouts)))
	for i, k := range m.agent.keys {
		if strings.HasPrefix(k, "mean/") {
			m.key.add(k, m.agent.vals[i])
		}
	}
	for i, k := range coverage.keys {
		m.key.add(k, coverage.vals[i])
	}
	return m, nil
}

// coverageMetrics is _coverage_metrics: empty when nothing was masked.
func coverageMetrics(all, scored []reply, masked int) *outObj {
	o := &outObj{}
	if masked == 0 {
		return o
	}
	tasks := map[int64]bool{}
	for _, r := range all {
		tasks[r.task] = true
	}
	measured := map[int64]bool{}
	for _, r := range scored {
		measured[r.task] = true
	}
	o.add("coverage/measured_rollouts", int64(len(scored)))
	o.add("coverage/masked_rollouts", int64(masked))
	o.add("coverage/measured_tasks", int64(len(measured)))
	fully := 0
	for t := range tasks {
		if !measured[t] {
			fully++
		}
	}
	o.add("coverage/fully_masked_tasks", int64(fully))
	return o
}

// rolloutInfo is RewardProfiler.rollout_info_from_result.
func rolloutInfo(r reply) *outObj {
	o := &outObj{}
	o.add("rollout_id", strconv.FormatInt(r.task, 10)+":"+strconv.FormatInt(r.rollout, 10))
	o.add(fieldTaskIndex, r.task)
	o.add(fieldRolloutIndex, r.rollout)
	if v, ok := r.fields.vals[fieldReward]; ok {
		o.add(fieldReward, v)
	}
	put := func(k string, v value) {
		switch v.kind {
		case kindInt, kindBool:
			o.set(k, v.i)
		case kindFloat:
			o.set(k, v.f)
		}
	}
	for _, k := range r.usage.keys {
		put(k, r.usage.vals[k])
	}
	for _, k := range r.fields.keys {
		if strings.HasPrefix(k, "_") || k == fieldReward || k == fieldResponse || k == fieldMaskSample {
			continue
		}
		put(k, r.fields.vals[k])
	}
	return o
}
