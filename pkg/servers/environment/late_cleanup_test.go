package environment

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The tests of lateCleanup run in a synctest bubble: its backoff waits,
// per-attempt timeouts and window are virtual time, so they take no real
// time and do not depend on the machine's load. The late cleanup is created
// inside the bubble, so its timers and contexts belong to it.

type lateHarness struct {
	*lateCleanup
	reg  *prometheus.Registry
	logs *LogBuffer
}

// newLate builds a late cleanup that logs into a buffer, with its own
// registry. Call it inside the bubble, and close it before the bubble ends.
func newLate(perTry, window time.Duration) *lateHarness {
	reg := prometheus.NewRegistry()
	logs := &LogBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return &lateHarness{lateCleanup: newLateCleanup(log, perTry, window, newLateCleanupMetrics(reg)), reg: reg, logs: logs}
}

// expect checks the pending count (both Pending and the gauge) and the
// outcome counters.
func (h *lateHarness) expect(t *testing.T, what string, pending int, done, abandoned float64) {
	t.Helper()
	if got := h.Pending(); got != pending {
		t.Errorf("%s: Pending() = %d, want %d", what, got, pending)
	}
	if got := GatheredValue(t, h.reg, "gymfleet_env_cleanup_retries_pending", ""); got != float64(pending) {
		t.Errorf("%s: gymfleet_env_cleanup_retries_pending = %v, want %d", what, got, pending)
	}
	if got := GatheredValue(t, h.reg, "gymfleet_env_cleanup_retries_total", "done"); got != done {
		t.Errorf("%s: retries done = %v, want %v", what, got, done)
	}
	if got := GatheredValue(t, h.reg, "gymfleet_env_cleanup_retries_total", "abandoned"); got != abandoned {
		t.Errorf("%s: retries abandoned = %v, want %v", what, got, abandoned)
	}
}

// attempt is one call of a step the late cleanup made.
type attempt struct {
	at  time.Time
	ctx context.Context
}

// recordingStep is a step function that reports each call on calls and
// answers it with answer(n) (n from 1); a nil answer func waits for the
// call's context to end and returns its error.
func recordingStep(calls chan<- attempt, answer func(n int) error) func(context.Context) error {
	var mu sync.Mutex
	n := 0
	return func(ctx context.Context) error {
		mu.Lock()
		n++
		i := n
		mu.Unlock()
		calls <- attempt{at: time.Now(), ctx: ctx}
		if answer == nil {
			<-ctx.Done()
			return ctx.Err()
		}
		return answer(i)
	}
}

var errNoAnswer = fmt.Errorf("resources POST /close_session: %w", context.DeadlineExceeded)

type ctxKey struct{}

func TestLateCleanup_RetriedUntilAnswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const perTry = 5 * time.Second
		h := newLate(perTry, 10*time.Minute)
		defer h.close()
		calls := make(chan attempt, 16)
		fn := recordingStep(calls, func(n int) error {
			if n <= 2 {
				return errNoAnswer
			}
			return nil
		})
		// The episode's cleanup context has ended by the time the step is
		// sent again; its values are kept, its cancellation is not.
		ctx, cancel := context.WithCancel(context.WithValue(t.Context(), ctxKey{}, "episode"))
		cancel()
		start := time.Now()
		if !h.add(ctx, "7-0", "close resources session", fn, errNoAnswer) {
			t.Fatal("add refused a step that got no answer")
		}
		h.expect(t, "after add", 1, 0, 0)

		var got []attempt
		for range 3 {
			got = append(got, <-calls)
		}
		synctest.Wait()
		h.expect(t, "after the answer", 0, 1, 0)
		select {
		case c := <-calls:
			t.Fatalf("the step was sent again after it was answered, at +%v", c.at.Sub(start))
		default:
		}
		// Backoff: 1 s, then 2 s, each ±20%.
		if d := got[0].at.Sub(start); d < 800*time.Millisecond || d > 1200*time.Millisecond {
			t.Errorf("first retry at +%v, want 1 s ±20%%", d)
		}
		if d := got[1].at.Sub(got[0].at); d < 1600*time.Millisecond || d > 2400*time.Millisecond {
			t.Errorf("second retry %v after the first, want 2 s ±20%%", d)
		}
		if d := got[2].at.Sub(got[1].at); d < 3200*time.Millisecond || d > 4800*time.Millisecond {
			t.Errorf("third retry %v after the second, want 4 s ±20%%", d)
		}
		for i, c := range got {
			if v, _ := c.ctx.Value(ctxKey{}).(string); v != "episode" {
				t.Errorf("attempt %d: the context lost the episode's values", i+1)
			}
			dl, ok := c.ctx.Deadline()
			if !ok || dl.Sub(c.at) != perTry {
				t.Errorf("attempt %d: deadline %v after the call (set %v), want cleanup_timeout %v", i+1, dl.Sub(c.at), ok, perTry)
			}
			if c.ctx.Err() == nil {
				t.Errorf("attempt %d: its context was not released after the attempt", i+1)
			}
		}
		if l := h.logs.Lines("level=WARN"); len(l) != 0 {
			t.Errorf("warnings for a step that was answered: %q", l)
		}
	})
}

// TestLateCleanup_AttemptBoundedByPerTry: an attempt that gets no answer
// either is cut at cleanup_timeout and sent again.
func TestLateCleanup_AttemptBoundedByPerTry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const perTry = 3 * time.Second
		h := newLate(perTry, time.Minute)
		defer h.close()
		calls := make(chan attempt, 16)
		hang := recordingStep(calls, nil)
		var mu sync.Mutex
		n := 0
		fn := func(ctx context.Context) error {
			mu.Lock()
			n++
			first := n == 1
			mu.Unlock()
			if first {
				return hang(ctx)
			}
			calls <- attempt{at: time.Now(), ctx: ctx}
			return nil
		}
		h.add(context.Background(), "7-0", "close resources session", fn, errNoAnswer)
		first := <-calls
		second := <-calls
		if err := first.ctx.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("the hanging attempt ended with %v, want its deadline", err)
		}
		// The second attempt starts one backoff (2 s ±20%) after the first
		// was cut at perTry.
		if d := second.at.Sub(first.at); d < perTry+1600*time.Millisecond || d > perTry+2400*time.Millisecond {
			t.Errorf("second attempt %v after the first, want cleanup_timeout %v + 2 s ±20%%", d, perTry)
		}
		synctest.Wait()
		h.expect(t, "after the answer", 0, 1, 0)
	})
}

func TestLateCleanup_AddKeepsOnlyStepsWithoutAnAnswer(t *testing.T) {
	up := func(status int) error {
		return &upstreamError{kind: "resources", url: "http://r/close_session", status: status, err: errors.New("refused")}
	}
	for _, tc := range []struct {
		name string
		err  error
		keep bool
	}{
		{"timeout", errNoAnswer, true},
		{"refused connection", errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), true},
		{"503", up(http.StatusServiceUnavailable), true},
		{"500", up(http.StatusInternalServerError), true},
		{"409", up(http.StatusConflict), false},
		{"404", up(http.StatusNotFound), false},
		{"400", up(http.StatusBadRequest), false},
		{"409 wrapped", fmt.Errorf("stage cleanup: %w", up(http.StatusConflict)), false},
		{"503 wrapped", fmt.Errorf("stage cleanup: %w", up(http.StatusServiceUnavailable)), true},
		{"nil", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newLate(time.Second, time.Minute)
				defer h.close()
				called := make(chan attempt, 1)
				got := h.add(context.Background(), "7-0", "close resources session", recordingStep(called, func(int) error { return nil }), tc.err)
				if got != tc.keep {
					t.Fatalf("add(%v) = %v, want %v", tc.err, got, tc.keep)
				}
				if !tc.keep {
					h.expect(t, "refused", 0, 0, 0)
					return
				}
				h.expect(t, "kept", 1, 0, 0)
				<-called
				synctest.Wait()
				h.expect(t, "answered", 0, 1, 0)
			})
		})
	}
}

func TestLateCleanup_Off(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newLate(time.Second, 0)
		defer h.close()
		if h.add(context.Background(), "7-0", "close resources session", func(context.Context) error { return nil }, errNoAnswer) {
			t.Error("add kept a step with cleanup_retry_window 0")
		}
		h.expect(t, "off", 0, 0, 0)
	})
	var none *lateCleanup
	if none.add(context.Background(), "7-0", "close resources session", func(context.Context) error { return nil }, errNoAnswer) {
		t.Error("a nil late cleanup kept a step")
	}
}

// TestLateCleanup_AbandonedPastTheWindow: a step that never gets an answer
// is sent again while the next attempt would start within the window, then
// abandoned with a warning.
func TestLateCleanup_AbandonedPastTheWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const window = 10 * time.Second
		h := newLate(100*time.Millisecond, window)
		defer h.close()
		calls := make(chan attempt, 16)
		fn := recordingStep(calls, func(int) error { return errNoAnswer })
		start := time.Now()
		h.add(context.Background(), "7-0", "close resources session", fn, errNoAnswer)
		// Retries at about 1 s, 3 s and 7 s; the next would be at about
		// 15 s, past the window (with any jitter: 12 s at the earliest).
		var got []attempt
		for range 3 {
			got = append(got, <-calls)
		}
		synctest.Wait()
		h.expect(t, "after the third retry", 0, 0, 1)
		if d := got[2].at.Sub(start); d > window {
			t.Errorf("an attempt started at +%v, past the window %v", d, window)
		}
		// Nothing more comes, however long we wait.
		time.Sleep(time.Hour) // virtual time: nothing is waited for but the clock
		synctest.Wait()
		select {
		case c := <-calls:
			t.Errorf("the step was sent again at +%v, after it was abandoned", c.at.Sub(start))
		default:
		}
		warns := h.logs.Lines("level=WARN", `msg="final cleanup step abandoned"`)
		if len(warns) != 1 {
			t.Fatalf("abandon warnings = %q, want one; logs:\n%s", warns, h.logs.String())
		}
		for _, want := range []string{"capture_key=7-0", `step="close resources session"`, "attempts=4", "deadline exceeded"} {
			if !strings.Contains(warns[0], want) {
				t.Errorf("warning %q lacks %q", warns[0], want)
			}
		}
	})
}

// TestLateCleanup_RefusalEndsRetries: a retry answered with a 4xx is final.
func TestLateCleanup_RefusalEndsRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newLate(time.Second, time.Minute)
		defer h.close()
		calls := make(chan attempt, 16)
		fn := recordingStep(calls, func(int) error {
			return &upstreamError{kind: "resources", url: "http://r/close_session", status: http.StatusConflict, err: errors.New("stale")}
		})
		h.add(context.Background(), "7-0", "close resources session", fn, errNoAnswer)
		<-calls
		synctest.Wait()
		h.expect(t, "refused", 0, 0, 1)
		if w := h.logs.Lines("level=WARN", `msg="final cleanup step abandoned"`, "409"); len(w) != 1 {
			t.Errorf("warnings = %q, want one naming the refusal", w)
		}
	})
}

// TestLateCleanup_CloseCancelsAndAbandons: close cancels the attempt in
// flight, abandons what waits with one warning, returns at once, and the
// late cleanup takes nothing more.
func TestLateCleanup_CloseCancelsAndAbandons(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newLate(time.Hour, 2*time.Hour)
		calls := make(chan attempt, 16)
		inFlight := recordingStep(calls, nil)
		h.add(context.Background(), "7-0", "close resources session", inFlight, errNoAnswer)
		flying := <-calls
		// Two more, due after the first's attempt started.
		waiting := recordingStep(calls, func(int) error { return nil })
		h.add(context.Background(), "8-0", "close resources session", waiting, errNoAnswer)
		h.add(context.Background(), "9-0", "close agent session", waiting, errNoAnswer)
		synctest.Wait()
		h.expect(t, "before close", 3, 0, 0)

		closed := make(chan struct{})
		start := time.Now()
		go func() {
			h.close()
			close(closed)
		}()
		select {
		case <-closed:
		case <-time.After(time.Minute): // virtual: close waits for no clock
			t.Fatal("close did not return")
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("close took %v of virtual time, want it not to wait for a timer", d)
		}
		if err := flying.ctx.Err(); !errors.Is(err, context.Canceled) {
			t.Errorf("the attempt in flight ended with %v, want it cancelled", err)
		}
		h.expect(t, "after close", 0, 0, 3)
		if w := h.logs.Lines("level=WARN", `msg="final cleanup steps abandoned: the server is closing"`, "steps=2"); len(w) != 1 {
			t.Errorf("want one warning for the two waiting steps; logs:\n%s", h.logs.String())
		}
		if w := h.logs.Lines("level=WARN", "capture_key=7-0"); len(w) != 1 {
			t.Errorf("want one warning for the step in flight; logs:\n%s", h.logs.String())
		}
		select {
		case c := <-calls:
			t.Errorf("a waiting step was sent after close: %v", c)
		default:
		}

		if h.add(context.Background(), "10-0", "close resources session", waiting, errNoAnswer) {
			t.Error("add after close kept a step")
		}
		h.close() // a second close is a no-op
		h.expect(t, "after add past close", 0, 0, 3)
	})
}

// TestLateCleanup_CloseWithWorkersBusy: with every worker in an attempt and
// one more step due, close abandons all of them: none is lost uncounted
// between the scheduler and a worker.
func TestLateCleanup_CloseWithWorkersBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newLate(time.Hour, 2*time.Hour)
		n := h.workers + 1
		calls := make(chan attempt, n)
		hang := recordingStep(calls, nil)
		for i := range n {
			h.add(context.Background(), fmt.Sprintf("%d-0", i), "close resources session", hang, errNoAnswer)
		}
		for range h.workers {
			<-calls
		}
		// The last step is due and handed to no worker: all are busy.
		time.Sleep(2 * time.Second) // virtual time: past every step's due time
		synctest.Wait()
		h.expect(t, "workers busy", n, 0, 0)
		h.close()
		h.expect(t, "after close", 0, 0, float64(n))
	})
}

func TestLateCleanup_MaxPending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newLate(time.Second, time.Minute)
		defer h.close()
		h.maxPending = 2
		calls := make(chan attempt, 16)
		fn := recordingStep(calls, func(int) error { return nil })
		for i := range 2 {
			if !h.add(context.Background(), fmt.Sprintf("%d-0", i), "close resources session", fn, errNoAnswer) {
				t.Fatalf("add %d refused below the bound", i)
			}
		}
		if h.add(context.Background(), "2-0", "close resources session", fn, errNoAnswer) {
			t.Error("add kept a step past maxPending")
		}
		h.expect(t, "full", 2, 0, 0)
		<-calls
		<-calls
		synctest.Wait()
		h.expect(t, "answered", 0, 2, 0)
		if !h.add(context.Background(), "2-0", "close resources session", fn, errNoAnswer) {
			t.Error("add refused a step once the pending ones were answered")
		}
	})
}

// TestLateCleanup_DueOrder: steps are sent in the order they are due, not
// the order they were added.
func TestLateCleanup_DueOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newLate(time.Second, time.Minute)
		defer h.close()
		order := make(chan string, 3)
		step := func(name string) func(context.Context) error {
			return func(context.Context) error { order <- name; return nil }
		}
		// Added a, b, c at the same instant, due (±20%) at 30 s, 15 s, 1 s.
		pauses := map[string]time.Duration{"a": 30 * time.Second, "b": 15 * time.Second, "c": time.Second}
		for _, name := range []string{"a", "b", "c"} {
			h.backoff = func(int) time.Duration { return pauses[name] }
			h.add(context.Background(), name, name, step(name), errNoAnswer)
		}
		var got []string
		for range 3 {
			got = append(got, <-order)
		}
		if strings.Join(got, "") != "cba" {
			t.Errorf("order = %v, want c b a", got)
		}
	})
}

func TestLateBackoff(t *testing.T) {
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}
	for i, w := range want {
		if got := lateBackoff(i + 1); got != w {
			t.Errorf("lateBackoff(%d) = %v, want %v", i+1, got, w)
		}
	}
	if got := lateBackoff(1000); got != 30*time.Second {
		t.Errorf("lateBackoff(1000) = %v, want 30s", got)
	}
	for range 1000 {
		if d := jitter(10 * time.Second); d < 8*time.Second || d > 12*time.Second {
			t.Fatalf("jitter(10s) = %v, want within ±20%%", d)
		}
	}
}
