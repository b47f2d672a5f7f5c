package ctlplane_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// gauge reads a label-less gauge from reg; absent is an error.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("%s is not registered as one gauge", name)
	return 0
}

// Ensure gymfleet_ckpt_blockers counts the episodes a prepare waits for,
// as they become ready, and reads 0 once the checkpoint is resumed.
func TestMetrics_BlockersFollowAPrepare(t *testing.T) {
	clock := ctlplane.NewManualClock(epoch)
	f := ctlplanetest.NewFake("agent", "a")
	ids := []rollout.EpisodeID{{RolloutID: "r1"}, {RolloutID: "r2"}, {RolloutID: "r3"}}
	for _, id := range ids {
		f.SetEpisode(id, false)
	}
	reg := prometheus.NewRegistry()
	cfg := ctlplane.Config{Enabled: true, ControlAuthToken: "t", LeaseGraceSeconds: 60, Root: os.TempDir()}
	c, err := ctlplane.New(cfg, f, ctlplane.Deps{Clock: clock, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if got := gauge(t, reg, "gymfleet_ckpt_blockers"); got != 0 {
		t.Fatalf("blockers while idle = %v, want 0", got)
	}
	done := make(chan *ctlplane.PrepareReply, 1)
	go func() {
		r, err := c.Prepare(context.Background(), ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: deadlineIn(clock, 5*time.Second)})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	waitFor(t, f.Closed)
	if got := gauge(t, reg, "gymfleet_ckpt_blockers"); got != 3 {
		t.Fatalf("blockers while preparing = %v, want 3", got)
	}
	f.SetEpisode(ids[0], true)
	if got := gauge(t, reg, "gymfleet_ckpt_blockers"); got != 2 {
		t.Fatalf("blockers after one became ready = %v, want 2", got)
	}
	waitFor(t, func() bool { return clock.Pending() >= 2 })
	clock.Advance(5 * time.Second)
	if r := <-done; r == nil || r.Phase != ctlplane.PhasePreparing || r.Report.BlockerCount != 2 {
		t.Fatalf("prepare at its deadline = %+v, want preparing with 2 blockers", r)
	}
	if got := gauge(t, reg, "gymfleet_ckpt_blockers"); got != 2 {
		t.Fatalf("blockers of a prepare past its deadline = %v, want 2 (still held)", got)
	}
	if _, err := c.Resume(ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: deadlineIn(clock, 5*time.Second)}); err != nil {
		t.Fatal(err)
	}
	if got := gauge(t, reg, "gymfleet_ckpt_blockers"); got != 0 {
		t.Fatalf("blockers after resume = %v, want 0", got)
	}
}
