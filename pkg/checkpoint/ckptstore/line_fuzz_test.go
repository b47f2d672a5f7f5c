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
}

// FuzzCanonicalLine: a line the fast reader accepts is the record the
// strict decoder reads from it, byte for byte, where that record is one
// JSON value. The fast reader frames a line and does not validate the
// record (the store's digest proves a file's records are the ones Write
// checked), so a line it accepts and the strict decoder refuses must hold
// a record that is not JSON, and nothing else may be wrong with it.
func FuzzCanonicalLine(f *testing.F) {
	for _, s := range lineSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		fast, ok := ckptstore.ReadCanonical(line)
		if !ok {
			return
		}
		if !codec.Valid(fast.Data) {
			// With a record that is JSON in its place, the line must read
			// as that record: the framing alone decided what was cut.
			at := cap(line) - cap(fast.Data) // the record is cut from line
			framed := append(append(append([]byte(nil), line[:at]...), '0'), line[at+len(fast.Data):]...)
			if got, ok := ckptstore.ReadCanonical(framed); !ok || got.EpisodeID != fast.EpisodeID || string(got.Data) != "0" {
				t.Fatalf("%q framed as %+v %q; with the record replaced, %q reads as %+v %q (ok %v)", line, fast.EpisodeID, fast.Data, framed, got.EpisodeID, got.Data, ok)
			}
			line = framed
			fast.Data = []byte("0")
		}
		var ref ckptstore.Record
		if err := codec.UnmarshalStrict(line, &ref); err != nil {
			t.Fatalf("fast reader accepted %q, the strict decoder refuses it: %v", line, err)
		}
		if fast.EpisodeID != ref.EpisodeID || !bytes.Equal(fast.Data, ref.Data) {
			t.Fatalf("%q: fast reader read %+v %s, the strict decoder %+v %s", line, fast.EpisodeID, fast.Data, ref.EpisodeID, ref.Data)
		}
	})
}

// FuzzRecordLineRoundTrip: every line the writer writes, the fast reader
// reads back as the record written.
func FuzzRecordLineRoundTrip(f *testing.F) {
	f.Add("w", 0, []byte(`{"a":1}`))
	f.Add("rollout-000001", 7, []byte(` [1, 2] `))
	f.Add("r.x_y-z", 999999999, []byte(`"text"`))
	f.Fuzz(func(t *testing.T, rid string, attempt int, data []byte) {
		id := rollout.EpisodeID{RolloutID: rid, Attempt: attempt}
		if id.Validate() != nil || !codec.Valid(data) {
			return
		}
		line := ckptstore.AppendRecord(ckptstore.Record{EpisodeID: id, Data: data})
		got, ok := ckptstore.ReadCanonical(line)
		if !ok || got.EpisodeID != id || !bytes.Equal(got.Data, bytes.TrimSpace(data)) {
			t.Fatalf("wrote %+v %q as %q, read back %+v %q (ok %v)", id, data, line, got.EpisodeID, got.Data, ok)
		}
	})
}
