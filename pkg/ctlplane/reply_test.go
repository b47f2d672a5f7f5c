package ctlplane_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
)

// stdCommitReply is what CommitReply.MarshalJSON wrote before it appended the
// episode ids by hand: encoding/json over one map of every field.
func stdCommitReply(t *testing.T, r ctlplane.CommitReply) []byte {
	t.Helper()
	m := map[string]any{}
	for k, v := range r.Extras {
		m[k] = v
	}
	keys := r.EpisodeIDs
	if keys == nil {
		keys = []string{}
	}
	m["phase"], m["manifest"], m["episode_ids"], m["write_seconds"] = r.Phase, r.Manifest, keys, r.WriteSeconds
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCommitReply_MarshalJSONAsEncodingJSON(t *testing.T) {
	many := make([]string, 2000)
	for i := range many {
		many[i] = fmt.Sprintf("w%04d-a%d", i, i%3)
	}
	manifest := ckptstore.Manifest{CheckpointID: "ck-1", Kind: "model", Instance: "policy_model", RecordCount: 2, Extras: map[string]any{"b": 1, "a": []int{1}}}
	cases := map[string]ctlplane.CommitReply{
		"empty":    {Phase: ctlplane.PhaseCommitted},
		"no ids":   {Phase: ctlplane.PhaseCommitted, EpisodeIDs: []string{}, WriteSeconds: 0.25},
		"many ids": {Phase: ctlplane.PhaseCommitted, Manifest: manifest, EpisodeIDs: many, WriteSeconds: 1e-7},
		"extras sort around fixed fields": {Phase: ctlplane.PhaseCommitted, EpisodeIDs: []string{"r", "r-a1"},
			Extras: map[string]any{"zz": true, "aa": "x<y>&z", "episode_ids_extra": nil, "m": map[string]int{"q": 1, "b": 2}}},
		"fixed fields win over extras": {Phase: ctlplane.PhaseCommitted, EpisodeIDs: []string{"r"}, WriteSeconds: 3,
			Extras: map[string]any{"phase": "bogus", "episode_ids": []string{"other"}, "write_seconds": "no", "manifest": 1}},
		"escapes": {Phase: ctlplane.PhaseCommitted, EpisodeIDs: []string{"a\"b", "<&>", "\u2028", "\xff"}},
	}
	for name, r := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			if want := stdCommitReply(t, r); string(got) != string(want) {
				t.Fatalf("CommitReply encodes as\n%s\nencoding/json over the same fields as\n%s", got, want)
			}
		})
	}
}

func TestCommitReply_MarshalJSONRefusesAnUnencodableExtra(t *testing.T) {
	r := ctlplane.CommitReply{Phase: ctlplane.PhaseCommitted, Extras: map[string]any{"bad": func() {}}}
	if _, err := json.Marshal(r); err == nil {
		t.Fatal("an extra encoding/json cannot encode was encoded")
	}
}
