package park

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
	}
}

func TestRun_StepsRunInOrderOnTheCallersGoroutine(t *testing.T) {
	var got []string
	Run(func(task *Task) {
		got = append(got, "first")
		w := task.Hold()
		go w.Resume(func() {
			got = append(got, "second")
			w2 := task.Hold()
			w2.ResumeHere(func() { got = append(got, "third") }) // resumed while this step runs: queued
			got = append(got, "second-end")
		})
	})
	want := []string{"first", "second", "second-end", "third"}
	if len(got) != len(want) {
		t.Fatalf("steps ran %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("steps ran %v, want %v", got, want)
		}
	}
}

func TestRun_ResumedBeforeTheStepReturns(t *testing.T) {
	ran := false
	Run(func(task *Task) {
		task.Hold().Resume(func() { ran = true })
		if ran {
			t.Error("a resumed step ran while the step that resumed it was running")
		}
	})
	if !ran {
		t.Fatal("the resumed step never ran")
	}
}

func TestRun_PanicGoesUpTheCallersGoroutineAndDropsLaterResumes(t *testing.T) {
	var w *Wait
	deferred := false
	func() {
		defer func() {
			if recover() != "boom" {
				t.Error("the step's panic did not reach Run's caller")
			}
		}()
		Run(func(task *Task) {
			task.Defer(func() { deferred = true })
			w = task.Hold()
			panic("boom")
		})
	}()
	if !deferred {
		t.Fatal("the task's defers did not run on its panic")
	}
	ran := false
	w.ResumeHere(func() { ran = true })
	if ran {
		t.Fatal("a wait resumed after its task ended ran its step")
	}
}

func TestStart_EndsInTheFirstStep(t *testing.T) {
	ended := Start(func(*Task) {}, func(any) { t.Error("End called for a task that ended in its first step") })
	if !ended {
		t.Fatal("a task that held nothing did not end in its first step")
	}
}

func TestStart_ResumeRunsTheRestAndCallsEnd(t *testing.T) {
	var w *Wait
	done := make(chan any, 1)
	var order []string
	ended := Start(func(task *Task) {
		task.Defer(func() { order = append(order, "defer") })
		w = task.Hold()
	}, func(p any) {
		order = append(order, "end")
		done <- p
	})
	if ended {
		t.Fatal("a task holding a wait ended")
	}
	w.Resume(func() { order = append(order, "next") })
	if p := <-done; p != nil {
		t.Fatalf("End got panic %v", p)
	}
	if len(order) != 3 || order[0] != "next" || order[1] != "defer" || order[2] != "end" {
		t.Fatalf("ran %v, want next, defer, end", order)
	}
	w.Resume(func() { t.Error("a wait resumed twice ran twice") })
}

func TestStart_ResumeHereRunsOnTheResumer(t *testing.T) {
	var w *Wait
	var ended atomic.Bool
	Start(func(task *Task) { w = task.Hold() }, func(any) { ended.Store(true) })
	here := false
	w.ResumeHere(func() { here = true })
	if !here || !ended.Load() {
		t.Fatalf("ResumeHere returned before its step ran (%v) or the task ended (%v)", here, ended.Load())
	}
}

func TestStart_PanicInALaterStepIsHandedToEnd(t *testing.T) {
	var w *Wait
	done := make(chan any, 1)
	Start(func(task *Task) { w = task.Hold() }, func(p any) { done <- p })
	boom := errors.New("boom")
	w.Resume(func() { panic(boom) })
	p := <-done
	pe, ok := p.(*Panic)
	if !ok || !errors.Is(pe, boom) || len(pe.Stack) == 0 {
		t.Fatalf("End got %#v, want a *Panic wrapping the step's error with its stack", p)
	}
}

func TestStart_StepsNeverRunConcurrently(t *testing.T) {
	const n = 200
	var running atomic.Int32
	var count atomic.Int32
	done := make(chan struct{})
	var waits []*Wait
	Start(func(task *Task) {
		for range n {
			waits = append(waits, task.Hold())
		}
	}, func(any) { close(done) })
	var wg sync.WaitGroup
	for _, w := range waits {
		wg.Go(func() {
			w.ResumeHere(func() {
				if running.Add(1) != 1 {
					t.Error("two steps of one task ran at once")
				}
				runtime.Gosched()
				count.Add(1)
				running.Add(-1)
			})
		})
	}
	wg.Wait()
	<-done
	if count.Load() != n {
		t.Fatalf("%d steps ran, want %d", count.Load(), n)
	}
}

func TestStart_AWaitingTaskHoldsNoGoroutine(t *testing.T) {
	before := runtime.NumGoroutine()
	const n = 1000
	waits := make([]*Wait, 0, n)
	for range n {
		Start(func(task *Task) { waits = append(waits, task.Hold()) }, func(any) {})
	}
	if now := runtime.NumGoroutine(); now > before+10 {
		t.Fatalf("%d tasks waiting hold %d goroutines", n, now-before)
	}
	var ended atomic.Int32
	for _, w := range waits {
		w.Resume(func() { ended.Add(1) })
	}
	waitFor(t, "every task to end", func() bool { return ended.Load() == n })
}

// A wait that two parties end at once (a reply and the request's context,
// say) resumes its task once: one step runs, the defers and End once.
func TestStart_AWaitResumedByTwoAtOnceRunsOnce(t *testing.T) {
	for range 200 {
		var w *Wait
		var steps, defers, ends atomic.Int32
		done := make(chan struct{})
		Start(func(task *Task) {
			task.Defer(func() { defers.Add(1) })
			w = task.Hold()
		}, func(any) {
			ends.Add(1)
			close(done)
		})
		var wg sync.WaitGroup
		wg.Go(func() { w.Resume(func() { steps.Add(1) }) })
		wg.Go(func() { w.ResumeHere(func() { steps.Add(1) }) })
		wg.Wait()
		<-done
		if steps.Load() != 1 || defers.Load() != 1 || ends.Load() != 1 {
			t.Fatalf("steps %d, defers %d, ends %d; want one each", steps.Load(), defers.Load(), ends.Load())
		}
	}
}
