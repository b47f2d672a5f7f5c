package modelproxy_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver/h2ctest"
)

// startModelOn serves a model server in front of several workers.
func startModelOn(t *testing.T, dir string, ck ctlplane.Config, urls ...string) *model {
	t.Helper()
	return startModel(t, "unused", dir, ck, func(c *modelproxy.Config) {
		c.Upstream.BaseURL = ""
		for _, u := range urls {
			c.Upstream.BaseURLs = append(c.Upstream.BaseURLs, u+"/v1")
		}
	})
}

// workerMetric reads a per-worker series of the model server's /metrics.
func workerMetric(t *testing.T, m *model, name, worker string) float64 {
	t.Helper()
	status, body := m.get(t, "/metrics")
	if status != http.StatusOK {
		t.Fatalf("/metrics: %d", status)
	}
	prefix := fmt.Sprintf(`%s{worker="%s/v1"} `, name, worker)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			var f float64
			if _, err := fmt.Sscanf(v, "%g", &f); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			return f
		}
	}
	return 0
}

// keysOf is the set of capture keys a worker saw.
func keysOf(t *testing.T, w *worker) map[string]int {
	out := map[string]int{}
	for _, c := range w.calls(t) {
		if c.CaptureKey != nil {
			out[*c.CaptureKey]++
		}
	}
	return out
}

// Every call of a rollout goes to one worker, and rollouts spread over
// both workers.
func TestWorkers_RolloutStaysOnItsWorkerAndLoadSpreads(t *testing.T) {
	t.Parallel()
	w0, w1 := startWorker(t, 0), startWorker(t, 0)
	m := startModelOn(t, t.TempDir(), ctlplane.Config{}, w0.url, w1.url)
	keys := []string{"spread-0", "spread-1", "spread-2", "spread-3"}
	for round := range 3 {
		for _, k := range keys {
			m.mustCall(t, k, chatPath, chatRequest(fmt.Sprintf("%s call %d", k, round), "ok"))
		}
	}
	on0, on1 := keysOf(t, w0), keysOf(t, w1)
	for _, k := range keys {
		if on0[k]+on1[k] != 3 || (on0[k] != 0 && on1[k] != 0) {
			t.Fatalf("rollout %s: %d calls on worker 0, %d on worker 1; want all 3 on one", k, on0[k], on1[k])
		}
	}
	if len(on0) == 0 || len(on1) == 0 {
		t.Fatalf("rollouts on worker 0 %v, on worker 1 %v: want both used", on0, on1)
	}
	for _, w := range []*worker{w0, w1} {
		if got := workerMetric(t, m, "gymfleet_model_worker_outstanding_calls", w.url); got != 0 {
			t.Fatalf("outstanding calls on %s after every call ended: %g", w.url, got)
		}
	}
}

// deadURL is the URL of a port nothing listens on.
func deadURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return "http://" + addr
}

// A worker that refuses connections never loses a call: the call, which it
// provably never processed, goes to the live worker, and so do the
// rollout's later calls. The server stays ready.
func TestWorkers_FailsOverFromADeadWorker(t *testing.T) {
	t.Parallel()
	dead, live := deadURL(t), startWorker(t, 0)
	m := startModelOn(t, t.TempDir(), ctlplane.Config{}, dead, live.url)
	keys := []string{"fo-0", "fo-1", "fo-2"}
	for _, k := range keys {
		m.mustCall(t, k, chatPath, chatRequest(k+" first", "ok"))
		m.mustCall(t, k, chatPath, chatRequest(k+" second", "ok"))
	}
	got := keysOf(t, live)
	for _, k := range keys {
		if got[k] != 2 {
			t.Fatalf("live worker saw %d calls of %s, want 2: %v", got[k], k, got)
		}
	}
	if n := workerMetric(t, m, "gymfleet_model_worker_failures_total", dead); n < 1 {
		t.Fatalf("failures of the dead worker = %g, want at least 1", n)
	}
	if n := workerMetric(t, m, "gymfleet_model_worker_failovers_total", dead); n < 1 {
		t.Fatalf("failovers from the dead worker = %g, want at least 1", n)
	}
	if st, body := m.get(t, "/readyz"); st != http.StatusOK {
		t.Fatalf("/readyz with one live worker: %d %s", st, body)
	}
}

// A checkpoint asks each worker to cut the calls generating on it (one
// request per worker, holding fewer calls than one inventory lists), and
// each cut call continues on the worker that staged its prefix.
func TestWorkers_GenerationCutAsksEveryWorker(t *testing.T) {
	t.Parallel()
	w0, w1 := startWorker(t, cutTPS), startWorker(t, cutTPS)
	m := startModelOn(t, t.TempDir(), ctlplanetest.Config(), w0.url, w1.url)
	body := chatRequest("tell me a long story", words(30))
	a := m.callAsync("cuta", chatPath, body)
	b := m.callAsync("cutb", chatPath, body)
	generating := func(w *worker) string {
		for _, c := range w.calls(t) {
			if c.Status == fakeinference.StatusGenerating && c.CompletionTokens >= 3 {
				return c.CallID
			}
		}
		return ""
	}
	waitFor(t, "a call generating on each worker", func() bool { return generating(w0) != "" && generating(w1) != "" })
	cut0, cut1 := generating(w0), generating(w1)
	prep := m.mustOp(t, "prepare", ckReq("cut1"))
	rep, _ := prep["report"].(map[string]any)
	counts, _ := rep["counts"].(map[string]any)
	if prep["phase"] != "prepared" || counts["cut"] != float64(2) || counts["cut_failed"] != float64(0) {
		t.Fatalf("prepare = %v, want prepared with two cuts", prep)
	}
	for i, want := range []struct {
		w    *worker
		call string
	}{{w0, cut0}, {w1, cut1}} {
		rounds, err := want.w.ctl.Cuts(context.Background())
		if err != nil || len(rounds) != 1 || !slices.Equal(rounds[0], []string{want.call}) {
			t.Fatalf("worker %d cut rounds = %v %v, want [[%s]]", i, rounds, err, want.call)
		}
	}
	m.mustOp(t, "resume", ckReq("cut1"))
	for _, ch := range []<-chan result{a, b} {
		if r := await(t, "a cut call", ch); r.err != nil || r.status != http.StatusOK {
			t.Fatalf("cut call: %d %s %v", r.status, r.body, r.err)
		}
	}
	for i, want := range []struct {
		w    *worker
		call string
	}{{w0, cut0}, {w1, cut1}} {
		calls := want.w.calls(t)
		last := calls[len(calls)-1]
		if len(calls) != 2 || last.ContinuedFrom == nil || *last.ContinuedFrom != want.call {
			t.Fatalf("worker %d: %d calls, last continued from %v; want the cut %s continued there", i, len(calls), last.ContinuedFrom, want.call)
		}
	}
}

// A worker holding more calls than one inventory lists is sent several,
// each answered by its own receipt: every call is cut once, and each
// continues from its own prefix after the resume.
func TestWorkers_GenerationCutInParts(t *testing.T) {
	t.Parallel()
	w := startWorker(t, cutTPS)
	m := startModel(t, w.url, t.TempDir(), ctlplanetest.Config(), func(c *modelproxy.Config) {
		c.GenerationCuts.InventoryCalls = 2
	})
	body := chatRequest("tell me a long story", words(30))
	keys := []string{"parta", "partb", "partc", "partd", "parte"}
	pending := make([]<-chan result, len(keys))
	for i, k := range keys {
		pending[i] = m.callAsync(k, chatPath, body)
	}
	generating := func() []string {
		var ids []string
		for _, c := range w.calls(t) {
			if c.Status == fakeinference.StatusGenerating && c.CompletionTokens >= 3 {
				ids = append(ids, c.CallID)
			}
		}
		return ids
	}
	waitFor(t, "every call generating", func() bool { return len(generating()) == len(keys) })
	want := generating()
	prep := m.mustOp(t, "prepare", ckReq("parts1"))
	rep, _ := prep["report"].(map[string]any)
	counts, _ := rep["counts"].(map[string]any)
	if prep["phase"] != "prepared" || counts["cut"] != float64(len(keys)) || counts["cut_failed"] != float64(0) {
		t.Fatalf("prepare = %v, want prepared with %d cuts", prep, len(keys))
	}
	rounds, err := w.ctl.Cuts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	sizes := make([]int, 0, len(rounds))
	for _, r := range rounds {
		listed = append(listed, r...)
		sizes = append(sizes, len(r))
	}
	slices.Sort(sizes)
	slices.Sort(listed)
	slices.Sort(want)
	if !slices.Equal(sizes, []int{1, 2, 2}) || !slices.Equal(listed, want) {
		t.Fatalf("cut rounds %v (sizes %v), want the %d generating calls %v in parts of at most 2", rounds, sizes, len(want), want)
	}
	m.mustOp(t, "resume", ckReq("parts1"))
	for _, ch := range pending {
		if r := await(t, "a cut call", ch); r.err != nil || r.status != http.StatusOK {
			t.Fatalf("cut call: %d %s %v", r.status, r.body, r.err)
		}
	}
	continued := map[string]bool{}
	for _, c := range w.calls(t) {
		if c.ContinuedFrom != nil {
			continued[*c.ContinuedFrom] = true
		}
	}
	for _, id := range want {
		if !continued[id] {
			t.Errorf("cut call %s was not continued from its prefix", id)
		}
	}
}

// After a crash, a restored cut's continuation may first go to a worker
// that does not hold its prefix: that worker refuses it (nothing is
// generated), and the call goes on to the worker that staged the prefix,
// where it continues instead of regenerating.
func TestWorkers_RestoredCutContinuesOnTheWorkerHoldingIt(t *testing.T) {
	t.Parallel()
	f := newCutFixture(t, "wcut-1")
	_, prefix := f.check(t)
	f.m.stop()
	await(t, "the cut call", f.pending)
	await(t, "the constrained call", f.other)

	other := startWorker(t, 0)
	// The worker without the prefix is listed first: a fresh picker tries
	// it first.
	m2 := startModelOn(t, f.dir, ctlplanetest.Config(), other.url, f.w.url)
	m2.mustOp(t, "restore", restoreReq("cut1", f.dir, f.key))
	m2.mustOp(t, "resume", ckReq("cut1"))
	m2.mustCall(t, "wcut-1-a1", chatPath, f.body)
	calls := f.w.callsOf(t, "wcut-1-a1")
	if len(calls) != 1 || calls[0].ContinuedFrom == nil || *calls[0].ContinuedFrom != f.cutCall.CallID || calls[0].ReusedPrefixTokens != prefix {
		t.Fatalf("calls on the prefix's worker = %+v, want one continuing %s", calls, f.cutCall.CallID)
	}
	if got := other.callsOf(t, "wcut-1-a1"); len(got) != 0 {
		t.Fatalf("the other worker generated %+v", got)
	}
	if n := workerMetric(t, m2, "gymfleet_model_worker_failures_total", other.url); n != 0 {
		t.Fatalf("a refused continuation counted as a worker failure: %g", n)
	}
	if n := workerMetric(t, m2, "gymfleet_model_worker_failovers_total", other.url); n != 1 {
		t.Fatalf("failovers from the worker without the prefix = %g, want 1 (it refused the continuation)", n)
	}
}

// lossyFront stands in front of worker w and closes the connection under
// the first chat call it reads, after beforeDrop returns (nil: at once);
// calls counts the chat calls it read.
func lossyFront(t *testing.T, w *worker, beforeDrop func()) (front *httptest.Server, calls *atomic.Int32) {
	t.Helper()
	target, err := url.Parse(w.url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	type connKey struct{}
	calls = new(atomic.Int32)
	front = h2ctest.Start(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/chat/completions") && calls.Add(1) == 1 {
			io.Copy(io.Discard, r.Body)
			if beforeDrop != nil {
				beforeDrop()
			}
			r.Context().Value(connKey{}).(net.Conn).Close()
			return
		}
		proxy.ServeHTTP(rw, r)
	}), func(s *http.Server) {
		s.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		}
	})
	return front, calls
}

// A call whose connection to its worker is lost after the request went out
// is sent again, as NeMo Gym's own client sends a request again after
// ServerDisconnectedError: the reply was lost with the connection, and
// nothing of the call was captured or delivered.
func TestWorkers_CallLostWithItsConnectionIsSentAgain(t *testing.T) {
	t.Parallel()
	w := startWorker(t, 0)
	front, calls := lossyFront(t, w, nil)

	m := startModelOn(t, t.TempDir(), ctlplane.Config{}, front.URL)
	m.mustCall(t, "lost-0", chatPath, chatRequest("lost first", "ok"))
	if n := calls.Load(); n != 2 {
		t.Fatalf("the front saw %d chat calls, want 2 (the lost one and its resend)", n)
	}
	if got := keysOf(t, w)["lost-0"]; got != 1 {
		t.Fatalf("the worker answered %d calls of lost-0, want 1", got)
	}
}

// A call lost with its connection while a checkpoint is open is not sent
// again until the checkpoint resumes: it waits held, as a cut call does.
func TestWorkers_CallLostWhilePreparedWaitsForResume(t *testing.T) {
	t.Parallel()
	w := startWorker(t, 0)
	arrived, drop := make(chan struct{}), make(chan struct{})
	front, calls := lossyFront(t, w, func() {
		close(arrived)
		<-drop
	})

	m := startModelOn(t, t.TempDir(), ctlplanetest.Config(), front.URL)
	pending := m.callAsync("lost-prepared", chatPath, chatRequest("lost while prepared", "ok"))
	<-arrived
	m.mustOp(t, "prepare", ckReq("c1"))
	close(drop)
	waitFor(t, "the lost call to be held", func() bool {
		held, _ := m.status(t)["held"].(float64)
		return held == 1
	})
	if n := calls.Load(); n != 1 {
		t.Fatalf("the front saw %d chat calls while the checkpoint was open, want 1", n)
	}
	notYet(t, "the lost call", pending)

	m.mustOp(t, "resume", ckReq("c1"))
	if r := await(t, "the lost call", pending); r.err != nil || r.status != http.StatusOK {
		t.Fatalf("lost call after resume: %d %s %v", r.status, r.body, r.err)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("the front saw %d chat calls, want 2 (the lost one and its resend)", n)
	}
}
