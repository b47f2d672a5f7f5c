package modelproxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
)

// Ensure the capture ledger gauges report the keys and rows written through
// captured calls, and the bytes they hold.
func TestMetrics_CaptureLedgerSize(t *testing.T) {
	t.Parallel()
	w := startWorker(t, 0)
	m := startModel(t, w.url, t.TempDir(), ctlplane.Config{}, nil)
	read := func() map[string]float64 {
		t.Helper()
		status, body := m.get(t, "/metrics")
		if status != http.StatusOK {
			t.Fatalf("/metrics: %d", status)
		}
		out := map[string]float64{}
		for _, line := range strings.Split(string(body), "\n") {
			var name string
			var v float64
			if strings.HasPrefix(line, "gymfleet_capture_ledger_") {
				if _, err := fmt.Sscanf(line, "%s %g", &name, &v); err != nil {
					t.Fatalf("%q: %v", line, err)
				}
				out[name] = v
			}
		}
		return out
	}
	if got := read(); got["gymfleet_capture_ledger_keys"] != 0 || got["gymfleet_capture_ledger_rows"] != 0 || len(got) != 3 {
		t.Fatalf("fresh ledger: %v", got)
	}
	m.mustCall(t, "k1", chatPath, chatRequest("one", "ok"))
	m.mustCall(t, "k1", chatPath, chatRequest("two", "ok"))
	m.mustCall(t, "k2", chatPath, chatRequest("three", "ok"))
	got := read()
	if got["gymfleet_capture_ledger_keys"] != 2 || got["gymfleet_capture_ledger_rows"] != 3 || got["gymfleet_capture_ledger_bytes"] <= 0 {
		t.Fatalf("after 3 calls under 2 keys: %v", got)
	}
}
