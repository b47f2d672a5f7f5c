package collect

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/gymfleet/gymfleet/pkg/infra/atomicfile"
	"github.com/gymfleet/gymfleet/pkg/infra/faultpoint"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// CollectionManifest is <dir>/<checkpoint_id>/collection.json: the
// collector's own part of a checkpoint, written after every participant
// committed and before LATEST points at it.
type CollectionManifest struct {
	CheckpointID string    `json:"checkpoint_id"`
	RunID        string    `json:"run_id"`
	CreatedAt    time.Time `json:"created_at"`
	// Continued are the attempts the environment exported: each continues
	// as attempt + 1 after a restore.
	Continued []rollout.EpisodeID `json:"continued"`
	// Restarted are in-flight attempts a participant reported as restarts
	// (left out of the scope): after a crash they start over.
	Restarted []rollout.EpisodeID `json:"restarted"`
}

// checkpointIDPattern is the shape of the ids NewCheckpointID makes.
var checkpointIDPattern = regexp.MustCompile(`^ckpt-[0-9]{8}T[0-9]{6}-[0-9a-f]{8}$`)

// NewCheckpointID is ckpt-<UTC %Y%m%dT%H%M%S>-<8 random hex digits>.
func NewCheckpointID(now time.Time) string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "ckpt-" + now.UTC().Format("20060102T150405") + "-" + hex.EncodeToString(b[:])
}

// ValidCheckpointID reports whether id has NewCheckpointID's shape (LATEST
// is read back only if it names such an id, never a path).
func ValidCheckpointID(id string) bool { return checkpointIDPattern.MatchString(id) }

// PublishCheckpoint writes <dir>/<id>/collection.json and then points
// <dir>/LATEST at it, each atomically: a crash leaves LATEST at the
// previous checkpoint or at this complete one.
func PublishCheckpoint(fsys atomicfile.FS, dir string, m CollectionManifest) error {
	if !ValidCheckpointID(m.CheckpointID) {
		return fmt.Errorf("checkpoint id %q is not ckpt-<UTC time>-<8 hex>", m.CheckpointID)
	}
	if m.Continued == nil {
		m.Continued = []rollout.EpisodeID{}
	}
	if m.Restarted == nil {
		m.Restarted = []rollout.EpisodeID{}
	}
	b, err := codec.MarshalIndent(m)
	if err != nil {
		return err
	}
	target := filepath.Join(dir, m.CheckpointID)
	if err := fsys.MkdirAll(target); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(fsys, filepath.Join(target, ManifestName), append(b, '\n')); err != nil {
		return fmt.Errorf("writing the collection manifest: %w", err)
	}
	faultpoint.Hit(faultpoint.CollectManifestWritten)
	if err := atomicfile.WriteFile(fsys, filepath.Join(dir, LatestName), []byte(m.CheckpointID+"\n")); err != nil {
		return fmt.Errorf("pointing LATEST at %s: %w", m.CheckpointID, err)
	}
	faultpoint.Hit(faultpoint.CollectLatestWritten)
	return nil
}

// ErrNoLatest reports a checkpoint directory without a LATEST pointer.
var ErrNoLatest = errors.New("no LATEST checkpoint")

// ReadLatest reads <dir>/LATEST and the collection manifest it names. It
// returns ErrNoLatest when there is no LATEST, and an error naming the
// problem when LATEST is not a checkpoint id or points at a partial
// checkpoint (no readable, matching collection.json).
func ReadLatest(dir string) (*CollectionManifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, LatestName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNoLatest
	}
	if err != nil {
		return nil, err
	}
	id := string(bytes.TrimSpace(b))
	if !ValidCheckpointID(id) {
		return nil, fmt.Errorf("LATEST holds %q, which is not a checkpoint id", truncate(id, 80))
	}
	return ReadManifest(dir, id)
}

// ReadManifest reads and checks <dir>/<id>/collection.json.
func ReadManifest(dir, id string) (*CollectionManifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, id, ManifestName))
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s is partial: %w", id, err)
	}
	var m CollectionManifest
	if err := codec.UnmarshalStrict(b, &m); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %s: %s", id, ManifestName, codec.DescribeError(err))
	}
	if m.CheckpointID != id {
		return nil, fmt.Errorf("checkpoint %s: %s names checkpoint %q", id, ManifestName, m.CheckpointID)
	}
	for _, e := range append(append([]rollout.EpisodeID(nil), m.Continued...), m.Restarted...) {
		if err := e.Validate(); err != nil {
			return nil, fmt.Errorf("checkpoint %s: %w", id, err)
		}
	}
	return &m, nil
}

// PruneResult lists what PruneCheckpoints removed.
type PruneResult struct {
	Old     []string // published checkpoints beyond the newest keep
	Partial []string // ckpt-* directories without a collection manifest
	Temp    []string // stray temp files of atomic writes
}

// PruneCheckpoints keeps the keep newest published checkpoints (those with
// a collection.json, ordered by created_at) and the one LATEST names, and
// removes older ones, partial ckpt-* directories (a commit that was never
// published) and the stray temp files of interrupted atomic writes. Call it
// only while no checkpoint of this directory is being written.
func PruneCheckpoints(dir string, keep int) (PruneResult, error) {
	var res PruneResult
	entries, err := os.ReadDir(dir)
	if err != nil {
		return res, err
	}
	latest := ""
	if b, err := os.ReadFile(filepath.Join(dir, LatestName)); err == nil {
		latest = string(bytes.TrimSpace(b))
	}
	type published struct {
		id      string
		created time.Time
	}
	var pubs []published
	var errs []error
	remove := func(path string) {
		if err := os.RemoveAll(path); err != nil {
			errs = append(errs, err)
		}
	}
	for _, e := range entries {
		name := e.Name()
		switch {
		case e.IsDir() && strings.HasPrefix(name, "ckpt-"):
			m, err := ReadManifest(dir, name)
			if err != nil {
				if _, statErr := os.Stat(filepath.Join(dir, name, ManifestName)); errors.Is(statErr, fs.ErrNotExist) && name != latest {
					res.Partial = append(res.Partial, name)
					remove(filepath.Join(dir, name))
				}
				continue
			}
			pubs = append(pubs, published{name, m.CreatedAt})
			removeTemps(filepath.Join(dir, name), name+"/", &res, remove)
		case !e.IsDir() && isTempName(name):
			res.Temp = append(res.Temp, name)
			remove(filepath.Join(dir, name))
		}
	}
	sort.Slice(pubs, func(i, j int) bool {
		if !pubs[i].created.Equal(pubs[j].created) {
			return pubs[i].created.After(pubs[j].created)
		}
		return pubs[i].id > pubs[j].id
	})
	for i, p := range pubs {
		if i < keep || p.id == latest {
			continue
		}
		res.Old = append(res.Old, p.id)
		remove(filepath.Join(dir, p.id))
	}
	return res, errors.Join(errs...)
}

func removeTemps(dir, prefix string, res *PruneResult, remove func(string)) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() && isTempName(e.Name()) {
			res.Temp = append(res.Temp, prefix+e.Name())
			remove(filepath.Join(dir, e.Name()))
		}
	}
}

// isTempName matches atomicfile's temp files: .<name>.<random>.tmp.
func isTempName(name string) bool {
	return strings.HasPrefix(name, ".") && strings.HasSuffix(name, ".tmp")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
