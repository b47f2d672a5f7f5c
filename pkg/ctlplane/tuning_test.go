package ctlplane_test

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// newTunedController is newController with a Tuner that is on, as a
// server's command hands one down.
func newTunedController(t *testing.T, f *ctlplanetest.Fake, clock ctlplane.Clock, store *ckptstore.Store, tn *runtimetune.Tuner) *ctlplane.Controller {
	t.Helper()
	cfg := ctlplane.Config{Enabled: true, ControlAuthToken: "t", LeaseGraceSeconds: 60, Root: os.TempDir()}
	c, err := ctlplane.New(cfg, f, ctlplane.Deps{Clock: clock, Store: store, Tuning: tn})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func tunerOn() *runtimetune.Tuner { return runtimetune.New(runtimetune.Config{Tuning: runtimetune.On}) }

// gcSettings reads GOGC and the memory limit without changing them.
func gcSettings() (gogc int64, limit int64) {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64()), int64(s[1].Value.Uint64())
}

// deferred reports whether GOGC is the one a checkpoint's hold sets:
// collections deferred until the hold's memory limit.
func deferred(gogc int64) bool { return gogc == runtimetune.HeldGCPercent }

// wantHeld fails t unless a checkpoint's hold defers collections.
func wantHeld(t *testing.T, when string) {
	t.Helper()
	if gogc, _ := gcSettings(); !deferred(gogc) {
		t.Fatalf("GOGC = %d %s, want %d (deferred)", gogc, when, runtimetune.HeldGCPercent)
	}
}

// wantReleased fails t unless GOGC is back at 100 with no memory limit.
func wantReleased(t *testing.T, after string) {
	t.Helper()
	if gogc, limit := gcSettings(); gogc != 100 || limit != math.MaxInt64 {
		t.Fatalf("after %s GOGC = %d, limit = %d; want 100 and no limit", after, gogc, limit)
	}
}

// Ensure a checkpoint defers collections from prepare until the reopen,
// under a memory limit, and restores GOGC and the limit afterwards; with
// two controllers in one process, the settings come back only when the last
// one reopens. (Not parallel: GC settings belong to the process.)
func TestController_HoldsCollectionsWhilePrepared(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	clock := ctlplane.NewManualClock(epoch)
	tn := tunerOn() // one per process, shared by its servers
	a := newTunedController(t, ctlplanetest.NewFake("agent", "a"), clock, nil, tn)
	b := newTunedController(t, ctlplanetest.NewFake("resources", "r"), clock, nil, tn)
	ctx := context.Background()
	req := ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: deadlineIn(clock, 10*time.Second)}

	if _, err := a.Prepare(ctx, req); err != nil {
		t.Fatal(err)
	}
	gogc, limit := gcSettings()
	if !deferred(gogc) {
		t.Fatalf("GOGC = %d while prepared, want %d (deferred)", gogc, runtimetune.HeldGCPercent)
	}
	if limit == math.MaxInt64 || limit <= 0 {
		t.Fatalf("memory limit = %d while collections are held, want a bound", limit)
	}
	if _, err := b.Prepare(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Resume(req); err != nil {
		t.Fatal(err)
	}
	wantHeld(t, "while another controller is still prepared")
	if _, err := b.Resume(req); err != nil {
		t.Fatal(err)
	}
	wantReleased(t, "the last reopen")
}

// Ensure the hold never raises a memory limit the operator set, and that a
// lease expiry and Close both end it.
func TestController_HoldKeepsALowerLimitAndEndsOnExpiryAndClose(t *testing.T) {
	const operatorLimit = 64 << 20
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(operatorLimit))
	clock := ctlplane.NewManualClock(epoch)
	c := newTunedController(t, ctlplanetest.NewFake("agent", "a"), clock, nil, tunerOn())
	ctx := context.Background()
	if _, err := c.Prepare(ctx, ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: deadlineIn(clock, 10*time.Second)}); err != nil {
		t.Fatal(err)
	}
	if _, limit := gcSettings(); limit != operatorLimit {
		t.Fatalf("memory limit = %d while held, want the operator's %d", limit, operatorLimit)
	}
	clock.Advance(71 * time.Second) // the lease (10 s + 60 s grace) expires
	if p, _ := c.Phase(); p != ctlplane.PhaseIdle {
		t.Fatalf("phase after expiry = %s, want idle", p)
	}
	if gogc, limit := gcSettings(); gogc != 100 || limit != operatorLimit {
		t.Fatalf("after the lease expired GOGC = %d, limit = %d; want 100 and %d", gogc, limit, operatorLimit)
	}

	if _, err := c.Prepare(ctx, ctlplane.CheckpointRequest{CheckpointID: "c2", DeadlineTS: deadlineIn(clock, 10*time.Second)}); err != nil {
		t.Fatal(err)
	}
	wantHeld(t, "while prepared")
	c.Close()
	if gogc, _ := gcSettings(); gogc != 100 {
		t.Fatalf("after Close GOGC = %d, want 100", gogc)
	}
}

// committedCheckpoint commits checkpoint c1 of one agent episode and
// reopens; it returns the reopen's request and a restore of c1.
func committedCheckpoint(t *testing.T) (ctlplane.CheckpointRequest, ctlplane.RestoreRequest) {
	t.Helper()
	ctx := context.Background()
	dl := deadlineIn(ctlplane.RealClock{}, 30*time.Second)
	dir := t.TempDir()
	ids := []rollout.EpisodeID{{RolloutID: "r1"}}
	src := ctlplanetest.NewFake("agent", "a")
	src.SetEpisode(ids[0], true)
	c := newController(t, src, ctlplane.RealClock{}, nil)
	req := ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: dl}
	if _, err := c.Prepare(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Commit(ctx, ctlplane.CommitRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: ids}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resume(req); err != nil {
		t.Fatal(err)
	}
	return req, ctlplane.RestoreRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: ids}
}

// readObserver is the local backend, calling onOpen as a records file is
// opened for reading.
type readObserver struct {
	*ckptstore.Local
	onOpen func()
}

func (b readObserver) OpenRecords(ctx context.Context, dir, name string) (io.ReadCloser, error) {
	b.onOpen()
	return b.Local.OpenRecords(ctx, dir, name)
}

// Ensure a restore defers collections from its start (its records are read
// with them held), while it installs and until its resume, under a memory
// limit, and that a failed install ends the hold with the rest of the
// restore. (Not parallel: GC settings belong to the process.)
func TestController_HoldsCollectionsWhileRestoring(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	ctx := context.Background()
	req, restore := committedCheckpoint(t)

	failing := ctlplanetest.NewFake("agent", "a")
	failing.InstallErr = errors.New("invalid session state")
	var gogcDuring int64
	failing.OnInstall = func() { gogcDuring, _ = gcSettings() }
	if _, err := newTunedController(t, failing, ctlplane.RealClock{}, nil, tunerOn()).Restore(ctx, restore); err == nil {
		t.Fatal("restore with a failing install succeeded")
	}
	if !deferred(gogcDuring) {
		t.Fatalf("GOGC = %d during a failing install, want deferred", gogcDuring)
	}
	wantReleased(t, "a failed install")

	ok := ctlplanetest.NewFake("agent", "a")
	var limitDuring, gogcReading int64
	ok.OnInstall = func() { gogcDuring, limitDuring = gcSettings() }
	store := ckptstore.New(readObserver{tempLocal(t), func() { gogcReading, _ = gcSettings() }})
	fresh := newTunedController(t, ok, ctlplane.RealClock{}, store, tunerOn())
	if _, err := fresh.Restore(ctx, restore); err != nil {
		t.Fatal(err)
	}
	if !deferred(gogcReading) {
		t.Fatalf("GOGC = %d while the records were read, want deferred", gogcReading)
	}
	// The records are a few bytes: the limit allows the least headroom.
	if !deferred(gogcDuring) || limitDuring == math.MaxInt64 || limitDuring < 256<<20 {
		t.Fatalf("during install GOGC = %d, limit = %d; want deferred under a limit of 256 MiB or more", gogcDuring, limitDuring)
	}
	wantHeld(t, "between restore and resume")
	if _, err := fresh.Resume(req); err != nil {
		t.Fatal(err)
	}
	wantReleased(t, "the resume")
}

// bodyObserver is a request body calling onRead as each of its bytes is
// read (not as it is drained once read).
type bodyObserver struct {
	r      io.Reader
	onRead func()
}

func (b *bodyObserver) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if n > 0 {
		b.onRead()
	}
	return n, err
}

// Ensure the restore route holds collections while it reads the request's
// body (it names every episode, and is decoded in a fresh process), and
// that a restore refused afterwards leaves the settings as they were.
// (Not parallel: GC settings belong to the process.)
func TestRoutes_RestoreHoldsCollectionsWhileItReadsTheBody(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	c := newTunedController(t, ctlplanetest.NewFake("agent", "a"), ctlplane.RealClock{}, nil, tunerOn())
	gogcReading := int64(100)
	// A deadline long past: the restore is refused once decoded.
	body := &bodyObserver{
		r:      strings.NewReader(`{"checkpoint_id":"c1","deadline_ts":1,"checkpoint_dir":"/nowhere","episode_ids":[]}`),
		onRead: func() { gogcReading, _ = gcSettings() },
	}
	req := httptest.NewRequest(http.MethodPost, "/restore", body)
	req.Header.Set("Authorization", "Bearer t")
	rec := httptest.NewRecorder()
	c.Routes().ServeHTTP(rec, req)
	if rec.Code < 400 {
		t.Fatalf("restore with a deadline long past answered %d, want a refusal", rec.Code)
	}
	if !deferred(gogcReading) {
		t.Fatalf("GOGC = %d while the restore's body was read, want deferred (reply %d %s)", gogcReading, rec.Code, rec.Body)
	}
	wantReleased(t, "a refused restore")
}

// Ensure Close ends the hold of a restore whose install is still running,
// and the install finishing afterwards leaves the settings restored.
func TestController_CloseEndsARestoresHold(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	_, restore := committedCheckpoint(t)
	installing, finish := make(chan struct{}), make(chan struct{})
	f := ctlplanetest.NewFake("agent", "a")
	f.OnInstall = func() {
		close(installing)
		<-finish
	}
	c := newTunedController(t, f, ctlplane.RealClock{}, nil, tunerOn())
	restored := make(chan error, 1)
	go func() {
		_, err := c.Restore(context.Background(), restore)
		restored <- err
	}()
	<-installing
	wantHeld(t, "while the install runs")
	closed := make(chan struct{})
	go func() {
		c.Close()
		close(closed)
	}()
	// Close releases the hold before it waits for the install to end.
	deadline := time.Now().Add(10 * time.Second)
	for gogc, _ := gcSettings(); gogc < 0; gogc, _ = gcSettings() {
		if time.Now().After(deadline) {
			t.Fatal("Close did not end the restore's hold while its install ran")
		}
		runtime.Gosched()
	}
	close(finish)
	<-closed
	<-restored
	wantReleased(t, "Close and the install's end")
}

// Ensure a controller without a Tuning leaves the runtime's settings as
// they are through a checkpoint and a restore's route. (Not parallel: GC
// settings belong to the process.)
func TestController_WithoutTuningLeavesTheRuntimeAlone(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	clock := ctlplane.NewManualClock(epoch)
	c := newController(t, ctlplanetest.NewFake("agent", "a"), clock, nil)
	req := ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: deadlineIn(clock, 10*time.Second)}
	if _, err := c.Prepare(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	wantReleased(t, "a prepare without a Tuning")
	if _, err := c.Resume(req); err != nil {
		t.Fatal(err)
	}
	wantReleased(t, "the resume")
}

// countingTuning counts what the controller tells it.
type countingTuning struct {
	mu                sync.Mutex
	started, finished int
	sizes             []int64
	installs          int
}

func (c *countingTuning) CheckpointStarted()  { c.mu.Lock(); c.started++; c.mu.Unlock() }
func (c *countingTuning) CheckpointFinished() { c.mu.Lock(); c.finished++; c.mu.Unlock() }
func (c *countingTuning) RestoreSized(n int64) {
	c.mu.Lock()
	c.sizes = append(c.sizes, n)
	c.mu.Unlock()
}
func (c *countingTuning) InstallStarting(int64) func() {
	c.mu.Lock()
	c.installs++
	c.mu.Unlock()
	return func() {}
}
func (c *countingTuning) RequestDecoding() func() { return func() {} }

func (c *countingTuning) counts() (started, finished, sized, installs int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.started, c.finished, len(c.sizes), c.installs
}

// Ensure a prepare retried and a restore each start the checkpoint once,
// the restore sizes it once and installs once, and each reopen finishes it
// once.
func TestController_TellsItsTuningOncePerCheckpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	req, restore := committedCheckpoint(t)
	tuning := &countingTuning{}
	cfg := ctlplane.Config{Enabled: true, ControlAuthToken: "t", LeaseGraceSeconds: 60, Root: os.TempDir()}
	c, err := ctlplane.New(cfg, ctlplanetest.NewFake("agent", "a"), ctlplane.Deps{Tuning: tuning, Store: ckptstore.New(tempLocal(t))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Restore(ctx, restore); err != nil {
		t.Fatal(err)
	}
	if s, f, sized, in := tuning.counts(); s != 1 || f != 0 || sized != 1 || in != 1 {
		t.Fatalf("after a restore: started %d, finished %d, sized %d, installs %d; want 1, 0, 1, 1", s, f, sized, in)
	}
	if _, err := c.Resume(req); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resume(req); err != nil { // sent again
		t.Fatal(err)
	}
	if s, f, _, _ := tuning.counts(); s != 1 || f != 1 {
		t.Fatalf("after the resume: started %d, finished %d; want 1 and 1", s, f)
	}
	p := ctlplane.CheckpointRequest{CheckpointID: "c2", DeadlineTS: deadlineIn(ctlplane.RealClock{}, 30*time.Second)}
	for range 2 { // a prepare sent again replays
		if _, err := c.Prepare(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	if s, f, _, _ := tuning.counts(); s != 2 || f != 2 {
		t.Fatalf("after a prepare and Close: started %d, finished %d; want 2 and 2", s, f)
	}
}
