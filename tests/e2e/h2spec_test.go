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
)

// TestH2spec runs the h2spec HTTP/2 conformance suite (the version pinned
// in tools/h2spec) against one listener of every process of a fleet, all
// at once: each server kind passes every case.
func TestH2spec(t *testing.T) {
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
			t.Parallel()
			failed, out := runH2spec(t, h2spec, u, nil)
			if len(failed) == 0 {
				return
			}
			// A reply that ends before the client's next frame is read
			// (h2spec sends them without waiting) makes a few cases
			// judge a stream the server has already finished, on x/net's
			// server too: a case fails only if it fails twice in a row.
			t.Logf("h2spec cases failed once, run again: %v\n%s", failed, out)
			if again, out := runH2spec(t, h2spec, u, failed); len(again) > 0 {
				t.Errorf("h2spec cases failed twice: %v\n%s", again, out)
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

// runH2spec runs the cases named (every case if none) against u and
// returns the ids ("http2/5.1/3") of those that failed, and its output.
func runH2spec(t *testing.T, h2spec string, u *url.URL, cases []string) (failed []string, out []byte) {
	t.Helper()
	report := filepath.Join(t.TempDir(), fmt.Sprintf("report-%d.xml", len(cases)))
	args := append([]string{"-h", u.Hostname(), "-p", u.Port(), "-o", "1", "-j", report}, cases...)
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
				// The index is the case's number only when the whole
				// suite ran; a rerun's failures are reported as they are.
				if cases == nil {
					failed = append(failed, fmt.Sprintf("%s/%d", s.Package, i+1))
				} else {
					failed = append(failed, fmt.Sprintf("%s %q", s.Package, c.Name))
				}
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
