// Package freshstack runs stack-hungry work on a goroutine of its own, so
// that the goroutine of a request that then waits for minutes keeps the
// small stack it started with.
//
// The runtime grows a goroutine's stack by doubling it and shrinks it, at a
// collection, only while less than a quarter of it is in use. A handler of
// ours waits in its upstream call with 5-7 KB of frames on its stack (net/http's
// server, our middleware, the handler, net/http's client): that fits the 8 KB
// stack a handler gets, but once anything on the way grew it to 16 KB it
// stays at 16 KB for as long as the call is held. Reflection-driven JSON is
// what grows it: goccy's encoder loop alone has a 3 KB frame, encoding/json
// recurses a frame per level of nesting. With every rollout parked at a
// model call, that is 8 KB per rollout in each of three servers: 2.4 GB of
// stacks at 100,000 rollouts in flight, and half as much again of heap the
// collector lets grow (its goal counts stacks).
//
// Run costs a goroutine start and two switches, more when the work
// grows the new goroutine's stack to 16 KB, which it then gives back
// (BenchmarkRun). Use it on the request path of servers whose requests
// park, around encoding and decoding whose depth depends on the data, not
// in bulk loops.
package freshstack

import (
	"fmt"
	"runtime/debug"
)

// Run calls fn on a new goroutine and returns when fn has returned. A panic
// in fn is raised again in the caller as a *Panic, so a server's recoverer
// still sees it.
func Run(fn func()) {
	done := make(chan *Panic, 1)
	go func() {
		returned := false
		defer func() {
			if returned {
				done <- nil
				return
			}
			// A panic, or runtime.Goexit (recover then returns nil).
			done <- &Panic{Value: recover(), Stack: debug.Stack()}
		}()
		fn()
		returned = true
	}()
	if p := <-done; p != nil {
		panic(p)
	}
}

// Call is Run for a function with a result.
func Call[T any](fn func() (T, error)) (v T, err error) {
	Run(func() { v, err = fn() })
	return v, err
}

// Panic is what Run panics with when fn did not return: the value fn
// panicked with (nil if it called runtime.Goexit) and fn's stack.
type Panic struct {
	Value any
	Stack []byte
}

func (p *Panic) Error() string {
	if p.Value == nil {
		return fmt.Sprintf("freshstack: the function exited its goroutine without returning\n\n%s", p.Stack)
	}
	return fmt.Sprintf("%v\n\n%s", p.Value, p.Stack)
}

// Unwrap returns the value fn panicked with when it is an error.
func (p *Panic) Unwrap() error {
	err, _ := p.Value.(error)
	return err
}
