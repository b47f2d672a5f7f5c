package scalebench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteComparison prints the figures of runs of the same bench on
// different HTTP stacks side by side, one column per run: the phases, the
// memory and CPU of each fleet, and whether the run kept the contract.
// Each run's own table (WriteTable) has the details.
func WriteComparison(w io.Writer, runs []*Result) error {
	if len(runs) == 0 {
		return nil
	}
	fmt.Fprintf(w, "scale bench side by side: %d rollouts per run\n", runs[0].Rollouts)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	line := func(name string, cell func(r *Result) string) {
		fmt.Fprintf(tw, "%s\t", name)
		for _, r := range runs {
			fmt.Fprintf(tw, "%s\t", cell(r))
		}
		fmt.Fprintln(tw)
	}
	secs := func(name string, f func(r *Result) float64) {
		line(name, func(r *Result) string { return fmtSeconds(f(r)) })
	}
	line("HTTP stack", func(r *Result) string { return r.Stack })
	line("runtime tuning", func(r *Result) string { return r.Tuning })
	line("replicas of each kind", func(r *Result) string { return fmt.Sprint(r.replicas()) })
	line("load average at start", func(r *Result) string { return strings.Fields(r.Host.LoadAverage + " -")[0] })
	secs("fleet start (s)", func(r *Result) float64 { return r.FleetStartSeconds })
	secs("dispatch: every /run sent (s)", func(r *Result) float64 { return r.DispatchSentSeconds })
	secs("dispatch: every rollout held (s)", func(r *Result) float64 { return r.DispatchSeconds })
	line("in flight", func(r *Result) string { return fmt.Sprint(r.InFlight) })
	secs("prepare (s)", func(r *Result) float64 { return r.Prepare.Seconds })
	secs("commit (s)", func(r *Result) float64 { return r.Commit.Seconds })
	line("checkpoint size", func(r *Result) string { return fmtBytes(r.Commit.Bytes) })
	secs("kill to ready (s)", func(r *Result) float64 { return r.KillToReadySeconds })
	secs("restore (s)", func(r *Result) float64 { return r.RestoreSeconds })
	secs("resume (s)", func(r *Result) float64 { return r.ResumeSeconds })
	secs("replacements finished (s)", func(r *Result) float64 { return r.ReplacementsSeconds })
	line("replacements failed", func(r *Result) string { return fmt.Sprint(r.ReplacementFailures) })
	secs("sessions closed (s)", func(r *Result) float64 { return r.Sessions.Seconds })
	for _, f := range []string{"first", "fresh"} {
		line(f+" fleet, sum of peak RSS", func(r *Result) string { return fmtBytes(int64(r.FleetPeakRSS(f))) })
		line(f+" fleet, CPU seconds", func(r *Result) string { return fmt.Sprintf("%.1f", r.fleetCPU(f)) })
	}
	// Per kind, so runs with different replica counts (env against env-0
	// and env-1) line up.
	for _, kind := range kindNames(runs) {
		line(kind+" (first), sum of peak RSS", func(r *Result) string {
			if k, ok := r.kindSum("first", kind); ok {
				return fmtBytes(int64(k.PeakRSSBytes))
			}
			return "-"
		})
		line(kind+" (first), sum of fds at boundary", func(r *Result) string {
			if k, ok := r.kindSum("first", kind); ok {
				return fmt.Sprint(k.FDsAtBoundary)
			}
			return "-"
		})
	}
	for _, name := range processNames(runs) {
		line(name+" (first), peak RSS", func(r *Result) string {
			if p, ok := r.process(name, "first"); ok {
				return fmtBytes(int64(p.PeakRSSBytes))
			}
			return "-"
		})
		line(name+" (first), fds at boundary", func(r *Result) string {
			if p, ok := r.process(name, "first"); ok {
				return fmt.Sprint(p.FDsAtBoundary)
			}
			return "-"
		})
	}
	line("bench, peak RSS", func(r *Result) string { return fmtBytes(int64(r.Bench.PeakRSSBytes)) })
	line("bench, CPU seconds", func(r *Result) string { return fmt.Sprintf("%.1f", r.Bench.CPUSeconds) })
	line("contract", func(r *Result) string {
		switch {
		case r.Error != "":
			return "ERROR"
		case len(r.Violations) > 0:
			return fmt.Sprintf("%d VIOLATIONS", len(r.Violations))
		}
		return "kept"
	})
	return tw.Flush()
}

// fleetCPU sums the CPU seconds of one fleet's processes ("first" or
// "fresh"; fakeinference is left out as in FleetPeakRSS).
func (r *Result) fleetCPU(fleetLabel string) float64 {
	var sum float64
	for _, p := range r.Processes {
		if p.Fleet == fleetLabel {
			sum += p.CPUSeconds
		}
	}
	return sum
}

// process is the named process of a fleet.
func (r *Result) process(name, fleetLabel string) (ProcessStat, bool) {
	for _, p := range r.Processes {
		if p.Name == name && p.Fleet == fleetLabel {
			return p, true
		}
	}
	return ProcessStat{}, false
}

// processNames lists the first fleet's processes that every run has, in
// the order the first run lists them: a process only some runs have (a
// replica) is compared through its kind's sums.
func processNames(runs []*Result) []string {
	var names []string
	for _, p := range runs[0].Processes {
		if p.Fleet != "first" {
			continue
		}
		inAll := true
		for _, r := range runs[1:] {
			if _, ok := r.process(p.Name, "first"); !ok {
				inAll = false
			}
		}
		if inAll {
			names = append(names, p.Name)
		}
	}
	return names
}

// kindNames lists the participant kinds of every run's first fleet, in the
// order the first run lists them.
func kindNames(runs []*Result) []string {
	var kinds []string
	seen := map[string]bool{}
	for _, r := range runs {
		for _, k := range r.KindSums() {
			if k.Fleet == "first" && !seen[k.Kind] {
				seen[k.Kind] = true
				kinds = append(kinds, k.Kind)
			}
		}
	}
	return kinds
}
