package ctlplane_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/infra/atomicfile"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/transport/sse"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Ensure a restore into a later epoch fences the process it replaces: the
// old one's replies, checkpoints and calls are refused, the new one
// refuses calls of the old epoch, and a restore into an earlier epoch than
// the fleet's is refused.
func TestEpoch_RestoreFencesTheEarlierIncarnation(t *testing.T) {
	ctx := context.Background()
	dl := deadlineIn(ctlplane.RealClock{}, 30*time.Second)
	base := t.TempDir()
	cfg := ctlplane.Config{Enabled: true, ControlAuthToken: "t", LeaseGraceSeconds: 60, Root: base, EpochFile: filepath.Join(base, "fleet", "EPOCH")}
	id := rollout.EpisodeID{RolloutID: "r1"}
	dir := filepath.Join(base, "c1")

	oldP := ctlplanetest.NewFake("agent", "a")
	oldP.SetEpisode(id, true)
	old, oldURL := fakeServer(t, cfg, oldP, ctlplane.Deps{})
	if _, err := old.Prepare(ctx, ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: dl}); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Commit(ctx, ctlplane.CommitRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: []rollout.EpisodeID{id}}); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Resume(ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: dl}); err != nil {
		t.Fatal(err)
	}
	// c2 is open on the old process when its replacement is restored.
	if _, err := old.Prepare(ctx, ctlplane.CheckpointRequest{CheckpointID: "c2", DeadlineTS: dl}); err != nil {
		t.Fatal(err)
	}
	if code, _ := probe(oldURL)(ctx, id); code != http.StatusOK {
		t.Fatalf("the old process before the restore: %d", code)
	}

	newP := ctlplanetest.NewFake("agent", "a")
	fresh, newURL := fakeServer(t, cfg, newP, ctlplane.Deps{})
	if _, err := fresh.Restore(ctx, ctlplane.RestoreRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: []rollout.EpisodeID{id}, Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	if fresh.Epoch() != 1 || old.Epoch() != 0 {
		t.Fatalf("epochs: restored %d, old %d; want 1 and 0", fresh.Epoch(), old.Epoch())
	}
	if b, err := os.ReadFile(cfg.EpochFile); err != nil || string(b) != "1\n" {
		t.Fatalf("epoch file: %q %v", b, err)
	}

	if _, err := old.Commit(ctx, ctlplane.CommitRequest{CheckpointID: "c2", DeadlineTS: dl, CheckpointDir: filepath.Join(base, "c2"), EpisodeIDs: []rollout.EpisodeID{id}}); !apierror.HasCode(err, apierror.StaleEpoch) {
		t.Fatalf("the old process's commit: %v, want stale_epoch", err)
	}
	if _, err := os.Stat(filepath.Join(base, "c2")); !os.IsNotExist(err) {
		t.Fatalf("the old process wrote into c2: %v", err)
	}
	if code, c := probe(oldURL)(ctx, rollout.EpisodeID{RolloutID: "r2"}); c != string(apierror.StaleEpoch) {
		t.Fatalf("the old process's reply: %d %s, want stale_epoch", code, c)
	}
	if !old.Fenced() || fresh.Fenced() {
		t.Fatalf("fenced: old %v, restored %v", old.Fenced(), fresh.Fenced())
	}

	// The old process's calls never leave it; the restored one refuses a
	// caller of epoch 0 and answers its own.
	oldClient := old.Client(httpclient.New(httpclient.Options{}))
	rep, err := httpclient.Do(ctx, oldClient, http.MethodPost, newURL+"/probe", nil, map[string]any{})
	if err != nil || apierror.Parse(rep.Status, rep.Body).Code != apierror.StaleEpoch {
		t.Fatalf("a call of the old process: %v %v", rep, err)
	}
	h := http.Header{ctlplane.EpochHeader: {"0"}}
	rep, err = httpclient.Do(ctx, httpclient.New(httpclient.Options{}), http.MethodPost, newURL+"/probe", h, map[string]any{})
	if err != nil || apierror.Parse(rep.Status, rep.Body).Code != apierror.StaleEpoch {
		t.Fatalf("a call of epoch 0 to the restored process: %v %v", rep, err)
	}
	if _, err := fresh.Resume(ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: dl}); err != nil {
		t.Fatal(err)
	}
	rep, err = httpclient.Do(ctx, fresh.Client(httpclient.New(httpclient.Options{})), http.MethodPost, newURL+"/probe", nil, map[string]any{})
	if err != nil || !rep.OK() || rep.Header.Get(ctlplane.EpochHeader) != "1" {
		t.Fatalf("a call within epoch 1: %v %v", rep, err)
	}
	// The same over h2c, the replies not waited for (httpclient.Start).
	if rep, err := started(ctx, old.Client(httpclient.New(httpclient.Options{H2C: true})), newURL+"/probe"); err != nil || apierror.Parse(rep.Status, rep.Body).Code != apierror.StaleEpoch {
		t.Fatalf("a started call of the old process: %v %v", rep, err)
	}
	if rep, err := started(ctx, fresh.Client(httpclient.New(httpclient.Options{H2C: true})), newURL+"/probe"); err != nil || !rep.OK() || rep.Header.Get(ctlplane.EpochHeader) != "1" {
		t.Fatalf("a started call within epoch 1: %v %v", rep, err)
	}

	// A controller that restores into an epoch the fleet has passed is a
	// stale one.
	late, _ := fakeServer(t, cfg, ctlplanetest.NewFake("agent", "a"), ctlplane.Deps{})
	if _, err := late.Restore(ctx, ctlplane.RestoreRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: []rollout.EpisodeID{id}, Epoch: 1}); err != nil {
		t.Fatalf("a restore into the fleet's own epoch: %v", err)
	}
	stale, _ := fakeServer(t, ctlplane.Config{Enabled: true, ControlAuthToken: "t", LeaseGraceSeconds: 60, Root: base, EpochFile: cfg.EpochFile}, ctlplanetest.NewFake("agent", "a"), ctlplane.Deps{})
	if err := os.WriteFile(cfg.EpochFile, []byte("5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := stale.Restore(ctx, ctlplane.RestoreRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: []rollout.EpisodeID{id}, Epoch: 2}); !apierror.HasCode(err, apierror.StaleEpoch) {
		t.Fatalf("a restore into epoch 2 of a fleet at 5: %v, want stale_epoch", err)
	}
}

// started posts {} to url with httpclient.Start and returns what done got.
func started(ctx context.Context, c *http.Client, url string) (*httpclient.Reply, error) {
	type result struct {
		rep *httpclient.Reply
		err error
	}
	out := make(chan result, 1)
	httpclient.Start(ctx, c, http.MethodPost, url, nil, map[string]any{}, func(rep *httpclient.Reply, err error) { out <- result{rep, err} })
	r := <-out
	return r.rep, r.err
}

// Ensure a streamed reply under way when its process's epoch was
// superseded ends in an error event, never in a completed reply: the
// model server's SSE to the agent, resumed after a pause during which
// the replacement was restored.
func TestEpoch_StreamEndsInErrorOnceSuperseded(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	cfg := ctlplane.Config{Enabled: true, ControlAuthToken: "t", LeaseGraceSeconds: 60, Root: base, EpochFile: filepath.Join(base, "EPOCH")}
	c, err := ctlplane.New(cfg, ctlplanetest.NewFake("model", "m"), ctlplane.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	resume := make(chan struct{})
	handlerErr := make(chan error, 1)
	r := httpserver.NewRouter(httpserver.RouterOptions{Middleware: []func(http.Handler) http.Handler{c.Middleware(nil)}})
	r.Post("/v1/responses", func(w http.ResponseWriter, r *http.Request) {
		sw := sse.NewWriter(w)
		if err := sw.Event("response.output_text.delta", []byte(`{"type":"response.output_text.delta","delta":"a"}`)); err != nil {
			handlerErr <- err
			return
		}
		<-resume
		// What the paused process goes on to send once resumed.
		err := sw.Event("response.completed", []byte(`{"type":"response.completed","response":{}}`))
		if err == nil {
			err = sw.Event("", []byte(sse.Done))
		}
		handlerErr <- err
	})
	srv := httptest.NewServer(r)
	defer srv.Close()

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/responses", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get(ctlplane.EpochHeader) != "0" {
		t.Fatalf("stream start: %d, epoch %q", resp.StatusCode, resp.Header.Get(ctlplane.EpochHeader))
	}
	rd := sse.NewReader(resp.Body)
	if ev, err := rd.Next(); err != nil || ev.Name != "response.output_text.delta" {
		t.Fatalf("first event: %+v %v", ev, err)
	}

	// The replacement is restored (the epoch file replaced) while the
	// stream waits, then the stream goes on.
	if err := atomicfile.WriteFile(atomicfile.OS, cfg.EpochFile, []byte("1\n")); err != nil {
		t.Fatal(err)
	}
	close(resume)

	ev, err := rd.Next()
	if err != nil {
		t.Fatalf("after the raise: %v, want an error event", err)
	}
	var got struct {
		Type  string `json:"type"`
		Code  string `json:"code"`
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if ev.Name != "error" || json.Unmarshal(ev.Data, &got) != nil || got.Type != "error" ||
		got.Code != string(apierror.StaleEpoch) || got.Error.Code != string(apierror.StaleEpoch) {
		t.Fatalf("after the raise: event %q %s, want an error event with stale_epoch", ev.Name, ev.Data)
	}
	if ev, err := rd.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the error event: %q %s %v, want the end of the stream", ev.Name, ev.Data, err)
	}
	if err := <-handlerErr; err == nil {
		t.Fatal("the handler's writes after the raise succeeded")
	}
	if !c.Fenced() {
		t.Fatal("the process is not fenced after its stream was cut")
	}
}
