package httpserver

import (
	"log/slog"
	"net/http"
	"sync"

	"github.com/gymfleet/gymfleet/pkg/infra/park"
)

// exchange is one request as the server's outermost layer (Server.track)
// sees it: the stack's writer, the status written (for the edge's
// metrics), and, for a request whose handler parked (Park) on a stack
// that can keep the request open without its goroutine (h2server), what
// ends it once its task has ended.
//
// A parked request's layers (the edge, track) leave their work after the
// handler to the exchange, which runs it once the task has ended and the
// handler's goroutine has returned through them, innermost first, then
// ends the stream.
type exchange struct {
	http.ResponseWriter
	status int

	// parked is set on the handler's goroutine by Park when the request
	// continues without it; end then ends the stream (h2server's Detach).
	parked bool
	end    func(abort bool)

	mu sync.Mutex
	// after holds the layers' work after the handler, innermost first,
	// each told what a step panicked with (nil: none did).
	after []func(panicked any)
	// unwound: the handler's goroutine returned through every layer.
	// ended: the task ended, panicked with what a step panicked with.
	unwound, ended bool
	panicked       any
}

func (e *exchange) WriteHeader(code int) {
	if e.status == 0 {
		e.status = code
	}
	e.ResponseWriter.WriteHeader(code)
}

func (e *exchange) Write(b []byte) (int, error) {
	if e.status == 0 {
		e.status = http.StatusOK
	}
	return e.ResponseWriter.Write(b)
}

func (e *exchange) Flush() {
	if f, ok := e.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (e *exchange) Unwrap() http.ResponseWriter { return e.ResponseWriter }

// exchangeOf finds the exchange beneath w, through the writers that wrap
// it (the checkpoint's epoch writer); nil for a request not served by a
// Server (a router called directly, in tests).
func exchangeOf(w http.ResponseWriter) *exchange {
	for {
		switch v := w.(type) {
		case *exchange:
			return v
		case interface{ Unwrap() http.ResponseWriter }:
			w = v.Unwrap()
		default:
			return nil
		}
	}
}

// detacher is a stack's writer that can keep its request open after the
// handler returns (h2server).
type detacher interface {
	Detach() (end func(abort bool))
}

// Park runs a handler as a task (pkg/infra/park) whose waits hold no
// goroutine: first runs now, on the handler's goroutine, and a step that
// holds a wait returns without waiting; the wait's end resumes the task
// with its next step, which may write the reply to w. The request ends
// once the task has ended.
//
// Over this package's HTTP/2 the handler's goroutine returns as soon as
// the task waits, and the request stays open on its own; over HTTP/1.1
// and net/http's HTTP/2, which cannot keep a request without its
// goroutine, the handler's goroutine runs every step and waits between
// them, as a blocking handler would.
func Park(w http.ResponseWriter, r *http.Request, first func(t *park.Task)) {
	ex := exchangeOf(w)
	var d detacher
	if ex != nil && !ex.parked {
		d, _ = ex.ResponseWriter.(detacher)
	}
	if d == nil {
		park.Run(first)
		return
	}
	ex.parked = true
	ex.end = d.Detach()
	returned := false
	defer func() {
		if !returned {
			// The first step panicked: the edge answers it on its way up,
			// and the exchange ends the stream once the handler returned.
			ex.taskEnded(nil)
		}
	}()
	ended := park.Start(first, ex.taskEnded)
	returned = true
	if ended {
		ex.taskEnded(nil)
	}
}

// afterHandler leaves fn, a layer's work after the handler, to the
// exchange when the request is parked (true); otherwise the layer does it
// itself (false). Called on the handler's goroutine as it returns.
func (e *exchange) afterHandler(fn func(panicked any)) bool {
	if e == nil || !e.parked {
		return false
	}
	e.mu.Lock()
	e.after = append(e.after, fn)
	e.mu.Unlock()
	return true
}

// returned notes that the handler's goroutine has returned through every
// layer, and ends the request if its task has ended.
func (e *exchange) returned() {
	e.mu.Lock()
	e.unwound = true
	done := e.ended
	e.mu.Unlock()
	if done {
		e.finish()
	}
}

// taskEnded notes that the request's task has ended, and ends the request
// if its handler's goroutine has returned.
func (e *exchange) taskEnded(panicked any) {
	e.mu.Lock()
	if e.ended {
		e.mu.Unlock()
		return
	}
	e.ended, e.panicked = true, panicked
	done := e.unwound
	e.mu.Unlock()
	if done {
		e.finish()
	}
}

// finish runs the layers' work left to the exchange, then ends the stream.
func (e *exchange) finish() {
	for _, fn := range e.after {
		fn(e.panicked)
	}
	e.end(aborted(e.panicked))
}

// aborted reports a step that panicked with http.ErrAbortHandler: its
// stream is reset, as net/http resets the stream of a handler that does.
func aborted(panicked any) bool {
	p, ok := panicked.(*park.Panic)
	return ok && p.Value == http.ErrAbortHandler
}

// ParkedHandlerFunc is HandlerFunc for a handler that parks: it calls
// reply once, from whichever of its task's steps decides the reply.
type ParkedHandlerFunc func(t *park.Task, r *http.Request, reply func(v any, err error))

// HandleParked adapts a ParkedHandlerFunc as Handle adapts a HandlerFunc:
// the reply is written as Handle writes it; a second reply is dropped.
func HandleParked(log *slog.Logger, h ParkedHandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		Park(w, r, func(t *park.Task) {
			replied := false
			h(t, r, func(v any, err error) {
				if replied {
					return
				}
				replied = true
				drainBody(r)
				writeResult(w, r, log, v, err)
			})
		})
	}
}
