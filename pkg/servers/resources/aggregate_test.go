package resources_test

import (
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/servers/resources"
)

// POST /aggregate_metrics is computed from the body, as Gym's
// SimpleResourcesServer computes it, and passes while a checkpoint holds
// the server's sessions (it touches none).
func TestAggregateMetrics(t *testing.T) {
	const body = `{"verify_responses":[{"_ng_task_index":0,"_ng_rollout_index":0,"reward":1.0},{"_ng_task_index":0,"_ng_rollout_index":1,"reward":0.0}]}`
	for i, ts := range []*testServer{start(t, resources.TypeCounter), checkpointed(t, resources.TypeCounter, "", "")} {
		if i == 1 {
			ts.mustCtl("prepare", ckptReq("c1"))
		}
		r := ts.post("/aggregate_metrics", "", body)
		if r.status != 200 || !strings.Contains(r.body, `"agent_metrics":{"mean/reward":0.5,"max/reward":1.0,"min/reward":0.0,"median/reward":0.5,"std/reward":0.7071067811865476,"mean_across_repeats/mean/reward":0.5,`) {
			t.Fatalf("/aggregate_metrics = %d %s", r.status, r.body)
		}
		expectCode(t, "no verify_responses", ts.post("/aggregate_metrics", "", `{}`), 400, "invalid_request")
	}
}
