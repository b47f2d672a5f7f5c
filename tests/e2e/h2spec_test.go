package e2e

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

// TestH2spec runs the h2spec HTTP/2 conformance suite (the version pinned
// in tools/h2spec) against one listener of every process of a fleet, one
// after another (in parallel, their handlers would compete for the CPU and
// lose more of the races below): each server kind passes every case.
func TestH2spec(t *testing.T) {
	if httpConf().EffectiveStack() != httpconf.StackLean {
		// The test holds the lean stack to x/net's conformance; on the
		// nethttp stack the servers are x/net's own, the baseline itself,
		// whose known failures (issue 33) this test would only restate.
		t.Skipf("h2spec targets the lean HTTP/2 server; this pass runs on %s", stack)
	}
	h2spec := buildH2spec(t)
	f := startFleet(t, nil)
	for _, p := range f.Cfg.Processes {
		if len(p.Endpoints) == 0 {
			continue
		}
		u, err := url.Parse(p.Endpoints[0].URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(p.Name, func(t *testing.T) {
			failed, out := runH2spec(t, h2spec, u, nil)
			// A handler that replies before the client's next frame is
			// read (h2spec sends its frames without waiting) makes a case
			// judge a stream the server has already finished and reset,
			// on x/net's server too (h2spec 5.1 #6, #9, #12, 6.9.1 #3,
			// 8.1.2.6 #1-2): a case fails only if it fails on each of
			// runs, which a server judging the frame wrongly does.
			const runs = 5
			for run := 2; len(failed) > 0 && run <= runs; run++ {
				t.Logf("h2spec cases failed on run %d of %d: %v\n%s", run-1, runs, failed, out)
				failed, out = runH2spec(t, h2spec, u, failed)
			}
			if len(failed) > 0 {
				t.Errorf("h2spec cases failed on each of %d runs: %v\n%s", runs, failed, out)
			}
		})
	}
}

// buildH2spec builds the pinned h2spec and returns its path.
func buildH2spec(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	bin := filepath.Join(t.TempDir(), "h2spec")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/summerwind/h2spec/cmd/h2spec")
	cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..", "tools", "h2spec")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building h2spec: %v\n%s", err, out)
	}
	return bin
}

// h2case is one h2spec case: its id ("http2/5.1/3"), to run it alone,
// and its suite and name, as its report names it.
type h2case struct{ id, suite, name string }

func (c h2case) String() string { return fmt.Sprintf("%s %q", c.id, c.name) }

// runH2spec runs the cases given (every case if none) against u and
// returns those that failed, and its output.
func runH2spec(t *testing.T, h2spec string, u *url.URL, cases []h2case) (failed []h2case, out []byte) {
	t.Helper()
	report := filepath.Join(t.TempDir(), "report.xml")
	args := []string{"-h", u.Hostname(), "-p", u.Port(), "-o", "2", "-j", report}
	for _, c := range cases {
		args = append(args, c.id)
	}
	out, err := exec.Command(h2spec, args...).CombinedOutput()
	raw, rerr := os.ReadFile(report)
	if rerr != nil {
		t.Fatalf("h2spec wrote no report (%v): %v\n%s", err, rerr, out)
	}
	var r struct {
		Suites []struct {
			Package string `xml:"package,attr"`
			Cases   []struct {
				Name    string    `xml:"classname,attr"`
				Failure *struct{} `xml:"failure"`
				Error   *struct{} `xml:"error"`
				Skipped *struct{} `xml:"skipped"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(raw, &r); err != nil {
		t.Fatalf("h2spec's report: %v", err)
	}
	total, passed := 0, 0
	for _, s := range r.Suites {
		for i, c := range s.Cases {
			total++
			switch {
			case c.Skipped != nil:
				t.Errorf("h2spec skipped %s/%d %q", s.Package, i+1, c.Name)
			case c.Failure != nil || c.Error != nil:
				// The index is the case's number when the whole suite ran;
				// a rerun's cases are found by name.
				fc := h2case{id: fmt.Sprintf("%s/%d", s.Package, i+1), suite: s.Package, name: c.Name}
				for _, rc := range cases {
					if rc.suite == fc.suite && rc.name == fc.name {
						fc = rc
					}
				}
				failed = append(failed, fc)
			default:
				passed++
			}
		}
	}
	if total == 0 || (err != nil && len(failed) == 0) {
		t.Fatalf("h2spec ran %d cases and exited with %v:\n%s", total, err, bytes.TrimSpace(out))
	}
	t.Logf("%s: h2spec passed %d of %d cases", u.Host, passed, total)
	return failed, out
}
