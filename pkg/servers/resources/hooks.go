package resources

import (
	"net/http"

	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// requestHooks are the points where a data request (seed, tool call,
// verify, close) meets checkpointing. enter, admit and handleSeed call
// every one of them unconditionally, all with s.mu held but seedHeaders;
// with checkpointing off they are noHooks, and with it on the participant
// (checkpoint.go). The server picks one when it is built and never changes
// it.
type requestHooks interface {
	// holds is what a request of op waits on before it may go on: nil when
	// it may go on now, else a channel closed when admission reopens.
	holds(op operation) <-chan struct{}
	// enter admits a request of op and episode ep (hasEp: it named one) as
	// it starts counting, or refuses it (a retired attempt).
	enter(op operation, ep rollout.EpisodeID, hasEp bool) error
	// track notes a request of op on sess in flight; counted says whether
	// it holds readiness until release(label) is called as it leaves.
	track(op operation, sess *session, ep rollout.EpisodeID, hasEp bool) (label string, counted bool)
	release(label string)
	// used notes that a restored session was used (or removed): a commit
	// keeps it from now on.
	used(sess *session)
	// seedHeaders adds the checkpoint headers of a seed reply.
	seedHeaders(h http.Header)
	// close stops the control plane.
	close()
}

// noHooks are the request hooks with checkpointing off: nothing waits,
// nothing is refused and nothing is tracked.
type noHooks struct{}

var _ requestHooks = noHooks{}

func (noHooks) holds(operation) <-chan struct{}                { return nil }
func (noHooks) enter(operation, rollout.EpisodeID, bool) error { return nil }
func (noHooks) release(string)                                 {}
func (noHooks) used(*session)                                  {}
func (noHooks) seedHeaders(http.Header)                        {}
func (noHooks) close()                                         {}
func (noHooks) track(operation, *session, rollout.EpisodeID, bool) (string, bool) {
	return "", false
}
