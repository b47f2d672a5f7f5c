package modelproxy_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
)

// wrkSeconds is how long wrk drives one target in one round.
const wrkSeconds = 5

// BenchmarkProxyCostWrk is BenchmarkProxyCPUPerCall driven from outside:
// wrk (Debian's), 2 threads and 32 keep-alive connections, saturates both
// cores against each target in turn, a round being every target once for
// wrkSeconds. A target's cost per call is the CPU this process (the
// upstream and the proxies) and wrk spent, over the calls wrk completed;
// what a proxy adds is its cost less the direct path's. CPU, not wall time,
// so other tenants' load moves the figures less; each target's throughput
// is reported beside it. b.N is the number of rounds: run it with
// -benchtime=3x and read the medians of -count runs.
func BenchmarkProxyCostWrk(b *testing.B) {
	wrk, err := exec.LookPath("wrk")
	if err != nil {
		b.Fatal("wrk is not installed (Debian: apt-get install wrk)")
	}
	upstreamBody, upstream, reverseProxy := cannedUpstreamAndReverseProxy(b)

	cfg := modelproxy.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Upstream.BaseURL, cfg.Upstream.Protocol = upstream+"/v1", modelproxy.ProtocolHTTP1
	cfg.Capture.Dir = b.TempDir()
	cfg.Checkpoint = ctlplane.DefaultConfig()
	server, err := modelproxy.New(cfg, modelproxy.Deps{})
	if err != nil {
		b.Fatal(err)
	}
	serveForBench(b, server)

	dir := b.TempDir()
	writeBody := func(name string, body []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, body, 0o644); err != nil {
			b.Fatal(err)
		}
		return p
	}
	upstreamFile, clientFile := writeBody("upstream.json", upstreamBody), writeBody("client.json", weatherChat(b, false))
	targets := []struct {
		name, url, body string
		capture         bool
	}{
		{"direct", upstream + "/v1/chat/completions", upstreamFile, false},
		{"reverseproxy", reverseProxy + "/v1/chat/completions", upstreamFile, false},
		{"modelserver", server.URL() + "/v1/chat/completions", clientFile, false},
		{"modelserver-capture", server.URL(), clientFile, true},
	}
	cost := make([][]float64, len(targets)) // µs per call, per round
	rate := make([][]float64, len(targets)) // calls per second, per round
	round := 0
	for b.Loop() {
		round++
		for i, t := range targets {
			script := wrkScript(b, dir, t.body, t.capture, fmt.Sprintf("r%d", round))
			before := processCPU(b)
			calls, secs, wrkCPU := runWrk(b, wrk, script, t.url)
			ours := processCPU(b) - before
			cost[i] = append(cost[i], float64((ours+wrkCPU).Microseconds())/float64(calls))
			rate[i] = append(rate[i], float64(calls)/secs)
		}
	}
	med := func(v []float64) float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		return s[len(s)/2]
	}
	direct := med(cost[0])
	added := make([]float64, len(targets))
	for i, t := range targets {
		b.ReportMetric(med(rate[i]), t.name+"-calls/s")
		if i > 0 {
			added[i] = med(cost[i]) - direct
			b.ReportMetric(added[i], t.name+"-added-cpu-µs/call")
		}
	}
	b.ReportMetric(direct, "direct-cpu-µs/call")
	if added[1] > 0 {
		b.ReportMetric(added[2]/added[1], "modelserver/reverseproxy")
		b.ReportMetric(added[3]/added[1], "capture/reverseproxy")
	}
}

// wrkScript writes wrk's Lua script: POST the body file; with capture,
// each call under a capture key of its own (the round, wrk's thread and a
// count), as a rollout's calls each append to its ledger.
func wrkScript(b *testing.B, dir, bodyFile string, capture bool, round string) string {
	b.Helper()
	s := fmt.Sprintf(`local f = assert(io.open(%q, "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
`, bodyFile)
	if capture {
		s += fmt.Sprintf(`local threads = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end
local n = 0
function request()
  n = n + 1
  return wrk.format(nil, string.format("/ng-rollout/wrk-%s-%%d-%%d/v1/chat/completions", tid, n))
end
`, round)
	}
	p := filepath.Join(dir, "script-"+strconv.FormatBool(capture)+"-"+round+".lua")
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		b.Fatal(err)
	}
	return p
}

var (
	wrkDone   = regexp.MustCompile(`(\d+) requests in ([0-9.]+)(us|ms|s|m)`)
	wrkErrors = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)|Socket errors: .*`)
)

// runWrk drives url for wrkSeconds and returns the calls completed, the
// seconds they took and wrk's own CPU time. Any failed call fails the
// benchmark.
func runWrk(b *testing.B, wrk, script, url string) (calls int, secs float64, cpu time.Duration) {
	b.Helper()
	cmd := exec.Command(wrk, "-t2", "-c32", "-d"+strconv.Itoa(wrkSeconds)+"s", "-s", script, url)
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("wrk %s: %v\n%s", url, err, out)
	}
	if m := wrkErrors.FindSubmatch(out); m != nil {
		b.Fatalf("wrk %s: calls failed: %s\n%s", url, m[0], out)
	}
	m := wrkDone.FindSubmatch(out)
	if m == nil {
		b.Fatalf("wrk %s: no request count in its output:\n%s", url, out)
	}
	calls, _ = strconv.Atoi(string(m[1]))
	secs, _ = strconv.ParseFloat(string(m[2]), 64)
	switch string(m[3]) {
	case "us":
		secs /= 1e6
	case "ms":
		secs /= 1e3
	case "m":
		secs *= 60
	}
	if calls == 0 {
		b.Fatalf("wrk %s completed no call:\n%s", url, out)
	}
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		b.Fatal("no resource usage for wrk")
	}
	return calls, secs, time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
