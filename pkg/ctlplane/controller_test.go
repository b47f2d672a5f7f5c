package ctlplane_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/infra/atomicfile"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/replica"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeServer serves a Fake participant's control plane and one data route,
// /probe, behind the fence middleware.
func fakeServer(t *testing.T, cfg ctlplane.Config, f *ctlplanetest.Fake, deps ctlplane.Deps) (*ctlplane.Controller, string) {
	t.Helper()
	c, err := ctlplane.New(cfg, f, deps)
	if err != nil {
		t.Fatal(err)
	}
	r := httpserver.NewRouter(httpserver.RouterOptions{Middleware: []func(http.Handler) http.Handler{c.Middleware(nil)}})
	c.Mount(r)
	r.Post("/probe", func(w http.ResponseWriter, r *http.Request) {
		httpserver.WriteJSON(w, 200, map[string]bool{"ok": true})
	})
	// Our server: HTTP/1.1 and h2c on one port.
	srv := httpserver.New(httpserver.Config{Addr: "127.0.0.1:0"}, r)
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	t.Cleanup(func() {
		srv.CloseNow()
		<-served
		c.Close()
	})
	return c, srv.URL()
}

func probe(url string) func(ctx context.Context, id rollout.EpisodeID) (int, string) {
	c := httpclient.New(httpclient.Options{})
	return func(ctx context.Context, id rollout.EpisodeID) (int, string) {
		rep, err := httpclient.Do(ctx, c, http.MethodPost, url+rollout.Path(id, "/probe"), nil, map[string]any{})
		if err != nil {
			return 0, err.Error()
		}
		if e := apierror.Parse(rep.Status, rep.Body); e != nil {
			return rep.Status, string(e.Code)
		}
		return rep.Status, ""
	}
}

func TestConformance_Fake(t *testing.T) {
	ctlplanetest.Run(t, func(t *testing.T, cfg ctlplane.Config) ctlplanetest.Subject {
		_, url := fakeServer(t, cfg, ctlplanetest.NewFake("resources", "fake"), ctlplane.Deps{})
		return ctlplanetest.Subject{URL: url, Kind: "resources", Instance: "fake", Probe: probe(url)}
	})
}

func TestConformance_Disabled(t *testing.T) {
	r := httpserver.NewRouter(httpserver.RouterOptions{})
	srv := httptest.NewServer(r)
	defer srv.Close()
	ctlplanetest.RunDisabled(t, srv.URL)
}

func TestNew_RefusesEnablingWithoutAToken(t *testing.T) {
	_, err := ctlplane.New(ctlplane.Config{Enabled: true, LeaseGraceSeconds: 1}, ctlplanetest.NewFake("model", "m"), ctlplane.Deps{})
	if err == nil {
		t.Fatal("enabling checkpoints without a token must fail start-up")
	}
}

var epoch = time.Unix(1_800_000_000, 0)

func deadlineIn(clock ctlplane.Clock, d time.Duration) float64 {
	return float64(clock.Now().Add(d).UnixNano()) / 1e9
}

func newController(t *testing.T, f *ctlplanetest.Fake, clock ctlplane.Clock, store *ckptstore.Store) *ctlplane.Controller {
	t.Helper()
	cfg := ctlplane.Config{Enabled: true, ControlAuthToken: "t", LeaseGraceSeconds: 60, Root: os.TempDir()}
	c, err := ctlplane.New(cfg, f, ctlplane.Deps{Clock: clock, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// Ensure an expired lease reopens exactly as a resume would, without sleeping.
func TestController_LeaseExpiryReopens(t *testing.T) {
	clock := ctlplane.NewManualClock(epoch)
	f := ctlplanetest.NewFake("agent", "a")
	c := newController(t, f, clock, nil)
	ctx := context.Background()
	if _, err := c.Prepare(ctx, ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: deadlineIn(clock, 10*time.Second)}); err != nil {
		t.Fatal(err)
	}
	if !f.Closed() {
		t.Fatal("prepare must close admission")
	}
	// A renew with a later deadline moves the lease.
	if _, err := c.Renew(ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: deadlineIn(clock, 30*time.Second)}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(69 * time.Second) // first lease (10s + 60s) passed, renewed one (30s + 60s) not
	if p, _ := c.Phase(); p != ctlplane.PhasePrepared || !f.Closed() {
		t.Fatalf("phase %s closed %v before the renewed lease expired", p, f.Closed())
	}
	clock.Advance(22 * time.Second)
	if p, _ := c.Phase(); p != ctlplane.PhaseIdle {
		t.Fatalf("phase after expiry = %s, want idle", p)
	}
	if f.Closed() {
		t.Fatal("expiry must reopen admission")
	}
	_, err := c.Prepare(ctx, ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: deadlineIn(clock, 10*time.Second)})
	if !apierror.HasCode(err, apierror.StaleCheckpoint) {
		t.Fatalf("a call of the expired checkpoint must be stale, got %v", err)
	}
	if n := clock.Pending(); n != 0 {
		t.Fatalf("%d lease timers still pending after expiry", n)
	}
}

// Ensure prepare waits for readiness by notification and replies prepared
// once the last blocker reaches its boundary.
func TestController_PrepareWaitsForNotification(t *testing.T) {
	f := ctlplanetest.NewFake("environment", "env")
	blocker := rollout.EpisodeID{RolloutID: "r1"}
	f.SetEpisode(blocker, false)
	c := newController(t, f, ctlplane.RealClock{}, nil)
	done := make(chan *ctlplane.PrepareReply, 1)
	go func() {
		r, err := c.Prepare(context.Background(), ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: deadlineIn(ctlplane.RealClock{}, 30*time.Second)})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	waitFor(t, f.Closed)
	select {
	case r := <-done:
		t.Fatalf("prepare replied %v while an episode blocks", r)
	default:
	}
	f.SetEpisode(blocker, true)
	r := <-done
	if r.Phase != ctlplane.PhasePrepared || !r.Report.Ready {
		t.Fatalf("reply = %+v, want prepared and ready", r)
	}
}

// Ensure a prepare that reaches its deadline replies preparing with the
// blockers and keeps admission closed.
func TestController_PrepareAtDeadlineReportsBlockers(t *testing.T) {
	clock := ctlplane.NewManualClock(epoch)
	f := ctlplanetest.NewFake("environment", "env")
	for _, r := range []string{"r3", "r1", "r2"} {
		f.SetEpisode(rollout.EpisodeID{RolloutID: r}, false)
	}
	f.SetRestart(rollout.EpisodeID{RolloutID: "r9"})
	c := newController(t, f, clock, nil)
	done := make(chan *ctlplane.PrepareReply, 1)
	go func() {
		r, err := c.Prepare(context.Background(), ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: deadlineIn(clock, 5*time.Second)})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	waitFor(t, f.Closed)
	waitFor(t, func() bool { return clock.Pending() >= 2 }) // lease and deadline timers armed
	clock.Advance(5 * time.Second)
	r := <-done
	if r.Phase != ctlplane.PhasePreparing || r.Report.Ready || r.Report.BlockerCount != 3 {
		t.Fatalf("reply = %+v", r)
	}
	if got := r.Report.Blockers; len(got) != 3 || got[0] != "r1" || got[2] != "r3" {
		t.Fatalf("blockers = %v, want sorted r1 r2 r3", got)
	}
	if len(r.Report.Restarts) != 1 || r.Report.Restarts[0] != "r9" {
		t.Fatalf("restarts = %v", r.Report.Restarts)
	}
	if !f.Closed() {
		t.Fatal("admission must stay closed after a prepare that was not ready")
	}
	// Commit of an unprepared checkpoint is refused.
	_, err := c.Commit(context.Background(), ctlplane.CommitRequest{CheckpointID: "c1", DeadlineTS: deadlineIn(clock, 5*time.Second), CheckpointDir: t.TempDir(), EpisodeIDs: []rollout.EpisodeID{}})
	if !apierror.HasCode(err, apierror.InvalidPhase) {
		t.Fatalf("commit while preparing: %v", err)
	}
}

// Ensure commit re-checks readiness and refuses a scope naming a restart.
func TestController_CommitRechecksReadinessAndRestarts(t *testing.T) {
	f := ctlplanetest.NewFake("resources", "r")
	c := newController(t, f, ctlplane.RealClock{}, nil)
	ctx := context.Background()
	dl := deadlineIn(ctlplane.RealClock{}, 30*time.Second)
	restart := rollout.EpisodeID{RolloutID: "restart-me"}
	f.SetRestart(restart)
	if _, err := c.Prepare(ctx, ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: dl}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Commit(ctx, ctlplane.CommitRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: t.TempDir(), EpisodeIDs: []rollout.EpisodeID{restart}})
	if !apierror.HasCode(err, apierror.RestartInScope) {
		t.Fatalf("a scope naming a restart: %v", err)
	}
	f.SetEpisode(rollout.EpisodeID{RolloutID: "late"}, false)
	_, err = c.Commit(ctx, ctlplane.CommitRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: t.TempDir(), EpisodeIDs: []rollout.EpisodeID{}})
	if !apierror.HasCode(err, apierror.InvalidPhase) {
		t.Fatalf("readiness regressed: %v", err)
	}
	if p, _ := c.Phase(); p != ctlplane.PhasePrepared {
		t.Fatalf("phase = %s, want prepared", p)
	}
}

// Ensure a commit into a directory that already holds the same checkpoint
// counts as done only if its records are this participant's: a later run
// reusing the checkpoint id and directory is refused before anything is
// treated as saved, and a commit of the same state replies with its
// episodes.
func TestController_CommitIntoAnExistingCheckpoint(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r1, r2 := rollout.EpisodeID{RolloutID: "r1"}, rollout.EpisodeID{RolloutID: "r2"}
	scope := []rollout.EpisodeID{r1, r2}
	commit := func(f *ctlplanetest.Fake) (*ctlplane.CommitReply, error) {
		t.Helper()
		c := newController(t, f, ctlplane.RealClock{}, nil)
		dl := deadlineIn(ctlplane.RealClock{}, 30*time.Second)
		if _, err := c.Prepare(ctx, ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: dl}); err != nil {
			t.Fatal(err)
		}
		return c.Commit(ctx, ctlplane.CommitRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: scope})
	}
	committed := func(f *ctlplanetest.Fake) bool {
		return slices.ContainsFunc(f.Calls(), func(c string) bool { return strings.HasPrefix(c, "committed") })
	}
	withEpisodes := func(ids ...rollout.EpisodeID) *ctlplanetest.Fake {
		f := ctlplanetest.NewFake("agent", "a")
		for _, id := range ids {
			f.SetEpisode(id, true)
		}
		return f
	}
	first := withEpisodes(r1, r2)
	if rep, err := commit(first); err != nil || len(rep.EpisodeIDs) != 2 {
		t.Fatalf("first commit: %+v, %v", rep, err)
	}
	later := withEpisodes(r1) // r2 finished in this run
	if rep, err := commit(later); !apierror.HasCode(err, apierror.CheckpointConflict) {
		t.Fatalf("a commit of other state under the same id and directory: %+v, %v; want checkpoint_conflict", rep, err)
	}
	if committed(later) {
		t.Fatalf("the refused participant was told its state is committed: %v", later.Calls())
	}
	same := withEpisodes(r1, r2)
	rep, err := commit(same)
	if err != nil || !slices.Equal(rep.EpisodeIDs, []string{"r1", "r2"}) || rep.Records != 2 {
		t.Fatalf("a commit of the same state: %+v, %v; want episodes r1 and r2", rep, err)
	}
	if !committed(same) {
		t.Fatalf("the participant whose commit matched was not told: %v", same.Calls())
	}
}

// blockingFS blocks the records fsync until released, to hold a write.
type blockingFS struct {
	atomicfile.FS
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

type blockingFile struct {
	atomicfile.File
	fs *blockingFS
}

func (b *blockingFS) CreateTemp(dir, pattern string) (atomicfile.File, error) {
	f, err := b.FS.CreateTemp(dir, pattern)
	if err != nil {
		return nil, err
	}
	return blockingFile{File: f, fs: b}, nil
}

func (f blockingFile) Sync() error {
	f.fs.once.Do(func() { close(f.fs.entered) })
	<-f.fs.release
	return f.File.Sync()
}

// Ensure a resume during a write stops it before it publishes: the
// directory never gets a manifest.
func TestController_ResumeStopsAnUnfinishedWrite(t *testing.T) {
	local := tempLocal(t)
	bfs := &blockingFS{FS: local.FS, entered: make(chan struct{}), release: make(chan struct{})}
	local.FS = bfs
	store := ckptstore.New(local)
	f := ctlplanetest.NewFake("model", "m")
	f.SetEpisode(rollout.EpisodeID{RolloutID: "r1"}, true)
	c := newController(t, f, ctlplane.RealClock{}, store)
	ctx := context.Background()
	dl := deadlineIn(ctlplane.RealClock{}, 30*time.Second)
	dir := t.TempDir()
	if _, err := c.Prepare(ctx, ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: dl}); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Commit(ctx, ctlplane.CommitRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: []rollout.EpisodeID{{RolloutID: "r1"}}})
		errc <- err
	}()
	<-bfs.entered
	if _, err := c.Resume(ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: dl}); err != nil {
		t.Fatal(err)
	}
	close(bfs.release)
	if err := <-errc; !apierror.HasCode(err, apierror.StaleCheckpoint) {
		t.Fatalf("the stopped commit must fail as resumed, got %v", err)
	}
	_, _, _, err := store.Read(ctx, ckptstore.Target{Dir: dir, Kind: "model", Instance: "m", CheckpointID: "c1"}, nil)
	if !apierror.HasCode(err, apierror.InvalidCheckpointState) {
		t.Fatalf("a stopped write must never publish a manifest; read gave %v", err)
	}
}

// Ensure a failed install leaves the participant idle and open.
func TestController_FailedRestoreReopens(t *testing.T) {
	ctx := context.Background()
	dl := deadlineIn(ctlplane.RealClock{}, 30*time.Second)
	dir := t.TempDir()
	src := ctlplanetest.NewFake("agent", "a")
	src.SetEpisode(rollout.EpisodeID{RolloutID: "r1"}, true)
	c := newController(t, src, ctlplane.RealClock{}, nil)
	if _, err := c.Prepare(ctx, ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: dl}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Commit(ctx, ctlplane.CommitRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: []rollout.EpisodeID{{RolloutID: "r1"}}}); err != nil {
		t.Fatal(err)
	}

	fresh := ctlplanetest.NewFake("agent", "a")
	fresh.InstallErr = errors.New("invalid session state")
	c2 := newController(t, fresh, ctlplane.RealClock{}, nil)
	_, err := c2.Restore(ctx, ctlplane.RestoreRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: []rollout.EpisodeID{{RolloutID: "r1"}}})
	if !apierror.HasCode(err, apierror.InvalidCheckpointState) {
		t.Fatalf("restore with a failing install: %v", err)
	}
	if p, _ := c2.Phase(); p != ctlplane.PhaseIdle || fresh.Closed() {
		t.Fatalf("after a failed restore: phase %s closed %v, want idle and open", p, fresh.Closed())
	}

	ok := ctlplanetest.NewFake("agent", "a")
	c3 := newController(t, ok, ctlplane.RealClock{}, nil)
	r, err := c3.Restore(ctx, ctlplane.RestoreRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: []rollout.EpisodeID{{RolloutID: "r1"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Restored) != 1 || r.Restored[0] != "r1-a1" {
		t.Fatalf("restored = %v, want [r1-a1] (the next attempt)", r.Restored)
	}
	if !ok.Closed() {
		t.Fatal("admission stays closed until resume after a restore")
	}
	// A process that served something is not fresh.
	_, err = c.Restore(ctx, ctlplane.RestoreRequest{CheckpointID: "c2", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: []rollout.EpisodeID{}})
	if err == nil {
		t.Fatal("restore into a process that served episodes must be refused")
	}
}

// Ensure retire raises the fence before the participant stops anything.
func TestController_RetireRaisesTheFenceFirst(t *testing.T) {
	f := ctlplanetest.NewFake("environment", "env")
	c := newController(t, f, ctlplane.RealClock{}, nil)
	id := rollout.EpisodeID{RolloutID: "r1", Attempt: 2}
	var fencedDuringRetire bool
	f.OnRetire = func([]rollout.EpisodeID) { fencedDuringRetire = c.Fence().Refuses(id) }
	if _, err := c.Retire(context.Background(), ctlplane.RetireRequest{CheckpointID: "c-retire", DeadlineTS: deadlineIn(ctlplane.RealClock{}, 30*time.Second), EpisodeIDs: []rollout.EpisodeID{id}}); err != nil {
		t.Fatal(err)
	}
	if !fencedDuringRetire {
		t.Fatal("the participant's Retire ran before the fence was raised")
	}
	if err := c.CheckFence(rollout.EpisodeID{RolloutID: "r1", Attempt: 1}); !apierror.HasCode(err, apierror.StaleAttempt) {
		t.Fatalf("an earlier attempt must be fenced too: %v", err)
	}
	if err := c.CheckFence(rollout.EpisodeID{RolloutID: "r1", Attempt: 3}); err != nil {
		t.Fatalf("the next attempt must pass: %v", err)
	}
}

// Ensure a retire cut short by its deadline fails with deadline_exceeded and
// keeps the fence.
func TestController_RetireDeadline(t *testing.T) {
	f := ctlplanetest.NewFake("resources", "r")
	f.RetireGate = make(chan struct{})
	defer close(f.RetireGate)
	c := newController(t, f, ctlplane.RealClock{}, nil)
	id := rollout.EpisodeID{RolloutID: "r1"}
	_, err := c.Retire(context.Background(), ctlplane.RetireRequest{CheckpointID: "c-retire", DeadlineTS: deadlineIn(ctlplane.RealClock{}, 50*time.Millisecond), EpisodeIDs: []rollout.EpisodeID{id}})
	if !apierror.HasCode(err, apierror.DeadlineExceeded) {
		t.Fatalf("got %v, want deadline_exceeded", err)
	}
	if !c.Fence().Refuses(id) {
		t.Fatal("the mark stays even if the retire failed")
	}
}

// Ensure the middleware refuses or holds data requests while closed.
func TestController_MiddlewareAdmission(t *testing.T) {
	f := ctlplanetest.NewFake("resources", "r")
	c := newController(t, f, ctlplane.RealClock{}, nil)
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })
	refuse := c.Middleware(ctlplane.ByPrefix(ctlplane.AdmitRefuse))(ok)
	wait := c.Middleware(ctlplane.ByPrefix(ctlplane.AdmitWait))(ok)
	dl := deadlineIn(ctlplane.RealClock{}, 30*time.Second)
	if _, err := c.Prepare(context.Background(), ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: dl}); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	refuse.ServeHTTP(rec, httptest.NewRequest("POST", "/x", nil))
	if rec.Code != http.StatusConflict {
		t.Fatalf("refused while closed: %d", rec.Code)
	}
	done := make(chan int, 1)
	go func() {
		rec := httptest.NewRecorder()
		wait.ServeHTTP(rec, httptest.NewRequest("POST", "/x", nil))
		done <- rec.Code
	}()
	select {
	case code := <-done:
		t.Fatalf("a waiting request passed while closed: %d", code)
	case <-time.After(50 * time.Millisecond):
	}
	if _, err := c.Resume(ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: dl}); err != nil {
		t.Fatal(err)
	}
	if code := <-done; code != 200 {
		t.Fatalf("the waiting request after resume: %d", code)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		<-time.After(2 * time.Millisecond)
	}
}

// tempLocal is a local backend confined to the temp directory, which holds
// every t.TempDir().
func tempLocal(t *testing.T) *ckptstore.Local {
	t.Helper()
	l, err := ckptstore.OpenLocal(os.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// A signing key file that is missing or short fails start-up, as does a
// key given with a store that is not keyed.
func TestNew_SigningKeyFile(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(short, []byte(strings.Repeat("k", 31)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(good, []byte(strings.Repeat("k", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := ctlplane.Config{Enabled: true, ControlAuthToken: "t", LeaseGraceSeconds: 60, Root: dir}
	for _, p := range []string{short, filepath.Join(dir, "missing")} {
		cfg.SigningKeyFile = p
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "checkpoint.signing_key_file") {
			t.Errorf("Validate with key file %s: %v, want an error naming checkpoint.signing_key_file", p, err)
		}
		if c, err := ctlplane.New(cfg, ctlplanetest.NewFake("model", "m"), ctlplane.Deps{}); err == nil {
			c.Close()
			t.Errorf("New with key file %s started", p)
		}
	}
	cfg.SigningKeyFile = good
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	unkeyed, err := ckptstore.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer unkeyed.Close()
	if c, err := ctlplane.New(cfg, ctlplanetest.NewFake("model", "m"), ctlplane.Deps{Store: unkeyed}); err == nil {
		c.Close()
		t.Error("New with a key file and an unkeyed store started")
	}
	c, err := ctlplane.New(cfg, ctlplanetest.NewFake("model", "m"), ctlplane.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

// A root in an object store: commits go beneath its bucket and prefix and
// nowhere else, and a fresh controller restores what another committed.
func TestController_S3Root(t *testing.T) {
	fake := httptest.NewServer(gofakes3.New(s3mem.New(), gofakes3.WithAutoBucket(true)).Server())
	defer fake.Close()
	t.Setenv("AWS_ACCESS_KEY_ID", "fake")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "fake")
	t.Setenv("AWS_REGION", "us-east-1")
	root := "s3://fleet-bucket/checkpoints"
	cfg := ctlplane.Config{Enabled: true, ControlAuthToken: "t", LeaseGraceSeconds: 60, Root: root, S3Endpoint: fake.URL, S3PathStyle: true}
	ctx := context.Background()
	dl := deadlineIn(ctlplane.RealClock{}, 30*time.Second)
	scope := []rollout.EpisodeID{{RolloutID: "r1"}, {RolloutID: "r2"}}
	newC := func(f *ctlplanetest.Fake) *ctlplane.Controller {
		c, err := ctlplane.New(cfg, f, ctlplane.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	src := ctlplanetest.NewFake("agent", "a")
	for _, id := range scope {
		src.SetEpisode(id, true)
	}
	c := newC(src)
	if _, err := c.Prepare(ctx, ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: dl}); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"s3://fleet-bucket/elsewhere/c1", "s3://other-bucket/checkpoints/c1", "s3://fleet-bucket/checkpoints/../c1", t.TempDir()} {
		_, err := c.Commit(ctx, ctlplane.CommitRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: scope})
		if !apierror.HasCode(err, apierror.InvalidRequest) {
			t.Fatalf("a commit to %s: %v, want invalid_request", dir, err)
		}
	}
	dir := root + "/c1"
	if rep, err := c.Commit(ctx, ctlplane.CommitRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: scope}); err != nil || rep.Records != 2 {
		t.Fatalf("a commit beneath the root: %+v, %v", rep, err)
	}
	fresh := ctlplanetest.NewFake("agent", "a")
	r, err := newC(fresh).Restore(ctx, ctlplane.RestoreRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: scope})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Restored, []string{"r1-a1", "r2-a1"}) {
		t.Fatalf("restored %v, want the next attempts of r1 and r2", r.Restored)
	}
}

func TestConfig_S3Root(t *testing.T) {
	base := ctlplane.Config{Enabled: true, ControlAuthToken: "t", LeaseGraceSeconds: 60}
	for root, ok := range map[string]bool{
		"s3://bucket":            true,
		"s3://bucket/a/b":        true,
		"s3://":                  false,
		"s3://bucket//a":         false,
		"s3://bucket/a/../b":     false,
		"s3://bucket/./a":        false,
		"/srv/checkpoints":       true,
		"relative/checkpoints/x": true,
	} {
		cfg := base
		cfg.Root = root
		if err := cfg.Validate(); (err == nil) != ok {
			t.Errorf("root %q: %v, want ok %v", root, err, ok)
		}
	}
}

// Ensure a restore into another count of a kind routed by rollout id
// installs, on each live replica, every former replica's records of the
// rollouts replica.Pick now sends there, and nothing else.
func TestController_RestoreByPartition(t *testing.T) {
	ctx := context.Background()
	dl := deadlineIn(ctlplane.RealClock{}, 30*time.Second)
	dir := t.TempDir()
	var scope []rollout.EpisodeID
	for i := range 12 {
		scope = append(scope, rollout.EpisodeID{RolloutID: fmt.Sprintf("r%d", i)})
	}
	var former []string
	for i, inst := range replica.Names("res", 2) {
		former = append(former, inst)
		f := ctlplanetest.NewFake("resources", inst)
		for _, id := range scope {
			if replica.Pick(id.RolloutID, 2) == i {
				f.SetEpisode(id, true)
			}
		}
		c := newController(t, f, ctlplane.RealClock{}, nil)
		if _, err := c.Prepare(ctx, ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: dl}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Commit(ctx, ctlplane.CommitRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: scope}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []int{3, 1} {
		seen := map[string]string{}
		for i, inst := range replica.Names("res", n) {
			f := ctlplanetest.NewFake("resources", inst)
			c := newController(t, f, ctlplane.RealClock{}, nil)
			plan := &ctlplane.ReplicaPlan{Sources: former, Partition: &replica.Partition{Index: i, Count: n}}
			r, err := c.Restore(ctx, ctlplane.RestoreRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: scope, Replicas: plan})
			if err != nil {
				t.Fatalf("restore into %s of %d: %v", inst, n, err)
			}
			for _, key := range r.Restored {
				id, err := rollout.ParseCaptureKey(key)
				if err != nil {
					t.Fatal(err)
				}
				if replica.Pick(id.RolloutID, n) != i || seen[key] != "" {
					t.Fatalf("%s installed on %s of %d (also on %q); Pick names replica %d", key, inst, n, seen[key], replica.Pick(id.RolloutID, n))
				}
				seen[key] = inst
			}
		}
		if len(seen) != len(scope) {
			t.Fatalf("into %d replicas: %d of %d rollouts installed: %v", n, len(seen), len(scope), seen)
		}
	}
	// A partition that is not the instance's place is refused before anything is read.
	f := ctlplanetest.NewFake("resources", "res-1")
	c := newController(t, f, ctlplane.RealClock{}, nil)
	plan := &ctlplane.ReplicaPlan{Sources: former, Partition: &replica.Partition{Index: 0, Count: 3}}
	if _, err := c.Restore(ctx, ctlplane.RestoreRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: scope, Replicas: plan}); !apierror.HasCode(err, apierror.InvalidRequest) {
		t.Fatalf("restore of res-1 as replica 0 of 3: %v, want invalid_request", err)
	}
}

// holdingFake is a Fake that names what it holds (ctlplane.Holder).
type holdingFake struct {
	*ctlplanetest.Fake
	held []rollout.EpisodeID
}

func (h holdingFake) Held() []rollout.EpisodeID { return h.held }

// TestController_CommitWithoutScope: a commit with episode_ids null (NeMo
// Gym's CommitRequest default, nemo_gym/_checkpoint/control.py @
// 011c3386d691) exports what a Holder holds, its restarts never in scope;
// a participant that is no Holder refuses it with checkpoint_error and stays
// prepared, as Gym's model participant refuses it (model.py
// export_model_records). The reply lists each exported episode once,
// sorted, as Gym's does.
func TestController_CommitWithoutScope(t *testing.T) {
	ctx := context.Background()
	dl := deadlineIn(ctlplane.RealClock{}, 30*time.Second)

	plain := ctlplanetest.NewFake("model", "m")
	c := newController(t, plain, ctlplane.RealClock{}, nil)
	if _, err := c.Prepare(ctx, ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: dl}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Commit(ctx, ctlplane.CommitRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: t.TempDir()})
	var ae *apierror.Error
	if !errors.As(err, &ae) || ae.Code != apierror.CheckpointError || ae.HTTPStatus() != http.StatusConflict {
		t.Fatalf("a commit without a scope on a participant that is no Holder: %v", err)
	}
	if p, _ := c.Phase(); p != ctlplane.PhasePrepared {
		t.Fatalf("phase = %s, want prepared", p)
	}
	if _, err := c.Commit(ctx, ctlplane.CommitRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: t.TempDir(), EpisodeIDs: []rollout.EpisodeID{}}); err != nil {
		t.Fatalf("a commit with a scope after the refusal: %v", err)
	}

	f := ctlplanetest.NewFake("environment", "e")
	held := []rollout.EpisodeID{{RolloutID: "r-0", Attempt: 0}, {RolloutID: "r", Attempt: 1}}
	restart := rollout.EpisodeID{RolloutID: "restart-me"}
	for _, id := range append(held, restart) {
		f.SetEpisode(id, true)
	}
	f.SetRestart(restart)
	cfg := ctlplane.Config{Enabled: true, ControlAuthToken: "t", LeaseGraceSeconds: 60, Root: os.TempDir()}
	hc, err := ctlplane.New(cfg, holdingFake{Fake: f, held: held}, ctlplane.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hc.Close)
	if _, err := hc.Prepare(ctx, ctlplane.CheckpointRequest{CheckpointID: "c1", DeadlineTS: dl}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rep, err := hc.Commit(ctx, ctlplane.CommitRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.EpisodeIDs, []string{"r-0", "r-a1"}) || rep.Manifest.RecordCount != 2 {
		t.Fatalf("commit reply episode_ids %v, %d records; want [r-0 r-a1], 2", rep.EpisodeIDs, rep.Manifest.RecordCount)
	}
	again, err := hc.Commit(ctx, ctlplane.CommitRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir})
	if err != nil || again != rep {
		t.Fatalf("a retry without a scope: %+v, %v; want the first reply", again, err)
	}
	_, err = hc.Commit(ctx, ctlplane.CommitRequest{CheckpointID: "c1", DeadlineTS: dl, CheckpointDir: dir, EpisodeIDs: held})
	if !apierror.HasCode(err, apierror.CheckpointConflict) {
		t.Fatalf("the same id with a scope after one without: %v", err)
	}
}
