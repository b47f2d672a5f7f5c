package environment

import (
	"context"

	tracking "github.com/gymfleet/gymfleet/pkg/episode"
	"github.com/gymfleet/gymfleet/pkg/infra/park"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// runLegacy relays the row to the agent's /run, which seeds, loops, verifies
// and cleans up itself, and calls done with the agent's reply plus
// episode_id. It parks while the agent runs the episode.
func (s *Server) runLegacy(t *park.Task, ctx context.Context, ep *episode, done func(codec.RawMessage, error)) {
	timer := s.metrics.stageTimer("legacy_run")
	// The agent owns a legacy episode and continues it from its own
	// boundaries, so the relay is a replay step: a checkpoint does not wait
	// for it, and after a crash the replacement is relayed again.
	leave := ep.tracked.Enter(tracking.Replay)
	// NeMo Gym's agents route /run only, never under /ng-rollout/
	// (base_responses_api_agent.py, Gym 07d6b0d07b22); the row names
	// its rollout to them.
	path := rollout.Path(ep.id, "/run")
	if ep.agent.Gym {
		path = "/run"
	}
	w := t.Hold()
	s.start(ctx, "agent", ep.agentURL, path, nil, ep.req.Row, func(rep *httpclient.Reply, err error) {
		w.ResumeHere(func() {
			leave()
			timer()
			done(legacyReply(ep, rep, err))
		})
	})
}

// legacyReply is the /run reply of a relayed episode.
func legacyReply(ep *episode, rep *httpclient.Reply, err error) (codec.RawMessage, error) {
	if err != nil {
		return nil, &stageError{stage: "legacy_run", err: err}
	}
	if !isObject(rep.Body) {
		return nil, &stageError{stage: "legacy_run", err: apierror.New(apierror.UpstreamError, "agent /run answered a body that is not a JSON object")}
	}
	return episodeReply(rep.Body, ep.id, nil)
}
