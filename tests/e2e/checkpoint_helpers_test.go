package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Checkpoint prepares (requiring every stage prepared) and commits the
// scope into CkptDir/<id>, and returns the commit result. It does not resume.
func (f *Fleet) Checkpoint(c *coordination.Coordinator, id string, scope ...rollout.EpisodeID) (*coordination.PrepareResult, *coordination.CommitResult) {
	f.t.Helper()
	ctx := context.Background()
	res, err := c.Prepare(ctx, id, deadline(30*time.Second))
	if err != nil {
		f.t.Fatalf("prepare %s: %v", id, err)
	}
	if !res.Prepared {
		f.t.Fatalf("prepare %s not prepared; blockers %v", id, res.Blockers())
	}
	cm, err := c.Commit(ctx, id, f.Dir(id), scope, deadline(30*time.Second), false)
	if err != nil {
		f.t.Fatalf("commit %s: %v", id, err)
	}
	f.requireRecordsAreJSON(id)
	return res, cm
}

// store opens the store checkpoint id is in as the fleet's servers do: a
// local directory, or the fleet's bucket at its S3 endpoint.
func (f *Fleet) store(id string) *ckptstore.Store {
	f.t.Helper()
	dir := f.Dir(id)
	if !ckptstore.IsS3(dir) {
		return ctlplanetest.Store(f.t, dir)
	}
	s, err := ckptstore.OpenWith(dir, ckptstore.Options{S3: ckptstore.S3Options{Endpoint: f.topo.S3Endpoint, PathStyle: f.topo.S3PathStyle}})
	if err != nil {
		f.t.Fatalf("opening %s: %v", dir, err)
	}
	f.t.Cleanup(func() { s.Close() })
	return s
}

// requireRecordsAreJSON fails the test unless every record of checkpoint
// id is one JSON object by encoding/json's reading: the store frames
// records and leaves their syntax to the participants' own encoders
// (ckptstore.Store.Write), so every checkpoint a scenario takes checks
// those encoders on the records a real fleet makes.
func (f *Fleet) requireRecordsAreJSON(id string) {
	f.t.Helper()
	ctx := context.Background()
	store := f.store(id)
	manifests, err := store.Manifests(ctx, f.Dir(id))
	if err != nil {
		f.t.Fatalf("manifests of %s: %v", id, err)
	}
	for _, m := range manifests {
		_, recs, _, err := store.Read(ctx, ckptstore.Target{Dir: f.Dir(id), Kind: m.Kind, Instance: m.Instance, CheckpointID: id}, nil)
		if err != nil {
			f.t.Fatalf("records of %s/%s in %s: %v", m.Kind, m.Instance, id, err)
		}
		for i, r := range recs {
			if !json.Valid(r.Data) || r.Data[0] != '{' {
				f.t.Fatalf("record %d of %s/%s in %s (%s) is not one JSON object: %.200q", i+1, m.Kind, m.Instance, id, r.EpisodeID, r.Data)
			}
		}
	}
}

// Dir is the directory of checkpoint id (an s3:// URL where CkptDir is).
func (f *Fleet) Dir(id string) string { return ckptstore.JoinDir(f.CkptDir, id) }

// Resume resumes checkpoint id everywhere.
func (f *Fleet) Resume(c *coordination.Coordinator, id string) {
	f.t.Helper()
	if err := c.Resume(context.Background(), id, deadline(30*time.Second)); err != nil {
		f.t.Fatalf("resume %s: %v", id, err)
	}
}

// CrashAndRestore kills the fleet (fakeinference survives), starts fresh
// processes, restores checkpoint id with the scope and resumes. It returns
// the coordinator of the fresh fleet.
func (f *Fleet) CrashAndRestore(id string, scope ...rollout.EpisodeID) *coordination.Coordinator {
	f.t.Helper()
	f.Crash()
	f.Restart()
	c := f.Coord()
	if _, err := c.Restore(context.Background(), id, f.Dir(id), scope, deadline(30*time.Second)); err != nil {
		f.t.Fatalf("restore %s: %v", id, err)
	}
	f.Resume(c, id)
	return c
}

// Records reads one participant's records of checkpoint id.
func (f *Fleet) Records(id, kind, instance string) []map[string]any {
	f.t.Helper()
	store := f.store(id)
	_, recs, _, err := store.Read(context.Background(), ckptstore.Target{Dir: f.Dir(id), Kind: kind, Instance: instance, CheckpointID: id}, nil)
	if err != nil {
		f.t.Fatalf("records of %s/%s in %s: %v", kind, instance, id, err)
	}
	out := make([]map[string]any, len(recs))
	for i, r := range recs {
		_ = codec.Unmarshal(r.Data, &out[i])
	}
	return out
}

// EnvBoundary is the "next" of the environment's record of a capture key.
func (f *Fleet) EnvBoundary(id, key string) string {
	f.t.Helper()
	var recs []map[string]any
	for _, env := range f.Cfg.Endpoints(fleet.KindEnvironment) {
		recs = append(recs, f.Records(id, "environment", env.Name)...)
	}
	for _, r := range recs {
		ep, _ := r["episode_id"].(map[string]any)
		e := rollout.EpisodeID{RolloutID: ep["rollout_id"].(string), Attempt: int(ep["attempt"].(float64))}
		if e.CaptureKey() != key {
			continue
		}
		if b, ok := r["boundary"].(map[string]any); ok {
			next, _ := b["next"].(string)
			return next
		}
		return "null"
	}
	f.t.Fatalf("checkpoint %s has no environment record of %s", id, key)
	return ""
}

// HoldSecondCalls holds every rollout's calls after its first.
func (f *Fleet) HoldSecondCalls() {
	f.t.Helper()
	if _, err := f.Fake.HoldAfterCallsPerRollout(context.Background(), 1); err != nil {
		f.t.Fatal(err)
	}
}

// Release releases every held call and removes the hold.
func (f *Fleet) Release() {
	f.t.Helper()
	if _, err := f.Fake.Release(context.Background()); err != nil {
		f.t.Fatal(err)
	}
}

// WaitHeld waits until the rollout's n-th call (1-based) is held.
func (f *Fleet) WaitHeld(rolloutID string, n int) {
	f.t.Helper()
	f.WaitFor("call "+rolloutID+" held", 60*time.Second, func() bool {
		calls := f.Calls(rolloutID)
		return len(calls) >= n && calls[n-1].Status == fakeinference.StatusHeld
	})
}

// slowServer is the slow_verify resources server's control API.
func (f *Fleet) slow(op string) map[string]any {
	f.t.Helper()
	ep, _ := f.Cfg.Endpoint("slow")
	method := http.MethodPost
	if op == "count" {
		method = http.MethodGet
	}
	rep, err := httpclient.Do(context.Background(), f.ctl, method, ep.URL+"/_ctl/verify/"+op, nil, nil)
	if err != nil || !rep.OK() {
		f.t.Fatalf("slow %s: %v %v", op, err, rep)
	}
	var m map[string]any
	_ = codec.Unmarshal(rep.Body, &m)
	return m
}

// rowsOf lists the ledger rows of a capture key (status 200 required).
func (f *Fleet) ledger(key string) []map[string]any {
	f.t.Helper()
	st, m := f.Manifest(key)
	if st != http.StatusOK {
		f.t.Fatalf("manifest of %s: %d %v", key, st, m)
	}
	var out []map[string]any
	recs, _ := m["records"].([]any)
	for _, r := range recs {
		out = append(out, r.(map[string]any))
	}
	if fails, _ := m["failures"].([]any); len(fails) > 0 {
		f.t.Fatalf("manifest of %s has failures: %v", key, fails)
	}
	return out
}

func ep(r string, a int) rollout.EpisodeID { return rollout.EpisodeID{RolloutID: r, Attempt: a} }

// assertReward requires status 200 and the reward.
func assertReward(t *testing.T, rep Reply, want float64) {
	t.Helper()
	if rep.Err != nil || rep.Status != http.StatusOK || rep.Reward() != want {
		t.Fatalf("reply: status %d err %v reward %v, want 200 and %v: %v", rep.Status, rep.Err, rep.Reward(), want, rep.Body)
	}
}
