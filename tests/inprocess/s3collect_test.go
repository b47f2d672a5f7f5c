package inprocess_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ops/collect"
	"github.com/gymfleet/gymfleet/pkg/servers/environment"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/tests/fleettest"
)

// TestCollect_CheckpointsToS3: a collection whose fleet checkpoints to an
// s3:// root (gofakes3, in process) is stopped at a checkpoint; the
// servers' records are objects under s3://…/<checkpoint_id>/ and the
// collector's state is in its local state directory. A fresh fleet and
// collect --resume then finish every row exactly once.
func TestCollect_CheckpointsToS3(t *testing.T) {
	fake := httptest.NewServer(gofakes3.New(s3mem.New(), gofakes3.WithAutoBucket(true)).Server())
	t.Cleanup(fake.Close)
	t.Setenv("AWS_ACCESS_KEY_ID", "fake")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "fake")
	t.Setenv("AWS_REGION", "us-east-1")
	const token, bucket = "s3-token", "gymfleet-collect"
	root := "s3://" + bucket + "/ck"
	ckDir := root + "/run1"
	state := t.TempDir()
	output := filepath.Join(t.TempDir(), "out.jsonl")
	input := filepath.Join("..", "..", "data", "demo.jsonl")
	const rows = 64

	startFleet := func() *fleettest.Fleet {
		client := httpclient.New(httpclient.Options{H2C: true})
		t.Cleanup(client.CloseIdleConnections)
		ck := ctlplane.DefaultConfig()
		ck.Enabled, ck.ControlAuthToken, ck.Root = true, token, root
		ck.S3Endpoint, ck.S3PathStyle = fake.URL, true
		return fleettest.Start(t, fleettest.Options{Client: client, Checkpoint: ck})
	}
	collector := func(fl *fleettest.Fleet, resume bool) *collect.Collector {
		c, err := collect.New(collect.Options{
			EnvURL: fl.EnvURLs[environment.ProtocolSingleAgentTurn], Concurrency: 4, Limit: rows,
			Fleet:       &collect.FleetControl{Endpoints: fl.Endpoints(), Token: token},
			Checkpoints: &collect.CheckpointOptions{Dir: ckDir, StateDir: state, Timeout: 30 * time.Second, Resume: resume},
		})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	coll, err := collector(startFleet(), false).Open(ctx, input, output)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := coll.Run(ctx); done <- err }()
	// Interrupt once some rows have finished, with others still to send.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if b, _ := os.ReadFile(output); len(b) > 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("no row finished")
		case <-tick.C:
		}
	}
	st, err := coll.Checkpoint(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, collect.ErrStopped) {
		t.Fatalf("the stopped run: %v", err)
	}
	if m, err := collect.ReadLatest(state); err != nil || m.CheckpointID != st.ID {
		t.Fatalf("LATEST in the state directory: %+v %v", m, err)
	}
	raw := s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(fake.URL), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider("fake", "fake", ""),
	})
	list, err := raw.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String("ck/run1/" + st.ID + "/")})
	if err != nil {
		t.Fatal(err)
	}
	manifests := 0
	for _, o := range list.Contents {
		if strings.HasSuffix(aws.ToString(o.Key), "/manifest.json") {
			manifests++
		}
	}
	if manifests == 0 {
		t.Fatalf("no participant manifest under s3://%s/ck/run1/%s/: %d objects", bucket, st.ID, len(list.Contents))
	}

	// Every process died: a fresh fleet, and collect --resume.
	sum, err := collector(startFleet(), true).CollectFile(ctx, input, output)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Succeeded+sum.AlreadyFinished != rows || sum.AlreadyFinished == 0 || sum.Succeeded == 0 {
		t.Fatalf("resume: %+v", sum)
	}
	t.Logf("checkpoint %s: %d in flight, %d continued; resume: %d already finished, %d succeeded, %d continued, %d restarted",
		st.ID, st.InFlight, len(st.Continued), sum.AlreadyFinished, sum.Succeeded, sum.Continued, sum.Restarted)
	f, err := os.Open(output)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var row struct {
			ID string `json:"_ng_rollout_id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			t.Fatal(err)
		}
		seen[row.ID]++
	}
	if len(seen) != rows {
		t.Fatalf("%d distinct rows in the output, want %d", len(seen), rows)
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("row %s is in the output %d times", id, n)
		}
	}
}
