package agent_test

import (
	"strings"
	"testing"
)

const aggregateBody = `{"verify_responses":[{"_ng_task_index":0,"_ng_rollout_index":0,"reward":1.0},{"_ng_task_index":0,"_ng_rollout_index":1,"reward":0.0}]}`

// As Gym's Simple Agent does, /aggregate_metrics goes to the resources
// server and its reply comes back unchanged.
func TestAggregateMetrics_ProxiesToResources(t *testing.T) {
	rec := &recorder{}
	rs := newResources(t, rec)
	rs.tool = func(name, body string) (int, string) {
		if name != "aggregate_metrics" || body != aggregateBody {
			return 500, `{"error":{"code":"internal","detail":"unexpected"}}`
		}
		return 200, `{"group_level_metrics":[],"agent_metrics":{"mean/reward":0.25},"key_metrics":{"mean/reward":0.25}}`
	}
	ta := startAgent(t, newModel(t, rec), rs, rec)
	r := ta.post("/aggregate_metrics", nil, aggregateBody)
	if r.status != 200 || r.body != `{"group_level_metrics":[],"agent_metrics":{"mean/reward":0.25},"key_metrics":{"mean/reward":0.25}}` {
		t.Fatalf("/aggregate_metrics = %d %s, want the resources server's reply", r.status, r.body)
	}
}

// A resources server without the route: the agent computes the baseline.
func TestAggregateMetrics_ComputesWhenResourcesHasNoRoute(t *testing.T) {
	ta := newFixture(t, nil)
	r := ta.post("/aggregate_metrics", nil, aggregateBody)
	if r.status != 200 || !strings.Contains(r.body, `"key_metrics":{"mean/reward":0.5}`) {
		t.Fatalf("/aggregate_metrics = %d %s, want mean/reward 0.5 computed locally", r.status, r.body)
	}
	expectCode(t, "bad body", ta.post("/aggregate_metrics", nil, `{"verify_responses":[{"_ng_task_index":"0","reward":1}]}`), 400, "invalid_request")
}

// A refusal by the resources server keeps its code.
func TestAggregateMetrics_RelaysRefusal(t *testing.T) {
	rec := &recorder{}
	rs := newResources(t, rec)
	rs.tool = func(string, string) (int, string) {
		return 400, `{"error":{"code":"invalid_request","detail":"aggregate_metrics: no"}}`
	}
	ta := startAgent(t, newModel(t, rec), rs, rec)
	expectCode(t, "refused", ta.post("/aggregate_metrics", nil, aggregateBody), 400, "invalid_request")
}
