package environment

import (
	"context"

	"github.com/gymfleet/gymfleet/pkg/apierror"
	"github.com/gymfleet/gymfleet/pkg/codec"
)

// runLegacy relays the row to the agent's /run, which seeds, loops, verifies
// and cleans up itself; the reply is the agent's plus episode_id.
func (s *Server) runLegacy(ctx context.Context, ep *episode) (codec.RawMessage, error) {
	timer := s.metrics.stageTimer("legacy_run")
	defer timer()
	rep, err := s.call(ctx, "agent", ep.agent.URL, ep.id, "/run", nil, ep.req.Row)
	if err != nil {
		return nil, &stageError{stage: "legacy_run", err: err}
	}
	if !isObject(rep.Body) {
		return nil, &stageError{stage: "legacy_run", err: apierror.New(apierror.UpstreamError, "agent /run answered a body that is not a JSON object")}
	}
	return episodeReply(rep.Body, ep.id, nil)
}
