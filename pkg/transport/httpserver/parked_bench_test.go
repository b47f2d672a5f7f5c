package httpserver_test

import (
	"context"
	"io"
	"net/http"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
)

// parkedRequests is how many requests each op holds at once.
const parkedRequests = 4000

// BenchmarkParkedHop measures what one server in a chain of synchronous
// HTTP/2 calls costs per request held further down the chain: the memory
// a rollout held at a model call keeps in each of the environment, agent
// and model servers only by waiting for its reply. It holds parkedRequests
// requests at an upstream server, once sent to it directly and once
// through a proxy server (our router and server, a handler that calls the
// upstream with our client), and reports the difference per request after
// collections have shrunk every stack: the proxy's handler goroutine (its
// stack parked in the client call), net/http's per-stream state and 4 KiB
// response buffer, the client's stream and its writer goroutine.
//
// "bare" proxies with a plain handler, "router" through NewRouter's
// middleware, and "deep" adds twelve frames holding 3 KiB of locals
// between the handler and the call, as the fleet's handlers have (the
// environment's parks 9 KiB deep). The figures are the reported metrics;
// the time per op is only setup.
func BenchmarkParkedHop(b *testing.B) {
	for _, c := range []struct {
		name   string
		router bool
		depth  int
	}{
		{"bare", false, 0},
		{"router", true, 0},
		{"deep", true, 3 << 10},
	} {
		b.Run(c.name, func(b *testing.B) {
			var hop parkedCost
			for b.Loop() {
				direct := measureParked(b, false, false, 0)
				proxied := measureParked(b, true, c.router, c.depth)
				hop = proxied.minus(direct)
			}
			b.ReportMetric(hop.heap, "heap-B/held")
			b.ReportMetric(hop.stacks, "stack-B/held")
			b.ReportMetric(hop.heap+hop.stacks, "B/held")
			b.ReportMetric(hop.goroutines, "goroutines/held")
		})
	}
}

// parkedCost is memory per held request.
type parkedCost struct{ heap, stacks, goroutines float64 }

func (p parkedCost) minus(q parkedCost) parkedCost {
	return parkedCost{p.heap - q.heap, p.stacks - q.stacks, p.goroutines - q.goroutines}
}

// measureParked holds parkedRequests requests at an upstream server, sent
// to it directly or through a proxy, and returns the memory per request
// they hold once collected.
func measureParked(b *testing.B, viaProxy, router bool, depth int) parkedCost {
	b.StopTimer()
	defer b.StartTimer()
	release := make(chan struct{})
	var held atomic.Int64
	allHeld := make(chan struct{})
	upstream := start(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("warm") {
			_, _ = io.WriteString(w, "{}")
			return
		}
		if held.Add(1) == parkedRequests {
			close(allHeld)
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		_, _ = io.WriteString(w, "{}")
	}))
	client := newClient(b, true)
	target := upstream.URL() + "/held"
	if viaProxy {
		proxyClient := newClient(b, true)
		var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			forward(w, r, proxyClient, upstream.URL()+r.URL.RequestURI(), depth)
		})
		if router {
			rt := httpserver.NewRouter(httpserver.RouterOptions{})
			rt.Post("/held", h.ServeHTTP)
			h = rt
		}
		target = start(b, h).URL() + "/held"
	}

	// Connections opened and every pool warmed before the baseline.
	warm(b, client, target)
	before := parkedMemory()
	var wg sync.WaitGroup
	for range parkedRequests {
		wg.Go(func() {
			rep, err := httpclient.Do(context.Background(), client, http.MethodPost, target, nil, struct{}{})
			if err == nil && !rep.OK() {
				err = rep.Err("held request")
			}
			if err != nil {
				b.Error(err)
			}
		})
	}
	select {
	case <-allHeld:
	case <-time.After(time.Minute):
		b.Fatalf("%d of %d requests held after a minute", held.Load(), parkedRequests)
	}
	after := parkedMemory()
	close(release)
	wg.Wait()
	n := float64(parkedRequests)
	return parkedCost{
		heap:       (after.heap - before.heap) / n,
		stacks:     (after.stacks - before.stacks) / n,
		goroutines: (after.goroutines - before.goroutines) / n,
	}
}

// forward calls url with r's body through c after depth bytes of frames,
// and writes the reply.
func forward(w http.ResponseWriter, r *http.Request, c *http.Client, url string, depth int) {
	if depth > 0 {
		var pad [256]byte
		forward(w, r, c, url, depth-len(pad))
		touch(&pad)
		return
	}
	rep, err := httpclient.Do(r.Context(), c, http.MethodPost, url, nil, struct{}{})
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	httpserver.WriteRawJSON(w, rep.Status, rep.Body)
}

// touch keeps a frame's padding on the stack.
//
//go:noinline
func touch(pad *[256]byte) { pad[0]++ }

// warm sends a few requests through target, answered at once, so that
// connections and pools exist before the baseline is read.
func warm(b *testing.B, c *http.Client, target string) {
	b.Helper()
	for i := range 8 {
		rep, err := httpclient.Do(context.Background(), c, http.MethodPost, target+"?warm="+strconv.Itoa(i), nil, struct{}{})
		if err != nil || !rep.OK() {
			b.Fatalf("warm-up request: %v %+v", err, rep)
		}
	}
}

// memoryNow is the live heap, the goroutine stacks and the goroutine count
// after collections: a collection halves a stack using under a quarter of
// it, so a few of them leave every parked stack at its smallest size.
type memoryNow struct{ heap, stacks, goroutines float64 }

func parkedMemory() memoryNow {
	for range 4 {
		runtime.GC()
	}
	samples := []metrics.Sample{
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/stacks:bytes"},
		{Name: "/sched/goroutines:goroutines"},
	}
	metrics.Read(samples)
	return memoryNow{
		heap:       float64(samples[0].Value.Uint64()),
		stacks:     float64(samples[1].Value.Uint64()),
		goroutines: float64(samples[2].Value.Uint64()),
	}
}
