package e2e

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
)

// mountSmallDisk mounts a tmpfs of size at a new directory and unmounts it
// when the test ends (after the fleet, which registered its cleanup later).
func mountSmallDisk(t *testing.T, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mounting a %s tmpfs (the test needs root): %v\n%s", size, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v\n%s", dir, err, out)
		}
	})
	return dir
}

// fillDisk writes a file at path until the filesystem is full.
func fillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		_, err := f.Write(chunk)
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// The last pages: a smaller write may still find room.
	one := make([]byte, 512)
	for {
		if _, err := f.Write(one); err != nil {
			break
		}
	}
}

// TestDiskFullDuringCommit fills the checkpoint disk (a small tmpfs)
// between two checkpoints. The second commit fails on every participant
// with storage_full (HTTP 507) and publishes nothing; the first still
// verifies; resumed, the fleet finishes the rollouts in flight and serves
// new ones with the disk still full; and fresh processes restore the first
// checkpoint and finish its rollouts again from its boundary (a trainer
// would not restore rollouts it saw finish: here it shows the checkpoint
// is whole).
func TestDiskFullDuringCommit(t *testing.T) {
	disk := mountSmallDisk(t, "2m")
	f := startFleetWith(t, fleetOptions{topo: func(tp *fleet.Topology) { tp.CheckpointRoot = disk }})
	f.CkptDir = filepath.Join(disk, "checkpoints")
	ctx := context.Background()
	rows, ids, scope := holdSweep(f)
	runs := startHeld(f, rows, ids)
	c := f.Coord()
	f.Checkpoint(c, "c1", scope...)
	f.Resume(c, "c1")

	fillDisk(t, filepath.Join(disk, "filler"))
	res, err := c.Prepare(ctx, "c2", deadline(30*time.Second))
	if err != nil || !res.Prepared {
		t.Fatalf("prepare c2: %+v %v", res, err)
	}
	_, err = c.Commit(ctx, "c2", f.Dir("c2"), scope, deadline(30*time.Second), false)
	var ce *coordination.Error
	if !errors.As(err, &ce) || ce.Code() != apierror.StorageFull {
		t.Fatalf("commit on a full disk: %v, want storage_full from every participant", err)
	}
	for name, ferr := range ce.Failures {
		var ae *apierror.Error
		if !errors.As(ferr, &ae) || ae.HTTPStatus() != http.StatusInsufficientStorage {
			t.Errorf("%s answered %v, want HTTP 507", name, ferr)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(f.Dir("c2"), "gym", "*", "*", "manifest.json")); len(m) != 0 {
		t.Fatalf("a commit on a full disk published %v", m)
	}
	if _, err := ctlplanetest.Store(t, f.Dir("c1")).Verify(ctx, f.Dir("c1")); err != nil {
		t.Fatalf("c1 no longer verifies: %v", err)
	}

	// The fleet serves on: the rollouts in flight finish, and a new one.
	f.Resume(c, "c2")
	f.Release()
	finished := map[string][]int{"sw-w": {2, 4}, "sw-l": {2, 4}, "sw-k": {2, 4, 6}}
	for i, r := range runs {
		assertReward(t, r.Wait(t, time.Minute), 1.0)
		if got := f.MessageCounts(ids[i]); !slices.Equal(got, finished[ids[i]]) {
			t.Errorf("%s model calls %v, want %v: the failed commit must leave its rollouts as they were", ids[i], got, finished[ids[i]])
		}
	}
	assertReward(t, f.RunOK(weatherRow("after-full", "weather_agent", "Lima")), 1.0)

	// c1 restores into fresh processes and its rollouts finish again from
	// its boundary: delivered call 0 is not repeated.
	f.CrashAndRestore("c1", scope...)
	for _, r := range rows {
		assertReward(t, f.RunOK(withAttempt(r, 1)), 1.0)
	}
	again := map[string][]int{"sw-w": {4}, "sw-l": {4}, "sw-k": {4, 6}}
	for _, id := range ids {
		if got, want := f.MessageCounts(id), append(finished[id], again[id]...); !slices.Equal(got, want) {
			t.Errorf("%s model calls %v, want %v: restored from c1, only calls after its boundary run again", id, got, want)
		}
	}
}
