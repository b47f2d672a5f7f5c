package environment

import (
	"context"

	tracking "github.com/gymfleet/gymfleet/pkg/episode"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// runLegacy relays the row to the agent's /run, which seeds, loops, verifies
// and cleans up itself; the reply is the agent's plus episode_id.
func (s *Server) runLegacy(ctx context.Context, ep *episode) (codec.RawMessage, error) {
	timer := s.metrics.stageTimer("legacy_run")
	defer timer()
	// The agent owns a legacy episode and continues it from its own
	// boundaries, so the relay is a replay step: a checkpoint does not wait
	// for it, and after a crash the replacement is relayed again.
	var rep *httpclient.Reply
	err := ep.tracked.Step(ctx, tracking.Replay, func(ctx context.Context) error {
		var err error
		// NeMo Gym's agents route /run only, never under /ng-rollout/
		// (base_responses_api_agent.py, Gym 07d6b0d07b22); the row names
		// its rollout to them.
		path := rollout.Path(ep.id, "/run")
		if ep.agent.Gym {
			path = "/run"
		}
		rep, err = s.post(ctx, "agent", ep.agentURL, path, nil, ep.req.Row)
		return err
	})
	if err != nil {
		return nil, &stageError{stage: "legacy_run", err: err}
	}
	if !isObject(rep.Body) {
		return nil, &stageError{stage: "legacy_run", err: apierror.New(apierror.UpstreamError, "agent /run answered a body that is not a JSON object")}
	}
	return episodeReply(rep.Body, ep.id, nil)
}
