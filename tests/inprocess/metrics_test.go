package inprocess_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

// TestMetrics_EveryServerLintsClean scrapes /metrics of every server of
// the fleet, checkpoints on and after a rollout (so every series has
// samples), and lints it as client_golang's testutil.CollectAndLint does.
// No label may hold a per-rollout value: no series names the rollout's
// capture key.
func TestMetrics_EveryServerLintsClean(t *testing.T) {
	f := startTracedFleet(t, httpconf.StackLean)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	row := loadDataset(t, "counter.jsonl")[0]
	const key = "metrics-lint"
	if _, err := httpclient.PostJSON(ctx, f.client, f.EnvURLs["single_agent_turn"]+"/run", nil, row.withID(key), nil); err != nil {
		t.Fatalf("/run: %v", err)
	}
	for _, ep := range f.Endpoints() {
		rep, err := httpclient.Do(ctx, f.client, http.MethodGet, ep.URL+"/metrics", nil, nil)
		if err != nil || rep.Status != 200 {
			t.Fatalf("%s /metrics: %v %v", ep.Name, rep, err)
		}
		problems, err := promlint.New(bytes.NewReader(rep.Body)).Lint()
		if err != nil {
			t.Fatalf("%s: %v", ep.Name, err)
		}
		for _, p := range problems {
			t.Errorf("%s: %s: %s", ep.Name, p.Metric, p.Text)
		}
		if strings.Contains(string(rep.Body), key) {
			t.Errorf("%s: a series names the rollout %s", ep.Name, key)
		}
		if !strings.Contains(string(rep.Body), "gymfleet_http_requests_in_flight") {
			t.Errorf("%s: no HTTP metrics", ep.Name)
		}
		if ep.Name != "fakeinference" && !strings.Contains(string(rep.Body), "gymfleet_ckpt_phase") {
			t.Errorf("%s: no checkpoint metrics", ep.Name)
		}
	}
}
