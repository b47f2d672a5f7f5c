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
