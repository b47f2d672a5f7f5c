package scalebench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
)

// Build is one build's runs of the bench at the same rollout count, for
// WriteBuildComparison.
type Build struct {
	// Label names the build in the table (a commit, or "work tree").
	Label string
	Runs  []*Result
}

// figure is one row of a build comparison: a value per run, absent (ok
// false) where a run did not measure it, as a build from before the
// figure existed.
type figure struct {
	name  string
	value func(r *Result) (v float64, ok bool)
	// digits after the point.
	digits int
}

// WriteBuildComparison prints the runs of two builds of the bench as one
// Markdown table, ready for docs/scale-log.md: per figure the median of
// each build's runs (each run's value beside it) and the second build's
// median over the first's. Wall times move with other tenants' load, so
// the load averages and the CPU each phase cost are rows of their own.
func WriteBuildComparison(w io.Writer, base, this Build) error {
	all := append(slices.Clone(base.Runs), this.Runs...)
	if len(all) == 0 {
		return fmt.Errorf("no runs to compare")
	}
	fmt.Fprintf(w, "| figure (%d rollouts) | %s: median (runs) | %s: median (runs) | %s / %s |\n",
		all[0].Rollouts, base.Label, this.Label, this.Label, base.Label)
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, f := range buildFigures(all) {
		a, b := values(base.Runs, f), values(this.Runs, f)
		if len(a) == 0 && len(b) == 0 {
			continue
		}
		ratio := "-"
		if ma, mb := median(a), median(b); len(a) > 0 && len(b) > 0 && ma != 0 {
			ratio = fmt.Sprintf("%.2f", mb/ma)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", f.name, cell(a, f.digits), cell(b, f.digits), ratio)
	}
	for _, b := range []Build{base, this} {
		for i, r := range b.Runs {
			if r.Error != "" || len(r.Violations) > 0 {
				fmt.Fprintf(w, "\n%s run %d: %d violations; error: %s\n", b.Label, i+1, len(r.Violations), r.Error)
			}
		}
	}
	return nil
}

// buildFigures lists the rows: phases, then the disk floor, the fleet's
// memory, and per participant kind its CPU and the bytes each held
// rollout costs it.
func buildFigures(runs []*Result) []figure {
	phase := func(name string) func(r *Result) (float64, bool) {
		return func(r *Result) (float64, bool) {
			for _, pc := range r.PhaseCPU {
				if pc.Phase == name {
					return pc.Seconds, true
				}
			}
			return 0, false
		}
	}
	secs := func(f func(r *Result) float64) func(r *Result) (float64, bool) {
		return func(r *Result) (float64, bool) { v := f(r); return v, v > 0 }
	}
	overFloor := func(f func(r *Result) float64) func(r *Result) (float64, bool) {
		return func(r *Result) (float64, bool) { v := r.OverFloor(f(r)); return v, v > 0 }
	}
	gib := func(f string) func(r *Result) (float64, bool) {
		return func(r *Result) (float64, bool) {
			v := float64(r.FleetPeakRSS(f)) / (1 << 30)
			return v, v > 0
		}
	}
	figs := []figure{
		{"load average (1 min) at start", loadAverage, 2},
		{"dispatch: every rollout held (s)", secs(func(r *Result) float64 { return r.DispatchSeconds }), 1},
		{"CPU in dispatch (CPU-s)", phase("dispatch"), 1},
		{"prepare (s)", secs(func(r *Result) float64 { return r.Prepare.Seconds }), 3},
		{"CPU in prepare (CPU-s)", phase("prepare"), 2},
		{"commit (s)", secs(func(r *Result) float64 { return r.Commit.Seconds }), 3},
		{"CPU in commit (CPU-s)", phase("commit"), 2},
		{"checkpoint size (MiB)", func(r *Result) (float64, bool) { return float64(r.Commit.Bytes) / (1 << 20), r.Commit.Bytes > 0 }, 0},
		{"disk floor: its bytes written and fsynced (s)", func(r *Result) (float64, bool) {
			if r.DiskFloor == nil {
				return 0, false
			}
			return r.DiskFloor.Seconds, true
		}, 3},
		{"commit / floor", overFloor(func(r *Result) float64 { return r.Commit.Seconds }), 1},
		{"restore (s)", secs(func(r *Result) float64 { return r.RestoreSeconds }), 3},
		{"CPU in restore (CPU-s)", phase("restore"), 2},
		{"restore / floor", overFloor(func(r *Result) float64 { return r.RestoreSeconds }), 1},
		{"replacements: every one finished (s)", secs(func(r *Result) float64 { return r.ReplacementsSeconds }), 1},
		{"replacements failed", func(r *Result) (float64, bool) { return float64(r.ReplacementFailures), r.Replacements > 0 }, 0},
		{"first fleet, sum of peak RSS (GiB)", gib("first"), 2},
		{"first fleet, sum of peak RSS through the dispatch (GiB)", func(r *Result) (float64, bool) {
			var sum uint64
			for _, k := range r.KindSums() {
				if k.Fleet == "first" {
					sum += k.PeakRSSAtBoundary
				}
			}
			return float64(sum) / (1 << 30), sum > 0
		}, 2},
		{"fresh fleet, sum of peak RSS (GiB)", gib("fresh"), 2},
	}
	for _, kind := range comparedKinds(runs) {
		figs = append(figs,
			figure{kind + ": CPU in dispatch per rollout (ms)", func(r *Result) (float64, bool) {
				return dispatchCPUOf(r, kind)
			}, 2},
			figure{kind + ": first fleet CPU per rollout (ms)", func(r *Result) (float64, bool) {
				k, ok := r.kindSum("first", kind)
				if !ok || r.Rollouts == 0 {
					return 0, false
				}
				return k.CPUSeconds * 1000 / float64(r.Rollouts), true
			}, 2},
			figure{kind + ": stack per held rollout (KiB)", func(r *Result) (float64, bool) {
				k, ok := r.kindSum("first", kind)
				if !ok || k.StackBytesAtBoundary == 0 || r.InFlight == 0 {
					return 0, false
				}
				return float64(k.StackBytesAtBoundary) / float64(r.InFlight) / 1024, true
			}, 1},
			figure{kind + ": heap per held rollout (KiB)", func(r *Result) (float64, bool) {
				k, ok := r.kindSum("first", kind)
				if !ok || k.HeapBytesAtBoundary == 0 || r.InFlight == 0 {
					return 0, false
				}
				return float64(k.HeapBytesAtBoundary) / float64(r.InFlight) / 1024, true
			}, 1},
			figure{kind + ": records per held rollout (KiB)", func(r *Result) (float64, bool) {
				for _, c := range r.Commit.Kinds {
					if c.Kind == kind && r.InFlight > 0 {
						return float64(c.Bytes) / float64(r.InFlight) / 1024, true
					}
				}
				return 0, false
			}, 2},
			figure{kind + ": peak RSS per held rollout (KiB)", func(r *Result) (float64, bool) {
				k, ok := r.kindSum("first", kind)
				if !ok || r.InFlight == 0 {
					return 0, false
				}
				return float64(k.PeakRSSBytes) / float64(r.InFlight) / 1024, true
			}, 1},
			figure{kind + ": fresh fleet peak RSS per rollout (KiB)", func(r *Result) (float64, bool) {
				k, ok := r.kindSum("fresh", kind)
				if !ok || r.InFlight == 0 || k.PeakRSSBytes == 0 {
					return 0, false
				}
				return float64(k.PeakRSSBytes) / float64(r.InFlight) / 1024, true
			}, 1},
		)
	}
	return figs
}

// comparedKinds are the participant kinds of the runs' first fleets.
func comparedKinds(runs []*Result) []string {
	var kinds []string
	for _, r := range runs {
		for _, k := range r.KindSums() {
			if k.Fleet == "first" && !slices.Contains(kinds, k.Kind) && k.Kind != fleet.KindFakeInference {
				kinds = append(kinds, k.Kind)
			}
		}
	}
	return kinds
}

// dispatchCPUOf is a kind's CPU in the dispatch per rollout, in ms.
func dispatchCPUOf(r *Result, kind string) (float64, bool) {
	for _, pc := range r.PhaseCPU {
		if pc.Phase != "dispatch" || r.Rollouts == 0 {
			continue
		}
		var sum float64
		found := false
		for _, p := range r.Processes {
			if p.Fleet == "first" && processKind(p) == kind {
				if s, ok := pc.ByProcess[p.Name]; ok {
					sum += s
					found = true
				}
			}
		}
		return sum * 1000 / float64(r.Rollouts), found
	}
	return 0, false
}

func loadAverage(r *Result) (float64, bool) {
	f := strings.Fields(r.Host.LoadAverage)
	if len(f) == 0 {
		return 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	return v, err == nil
}

func values(runs []*Result, f figure) []float64 {
	var out []float64
	for _, r := range runs {
		if v, ok := f.value(r); ok {
			out = append(out, v)
		}
	}
	return out
}

// median of vs; NaN for none.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// cell is "median (v1, v2, ...)", the runs in the order they ran.
func cell(vs []float64, digits int) string {
	if len(vs) == 0 {
		return "-"
	}
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = strconv.FormatFloat(v, 'f', digits, 64)
	}
	m := strconv.FormatFloat(median(vs), 'f', digits, 64)
	if len(vs) == 1 {
		return m
	}
	return m + " (" + strings.Join(parts, ", ") + ")"
}
