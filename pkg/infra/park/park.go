// Package park runs a task as a series of steps, so that the task holds no
// goroutine while it waits.
//
// A request of ours that waits for minutes (an episode waiting for its
// agent, an activation for its model call, a model call for its
// generation) held a goroutine the whole time: a stack per held rollout
// in each of three servers, which the collector scans and counts in its
// heap goal. Here a task that begins a wait (Hold)
// returns from its step instead of blocking; whatever ends the wait
// (a reply arriving, admission reopening) resumes the task with its next
// step. Between the two the task is a few objects on the heap.
//
// Steps never run concurrently: a step resumed while another runs is
// queued and runs after it, on the same goroutine. Where a resumed step
// runs when no step is running depends on how the task was started:
//
//   - Run: on the goroutine that called Run, which waits for it. Run
//     returns once the task has ended. This is how the same code serves a
//     caller that has a goroutine to give (a synchronous API, net/http's
//     server) at no cost beyond what a blocking call costs.
//   - Start: on the goroutine that resumes it (Wait.ResumeHere), or on a
//     new goroutine (Wait.Resume). End is called once the task has ended.
//
// A task ends when a step returns and no wait is held and no step is
// queued. A step that panics ends the task: under Run the panic goes on
// up the caller's goroutine; under Start it is recovered and handed to
// End. A wait resumed after its task ended is dropped.
package park

import (
	"fmt"
	"runtime/debug"
	"sync"
)

// Task is one task run as steps. Its methods may be called from any
// goroutine.
type Task struct {
	mu sync.Mutex
	// running is set while a goroutine runs the task's steps.
	running bool
	// holds counts waits begun and not yet resumed.
	holds int
	// queue holds steps resumed while another ran (or, under Run, while
	// the caller's goroutine was waiting for one).
	queue []func()
	ended bool
	// wake, under Run, tells the waiting goroutine a step was queued.
	wake chan struct{}
	// end, under Start, is called once the task has ended, with what a
	// step panicked with (nil when none did).
	end func(panicked any)
	// defers run, last first, when the task ends.
	defers []func()
}

// Run runs first as the task's first step on the calling goroutine, and
// every step resumed after it, and returns once the task has ended.
func Run(first func(t *Task)) {
	t := &Task{wake: make(chan struct{}, 1)}
	t.running = true
	ended := t.steps(func() { first(t) })
	for !ended {
		<-t.wake
		t.mu.Lock()
		next := t.popLocked()
		if next == nil { // a wake already served
			t.mu.Unlock()
			continue
		}
		t.running = true
		t.mu.Unlock()
		ended = t.steps(next)
	}
}

// Start runs first as the task's first step on the calling goroutine and
// returns when it has returned, and with it every step queued meanwhile:
// ended reports whether the task ended there (end is then not called, and
// a panic goes on up the caller's goroutine). Otherwise the task waits,
// holding no goroutine, and end is called once it has ended, on the
// goroutine of its last step.
func Start(first func(t *Task), end func(panicked any)) (ended bool) {
	t := &Task{end: end, running: true}
	return t.steps(func() { first(t) })
}

// Wait is a wait a step began: whatever ends the wait resumes the task
// with its next step, once.
type Wait struct {
	t    *Task
	once sync.Once
}

// Hold begins a wait: the task does not end while it is held, and the
// wait's Resume (or ResumeHere) gives the task its next step. A step that
// holds a wait returns without waiting; the task then holds no goroutine.
func (t *Task) Hold() *Wait {
	t.mu.Lock()
	t.holds++
	t.mu.Unlock()
	return &Wait{t: t}
}

// Resume ends the wait with next as the task's next step: it runs after
// the step running now, if any, else on a new goroutine (on Run's
// goroutine under Run). Calls after the first do nothing.
func (w *Wait) Resume(next func()) {
	w.once.Do(func() {
		if w.t.resume(next) {
			go w.t.runStarted(next)
		}
	})
}

// ResumeHere is Resume, but when no step runs, next runs on the calling
// goroutine, which returns once the task waits again or has ended: for a
// goroutine that was started only to deliver what the wait waited for.
func (w *Wait) ResumeHere(next func()) {
	w.once.Do(func() {
		if w.t.resume(next) {
			w.t.runStarted(next)
		}
	})
}

// resume releases a hold with next; it reports whether the caller is to
// run next itself (a started task that no goroutine is running).
func (t *Task) resume(next func()) (run bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.holds--
	if t.ended {
		return false
	}
	if t.running || t.wake != nil {
		t.queue = append(t.queue, next)
		if !t.running && t.wake != nil {
			select {
			case t.wake <- struct{}{}:
			default:
			}
		}
		return false
	}
	t.running = true
	return true
}

// Defer adds fn to what runs when the task ends, however it ends, last
// added first, before End (under Start) or before Run returns.
func (t *Task) Defer(fn func()) {
	t.mu.Lock()
	t.defers = append(t.defers, fn)
	t.mu.Unlock()
}

// runStarted runs a started task's steps from next on the calling
// goroutine, and calls end if they end the task, recovering a step's
// panic for it.
func (t *Task) runStarted(next func()) {
	var ended, returned bool
	var panicked any
	func() {
		defer func() {
			if !returned {
				// The steps did not return: a panic (recover does not
				// stop runtime.Goexit, and End is not told of it).
				panicked = recovered(recover())
				ended = true
			}
		}()
		ended = t.steps(next)
		returned = true
	}()
	if ended {
		t.end(panicked)
	}
}

// recovered is what End is told a step panicked with: the value, and the
// stack it panicked on where it is not an error already.
func recovered(v any) any {
	if v == nil {
		return nil
	}
	return &Panic{Value: v, Stack: debug.Stack()}
}

// Panic is what End receives for a step that panicked.
type Panic struct {
	Value any
	Stack []byte
}

func (p *Panic) Error() string { return fmt.Sprintf("%v\n\n%s", p.Value, p.Stack) }

// Unwrap returns the value the step panicked with when it is an error.
func (p *Panic) Unwrap() error {
	err, _ := p.Value.(error)
	return err
}

// steps runs fn and every step queued meanwhile, and reports whether the
// task ended with them; otherwise it waits with no goroutine running it.
// A panicking step ends the task (its defers run) and the panic goes on.
func (t *Task) steps(fn func()) (ended bool) {
	returned := false
	defer func() {
		if !returned {
			t.mu.Lock()
			t.running = false
			t.ended = true
			t.queue = nil
			t.mu.Unlock()
			t.runDefers()
		}
	}()
	for {
		fn()
		t.mu.Lock()
		if next := t.popLocked(); next != nil {
			t.mu.Unlock()
			fn = next
			continue
		}
		t.running = false
		ended = t.holds == 0
		t.ended = ended
		t.mu.Unlock()
		returned = true
		if ended {
			t.runDefers()
		}
		return ended
	}
}

// popLocked takes the first queued step, or nil.
func (t *Task) popLocked() func() {
	if len(t.queue) == 0 {
		return nil
	}
	next := t.queue[0]
	t.queue[0] = nil
	t.queue = t.queue[1:]
	if len(t.queue) == 0 {
		t.queue = nil
	}
	return next
}

// runDefers runs the deferred functions, last first.
func (t *Task) runDefers() {
	t.mu.Lock()
	defers := t.defers
	t.defers = nil
	t.mu.Unlock()
	for i := len(defers) - 1; i >= 0; i-- {
		defers[i]()
	}
}
