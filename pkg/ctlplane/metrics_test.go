package ctlplane_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// metricValue is the value of the series of name with exactly labels
// (a counter's or gauge's value, a histogram's sample count); ok false if
// no such series exists.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue next
				}
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				return m.GetCounter().GetValue(), true
			case dto.MetricType_GAUGE:
				return m.GetGauge().GetValue(), true
			case dto.MetricType_HISTOGRAM:
				return float64(m.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}

type metricWant struct {
	name   string
	labels map[string]string
	// value is checked exactly unless atLeast is set.
	value   float64
	atLeast bool
}

func checkMetrics(t *testing.T, reg *prometheus.Registry, wants []metricWant) {
	t.Helper()
	for _, w := range wants {
		got, ok := metricValue(t, reg, w.name, w.labels)
		switch {
		case !ok:
			t.Errorf("%s%v: no such series", w.name, w.labels)
		case w.atLeast && got < w.value, !w.atLeast && got != w.value:
			t.Errorf("%s%v = %g, want %g", w.name, w.labels, got, w.value)
		}
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestMetrics_EveryCheckpointMetric drives each of the control plane's
// metrics through the routes (and the lease and deadline through a manual
// clock), checks every one's value and lints the registry.
func TestMetrics_EveryCheckpointMetric(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	cfg := ctlplane.Config{Enabled: true, ControlAuthToken: "tok", LeaseGraceSeconds: 60, Root: root}
	ep := rollout.EpisodeID{RolloutID: "r1"}
	hc := httpclient.New(httpclient.Options{})
	t.Cleanup(hc.CloseIdleConnections)
	call := func(url, op string, body any, token string) int {
		t.Helper()
		rep, err := httpclient.Do(ctx, hc, http.MethodPost, url+ctlplane.RoutePrefix+"/"+op, http.Header{"Authorization": {"Bearer " + token}}, body)
		if err != nil {
			t.Fatal(err)
		}
		return rep.Status
	}
	dl := float64(time.Now().Add(time.Minute).UnixNano()) / 1e9
	dir := filepath.Join(root, "c1")

	// A checkpoint: prepare, commit, resume; a refused call.
	reg := prometheus.NewRegistry()
	f := ctlplanetest.NewFake("resources", "fake")
	f.SetEpisode(ep, true)
	_, url := fakeServer(t, cfg, f, ctlplane.Deps{Registry: reg})
	if s := call(url, "prepare", ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: dl}, "tok"); s != 200 {
		t.Fatalf("prepare: %d", s)
	}
	checkMetrics(t, reg, []metricWant{{name: "gymfleet_ckpt_phase", value: float64(ctlplane.PhasePrepared)}})
	if s := call(url, "commit", ctlplane.CommitRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: []rollout.EpisodeID{ep}}, "tok"); s != 200 {
		t.Fatalf("commit: %d", s)
	}
	checkMetrics(t, reg, []metricWant{{name: "gymfleet_ckpt_phase", value: float64(ctlplane.PhaseCommitted)}})
	if s := call(url, "resume", ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: dl}, "tok"); s != 200 {
		t.Fatalf("resume: %d", s)
	}
	if s := call(url, "prepare", ctlplane.CheckpointRequest{CheckpointID: "c2", DeadlineTS: dl}, "wrong"); s != 401 {
		t.Fatalf("a wrong token: %d", s)
	}
	// An earlier attempt after a retire is refused by the fence.
	if s := call(url, "retire", ctlplane.RetireRequest{CheckpointID: "c-retire", DeadlineTS: dl, EpisodeIDs: []rollout.EpisodeID{ep}}, "tok"); s != 200 {
		t.Fatalf("retire: %d", s)
	}
	if s, _ := probe(url)(ctx, ep); s != 409 {
		t.Fatalf("a retired attempt: %d", s)
	}
	info, err := os.Stat(filepath.Join(dir, "gym", "resources", "fake", "manifest.json"))
	if err != nil || info.Size() == 0 {
		t.Fatalf("no manifest: %v", err)
	}
	checkMetrics(t, reg, []metricWant{
		{name: "gymfleet_ckpt_operations_total", labels: map[string]string{"op": "prepare", "outcome": "ok"}, value: 1},
		{name: "gymfleet_ckpt_operations_total", labels: map[string]string{"op": "commit", "outcome": "ok"}, value: 1},
		{name: "gymfleet_ckpt_operations_total", labels: map[string]string{"op": "commit_write", "outcome": "ok"}, value: 1},
		{name: "gymfleet_ckpt_operations_total", labels: map[string]string{"op": "resume", "outcome": "ok"}, value: 1},
		{name: "gymfleet_ckpt_operations_total", labels: map[string]string{"op": "retire", "outcome": "ok"}, value: 1},
		{name: "gymfleet_ckpt_operation_duration_seconds", labels: map[string]string{"op": "prepare"}, value: 1},
		{name: "gymfleet_ckpt_operation_duration_seconds", labels: map[string]string{"op": "commit_write"}, value: 1},
		{name: "gymfleet_ckpt_records_total", labels: map[string]string{"op": "commit"}, value: 1},
		{name: "gymfleet_ckpt_bytes_total", labels: map[string]string{"op": "commit"}, value: 1, atLeast: true},
		{name: "gymfleet_ckpt_refusals_total", labels: map[string]string{"code": "unauthorized"}, value: 1},
		{name: "gymfleet_ckpt_refusals_total", labels: map[string]string{"code": "stale_attempt"}, value: 1},
		{name: "gymfleet_ckpt_phase", value: float64(ctlplane.PhaseIdle)},
		{name: "gymfleet_ckpt_lease_expiries_total", value: 0},
		{name: "gymfleet_ckpt_prepares_not_ready_total", value: 0},
	})

	// A restore of that checkpoint into a fresh participant.
	reg2 := prometheus.NewRegistry()
	_, url2 := fakeServer(t, cfg, ctlplanetest.NewFake("resources", "fake"), ctlplane.Deps{Registry: reg2})
	if s := call(url2, "restore", ctlplane.RestoreRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: []rollout.EpisodeID{ep}}, "tok"); s != 200 {
		t.Fatalf("restore: %d", s)
	}
	checkMetrics(t, reg2, []metricWant{
		{name: "gymfleet_ckpt_operations_total", labels: map[string]string{"op": "restore", "outcome": "ok"}, value: 1},
		{name: "gymfleet_ckpt_operations_total", labels: map[string]string{"op": "restore_install", "outcome": "ok"}, value: 1},
		{name: "gymfleet_ckpt_records_total", labels: map[string]string{"op": "restore"}, value: 1},
		{name: "gymfleet_ckpt_bytes_total", labels: map[string]string{"op": "restore"}, value: 1, atLeast: true},
		{name: "gymfleet_ckpt_phase", value: float64(ctlplane.PhaseRestored)},
	})
	// A prepare of the restored participant is refused in phase restored.
	if s := call(url2, "prepare", ctlplane.CheckpointRequest{CheckpointID: "c3", DeadlineTS: dl}, "tok"); s != 409 {
		t.Fatalf("prepare while restored: %d", s)
	}
	checkMetrics(t, reg2, []metricWant{
		{name: "gymfleet_ckpt_operations_total", labels: map[string]string{"op": "prepare", "outcome": "refused"}, value: 1},
	})

	// A prepare that reaches its deadline, then a lease that expires.
	reg3 := prometheus.NewRegistry()
	clock := ctlplane.NewManualClock(epoch)
	f3 := ctlplanetest.NewFake("agent", "a")
	f3.SetEpisode(ep, false)
	c3, err := ctlplane.New(cfg, f3, ctlplane.Deps{Clock: clock, Registry: reg3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c3.Close)
	done := make(chan error, 1)
	go func() {
		_, err := c3.Prepare(ctx, ctlplane.CheckpointRequest{CheckpointID: "c4", DeadlineTS: deadlineIn(clock, 5*time.Second)})
		done <- err
	}()
	waitFor(t, func() bool { return clock.Pending() >= 2 })
	clock.Advance(5 * time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	checkMetrics(t, reg3, []metricWant{
		{name: "gymfleet_ckpt_prepares_not_ready_total", value: 1},
		{name: "gymfleet_ckpt_phase", value: float64(ctlplane.PhasePreparing)},
	})
	clock.Advance(61 * time.Second)
	checkMetrics(t, reg3, []metricWant{
		{name: "gymfleet_ckpt_lease_expiries_total", value: 1},
		{name: "gymfleet_ckpt_phase", value: float64(ctlplane.PhaseIdle)},
	})

	// Every metric the control plane registers was checked above.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if n := mf.GetName(); strings.HasPrefix(n, "gymfleet_ckpt_") && !strings.Contains(checkedNames, n+" ") {
			t.Errorf("metric %s is not checked by this test", n)
		}
	}
}

const checkedNames = "gymfleet_ckpt_operations_total gymfleet_ckpt_operation_duration_seconds gymfleet_ckpt_records_total " +
	"gymfleet_ckpt_bytes_total gymfleet_ckpt_refusals_total gymfleet_ckpt_phase gymfleet_ckpt_lease_expiries_total " +
	"gymfleet_ckpt_prepares_not_ready_total " +
	"gymfleet_ckpt_blockers " // checked by TestMetrics_BlockersFollowAPrepare
