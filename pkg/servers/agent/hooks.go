package agent

import (
	"context"

	"github.com/gymfleet/gymfleet/pkg/infra/park"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// agentHooks are the points where the agent's request path meets
// checkpointing. Handlers call every one of them unconditionally; with
// checkpointing off they are noHooks, and with it on the participant
// (checkpoint.go). The server picks one when it is built and never changes
// it.
type agentHooks interface {
	// served counts a session opened or a stateless activation run (a
	// process that served any may not be restored into).
	served()
	// startActivation notes that sess's activation starts running and
	// returns the hooks its loop calls at its boundaries. Called with s.mu
	// held.
	startActivation(sess *session) loopHooks
	// endActivation notes that sess's activation stopped. Called with s.mu
	// held.
	endActivation(sess *session)
	// admitRun refuses a legacy /run of an attempt the controller retired.
	admitRun(ep rollout.EpisodeID) error
	// runLegacy runs a legacy /run of ep (Server.runLegacy), as an episode
	// a checkpoint can capture and a restore continue.
	runLegacy(ctx context.Context, ep rollout.EpisodeID, row map[string]codec.RawMessage, body []byte, params *openai.ResponsesRequest) (any, error)
	// close stops the control plane and its background work.
	close()
}

// noHooks are the agent hooks with checkpointing off: nothing is tracked
// and a legacy /run runs from its first stage.
type noHooks struct{ s *Server }

var _ agentHooks = noHooks{}

func (noHooks) served()                            {}
func (noHooks) startActivation(*session) loopHooks { return directLoop{} }
func (noHooks) endActivation(*session)             {}
func (noHooks) admitRun(rollout.EpisodeID) error   { return nil }
func (noHooks) close()                             {}

func (h noHooks) runLegacy(ctx context.Context, ep rollout.EpisodeID, row map[string]codec.RawMessage, body []byte, params *openai.ResponsesRequest) (any, error) {
	return h.s.runLegacy(ctx, nil, directLoop{}, ep, row, body, params, newLegacyProgress())
}

// directLoop are the loop hooks of an activation no checkpoint captures:
// boundaries record nothing and a model call is just made.
type directLoop struct{}

func (directLoop) atBoundary(context.Context, Boundary, *LoopState) error { return nil }

func (directLoop) awaitModel(t *park.Task, ctx context.Context, a *activation, done func(*openai.Response, error)) {
	a.callModel(t, ctx, done)
}
