package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// s3Root makes a bucket on the S3 server GYMFLEET_S3_ENDPOINT names and
// returns a root of the test's own in it. make test-s3 starts a SeaweedFS
// server and sets the variable (with the AWS credentials that reach it).
// Without it the server is an in-process fake (gofakes3, as the store's
// conformance suite uses), reached by the fleet's processes over loopback
// with static credentials they inherit: the scenarios run in make test
// too, and a real server's semantics are test-s3's to check.
func s3Root(t *testing.T) (root, endpoint string) {
	t.Helper()
	endpoint = os.Getenv("GYMFLEET_S3_ENDPOINT")
	if endpoint == "" {
		fake := httptest.NewServer(gofakes3.New(s3mem.New(), gofakes3.WithAutoBucket(true)).Server())
		t.Cleanup(fake.Close)
		endpoint = fake.URL
		t.Setenv("AWS_ACCESS_KEY_ID", "fake")
		t.Setenv("AWS_SECRET_ACCESS_KEY", "fake")
		t.Setenv("AWS_SESSION_TOKEN", "")
		t.Setenv("AWS_REGION", "us-east-1")
	}
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx, config.WithRegion("us-east-1"))
	if err != nil {
		t.Fatal(err)
	}
	client := s3.NewFromConfig(cfg, func(o *s3.Options) {
		o.BaseEndpoint = aws.String(endpoint)
		o.UsePathStyle = true
	})
	const bucket = "gymfleet-e2e"
	if _, err := client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(bucket)}); err != nil {
		if _, err := client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
			t.Fatalf("create bucket %s: %v", bucket, err)
		}
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	return "s3://" + bucket + "/" + t.Name() + "-" + hex.EncodeToString(rnd[:]), endpoint
}

// startS3Fleet starts a fleet whose every server checkpoints beneath root
// in the object store at endpoint.
func startS3Fleet(t *testing.T, root, endpoint string) *Fleet {
	t.Helper()
	f := startFleet(t, func(topo *fleet.Topology) {
		topo.CheckpointRoot = root
		topo.S3Endpoint = endpoint
		topo.S3PathStyle = true
	})
	f.CkptDir = root
	return f
}

// s3CheckpointHeld starts an S3 fleet, holds the second model call of a
// weather rollout named id, and commits checkpoint c1 of it there. It
// returns the fleet, the rollout's row and its first attempt, in flight.
func s3CheckpointHeld(t *testing.T, root, endpoint, id string) (*Fleet, map[string]any, *Run) {
	t.Helper()
	f := startS3Fleet(t, root, endpoint)
	f.HoldSecondCalls()
	row := weatherRow(id, "weather_agent", "Paris")
	first := f.Start(row)
	f.WaitHeld(id, 2)
	f.Checkpoint(f.Coord(), "c1", ep(id, 0))
	return f, row, first
}

// notAcrossCrash fails the test if first, an attempt in flight when its
// fleet's processes were killed, replied as if it had finished.
func notAcrossCrash(t *testing.T, first *Run) {
	t.Helper()
	if rep := first.Wait(t, 30*time.Second); rep.Status == http.StatusOK {
		t.Fatalf("the first attempt replied across the crash: %v", rep.Body)
	}
}

// TestS3_CheckpointRestoredByAnotherFleet: a fleet commits a checkpoint of
// an episode in flight to S3 and dies whole (its inference server too, as
// a lost host would); a second fleet, other processes on other ports that
// share only the bucket, restores it and the episode continues from its
// last boundary: the model call delivered before the checkpoint is never
// made again.
func TestS3_CheckpointRestoredByAnotherFleet(t *testing.T) {
	root, endpoint := s3Root(t)
	a, row, first := s3CheckpointHeld(t, root, endpoint, "s3-native-1")
	// Every participant's part verifies where it was written.
	ms, err := a.Coord().VerifyWith(context.Background(), a.Dir("c1"), "c1", ckptstore.Options{S3: ckptstore.S3Options{Endpoint: endpoint, PathStyle: true}})
	if err != nil || len(ms) == 0 {
		t.Fatalf("verify %s: %d manifests, %v", a.Dir("c1"), len(ms), err)
	}
	if err := a.L.KillAll(); err != nil {
		t.Fatal(err)
	}
	notAcrossCrash(t, first)

	b := startS3Fleet(t, root, endpoint)
	c := b.Coord()
	if _, err := c.Restore(context.Background(), "c1", b.Dir("c1"), []rollout.EpisodeID{ep("s3-native-1", 0)}, deadline(30*time.Second)); err != nil {
		t.Fatalf("restore %s in another fleet: %v", b.Dir("c1"), err)
	}
	b.Resume(c, "c1")
	assertReward(t, b.RunOK(withAttempt(row, 1)), 1.0)
	// The first call (two messages) was delivered in the first fleet and
	// is not made again: the second fleet's model sees only the second
	// call, undelivered at the checkpoint, issued once.
	if got, want := b.MessageCounts("s3-native-1"), []int{4}; !slices.Equal(got, want) {
		t.Fatalf("the second fleet's model calls (messages each) %v, want %v", got, want)
	}
}

// TestS3_ContinueAfterCrash is scenario 1 with its checkpoint in S3: every
// process but the inference server is killed and fresh ones on the same
// ports restore from the bucket.
func TestS3_ContinueAfterCrash(t *testing.T) {
	root, endpoint := s3Root(t)
	f, row, first := s3CheckpointHeld(t, root, endpoint, "s3-native-2")
	f.CrashAndRestore("c1", ep("s3-native-2", 0))
	notAcrossCrash(t, first)
	f.Release()
	assertReward(t, f.RunOK(withAttempt(row, 1)), 1.0)
	if got, want := f.MessageCounts("s3-native-2"), []int{2, 4, 4}; !slices.Equal(got, want) {
		t.Fatalf("model calls (messages each) %v, want %v: the delivered call 0 is never repeated, the undelivered call 1 is re-issued once", got, want)
	}
}
