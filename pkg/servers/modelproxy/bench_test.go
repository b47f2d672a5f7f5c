package modelproxy_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// serveForBench runs a server until the benchmark ends.
func serveForBench(b *testing.B, s interface {
	Listen() error
	Serve() error
	Close(context.Context) error
}) {
	b.Helper()
	if err := s.Listen(); err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	b.Cleanup(func() {
		_ = s.Close(context.Background())
		<-done
	})
}

// zeroLatencyWorker serves a fakeinference that generates without delay
// until the benchmark ends.
func zeroLatencyWorker(b *testing.B) *fakeinference.Server {
	b.Helper()
	wcfg := fakeinference.DefaultConfig()
	wcfg.Listen, wcfg.TokensPerSecond, wcfg.MinCallSeconds = "127.0.0.1:0", 0, 0
	worker, err := fakeinference.New(wcfg, fakeinference.Deps{})
	if err != nil {
		b.Fatal(err)
	}
	serveForBench(b, worker)
	return worker
}

// weatherChat is a tool-calling chat request as a client sends it or, with
// upstream, as the model server sends it on: with the token parameters
// prepareChat (chat.go) adds to every call.
func weatherChat(b *testing.B, upstream bool) []byte {
	b.Helper()
	body := map[string]any{
		"model": "fake-model",
		"messages": []any{
			map[string]any{"role": "system", "content": "You are a weather assistant."},
			map[string]any{"role": "user", "content": `What is the weather in Paris? Call get_weather with {"city": "Paris"}.`},
		},
		"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "get_weather", "parameters": map[string]any{"type": "object"}}}},
	}
	if upstream {
		body["logprobs"], body["top_logprobs"], body["return_tokens_as_token_ids"], body["return_token_ids"] = true, 0, true, true
	}
	raw, err := codec.Marshal(body)
	if err != nil {
		b.Fatal(err)
	}
	return raw
}

// BenchmarkAddedLatency measures what the model proxy adds to one model
// call: the same chat request sent straight to fakeinference (generating
// without delay) and through the proxy with token capture (conversion of the
// token fields, a ledger row per call), one call at a time. It reports the
// median and p99 of both and of the difference, with checkpointing off (no
// control plane at all) and on (the ticket registry, the delivery gate and
// the fence on every call).
func BenchmarkAddedLatency(b *testing.B) {
	b.Run("checkpoint=off", func(b *testing.B) { benchAddedLatency(b, ctlplane.DefaultConfig()) })
	b.Run("checkpoint=on", func(b *testing.B) {
		benchAddedLatency(b, ctlplane.Config{Enabled: true, ControlAuthToken: "bench", LeaseGraceSeconds: 600, Root: os.TempDir()})
	})
}

func benchAddedLatency(b *testing.B, ck ctlplane.Config) {
	worker := zeroLatencyWorker(b)
	cfg := modelproxy.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Upstream.BaseURL, cfg.Upstream.H2C = worker.URL()+"/v1", true
	cfg.Capture.Dir = b.TempDir()
	cfg.Checkpoint = ck
	proxy, err := modelproxy.New(cfg, modelproxy.Deps{})
	if err != nil {
		b.Fatal(err)
	}
	serveForBench(b, proxy)
	client := httpclient.New(httpclient.Options{H2C: true})
	b.Cleanup(client.CloseIdleConnections)

	directBody, proxyBody := weatherChat(b, true), weatherChat(b, false)
	call := func(url string, body []byte) time.Duration {
		start := time.Now()
		rep, err := httpclient.Do(context.Background(), client, http.MethodPost, url, nil, body)
		if err != nil || !rep.OK() {
			b.Fatalf("%s: %v %v", url, err, rep)
		}
		return time.Since(start)
	}
	// Warm both paths (connections, ledger segment).
	for i := 0; i < 20; i++ {
		call(worker.URL()+"/v1/chat/completions", directBody)
		call(fmt.Sprintf("%s/ng-rollout/warm-%d/v1/chat/completions", proxy.URL(), i), proxyBody)
	}
	direct := make([]time.Duration, 0, b.N)
	proxied := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		direct = append(direct, call(worker.URL()+"/v1/chat/completions", directBody))
		proxied = append(proxied, call(fmt.Sprintf("%s/ng-rollout/bench-%d/v1/chat/completions", proxy.URL(), i), proxyBody))
	}
	b.StopTimer()
	added := make([]time.Duration, b.N)
	for i := range added {
		added[i] = proxied[i] - direct[i]
	}
	for _, s := range []struct {
		name string
		d    []time.Duration
	}{{"direct", direct}, {"proxied", proxied}, {"added", added}} {
		slices.Sort(s.d)
		b.ReportMetric(float64(s.d[len(s.d)/2].Microseconds()), s.name+"-p50-µs")
		b.ReportMetric(float64(s.d[len(s.d)*99/100].Microseconds()), s.name+"-p99-µs")
	}
}
