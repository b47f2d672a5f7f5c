package scalebench

import (
	"bytes"
	"strings"
	"testing"
)

// Ensure the side-by-side table has a column per run, each run's own
// figures in it, and names a run that failed.
func TestWriteComparison(t *testing.T) {
	lean, nethttp := sampleResult(), sampleResult()
	lean.Stack, nethttp.Stack = "lean", "nethttp"
	nethttp.DispatchSeconds = 9.5
	nethttp.Processes[0].PeakRSSBytes = 1200 << 20
	nethttp.Error = "dispatch stalled"
	var out bytes.Buffer
	if err := WriteComparison(&out, []*Result{lean, nethttp}); err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		name, cells, ok := strings.Cut(line, "  ")
		if ok {
			rows[strings.TrimSpace(name)] = strings.Fields(cells)
		}
	}
	for name, want := range map[string][]string{
		"HTTP stack":                       {"lean", "nethttp"},
		"dispatch: every rollout held (s)": {"4.250", "9.500"},
		"env (first), peak RSS":            {"800.0", "MiB", "1.17", "GiB"},
		"env (first), fds at boundary":     {"19", "19"},
		"contract":                         {"kept", "ERROR"},
	} {
		if got := rows[name]; strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("row %q = %q, want %q\n%s", name, got, want, out.String())
		}
	}
	if _, ok := rows["fakeinference (first), peak RSS"]; ok {
		t.Errorf("fakeinference, kept by the crash, is listed with the first fleet:\n%s", out.String())
	}
}

// Ensure the build comparison prints each build's median with its runs in
// the order they ran, the ratio of the medians, a figure one build did not
// measure as "-", and names a failed run.
func TestWriteBuildComparison(t *testing.T) {
	var base, this []*Result
	for _, commit := range []float64{0.4, 0.6, 0.5} {
		r := sampleResult()
		r.Commit.Seconds = commit
		base = append(base, r)
	}
	for _, commit := range []float64{0.2, 0.3, 0.25} {
		r := sampleResult()
		r.Commit.Seconds = commit
		r.DiskFloor = &DiskFloor{Seconds: 0.1, Bytes: 1 << 20, Files: 2}
		this = append(this, r)
	}
	this[2].Error = "restore failed"
	var out bytes.Buffer
	if err := WriteBuildComparison(&out, Build{Label: "old", Runs: base}, Build{Label: "new", Runs: this}); err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) == 6 {
			for i := range cells {
				cells[i] = strings.TrimSpace(cells[i])
			}
			rows[cells[1]] = cells[2:5]
		}
	}
	for name, want := range map[string][]string{
		"commit (s)":     {"0.500 (0.400, 0.600, 0.500)", "0.250 (0.200, 0.300, 0.250)", "0.50"},
		"commit / floor": {"-", "2.5 (2.0, 3.0, 2.5)", "-"},
		"disk floor: its bytes written and fsynced (s)": {"-", "0.100 (0.100, 0.100, 0.100)", "-"},
	} {
		if got := rows[name]; strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("row %q = %q, want %q\n%s", name, got, want, out.String())
		}
	}
	if !strings.Contains(out.String(), "new run 3: 0 violations; error: restore failed") {
		t.Errorf("the failed run is not named:\n%s", out.String())
	}
}
