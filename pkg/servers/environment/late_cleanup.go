package environment

import (
	"container/heap"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/infra/backoff"
)

// lateCleanup sends again, in the background, the final-cleanup steps that
// got no answer within an episode's cleanup_timeout, until they are answered
// or cleanup_retry_window has passed since they first failed.
//
// The /run reply cannot wait for them: its budget is spent. But an
// unanswered close is not a refused one. After a restore of 100,000
// rollouts on two cores, every server's goroutines queue for a core for tens
// of seconds at a time, and thousands of closes per run timed out while the
// resources server was still there to answer them; each one left a session
// open for good (ours never expire sessions). Retried once the burst has
// passed, they are answered. A close is idempotent (the reference requires
// cleanup steps to be), so sending it again is safe; an answer that refuses
// it (4xx) is final and is not retried.
//
// What is pending is lost if the process dies, as the episode's own cleanup
// would be; retire is the crash-tolerant release.
type lateCleanup struct {
	log     *slog.Logger
	perTry  time.Duration // each attempt's budget: cleanup_timeout
	window  time.Duration // since the first failure
	workers int
	// maxPending bounds what is kept; a step past it is abandoned at once,
	// with a warning, rather than growing the heap without limit.
	maxPending int
	// backoff is the pause before attempt n+1 (n >= 1), before jitter.
	backoff func(n int) time.Duration
	now     func() time.Time

	metrics lateCleanupMetrics

	// stopped ends with close: it cancels the attempts in flight.
	stopped context.Context
	stop    context.CancelFunc

	mu     sync.Mutex
	steps  lateHeap
	wake   chan struct{} // buffered 1: the scheduler looks at the heap again
	work   chan *lateStep
	closed bool
	busy   int // steps taken by workers and not yet back or done
	wg     sync.WaitGroup
}

// lateStep is one cleanup step waiting to be sent again.
type lateStep struct {
	key      string // the episode's capture key, for the logs
	name     string
	fn       func(context.Context) error
	ctx      context.Context // the episode's request context, without its cancellation
	due      time.Time
	giveUp   time.Time
	attempts int
	lastErr  error
}

// lateCleanupMetrics are the late cleanup's metrics, registered once per server.
type lateCleanupMetrics struct {
	pending  prometheus.Gauge
	outcomes *prometheus.CounterVec
}

func newLateCleanupMetrics(reg prometheus.Registerer) lateCleanupMetrics {
	m := lateCleanupMetrics{
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gymfleet_env_cleanup_retries_pending",
			Help: "Final-cleanup steps that got no answer in time and wait to be sent again.",
		}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gymfleet_env_cleanup_retries_total",
			Help: "Final-cleanup steps sent again in the background, by outcome: done (answered), abandoned (refused, or unanswered past cleanup_retry_window).",
		}, []string{"outcome"}),
	}
	reg.MustRegister(m.pending, m.outcomes)
	return m
}

const (
	lateCleanupWorkers    = 32
	lateCleanupMaxPending = 1 << 20
)

func newLateCleanup(log *slog.Logger, perTry, window time.Duration, m lateCleanupMetrics) *lateCleanup {
	l := &lateCleanup{
		log:        log,
		perTry:     perTry,
		window:     window,
		workers:    lateCleanupWorkers,
		maxPending: lateCleanupMaxPending,
		backoff:    lateBackoff,
		now:        time.Now,
		metrics:    m,
		wake:       make(chan struct{}, 1),
		work:       make(chan *lateStep),
	}
	l.stopped, l.stop = context.WithCancel(context.Background())
	l.wg.Add(1 + l.workers)
	go l.schedule()
	for range l.workers {
		go l.serve()
	}
	return l
}

// lateBackoff doubles from 1 s to 30 s: the first retry comes after the
// burst that starved the call has usually passed, the later ones do not add
// a burst of their own.
func lateBackoff(n int) time.Duration {
	return backoff.Policy{Initial: time.Second, Max: 30 * time.Second}.Delay(n)
}

// retryable reports whether err is a step that got no answer: a refusal
// (4xx) is final.
func retryable(err error) bool {
	var up *upstreamError
	if errors.As(err, &up) {
		return up.status >= http.StatusInternalServerError
	}
	return err != nil
}

// add keeps a failed step to send again; it reports false when the step is
// not kept (refused, retries are off, the server is closing, or too many
// are pending), and then the caller's warning is the last word on it.
func (l *lateCleanup) add(ctx context.Context, key, name string, fn func(context.Context) error, err error) bool {
	if l == nil || l.window <= 0 || !retryable(err) {
		return false
	}
	now := l.now()
	st := &lateStep{key: key, name: name, fn: fn, ctx: context.WithoutCancel(ctx), giveUp: now.Add(l.window), attempts: 1, lastErr: err}
	st.due = now.Add(jitter(l.backoff(1)))
	l.mu.Lock()
	if l.closed || len(l.steps)+l.busy >= l.maxPending {
		l.mu.Unlock()
		return false
	}
	heap.Push(&l.steps, st)
	l.metrics.pending.Set(float64(len(l.steps) + l.busy))
	l.mu.Unlock()
	l.poke()
	return true
}

func (l *lateCleanup) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// schedule hands each step to a worker when it is due.
func (l *lateCleanup) schedule() {
	defer l.wg.Done()
	defer close(l.work)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		l.mu.Lock()
		var next *lateStep
		wait := time.Hour
		if len(l.steps) > 0 {
			if d := l.steps[0].due.Sub(l.now()); d <= 0 {
				next = heap.Pop(&l.steps).(*lateStep)
				l.busy++
			} else {
				wait = d
			}
		}
		l.mu.Unlock()
		if next != nil {
			select {
			case l.work <- next:
			case <-l.stopped.Done():
				// Taken from the heap before close counted what waits
				// there: abandoned here, not lost uncounted.
				l.finish(next, true)
				return
			}
			continue
		}
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-l.wake:
		case <-l.stopped.Done():
			return
		}
	}
}

// serve sends due steps again, one at a time.
func (l *lateCleanup) serve() {
	defer l.wg.Done()
	for st := range l.work {
		ctx, cancel := context.WithTimeout(st.ctx, l.perTry)
		// close cancels what is in flight, so its wait is short.
		unhook := context.AfterFunc(l.stopped, cancel)
		err := st.fn(ctx)
		unhook()
		cancel()
		st.attempts++
		if err == nil {
			l.metrics.outcomes.WithLabelValues("done").Inc()
			l.finish(st, false)
			continue
		}
		st.lastErr = err
		next := l.now().Add(jitter(l.backoff(st.attempts)))
		if !retryable(err) || next.After(st.giveUp) {
			l.abandon(st, "final cleanup step abandoned")
			l.finish(st, false)
			continue
		}
		st.due = next
		l.finish(st, true)
	}
}

// finish takes a step a worker had back: into the heap again, or gone.
func (l *lateCleanup) finish(st *lateStep, again bool) {
	l.mu.Lock()
	l.busy--
	if again && !l.closed {
		heap.Push(&l.steps, st)
	} else if again {
		l.mu.Unlock()
		l.abandon(st, "final cleanup step abandoned: the server is closing")
		l.mu.Lock()
	}
	l.metrics.pending.Set(float64(len(l.steps) + l.busy))
	l.mu.Unlock()
	if again {
		l.poke()
	}
}

func (l *lateCleanup) abandon(st *lateStep, msg string) {
	l.metrics.outcomes.WithLabelValues("abandoned").Inc()
	attrs := []any{"capture_key", st.key, "step", st.name, "attempts", st.attempts, "err", st.lastErr}
	// The episode's trace, which the step's context kept.
	if sc := trace.SpanContextFromContext(st.ctx); sc.IsValid() {
		attrs = append(attrs, "trace_id", sc.TraceID().String())
	}
	l.log.Warn(msg, attrs...)
}

// Pending is how many steps wait to be sent again or are being sent.
func (l *lateCleanup) Pending() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.steps) + l.busy
}

// close stops the retries: what is in flight is cancelled, what waits is
// abandoned with one warning for all of it. It returns once every goroutine
// of the late cleanup has ended.
func (l *lateCleanup) close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	left := len(l.steps)
	l.steps = nil
	l.mu.Unlock()
	l.stop()
	l.wg.Wait()
	if left > 0 {
		l.metrics.outcomes.WithLabelValues("abandoned").Add(float64(left))
		l.log.Warn("final cleanup steps abandoned: the server is closing", "steps", left)
	}
	l.metrics.pending.Set(0)
}

// jitter spreads retries of steps that failed together over ±20%.
func jitter(d time.Duration) time.Duration { return backoff.Spread(d, 0.2) }

// lateHeap orders steps by when they are due.
type lateHeap []*lateStep

func (h lateHeap) Len() int           { return len(h) }
func (h lateHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h lateHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *lateHeap) Push(x any)        { *h = append(*h, x.(*lateStep)) }
func (h *lateHeap) Pop() any {
	old := *h
	st := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return st
}
