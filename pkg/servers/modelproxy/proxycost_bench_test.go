package modelproxy_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
)

// proxyCostConns is how many keep-alive connections the load keeps busy at
// once, as wrk -c32 does.
const proxyCostConns = 32

// proxyCostRound is how many calls one target gets before the next target's
// turn: the targets take turns so that a change in the machine's load falls
// on all of them alike.
const proxyCostRound = 2000

// BenchmarkProxyCPUPerCall is the model server's cost per call set against
// httputil.ReverseProxy's (issue 34): the CPU time one chat completion adds
// when it goes through a proxy rather than straight to the upstream, for
// the reverse proxy, the model server without capture (plain
// /v1/chat/completions), with capture (/ng-rollout/<key>/..., a ledger
// row per call), and with capture and checkpointing on. Every hop speaks HTTP/1.1 with keep-alive, as a wrk load
// and vLLM's uvicorn do. The upstream answers at once with a reply that
// fakeinference gave for the same request (token ids and log-probs in
// vLLM's shape), so the upstream's own CPU is the same on every path and
// the difference from the direct path is what the proxy adds.
//
// b.N is the number of calls per target; the targets take turns in rounds.
// It reports each target's added CPU in µs per call and the two ratios the
// issue bounds (model server ≤ 1.5× the reverse proxy, with capture ≤ 2.5×).
// Run it with e.g. -benchtime=20000x -count=5 and read the medians.
func BenchmarkProxyCPUPerCall(b *testing.B) {
	upstreamBody, upstream, reverseProxy := cannedUpstreamAndReverseProxy(b)

	newServer := func(ck ctlplane.Config) *modelproxy.Server {
		cfg := modelproxy.DefaultConfig()
		cfg.Listen = "127.0.0.1:0"
		cfg.Upstream.BaseURL, cfg.Upstream.Protocol = upstream+"/v1", modelproxy.ProtocolHTTP1
		cfg.Capture.Dir = b.TempDir()
		cfg.Checkpoint = ck
		server, err := modelproxy.New(cfg, modelproxy.Deps{})
		if err != nil {
			b.Fatal(err)
		}
		serveForBench(b, server)
		return server
	}
	server := newServer(ctlplane.DefaultConfig())
	// The same with checkpointing on (the ticket registry, the delivery gate
	// and the epoch fence on every call), as a fleet runs it.
	participant := newServer(ctlplane.Config{Enabled: true, ControlAuthToken: "bench", LeaseGraceSeconds: 600, Root: b.TempDir()})

	clientBody := weatherChat(b, false)
	targets := []struct {
		name string
		url  func(call int) string
		body []byte
	}{
		// The direct path and the reverse proxy send what the model server
		// would send upstream, so the upstream sees one request on all paths.
		{"direct", func(int) string { return upstream + "/v1/chat/completions" }, upstreamBody},
		{"reverseproxy", func(int) string { return reverseProxy + "/v1/chat/completions" }, upstreamBody},
		{"modelserver", func(int) string { return server.URL() + "/v1/chat/completions" }, clientBody},
		{"modelserver-capture", func(call int) string {
			return fmt.Sprintf("%s/ng-rollout/cost-%d/v1/chat/completions", server.URL(), call)
		}, clientBody},
		{"modelserver-capture-checkpointing", func(call int) string {
			return fmt.Sprintf("%s/ng-rollout/cost-%d/v1/chat/completions", participant.URL(), call)
		}, clientBody},
	}
	client := &http.Client{Transport: newHTTP1Transport()}
	b.Cleanup(client.CloseIdleConnections)

	cpu := make([]time.Duration, len(targets))
	calls := make([]int, len(targets))
	run := func(i, n int) {
		before := processCPU(b)
		loadCalls(b, client, n, calls[i], targets[i].url, targets[i].body)
		cpu[i] += processCPU(b) - before
		calls[i] += n
	}
	for i := range targets { // connections, the ledger's first segment
		run(i, 4*proxyCostConns)
	}
	clear(cpu)
	clear(calls)
	b.ResetTimer()
	for done := 0; done < b.N; done += proxyCostRound {
		n := min(proxyCostRound, b.N-done)
		for i := range targets {
			run(i, n)
		}
	}
	b.StopTimer()

	perCall := func(i int) float64 { return float64(cpu[i].Microseconds()) / float64(calls[i]) }
	direct := perCall(0)
	added := make([]float64, len(targets))
	for i := 1; i < len(targets); i++ {
		added[i] = perCall(i) - direct
		b.ReportMetric(added[i], targets[i].name+"-added-cpu-µs/call")
	}
	b.ReportMetric(direct, "direct-cpu-µs/call")
	if added[1] > 0 {
		b.ReportMetric(added[2]/added[1], "modelserver/reverseproxy")
		b.ReportMetric(added[3]/added[1], "capture/reverseproxy")
		b.ReportMetric(added[4]/added[1], "checkpointing/reverseproxy")
	}
}

// cannedUpstreamAndReverseProxy serves cannedUpstream's reply at once to
// every request, and httputil.ReverseProxy in front of it: the two
// baselines every proxy-cost benchmark measures the model server against.
// It returns the request the model server would send upstream and the
// two base URLs.
func cannedUpstreamAndReverseProxy(b *testing.B) (upstreamBody []byte, upstream, reverseProxy string) {
	b.Helper()
	upstreamBody, reply := cannedUpstream(b)
	upstream = serveHTTP1(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(reply)
	}))

	target, err := url.Parse(upstream)
	if err != nil {
		b.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = newHTTP1Transport()
	reverseProxy = serveHTTP1(b, rp)
	return upstreamBody, upstream, reverseProxy
}

// cannedUpstream asks a zero-latency fakeinference for the reply to the
// request the model server sends upstream, and returns that request and
// reply.
func cannedUpstream(b *testing.B) (request, reply []byte) {
	b.Helper()
	worker := zeroLatencyWorker(b)
	request = weatherChat(b, true)
	client := httpclient.New(httpclient.Options{})
	defer client.CloseIdleConnections()
	rep, err := httpclient.Do(context.Background(), client, http.MethodPost, worker.URL()+"/v1/chat/completions", nil, request)
	if err != nil || !rep.OK() {
		b.Fatalf("fakeinference: %v %v", err, rep)
	}
	if !bytes.Contains(rep.Body, []byte(`"token_ids"`)) || !bytes.Contains(rep.Body, []byte(`"prompt_token_ids"`)) {
		b.Fatalf("fakeinference's reply carries no token ids: %s", rep.Body)
	}
	return request, rep.Body
}

// loadCalls makes n calls from proxyCostConns goroutines, each on its own
// keep-alive connection, numbering them from first.
func loadCalls(b *testing.B, client *http.Client, n, first int, target func(int) string, body []byte) {
	b.Helper()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		next = first
		fail error
	)
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if next-first >= n || fail != nil {
			return 0, false
		}
		next++
		return next - 1, true
	}
	for range proxyCostConns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				call, ok := take()
				if !ok {
					return
				}
				if err := postOnce(client, target(call), body); err != nil {
					mu.Lock()
					fail = err
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if fail != nil {
		b.Fatal(fail)
	}
}

func postOnce(client *http.Client, target string, body []byte) error {
	resp, err := client.Post(target, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", target, resp.Status)
	}
	return nil
}

// newHTTP1Transport keeps a keep-alive connection per concurrent caller.
func newHTTP1Transport() *http.Transport {
	return &http.Transport{
		MaxIdleConnsPerHost: 2 * proxyCostConns,
		ForceAttemptHTTP2:   false,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}
}

// serveHTTP1 serves h over HTTP/1.1 on loopback until the benchmark ends.
func serveHTTP1(b *testing.B, h http.Handler) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	b.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return "http://" + ln.Addr().String()
}

// processCPU is the user and system CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
