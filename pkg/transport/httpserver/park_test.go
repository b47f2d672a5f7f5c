package httpserver_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gymfleet/gymfleet/pkg/infra/park"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
)

// parkedRoute serves /park with a handler that holds a wait and hands it
// to the test, which resumes it with the reply's step.
type parkedRoute struct {
	waits chan parkedWait
}

type parkedWait struct {
	w   *park.Wait
	r   *http.Request
	out func(v any, err error)
}

func newParkedRoute(t *testing.T, st httpconf.Stack) (*serving, *parkedRoute, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	pr := &parkedRoute{waits: make(chan parkedWait, 1000)}
	r := httpserver.NewRouter(httpserver.RouterOptions{Registry: reg})
	r.Post("/park", httpserver.HandleParked(nil, func(task *park.Task, req *http.Request, reply func(any, error)) {
		if _, err := httpserver.ReadBody(req); err != nil {
			reply(nil, err)
			return
		}
		pr.waits <- parkedWait{w: task.Hold(), r: req, out: reply}
	}))
	return startOn(t, st, r), pr, reg
}

// handlerGoroutines counts goroutines inside Park: a parked request's
// handler waiting on its goroutine.
func handlerGoroutines() int {
	buf := make([]byte, 1<<24)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "httpserver.Park(") {
			n++
		}
	}
	return n
}

// A parked handler's request holds no goroutine on the lean HTTP/2 stack,
// and its handler's goroutine on the others, and is answered by the step
// its wait resumes.
func TestPark_RepliesFromTheResumedStep(t *testing.T) {
	for _, c := range []struct {
		stack       httpconf.Stack
		h2c         bool
		goroutineOf bool // the parked request keeps its handler's goroutine
	}{
		{httpconf.StackLean, true, false},
		{httpconf.StackLean, false, true},
		{httpconf.StackNetHTTP, true, true},
	} {
		t.Run(fmt.Sprintf("%s/h2c=%v", c.stack, c.h2c), func(t *testing.T) {
			s, pr, reg := newParkedRoute(t, c.stack)
			cl := newClientOn(t, c.stack, c.h2c)
			const n = 50
			type result struct {
				code int
				body string
				err  error
			}
			results := make(chan result, n)
			for i := range n {
				go func() {
					resp, err := cl.Post(s.URL()+"/park", "application/json", strings.NewReader(fmt.Sprintf(`{"i":%d}`, i)))
					if err != nil {
						results <- result{err: err}
						return
					}
					defer resp.Body.Close()
					b, err := io.ReadAll(resp.Body)
					results <- result{resp.StatusCode, string(b), err}
				}()
			}
			var waits []parkedWait
			for range n {
				waits = append(waits, <-pr.waits)
			}
			waitFor(t, "every handler to return or park", func() bool {
				got := handlerGoroutines()
				if c.goroutineOf {
					return got == n
				}
				return got == 0
			})
			if got := testutil.ToFloat64(gaugeOf(t, reg, "gymfleet_http_requests_in_flight")); got != n {
				t.Fatalf("in-flight gauge = %v with %d requests parked, want %d", got, n, n)
			}
			for i, pw := range waits {
				if i%2 == 0 {
					pw.w.Resume(func() { pw.out(map[string]string{"step": "resumed", "ctx": fmt.Sprint(pw.r.Context().Err())}, nil) })
				} else {
					go pw.w.ResumeHere(func() { pw.out(map[string]string{"step": "resumed", "ctx": fmt.Sprint(pw.r.Context().Err())}, nil) })
				}
			}
			for range n {
				r := <-results
				if r.err != nil || r.code != http.StatusOK || !strings.Contains(r.body, `"step":"resumed"`) || !strings.Contains(r.body, `"ctx":"\u003cnil\u003e"`) {
					t.Fatalf("parked request got %d %q %v, want 200 from the resumed step with its context live", r.code, r.body, r.err)
				}
			}
			waitFor(t, "the in-flight gauge to drop", func() bool {
				return testutil.ToFloat64(gaugeOf(t, reg, "gymfleet_http_requests_in_flight")) == 0
			})
		})
	}
}

func gaugeOf(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	return collectorFunc(func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatalf("no metric %s", name)
		return 0
	})
}

// collectorFunc is a gauge read from f, for testutil.ToFloat64.
type collectorFunc func() float64

func (f collectorFunc) Describe(ch chan<- *prometheus.Desc) {
	ch <- prometheus.NewDesc("read", "read", nil, nil)
}

func (f collectorFunc) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc("read", "read", nil, nil), prometheus.GaugeValue, f())
}

// A step that panics is answered as a handler's panic is: 500 in the
// fleet's envelope, or, for http.ErrAbortHandler, a reset stream.
func TestPark_PanicInAResumedStep(t *testing.T) {
	forStacks(t, func(t *testing.T, st httpconf.Stack) {
		s, pr, _ := newParkedRoute(t, st)
		cl := newClientOn(t, st, true)
		post := func() (int, string, error) {
			resp, err := cl.Post(s.URL()+"/park", "application/json", strings.NewReader(`{}`))
			if err != nil {
				return 0, "", err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b), err
		}
		type result struct {
			code int
			body string
			err  error
		}
		got := make(chan result, 1)
		go func() { c, b, err := post(); got <- result{c, b, err} }()
		(<-pr.waits).w.Resume(func() { panic("boom") })
		if r := <-got; r.err != nil || r.code != http.StatusInternalServerError || !strings.Contains(r.body, `"code":"internal"`) {
			t.Fatalf("a step's panic got %d %q %v, want 500 internal", r.code, r.body, r.err)
		}
		go func() { c, b, err := post(); got <- result{c, b, err} }()
		(<-pr.waits).w.Resume(func() { panic(http.ErrAbortHandler) })
		if r := <-got; r.err == nil {
			t.Fatalf("a step's ErrAbortHandler got %d %q, want the stream reset", r.code, r.body)
		}
	})
}

// A client that goes away cancels a parked request's context, which is
// what its waits watch.
func TestPark_ClientGoneCancelsTheContext(t *testing.T) {
	s, pr, _ := newParkedRoute(t, httpconf.StackLean)
	cl := newClientOn(t, httpconf.StackLean, true)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/park", strings.NewReader(`{}`))
		resp, err := cl.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	pw := <-pr.waits
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request = %v", err)
	}
	<-pw.r.Context().Done()
	done := make(chan struct{})
	pw.w.Resume(func() {
		pw.out(nil, context.Cause(pw.r.Context()))
		close(done)
	})
	<-done
}

// Close waits for a parked request as for any other in flight.
func TestPark_CloseWaitsForAParkedRequest(t *testing.T) {
	forStacks(t, func(t *testing.T, st httpconf.Stack) {
		s, pr, _ := newParkedRoute(t, st)
		cl := newClientOn(t, st, true)
		type result struct {
			code int
			err  error
		}
		got := make(chan result, 1)
		go func() {
			resp, err := cl.Post(s.URL()+"/park", "application/json", strings.NewReader(`{}`))
			if err != nil {
				got <- result{err: err}
				return
			}
			resp.Body.Close()
			got <- result{code: resp.StatusCode}
		}()
		pw := <-pr.waits
		closed := make(chan error, 1)
		go func() { closed <- s.Close(context.Background()) }()
		waitFor(t, "the listener refuses connections", func() bool {
			conn, err := net.Dial("tcp", s.Addr())
			if err != nil {
				return true
			}
			conn.Close()
			return false
		})
		select {
		case err := <-closed:
			t.Fatalf("Close returned (%v) while a request was parked", err)
		default:
		}
		var once sync.Once
		pw.w.Resume(func() { once.Do(func() { pw.out(map[string]string{"step": "after close began"}, nil) }) })
		if r := <-got; r.err != nil || r.code != http.StatusOK {
			t.Fatalf("parked request got %d %v, want 200", r.code, r.err)
		}
		if err := <-closed; err != nil {
			t.Fatalf("Close: %v", err)
		}
		s.served(t)
	})
}
