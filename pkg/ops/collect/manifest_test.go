package collect_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/infra/atomicfile"
	"github.com/gymfleet/gymfleet/pkg/ops/collect"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

func TestNewCheckpointID(t *testing.T) {
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.FixedZone("X", 3600))
	id := collect.NewCheckpointID(at)
	if !strings.HasPrefix(id, "ckpt-20260304T040607-") || len(id) != len("ckpt-20260304T040607-")+8 || !collect.ValidCheckpointID(id) {
		t.Fatalf("id %q: want ckpt-<UTC %%Y%%m%%dT%%H%%M%%S>-<8 hex>", id)
	}
	if !rollout.ValidID(id) {
		t.Fatalf("id %q is not a valid control-plane id", id)
	}
	if collect.NewCheckpointID(at) == id {
		t.Fatal("two ids of the same second are equal")
	}
	for _, bad := range []string{"", "ckpt-1", "../ckpt-20260304T040607-abcdef01", "ckpt-20260304T040607-ABCDEF01"} {
		if collect.ValidCheckpointID(bad) {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestPublishCheckpoint_ManifestThenLatest(t *testing.T) {
	dir := t.TempDir()
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	m := collect.CollectionManifest{
		CheckpointID: collect.NewCheckpointID(at), RunID: "run1", CreatedAt: at,
		Continued: []rollout.EpisodeID{{RolloutID: "a", Attempt: 0}, {RolloutID: "b", Attempt: 2}},
	}
	if err := collect.PublishCheckpoint(atomicfile.OS, dir, m); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, collect.LatestName))
	if err != nil || string(b) != m.CheckpointID+"\n" {
		t.Fatalf("LATEST = %q, %v", b, err)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, m.CheckpointID, collect.ManifestName))
	for _, want := range []string{`"checkpoint_id": "` + m.CheckpointID + `"`, `"run_id": "run1"`, `"created_at": "2026-03-04T05:06:07Z"`,
		`"rollout_id": "b"`, `"attempt": 2`, `"restarted": []`} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("collection.json lacks %s:\n%s", want, raw)
		}
	}
	got, err := collect.ReadLatest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.RunID != "run1" || !slices.Equal(got.Continued, m.Continued) || !got.CreatedAt.Equal(at) {
		t.Errorf("read back %+v", got)
	}
	if err := collect.PublishCheckpoint(atomicfile.OS, dir, collect.CollectionManifest{CheckpointID: "../x"}); err == nil {
		t.Error("an id that is a path was published")
	}
}

// failingFS fails the rename of one file, as a full disk would.
type failingFS struct {
	atomicfile.FS
	failRenameTo string
}

func (f failingFS) Rename(o, n string) error {
	if filepath.Base(n) == f.failRenameTo {
		return errors.New("disk full")
	}
	return f.FS.Rename(o, n)
}

func TestPublishCheckpoint_LatestMovesOnlyAfterTheManifest(t *testing.T) {
	dir := t.TempDir()
	first := collect.CollectionManifest{CheckpointID: collect.NewCheckpointID(time.Now()), RunID: "r", CreatedAt: time.Now()}
	if err := collect.PublishCheckpoint(atomicfile.OS, dir, first); err != nil {
		t.Fatal(err)
	}
	second := collect.CollectionManifest{CheckpointID: collect.NewCheckpointID(time.Now()), RunID: "r", CreatedAt: time.Now()}
	if err := collect.PublishCheckpoint(failingFS{atomicfile.OS, collect.ManifestName}, dir, second); err == nil {
		t.Fatal("a failed manifest write published")
	}
	if m, err := collect.ReadLatest(dir); err != nil || m.CheckpointID != first.CheckpointID {
		t.Fatalf("LATEST moved past a manifest that was never written: %v %v", m, err)
	}
}

func TestReadLatest_Refusals(t *testing.T) {
	dir := t.TempDir()
	if _, err := collect.ReadLatest(dir); !errors.Is(err, collect.ErrNoLatest) {
		t.Fatalf("no LATEST: %v", err)
	}
	write := func(name, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	id := "ckpt-20260101T000000-0123abcd"
	cases := []struct {
		name, latest, manifest, want string
	}{
		{"not an id", "../../etc", "", "not a checkpoint id"},
		{"partial: no collection.json", id, "", "is partial"},
		{"another checkpoint's manifest", id, `{"checkpoint_id":"ckpt-20260101T000000-ffffffff","run_id":"r","created_at":"2026-01-01T00:00:00Z","continued":[],"restarted":[]}`, "names checkpoint"},
		{"unknown field", id, `{"checkpoint_id":"` + id + `","run_id":"r","created_at":"2026-01-01T00:00:00Z","continued":[],"restarted":[],"x":1}`, "x"},
		{"invalid episode", id, `{"checkpoint_id":"` + id + `","run_id":"r","created_at":"2026-01-01T00:00:00Z","continued":[{"rollout_id":"bad id","attempt":0}],"restarted":[]}`, "invalid"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_ = os.RemoveAll(filepath.Join(dir, id))
			write(collect.LatestName, tc.latest+"\n")
			if tc.manifest != "" {
				write(filepath.Join(id, collect.ManifestName), tc.manifest)
			}
			if _, err := collect.ReadLatest(dir); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestPruneCheckpoints(t *testing.T) {
	dir := t.TempDir()
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var ids []string
	for i := 0; i < 4; i++ {
		m := collect.CollectionManifest{CheckpointID: collect.NewCheckpointID(base.Add(time.Duration(i) * time.Minute)), RunID: "r", CreatedAt: base.Add(time.Duration(i) * time.Minute)}
		// A participant's part, as a commit leaves it.
		if err := os.MkdirAll(filepath.Join(dir, m.CheckpointID, "gym", "environment", "env"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := collect.PublishCheckpoint(atomicfile.OS, dir, m); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.CheckpointID)
	}
	partial := "ckpt-20260101T010000-00000000"
	mustWrite(t, filepath.Join(dir, partial, "gym", "model", "policy_model", "records-x.jsonl"), "{}\n")
	mustWrite(t, filepath.Join(dir, ".LATEST.123.tmp"), "half")
	mustWrite(t, filepath.Join(dir, ids[3], ".collection.json.9.tmp"), "half")
	mustWrite(t, filepath.Join(dir, collect.DispatchLogName), `{"run_id":"r"}`+"\n")
	mustWrite(t, filepath.Join(dir, "notes.txt"), "the operator's")

	res, err := collect.PruneCheckpoints(dir, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Old, []string{ids[1], ids[0]}) && !slices.Equal(res.Old, []string{ids[0], ids[1]}) {
		t.Errorf("removed old %v, want %v", res.Old, ids[:2])
	}
	if !slices.Equal(res.Partial, []string{partial}) || len(res.Temp) != 2 {
		t.Errorf("removed partial %v temp %v", res.Partial, res.Temp)
	}
	var left []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		left = append(left, e.Name())
	}
	want := []string{collect.LatestName, ids[2], ids[3], collect.DispatchLogName, "notes.txt"}
	slices.Sort(want)
	if !slices.Equal(left, want) {
		t.Errorf("left %v, want %v", left, want)
	}
	if _, err := os.Stat(filepath.Join(dir, ids[3], ".collection.json.9.tmp")); !errors.Is(err, os.ErrNotExist) {
		t.Error("a temp file inside a kept checkpoint survived")
	}

	// LATEST is kept even when it is not among the newest.
	mustWrite(t, filepath.Join(dir, collect.LatestName), ids[2]+"\n")
	newest := collect.CollectionManifest{CheckpointID: collect.NewCheckpointID(base.Add(time.Hour)), RunID: "r", CreatedAt: base.Add(time.Hour)}
	if err := os.MkdirAll(filepath.Join(dir, newest.CheckpointID), 0o755); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(dir, newest.CheckpointID, collect.ManifestName), `{"checkpoint_id":"`+newest.CheckpointID+`","run_id":"r","created_at":"2026-01-01T01:00:00Z","continued":[],"restarted":[]}`)
	if res, err = collect.PruneCheckpoints(dir, 1); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Old, []string{ids[3]}) {
		t.Errorf("with keep 1 and LATEST at %s: removed %v, want [%s]", ids[2], res.Old, ids[3])
	}
}

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
