package ctlplane

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/infra/atomicfile"
	"github.com/gymfleet/gymfleet/pkg/tokencapture"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// waitLimit bounds every wait for another goroutine: a test that reaches
// it has failed (deadlock), it is no timing assertion.
const waitLimit = 30 * time.Second

func await(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitLimit):
		t.Fatalf("still waiting for %s", what)
	}
}

// incarnations are two processes of one participant over one epoch file:
// the zombie (first) and its replacement, each with its own open lock
// file, as two processes have.
func incarnations(t *testing.T) (root, path string, zombie, replacement *epochState) {
	t.Helper()
	root = t.TempDir()
	path = filepath.Join(root, DefaultEpochFileName)
	var err error
	if zombie, err = newEpochState(path); err != nil {
		t.Fatal(err)
	}
	if replacement, err = newEpochState(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		zombie.lock.close()
		replacement.lock.close()
	})
	return root, path, zombie, replacement
}

func threeRecords(add func(ckptstore.Record) error) (map[string]any, error) {
	for _, id := range []string{"r1", "r2", "r3"} {
		if err := add(ckptstore.Record{EpisodeID: rollout.EpisodeID{RolloutID: id}, Data: []byte(`{}`)}); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

func storeTarget(root, name string) ckptstore.Target {
	return ckptstore.Target{Dir: filepath.Join(root, name), Kind: "agent", Instance: "a", CheckpointID: name}
}

// Ensure the publish window is closed: a zombie whose check passed, then
// paused while its replacement raised the epoch, publishes no manifest
// and appends no ledger row when it resumes, and what it leaves is
// nothing a restore accepts.
func TestEpochGuard_RaiseAfterCheckRefusesThePublish(t *testing.T) {
	ctx := context.Background()
	root, _, zombie, replacement := incarnations(t)
	store, err := ckptstore.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	ledger, err := tokencapture.Open(filepath.Join(root, "ledger"), tokencapture.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ledger.Close()
	ledger.SetFence(zombie.guard)

	// The zombie's early check passes, as the commit's and a call's do
	// before their work ...
	if err := zombie.check(true); err != nil {
		t.Fatal(err)
	}
	// ... then it is paused, and its replacement is restored meanwhile.
	if err := replacement.adopt(1); err != nil {
		t.Fatal(err)
	}

	tgt := storeTarget(root, "c1")
	if _, err := store.Write(ctx, tgt, &ckptstore.WriteStop{Guard: zombie.guard}, threeRecords); !apierror.HasCode(err, apierror.StaleEpoch) {
		t.Fatalf("the zombie's commit: %v, want stale_epoch", err)
	}
	if _, err := os.Stat(filepath.Join(tgt.ParticipantDir(), ckptstore.ManifestFile)); !os.IsNotExist(err) {
		t.Fatalf("the zombie published a manifest: %v", err)
	}
	if _, _, _, err := store.Read(ctx, tgt, nil); !apierror.HasCode(err, apierror.InvalidCheckpointState) {
		t.Fatalf("a restore of what the zombie left: %v, want invalid_checkpoint_state", err)
	}

	key := rollout.EpisodeID{RolloutID: "r1"}.CaptureKey()
	if _, err := ledger.Append(key, tokencapture.Row{CallID: "call-1"}); !apierror.HasCode(err, apierror.StaleEpoch) {
		t.Fatalf("the zombie's ledger append: %v, want stale_epoch", err)
	}
	if err := ledger.Fail(key, tokencapture.Failure{Reason: "x"}); !apierror.HasCode(err, apierror.StaleEpoch) {
		t.Fatalf("the zombie's ledger failure record: %v, want stale_epoch", err)
	}
	if rows, err := ledger.Rows(key); err != nil || len(rows) != 0 {
		t.Fatalf("the zombie's ledger holds %d rows (%v), want none", len(rows), err)
	}
	if st := ledger.Stats(); st.Rows != 0 {
		t.Fatalf("the zombie's ledger stats: %+v, want no rows", st)
	}
}

// Ensure a raise cannot overtake a publication already past its check:
// the zombie paused between its check and its publish (the test hook)
// holds the raise off; its manifest, made in its own epoch, lands first,
// the raise after, and the zombie's next publish is refused.
func TestEpochGuard_RaiseWaitsForAPublishPastItsCheck(t *testing.T) {
	ctx := context.Background()
	root, path, zombie, replacement := incarnations(t)
	store, err := ckptstore.Open(root)
	if err != nil {
		t.Fatal(err)
	}

	checked, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	zombie.afterCheck = func() {
		once.Do(func() {
			close(checked)
			<-resume
		})
	}
	raiseWaits := make(chan struct{})
	var waitOnce sync.Once
	replacement.lock.onWait = func() { waitOnce.Do(func() { close(raiseWaits) }) }

	tgt := storeTarget(root, "c1")
	published := make(chan error, 1)
	go func() {
		_, err := store.Write(ctx, tgt, &ckptstore.WriteStop{Guard: zombie.guard}, threeRecords)
		published <- err
	}()
	await(t, checked, "the zombie's check")

	raised := make(chan error, 1)
	go func() { raised <- replacement.adopt(1) }()
	await(t, raiseWaits, "the raise to find the lock held")
	select {
	case err := <-raised:
		t.Fatalf("the raise finished while a publication past its check was paused: %v", err)
	default:
	}
	if b, err := os.ReadFile(path); err == nil {
		t.Fatalf("the epoch file was written while a publication was in flight: %q", b)
	}

	close(resume)
	if err := <-published; err != nil {
		t.Fatalf("the publication that passed its check: %v", err)
	}
	if err := <-raised; err != nil {
		t.Fatalf("the raise: %v", err)
	}
	if _, _, _, err := store.Read(ctx, tgt, nil); err != nil {
		t.Fatalf("the manifest published before the raise: %v", err)
	}
	if b, err := os.ReadFile(path); err != nil || strings.TrimSpace(string(b)) != "1" {
		t.Fatalf("epoch file after the raise: %q %v", b, err)
	}

	tgt2 := storeTarget(root, "c2")
	if _, err := store.Write(ctx, tgt2, &ckptstore.WriteStop{Guard: zombie.guard}, threeRecords); !apierror.HasCode(err, apierror.StaleEpoch) {
		t.Fatalf("the zombie's next commit: %v, want stale_epoch", err)
	}
	if _, err := os.Stat(filepath.Join(tgt2.ParticipantDir(), ckptstore.ManifestFile)); !os.IsNotExist(err) {
		t.Fatalf("the zombie published after the raise: %v", err)
	}
}

// Ensure writes of one process share the lock, and a raise of the same
// process waits for them as another process's does.
func TestEpochGuard_SharedWithinAProcess(t *testing.T) {
	_, _, e, _ := incarnations(t)
	inner := make(chan struct{})
	err := e.guard(func() error {
		// A second writer of the same process is not held off by the first.
		done := make(chan error, 1)
		go func() { done <- e.guard(func() error { return nil }) }()
		if err := <-done; err != nil {
			return err
		}
		close(inner)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	await(t, inner, "the second writer")
	if err := e.adopt(2); err != nil {
		t.Fatal(err)
	}
	if e.cur.Load() != 2 {
		t.Fatalf("epoch %d, want 2", e.cur.Load())
	}
}

// Ensure the reply check's cache never hides a raise: the file replaced
// (a raise) or rewritten in place with another size is read again.
func TestEpochCheck_CacheSeesEveryRaise(t *testing.T) {
	path := filepath.Join(t.TempDir(), "EPOCH")
	if err := os.WriteFile(path, []byte("3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := newEpochState(path)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := e.check(false); err != nil {
			t.Fatal(err)
		}
	}
	if err := atomicfile.WriteFile(atomicfile.OS, path, []byte("4\n")); err != nil {
		t.Fatal(err)
	}
	if err := e.check(false); !apierror.HasCode(err, apierror.StaleEpoch) {
		t.Fatalf("after a raise: %v, want stale_epoch", err)
	}

	other, err := newEpochState(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.check(false); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("40\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := other.check(false); !apierror.HasCode(err, apierror.StaleEpoch) {
		t.Fatalf("after a rewrite in place: %v, want stale_epoch", err)
	}
}

// Ensure an epoch lock that stays held (its holder stopped) fails the
// waiter instead of hanging it.
func TestEpochLock_BoundedWait(t *testing.T) {
	_, _, holder, waiter := incarnations(t)
	if err := holder.lock.rlock(); err != nil {
		t.Fatal(err)
	}
	defer holder.lock.runlock()
	waiter.lock.wait = 0
	if err := waiter.adopt(1); !apierror.HasCode(err, apierror.Unavailable) {
		t.Fatalf("a raise against a held lock: %v, want unavailable", err)
	}
}
