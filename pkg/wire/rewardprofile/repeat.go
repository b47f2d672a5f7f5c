package rewardprofile

import (
	"math"
	"sort"
	"strings"
)

// repeatLevel is RewardProfiler._compute_repeat_level_metrics for the one
// agent compute_aggregate_metrics profiles: per rollout index (a repeat),
// over the tasks that repeat has, each numeric column's mean, median, std,
// standard error, min, max, quartiles and 95% t interval. Nothing when
// every reply has the same rollout index. replies are sorted by (task,
// rollout) and f is their frame.
func repeatLevel(replies []reply, f frame, tq tQuantiles) []*outObj {
	rollouts := []int64{}
	seen := map[int64]bool{}
	tasks := map[int64]bool{}
	for _, r := range replies {
		if !seen[r.rollout] {
			seen[r.rollout] = true
			rollouts = append(rollouts, r.rollout)
		}
		tasks[r.task] = true
	}
	if len(rollouts) <= 1 {
		return nil
	}
	sort.Slice(rollouts, func(i, j int) bool { return rollouts[i] < rollouts[j] })
	// Index.difference sorts the columns by name.
	cols := make([]int, len(f.columns))
	for c := range cols {
		cols[c] = c
	}
	sort.Slice(cols, func(i, j int) bool { return f.columns[cols[i]] < f.columns[cols[j]] })

	out := make([]*outObj, 0, len(rollouts))
	for _, roll := range rollouts {
		var rows []int
		present := map[int64]bool{}
		for i, r := range replies {
			if r.rollout == roll {
				rows = append(rows, i)
				present[r.task] = true
			}
		}
		e := &outObj{}
		e.add(fieldRolloutIndex, roll)
		e.add("sample_count", int64(len(present)))
		e.add("missing_count", int64(len(tasks)-len(present)))
		for _, c := range cols {
			var vals []float64
			for _, i := range rows {
				if f.present[c][i] {
					vals = append(vals, f.cells[c][i])
				}
			}
			if len(vals) == 0 {
				continue
			}
			s := describeSeries(vals)
			sem := s.std / math.Sqrt(float64(s.n))
			name := f.columns[c]
			e.add("mean/"+name, s.mean)
			e.add("median/"+name, s.median)
			e.add("std/"+name, s.std)
			e.add("sem/"+name, sem)
			e.add("min/"+name, s.min)
			e.add("max/"+name, s.max)
			e.add("p25/"+name, s.p25)
			e.add("p75/"+name, s.p75)
			if lo, hi, ok := tq.confidenceInterval(s.mean, sem, s.n); ok {
				e.add("ci_low_95/"+name, lo)
				e.add("ci_high_95/"+name, hi)
			}
		}
		out = append(out, e)
	}
	return out
}

// acrossRepeats is _aggregate_repeat_level_metrics appended to the agent's
// metrics: each repeat's point estimates (the mean/<column> entries) taken
// as one observation, summarized across the repeats.
func acrossRepeats(agent *outObj, repeats []*outObj, tq tQuantiles) {
	if len(repeats) == 0 {
		return
	}
	// DataFrame.from_records: the columns in order of first appearance.
	var names []string
	seen := map[string]bool{}
	for _, e := range repeats {
		for _, k := range e.keys {
			if !seen[k] {
				seen[k] = true
				names = append(names, k)
			}
		}
	}
	for _, name := range names {
		if !isPrimaryMetric(name) {
			continue
		}
		var vals []float64
		for _, e := range repeats {
			for i, k := range e.keys {
				if k == name {
					if v, ok := e.vals[i].(float64); ok {
						vals = append(vals, v)
					}
				}
			}
		}
		if len(vals) == 0 {
			continue
		}
		s := describeSeries(vals)
		se := s.std / math.Sqrt(float64(s.n))
		agent.add("mean_across_repeats/"+name, s.mean)
		agent.add("median_across_repeats/"+name, s.median)
		agent.add("std_across_repeats/"+name, s.std)
		agent.add("min_across_repeats/"+name, s.min)
		agent.add("max_across_repeats/"+name, s.max)
		agent.add("se_across_repeats/"+name, se)
		if lo, hi, ok := tq.confidenceInterval(s.mean, se, s.n); ok {
			agent.add("ci_low_95_across_repeats/"+name, lo)
			agent.add("ci_high_95_across_repeats/"+name, hi)
		}
	}
}

// Metric-name grammar of nemo_gym/metrics_config.py (nemo-gym 0.7.0).
var (
	// excludedNames are METRIC_EXCLUDED_NAMES.
	excludedNames = []string{fieldTaskIndex, fieldRolloutIndex, "_ng_attempt_index", "sample_count", "missing_count", "num_repeats", "token_usage_version"}
	// excludedPrefixes are every Stat's prefix but mean's.
	excludedPrefixes = []string{"max/", "min/", "median/", "std/", "sem/", "se/", "p25/", "p75/", "ci_low_95/", "ci_high_95/", "histogram/"}
	// excludedSuffixes are METRIC_EXCLUDED_SUFFIXES.
	excludedSuffixes = []string{
		"/max", "/min", "/median", "/p5", "/p25", "/p75", "/p95", "/ci_low_95", "/ci_high_95",
		"/ci_lower", "/ci_upper", "_ci_lower", "_ci_upper", "_ci95_lower", "_ci95_upper", "/_ng_attempt_index",
		"/std_dev_across_runs", "/std_err_across_runs", "/avg_sample_std_dev",
	}
)

// isPrimaryMetric is is_primary_metric: a point estimate fit for repeat
// aggregation.
func isPrimaryMetric(name string) bool {
	for _, n := range excludedNames {
		if name == n {
			return false
		}
	}
	for _, p := range excludedPrefixes {
		if strings.HasPrefix(name, p) {
			return false
		}
	}
	for _, s := range excludedSuffixes {
		if strings.HasSuffix(name, s) {
			return false
		}
	}
	return !strings.Contains(name, "_across_repeats/")
}
