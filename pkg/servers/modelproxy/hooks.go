package modelproxy

import (
	"context"
	"net/http"

	"github.com/gymfleet/gymfleet/pkg/infra/park"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

// callHooks are the points where a model call meets checkpointing. The call
// path (call.go, chat.go, responses.go, upstream.go) calls every one of
// them unconditionally; with checkpointing off they are noHooks, and with
// it on the participant (checkpoint.go). The server picks one when it is
// built and never changes it.
type callHooks interface {
	// admit registers an admitted call. The call's work derives from the
	// returned request's context; an error refuses the call (it is
	// answered with it).
	admit(r *http.Request, t *ticket) (*http.Request, error)
	// describeChat and describeResponses note what the client asked (before
	// the token parameters are added): the request digest, streaming, and
	// whether decoding is constrained.
	describeChat(t *ticket, digest string, f chatFields)
	describeResponses(t *ticket, digest string, req *openai.ResponsesRequest, chat *openai.ChatRequest)
	// upstreamRunning notes whether the call's upstream request is in
	// flight.
	upstreamRunning(t *ticket, running bool)
	// deliver lets the response start and calls done; it may hold it
	// first, parked in task, and fails only when ctx ends or the server is
	// closing. Nothing past it is undone.
	deliver(task *park.Task, ctx context.Context, t *ticket, done func(error))
	// awaitResume waits, parked in task, after a generation cut stopped the
	// call, until it may be re-issued, and calls done.
	awaitResume(task *park.Task, ctx context.Context, t *ticket, done func(error))
	// settle notes that a started response staged its ledger row (or has
	// none); completion is whether the call had a reply to capture.
	settle(t *ticket, completion bool)
	// release ends the call when its handler returns. It may answer a call
	// that never started (stale_attempt) or reset its stream (shutdown).
	release(w http.ResponseWriter, r *http.Request, t *ticket)
	// refuseRemoval is the error a ledger retire or delete gets now, or nil.
	refuseRemoval() error
	// beginShutdown starts closing: nothing held is delivered any more.
	beginShutdown()
	// close stops background work and waits for it.
	close()
}

// noHooks are the call hooks with checkpointing off: every call is
// delivered at once and nothing is tracked.
type noHooks struct{}

var _ callHooks = noHooks{}

func (noHooks) admit(r *http.Request, _ *ticket) (*http.Request, error) { return r, nil }
func (noHooks) describeChat(*ticket, string, chatFields)                {}
func (noHooks) describeResponses(*ticket, string, *openai.ResponsesRequest, *openai.ChatRequest) {
}
func (noHooks) upstreamRunning(*ticket, bool) {}

func (noHooks) deliver(_ *park.Task, _ context.Context, t *ticket, done func(error)) {
	t.started.Store(true)
	done(nil)
}

func (noHooks) awaitResume(_ *park.Task, ctx context.Context, _ *ticket, done func(error)) {
	done(ctx.Err())
}

func (noHooks) settle(*ticket, bool)                                {}
func (noHooks) release(http.ResponseWriter, *http.Request, *ticket) {}
func (noHooks) refuseRemoval() error                                { return nil }
func (noHooks) beginShutdown()                                      {}
func (noHooks) close()                                              {}
