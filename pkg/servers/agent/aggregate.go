package agent

import (
	"net/http"

	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rewardprofile"
)

// handleAggregateMetrics is POST /aggregate_metrics as NeMo Gym's Simple
// Agent serves it (responses_api_agents/simple_agent/app.py at 07d6b0d07b22):
// the body is sent on to the agent's resources server, whose verifier owns
// the metrics, and its reply relayed. A resources server without the route
// (404 or 405: one that predates it) gets the baseline computed here, what
// Gym's agent computes when it has no verifier.
func (s *Server) handleAggregateMetrics(r *http.Request) (any, error) {
	body, err := httpserver.ReadBody(r)
	if err != nil {
		return nil, err
	}
	url := baseURL(s.cfg.resourcesURL("")) + rewardprofile.Path
	rep, err := httpclient.Do(r.Context(), s.client, http.MethodPost, url, nil, body)
	if err != nil {
		return nil, upstream(r.Context(), "resources server "+rewardprofile.Path, err)
	}
	switch {
	case rep.OK():
		return codec.RawMessage(rep.Body), nil
	case rep.Status == http.StatusNotFound || rep.Status == http.StatusMethodNotAllowed:
		vrs, err := rewardprofile.DecodeRequest(body)
		if err != nil {
			return nil, rewardprofile.AsAPIError(err)
		}
		out, err := rewardprofile.Compute(vrs)
		if err != nil {
			return nil, rewardprofile.AsAPIError(err)
		}
		return codec.RawMessage(out), nil
	}
	return nil, rep.Err("resources server " + rewardprofile.Path)
}
