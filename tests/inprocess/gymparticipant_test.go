package inprocess_test

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/servers/environment"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
	"github.com/gymfleet/gymfleet/tests/fleettest"
	"github.com/gymfleet/gymfleet/tests/gymstandin"
)

// TestMixedFleet_OurCoordinatorCheckpointsGymParticipants: our coordinator
// checkpoints a fleet that mixes our servers with a NeMo Gym participant -
// gymstandin.Participant, which answers as Gym's own control plane
// answered the same calls (its recording, tests/gymstandin/testdata) and
// writes its directory as Gym's store.py does - with a rollout in flight
// whose episode both hold state for: prepare, commit, resume; then a
// restore of that directory into a fresh fleet and a fresh Gym
// participant, the replacement finishing there, retire and forget. The Gym
// participant announces no epoch, so no call to it carries one (its
// request models forbid unknown fields: it would answer 422), and every
// retire and forget names a checkpoint, as its request models require.
func TestMixedFleet_OurCoordinatorCheckpointsGymParticipants(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	client := httpclient.New(httpclient.Options{H2C: true})
	t.Cleanup(client.CloseIdleConnections)
	ck := ctlplanetest.Config()
	ck.Root = t.TempDir()
	start := func() (*fleettest.Fleet, *gymstandin.Participant, *coordination.Coordinator) {
		fl := fleettest.Start(t, fleettest.Options{Client: client, Checkpoint: ck})
		gym := gymstandin.StartParticipant(t, "gym_resources", ctlplanetest.Token)
		eps := append(fl.Endpoints(), coordination.Endpoint{Name: "gym_resources", URL: gym.URL})
		coord, err := coordination.Discover(ctx, eps, coordination.Options{Token: ctlplanetest.Token})
		if err != nil {
			t.Fatal(err)
		}
		found := slices.IndexFunc(coord.Members(), func(m coordination.Member) bool {
			return m.Name == "gym_resources" && m.Kind == "resources" && m.Instance == "gym_resources"
		})
		if found < 0 || len(coord.Members()) != 8 {
			t.Fatalf("participants: %+v", coord.Members())
		}
		return fl, gym, coord
	}
	fl, gym, coord := start()
	f := &testFleet{envURLs: fl.EnvURLs, client: client}
	row := loadDataset(t, "weather.jsonl")[0]
	ep := rollout.EpisodeID{RolloutID: "mixed-1"}

	// The rollout waits at its second model call; a Gym resources server
	// holds a session of it too.
	if _, err := fl.Ctl.HoldAfterCallsPerRollout(ctx, 1); err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	go func() {
		st, _ := f.postRun(ctx, t, environment.ProtocolSingleAgentTurn, row.withID(ep.RolloutID))
		done <- st
	}()
	waitHeld(ctx, t, fl, 1)
	gym.Seed("gym-session-1", ep.RolloutID, ep.Attempt)

	deadline := time.Now().Add(30 * time.Second)
	if prep, err := coord.Prepare(ctx, "mixed-c1", deadline); err != nil || !prep.Prepared {
		t.Fatalf("prepare: %+v, %v", prep, err)
	}
	dir := filepath.Join(ck.Root, "mixed-c1")
	res, err := coord.Commit(ctx, "mixed-c1", dir, []rollout.EpisodeID{ep}, deadline, false)
	if err != nil {
		t.Fatalf("commit: %v", err)
	}
	if got := res.Replies["gym_resources"]["episode_ids"]; !jsonEqual(got, []string{"mixed-1"}) {
		t.Errorf("the Gym participant exported %v", got)
	}
	if _, recs, err := gymstandin.ReadState(dir, "resources", "gym_resources"); err != nil || len(recs) != 1 {
		t.Fatalf("the Gym participant's directory: %d records, %v", len(recs), err)
	}
	if err := coord.Resume(ctx, "mixed-c1", deadline); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if _, err := fl.Ctl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if st := <-done; st != http.StatusOK {
		t.Fatalf("the first attempt's /run: %d", st)
	}

	// Restored into fresh processes: ours and a fresh Gym participant.
	fresh, freshGym, coord2 := start()
	rr, err := coord2.Restore(ctx, "mixed-r1", dir, []rollout.EpisodeID{ep}, time.Now().Add(30*time.Second))
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if r := rr.Replies["gym_resources"]; r.SourceCheckpointID != "mixed-c1" || !slices.Equal(r.Restored, []string{"mixed-1-a1"}) {
		t.Errorf("the Gym participant's restore reply: %+v", r)
	}
	if err := coord2.Resume(ctx, "mixed-r1", time.Now().Add(30*time.Second)); err != nil {
		t.Fatalf("resume after restore: %v", err)
	}
	f2 := &testFleet{envURLs: fresh.EnvURLs, client: client}
	next := ep.Next()
	body := map[string]json.RawMessage{}
	if err := json.Unmarshal(row.withID(ep.RolloutID), &body); err != nil {
		t.Fatal(err)
	}
	body["_ng_attempt_index"], _ = json.Marshal(next.Attempt)
	b, _ := json.Marshal(body)
	if st, out := f2.postRun(ctx, t, environment.ProtocolSingleAgentTurn, b); st != http.StatusOK {
		t.Fatalf("the replacement's /run: %d %s", st, out)
	}
	if err := coord2.Retire(ctx, "", []rollout.EpisodeID{next}, time.Now().Add(30*time.Second)); err != nil {
		t.Fatalf("retire: %v", err)
	}
	if err := coord2.Forget(ctx, []string{ep.RolloutID}, time.Now().Add(30*time.Second)); err != nil {
		t.Fatalf("forget: %v", err)
	}
	if s := freshGym.Sessions(); len(s) != 0 {
		t.Errorf("the Gym participant still holds %v after retire", s)
	}

	for _, g := range []*gymstandin.Participant{gym, freshGym} {
		for _, r := range g.Requests() {
			if _, ok := r.Body["epoch"]; ok {
				t.Errorf("%s to the Gym participant carried an epoch", r.Op)
			}
			if id, _ := r.Body["checkpoint_id"].(string); id == "" {
				t.Errorf("%s to the Gym participant named no checkpoint", r.Op)
			}
		}
	}
	var ops []string
	for _, r := range freshGym.Requests() {
		ops = append(ops, r.Op)
	}
	if want := []string{"restore", "resume", "retire", "forget"}; !slices.Equal(ops, want) {
		t.Errorf("calls to the fresh Gym participant: %v, want %v", ops, want)
	}
}

// waitHeld polls the fake inference server until n calls are held.
func waitHeld(ctx context.Context, t *testing.T, fl *fleettest.Fleet, n int) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := fl.Ctl.CallCount(ctx)
		if err == nil && c.Held >= n {
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("%d calls held, want %d: %v", c.Held, n, err)
		}
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}
