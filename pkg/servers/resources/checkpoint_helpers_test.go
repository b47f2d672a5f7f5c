package resources_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/servers/resources"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// checkpointed starts a server of typ with checkpointing on; mode and
// verify override the type's defaults when not empty.
func checkpointed(t *testing.T, typ, mode, verify string, mutate ...func(*resources.Config)) *testServer {
	t.Helper()
	return start(t, typ, append([]func(*resources.Config){func(c *resources.Config) {
		c.Checkpoint = ctlplanetest.Config()
		c.CheckpointMode, c.VerifyMode = mode, verify
	}}, mutate...)...)
}

func deadlineIn(d time.Duration) float64 {
	return float64(time.Now().Add(d).UnixNano()) / 1e9
}

// ctl sends a control call; body is marshalled as JSON.
func (ts *testServer) ctl(op string, body map[string]any) reply {
	ts.t.Helper()
	method, path := http.MethodPost, ctlplane.RoutePrefix+"/"+op
	var text string
	if op == "status" {
		method = http.MethodGet
	} else {
		if _, ok := body["deadline_ts"]; !ok {
			body["deadline_ts"] = deadlineIn(30 * time.Second)
		}
		b, err := json.Marshal(body)
		if err != nil {
			ts.t.Fatal(err)
		}
		text = string(b)
	}
	req, err := http.NewRequest(method, ts.url+path, strings.NewReader(text))
	if err != nil {
		ts.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+ctlplanetest.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{status: -1, body: err.Error()}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{status: -1, body: err.Error()}
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: strings.TrimSpace(string(b))}
}

// mustCtl sends a control call and fails the test unless it answers 200.
func (ts *testServer) mustCtl(op string, body map[string]any) map[string]any {
	ts.t.Helper()
	r := ts.ctl(op, body)
	if r.status != http.StatusOK {
		ts.t.Fatalf("%s %v: %d %s", op, body, r.status, r.body)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(r.body), &m); err != nil {
		ts.t.Fatalf("%s reply %s: %v", op, r.body, err)
	}
	return m
}

// status returns GET status.
func (ts *testServer) status() map[string]any {
	ts.t.Helper()
	return ts.mustCtl("status", nil)
}

// report returns the status's report as compact JSON.
func (ts *testServer) report() string {
	ts.t.Helper()
	b, err := json.Marshal(ts.status()["report"])
	if err != nil {
		ts.t.Fatal(err)
	}
	return string(b)
}

func ckptReq(id string) map[string]any { return map[string]any{"checkpoint_id": id} }

func scopeReq(id, dir string, scope ...rollout.EpisodeID) map[string]any {
	if scope == nil {
		scope = []rollout.EpisodeID{}
	}
	return map[string]any{"checkpoint_id": id, "checkpoint_dir": dir, "episode_ids": scope}
}

func episodes(keys ...string) []rollout.EpisodeID {
	var out []rollout.EpisodeID
	for _, k := range keys {
		id, err := rollout.ParseCaptureKey(k)
		if err != nil {
			panic(err)
		}
		out = append(out, id)
	}
	return out
}

// records reads the records a server committed, as "<record JSON>" lines.
func records(t *testing.T, dir, instance, id string) []string {
	t.Helper()
	store := ctlplanetest.Store(t, dir)
	_, recs, _, err := store.Read(context.Background(), ckptstore.Target{Dir: dir, Kind: ctlplane.KindResources, Instance: instance, CheckpointID: id}, nil)
	if err != nil {
		t.Fatalf("read the commit of %s: %v", instance, err)
	}
	out := []string{}
	for _, r := range recs {
		out = append(out, string(r.Data))
	}
	return out
}

// writeCheckpoint publishes a resources commit holding the given records
// (record JSON by capture key), as a crashed process would have.
func writeCheckpoint(t *testing.T, instance, id string, recs map[string]string, manifest map[string]any) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ckpt")
	store := ctlplanetest.Store(t, dir)
	target := ckptstore.Target{Dir: dir, Kind: ctlplane.KindResources, Instance: instance, CheckpointID: id}
	_, err := store.Write(context.Background(), target, &ckptstore.WriteStop{}, func(add func(ckptstore.Record) error) (map[string]any, error) {
		for key, data := range recs {
			if err := add(ckptstore.Record{EpisodeID: episodes(key)[0], Data: json.RawMessage(data)}); err != nil {
				return nil, err
			}
		}
		return manifest, nil
	})
	if err != nil {
		t.Fatalf("write checkpoint: %v", err)
	}
	return dir
}

// waitUntil polls cond until it holds, failing the test at the deadline.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		<-time.After(5 * time.Millisecond)
	}
}

// waitHTTPInFlight waits until n data requests are being served (the
// /metrics request that reads the gauge counts itself too).
func (ts *testServer) waitHTTPInFlight(n int) {
	ts.t.Helper()
	want := fmt.Sprintf("gymfleet_http_requests_in_flight %d\n", n+1)
	waitUntil(ts.t, fmt.Sprintf("%d requests are in flight", n), func() bool {
		return strings.Contains(ts.do(http.MethodGet, "/metrics", "", "").body+"\n", want)
	})
}

// async sends a data request on its own goroutine.
func (ts *testServer) async(path, session, body string) <-chan reply {
	ch := make(chan reply, 1)
	go func() { ch <- ts.post(path, session, body) }()
	return ch
}

// pending fails the test if a reply already arrived.
func pending(t *testing.T, what string, ch <-chan reply) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s answered while it should wait: %d %s", what, r.status, r.body)
	default:
	}
}
