package control

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// FuzzEpisodeIDs checks the list's fast read against the strict decoder:
// whatever it reads, the strict decoder reads the same, and a list decodes
// (through UnmarshalJSON, inside a body) exactly as the strict decoder
// decodes it, error or not.
func FuzzEpisodeIDs(f *testing.F) {
	for _, s := range []string{
		`[]`, `[{"rollout_id":"w00000","attempt":0}]`,
		`[{"rollout_id":"a","attempt":1},{"rollout_id":"b-c.d_e","attempt":123456789012345678}]`,
		`[{"rollout_id":"a","attempt":01}]`, `[{"rollout_id":"a","attempt":-1}]`, `[{"rollout_id":"","attempt":0}]`,
		`[{"rollout_id":"a\u0062","attempt":0}]`, `[{"rollout_id":"\u00e9","attempt":0}]`, "[{\"rollout_id\":\"\xc3\xa9\",\"attempt\":0}]",
		`[{"rollout_id":"a","attempt":0},]`, `[{"rollout_id":"a","attempt":0}{"rollout_id":"b","attempt":0}]`,
		`[{"attempt":0,"rollout_id":"a"}]`, `[{"rollout_id": "a", "attempt": 0}]`, `[{"rollout_id":"a","attempt":0,"x":1}]`,
		`[{"rollout_id":"a","attempt":1e2}]`, `[{"rollout_id":"a","attempt":1.0}]`, `null`, `[null]`, `{}`,
		`[{"rollout_id":"a","attempt":1234567890123456789}]`, `[{"rollout_id":"a","rollout_id":"b","attempt":0}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var want []rollout.EpisodeID
		wantErr := codec.UnmarshalStrictFast(b, &want)
		if fast, ok := readEpisodeList(b); ok {
			if wantErr != nil || !reflect.DeepEqual([]rollout.EpisodeID(fast), want) && !(len(fast) == 0 && len(want) == 0) {
				t.Fatalf("read %q as %v; the strict decoder reads %v, %v", b, fast, want, wantErr)
			}
		}
		var req RestoreRequest
		body := append(append([]byte(`{"checkpoint_id":"c","deadline_ts":1,"checkpoint_dir":"/d","episode_ids":`), b...), '}')
		err := codec.UnmarshalStrictFast(body, &req)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("%q in a body: %v; on its own the strict decoder says %v", b, err, wantErr)
		}
		if err == nil && !(reflect.DeepEqual([]rollout.EpisodeID(req.EpisodeIDs), want) || len(req.EpisodeIDs) == 0 && len(want) == 0 && (req.EpisodeIDs == nil) == (want == nil)) {
			t.Fatalf("%q in a body decodes to %#v, on its own to %#v", b, req.EpisodeIDs, want)
		}
	})
}

// The coordinator's encoding of a scope is read by the fast path, into a
// slice of its exact length.
func TestEpisodeIDs_ReadsTheCoordinatorsForm(t *testing.T) {
	ids := make([]rollout.EpisodeID, 1000)
	for i := range ids {
		ids[i] = rollout.EpisodeID{RolloutID: fmt.Sprintf("w%05d", i), Attempt: i % 12}
	}
	b, err := codec.Marshal(ids)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := readEpisodeList(b)
	if !ok || !reflect.DeepEqual([]rollout.EpisodeID(got), ids) || cap(got) != len(ids) {
		t.Fatalf("read %d of %d ids (ok %v, capacity %d)", len(got), len(ids), ok, cap(got))
	}
	if _, ok := readEpisodeList([]byte(strings.ReplaceAll(string(b), ":", ": "))); ok {
		t.Fatal("a list with spaces was taken for the coordinator's form")
	}
}
