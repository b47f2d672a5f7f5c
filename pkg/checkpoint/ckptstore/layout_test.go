package ckptstore_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// writeDir lays out one participant directory by hand, bypassing our
// writer: the records lines as given and a manifest over them, with the
// fields and formatting of NeMo Gym's writer
// (nemo_gym/_checkpoint/store.py @ e7e449e9aa0d, _write:
// json.dumps(manifest, sort_keys=True, indent=1)).
func writeDir(t *testing.T, lines []string) string {
	t.Helper()
	dir := t.TempDir()
	pdir := filepath.Join(dir, "gym", "agent", "simple_agent")
	if err := os.MkdirAll(pdir, 0o755); err != nil {
		t.Fatal(err)
	}
	body := strings.Join(lines, "\n") + "\n"
	sum := sha256.Sum256([]byte(body))
	digest := hex.EncodeToString(sum[:])
	name := "records-" + digest + ".jsonl"
	if err := os.WriteFile(filepath.Join(pdir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	manifest := "{\n \"checkpoint_id\": \"ckpt-1\",\n \"instance\": \"simple_agent\",\n \"kind\": \"agent\",\n" +
		" \"record_count\": " + itoa(len(lines)) + ",\n \"records_file\": \"" + name + "\",\n" +
		" \"records_sha256\": \"" + digest + "\",\n \"schema_version\": 1\n}"
	if err := os.WriteFile(filepath.Join(pdir, ckptstore.ManifestFile), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestStore_ReadsUpstreamLayout: a directory as NeMo Gym's store writes it
// (flat lines through Python's json.dumps, ", " and ": " separators, and a
// legacy agent record with its top-level episode member, as NeMo RL's
// gym_checkpoint_adapter.py @ ec883a24be08 _legacy_agent_capture_keys
// reads it) reads back: each record whole, its episode id taken from the
// line.
func TestStore_ReadsUpstreamLayout(t *testing.T) {
	lines := []string{
		`{"episode_id": {"rollout_id": "r1", "attempt": 0}, "session_id": "s1", "episode": {"next": "verify"}}`,
		`{"episode_id": {"rollout_id": "r2", "attempt": 3}, "session_id": "s2", "episode": null}`,
	}
	dir := writeDir(t, lines)
	s := tempStore(t)
	m, recs, _, err := s.Read(context.Background(), ckptstore.Target{Dir: dir, Kind: "agent", Instance: "simple_agent", CheckpointID: "ckpt-1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m.RecordCount != 2 || len(recs) != 2 {
		t.Fatalf("manifest %+v, %d records", m, len(recs))
	}
	want := []rollout.EpisodeID{{RolloutID: "r1"}, {RolloutID: "r2", Attempt: 3}}
	for i, r := range recs {
		if r.EpisodeID != want[i] || string(r.Data) != lines[i] {
			t.Fatalf("record %d = %s %s, want %s %s", i, r.EpisodeID, r.Data, want[i], lines[i])
		}
	}
}

// TestStore_ReadsTheFormerWrappedLayout: a checkpoint written before
// records were flat ({"episode_id":…,"record":{…}}) still restores: each
// record is the one the line wrapped.
func TestStore_ReadsTheFormerWrappedLayout(t *testing.T) {
	lines := []string{
		`{"episode_id":{"rollout_id":"r1","attempt":0},"record":{"type":"agent_session","episode_id":{"rollout_id":"r1","attempt":0},"session_id":"s1"}}`,
		`{"episode_id":{"rollout_id":"r2","attempt":1},"record":{"rows":[],"generation_cuts":[]}}`,
		`{"episode_id": {"rollout_id": "r3", "attempt": 0}, "record": null}`,
	}
	dir := writeDir(t, lines)
	_, recs, _, err := tempStore(t).Read(context.Background(), ckptstore.Target{Dir: dir, Kind: "agent", Instance: "simple_agent"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantData := []string{
		`{"type":"agent_session","episode_id":{"rollout_id":"r1","attempt":0},"session_id":"s1"}`,
		`{"rows":[],"generation_cuts":[]}`,
		`null`,
	}
	for i, r := range recs {
		if string(r.Data) != wantData[i] {
			t.Fatalf("record %d = %s, want %s", i, r.Data, wantData[i])
		}
	}
}

// TestStore_WritesFlatLines: what our writer writes is upstream's line:
// one object, episode_id first, the record's members beside it; Python's
// json.loads of each line (upstream's reader) sees the same members.
func TestStore_WritesFlatLines(t *testing.T) {
	dir := t.TempDir()
	s := tempStore(t)
	tg := ckptstore.Target{Dir: dir, Kind: "resources", Instance: "counter", CheckpointID: "c1"}
	w, err := s.Write(context.Background(), tg, nil, func(add func(ckptstore.Record) error) (map[string]any, error) {
		if err := add(ckptstore.Record{EpisodeID: rollout.EpisodeID{RolloutID: "a", Attempt: 2}, Data: []byte(`{"session_id":"s","state":{"count":1}}`)}); err != nil {
			return nil, err
		}
		return nil, add(ckptstore.Record{EpisodeID: rollout.EpisodeID{RolloutID: "b"}, Data: []byte(`{"episode_id":{"rollout_id":"b","attempt":0},"state":null}`)})
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "gym", "resources", "counter", w.Manifest.RecordsFile))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"episode_id":{"rollout_id":"a","attempt":2},"session_id":"s","state":{"count":1}}` + "\n" +
		`{"episode_id":{"rollout_id":"b","attempt":0},"state":null}` + "\n"
	if string(b) != want {
		t.Fatalf("records file:\n%s\nwant:\n%s", b, want)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var members map[string]codec.RawMessage
		if err := codec.UnmarshalStrict([]byte(line), &members); err != nil || members["episode_id"] == nil {
			t.Fatalf("line %s is not one object with an episode_id: %v", line, err)
		}
	}
	// A record naming another episode than the one it is filed under is
	// refused: a flat line names one.
	_, err = s.Write(context.Background(), ckptstore.Target{Dir: t.TempDir(), Kind: "resources", Instance: "counter", CheckpointID: "c1"}, nil,
		func(add func(ckptstore.Record) error) (map[string]any, error) {
			return nil, add(ckptstore.Record{EpisodeID: rollout.EpisodeID{RolloutID: "a"}, Data: []byte(`{"episode_id":{"rollout_id":"b","attempt":0}}`)})
		})
	if err == nil || !strings.Contains(err.Error(), "filed under a") {
		t.Fatalf("a record of b filed under a: %v", err)
	}
}
