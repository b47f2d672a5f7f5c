package ckptstore_test

import (
	"bytes"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

var lineSeeds = []string{
	`{"episode_id":{"rollout_id":"w","attempt":1},"record":{"a":[1,2]}}` + "\n",
	`{"episode_id":{"rollout_id":"w","attempt":0},"record":null}` + "\n",
	`{"episode_id":{"rollout_id":"w","attempt":0},"record": {"a":1} }` + "\n",
	`{"episode_id":{"rollout_id":"w","attempt":0},"record":{"a":1}}}` + "\n",
	`{"episode_id":{"rollout_id":"w","attempt":0},"record":1,"x":2}` + "\n",
	`{"episode_id":{"rollout_id":"w","attempt":0},"record":}` + "\n",
	`{"episode_id":{"rollout_id":"w","attempt":0},"record":{"a":}}` + "\n",
	`{"episode_id":{"rollout_id":"w","attempt":0},"record":1},"x":{"y":2}` + "\n",
	`{"episode_id":{"rollout_id":"w","attempt":007},"record":1}` + "\n",
	`{"episode_id":{"rollout_id":"w","attempt":-1},"record":1}` + "\n",
	`{"episode_id":{"rollout_id":"w","attempt":1.5},"record":1}` + "\n",
	`{"episode_id":{"rollout_id":"w\u0041","attempt":1},"record":1}` + "\n",
	`{"episode_id":{"rollout_id":"w","attempt":99999999999999999999},"record":1}` + "\n",
	"{\"episode_id\":{\"rollout_id\":\"w\xff\",\"attempt\":1},\"record\":1}\n",
	`{"episode_id":{"rollout_id":"w","attempt":1},"record":"x"}` + "\r\n",
	`{"episode_id":{"attempt":1,"rollout_id":"w"},"record":1}` + "\n",
	// Flat lines, as upstream's store.py and ours write them.
	`{"episode_id":{"rollout_id":"w","attempt":0}}` + "\n",
	`{"episode_id":{"rollout_id":"w","attempt":2},"task_digest":"d","boundary":null}` + "\n",
	`{"episode_id":{"rollout_id":"w","attempt":0},"record":1,"x":2}` + "\n",
	`{"episode_id": {"rollout_id": "w", "attempt": 0}, "state": {"a": 1}}` + "\n",
	`{"state": {"a": 1}, "episode_id": {"rollout_id": "w", "attempt": 0}}` + "\n",
	`{"episode_id":{"rollout_id":"w","attempt":0},"x":}` + "\n",
	`{"episode_id":{"rollout_id":"w","attempt":0}x}` + "\n",
}

// FuzzCanonicalLine: a line the fast reader accepts is the record the
// strict decoder reads from it, byte for byte. The fast reader frames a
// line and does not validate a flat record (each participant decodes its
// records strictly), so a line it accepts and the strict decoder refuses
// must not be one JSON object: with its record replaced by one, it reads
// as that record, so the framing alone decided what was cut.
func FuzzCanonicalLine(f *testing.F) {
	for _, s := range lineSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		fast, ok := ckptstore.ReadCanonical(line)
		if !ok {
			return
		}
		ref, err := ckptstore.DecodeLine(line)
		if err != nil {
			if codec.Valid(bytes.TrimSuffix(line, []byte("\n"))) && codec.Valid(fast.Data) {
				t.Fatalf("fast reader accepted %q as %+v %q; the strict decoder refuses it: %v", line, fast.EpisodeID, fast.Data, err)
			}
			return
		}
		if fast.EpisodeID != ref.EpisodeID || !bytes.Equal(fast.Data, ref.Data) {
			t.Fatalf("%q: fast reader read %+v %s, the strict decoder %+v %s", line, fast.EpisodeID, fast.Data, ref.EpisodeID, ref.Data)
		}
	})
}

// FuzzRecordLineRoundTrip: every line the writer writes is flat, starts
// with the episode id, and the fast reader reads it back as a record with
// the members written.
func FuzzRecordLineRoundTrip(f *testing.F) {
	f.Add("w", 0, []byte(`{"a":1}`))
	f.Add("rollout-000001", 7, []byte(` {"b": [1, 2]} `))
	f.Add("r.x_y-z", 999999999, []byte(`{}`))
	f.Add("w", 3, []byte(`{"episode_id":{"rollout_id":"w","attempt":3},"a":"x"}`))
	f.Fuzz(func(t *testing.T, rid string, attempt int, data []byte) {
		id := rollout.EpisodeID{RolloutID: rid, Attempt: attempt}
		var want map[string]codec.RawMessage
		if id.Validate() != nil || codec.UnmarshalStrict(data, &want) != nil || bytes.IndexByte(data, '\n') >= 0 {
			return
		}
		line, err := ckptstore.AppendRecord(ckptstore.Record{EpisodeID: id, Data: data})
		if raw, has := want["episode_id"]; has {
			var named rollout.EpisodeID
			if codec.UnmarshalStrict(raw, &named) != nil || named != id {
				if err == nil {
					t.Fatalf("wrote %q filed under %s", data, id)
				}
				return
			}
		}
		if err != nil {
			t.Fatalf("%+v %q: %v", id, data, err)
		}
		got, ok := ckptstore.ReadCanonical(line)
		if !ok && bytes.HasPrefix(line, []byte(`{"episode_id":{`)) {
			// An id member not first, or not as our encoders write it.
			got, err = ckptstore.DecodeLine(line)
			ok = err == nil
		}
		var members map[string]codec.RawMessage
		if !ok || got.EpisodeID != id || codec.UnmarshalStrict(got.Data, &members) != nil {
			t.Fatalf("wrote %+v %q as %q, read back %+v %q (ok %v)", id, data, line, got.EpisodeID, got.Data, ok)
		}
		delete(members, "episode_id")
		delete(want, "episode_id")
		if len(members) != len(want) {
			t.Fatalf("wrote %q as %q: members %v, want %v", data, line, members, want)
		}
		for k, v := range want {
			if !bytes.Equal(bytes.TrimSpace(members[k]), bytes.TrimSpace(v)) {
				t.Fatalf("wrote %q as %q: %s is %s, want %s", data, line, k, members[k], v)
			}
		}
	})
}
