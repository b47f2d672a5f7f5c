package control

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

func TestNewScope_SortsAndDropsDuplicatesWhateverTheOrder(t *testing.T) {
	ep := func(r string, a int) rollout.EpisodeID { return rollout.EpisodeID{RolloutID: r, Attempt: a} }
	want := []rollout.EpisodeID{ep("a", 0), ep("a", 2), ep("b", 1), ep("c", 0)}
	orders := [][]rollout.EpisodeID{
		{ep("a", 0), ep("a", 2), ep("b", 1), ep("c", 0)},
		{ep("c", 0), ep("b", 1), ep("a", 2), ep("a", 0)},
		{ep("b", 1), ep("a", 0), ep("c", 0), ep("a", 0), ep("a", 2), ep("b", 1)},
	}
	digest := scopeDigest(NewScope(want))
	for _, ids := range orders {
		given := slices.Clone(ids)
		s := NewScope(ids)
		if !slices.Equal(ids, given) {
			t.Errorf("NewScope reordered its caller's slice %v to %v", given, ids)
		}
		if got := s.IDs(); !slices.Equal(got, want) {
			t.Errorf("NewScope(%v).IDs() = %v, want %v", ids, got, want)
		}
		if s.Len() != len(want) {
			t.Errorf("NewScope(%v).Len() = %d, want %d", ids, s.Len(), len(want))
		}
		for i, id := range want {
			if !s.Has(id) {
				t.Errorf("NewScope(%v) lacks %v", ids, id)
			}
			if at, ok := s.Index(id); !ok || at != i {
				t.Errorf("NewScope(%v).Index(%v) = %d, %v; want %d, true", ids, id, at, ok, i)
			}
		}
		if s.Has(ep("a", 1)) || s.Has(ep("d", 0)) {
			t.Errorf("NewScope(%v) has an episode it was not given", ids)
		}
		if _, ok := s.Index(ep("a", 1)); ok {
			t.Errorf("NewScope(%v) indexes an episode it was not given", ids)
		}
		if got := scopeDigest(s); got != digest {
			t.Errorf("the digest of %v is %s, of the same set sorted %s", ids, got, digest)
		}
	}
	if scopeDigest(NewScope(want[:3])) == digest {
		t.Error("a smaller scope has the same digest")
	}
	// The digest is the SHA-256 of the sorted capture keys, a line each,
	// however many windows they are hashed in.
	many := make([]rollout.EpisodeID, 5000)
	var lines []byte
	for i := range many {
		many[i] = rollout.EpisodeID{RolloutID: fmt.Sprintf("rollout-%05d", i), Attempt: i % 3}
		lines = append(lines, many[i].CaptureKey()+"\n"...)
	}
	if sum := sha256.Sum256(lines); scopeDigest(NewScope(many)) != hex.EncodeToString(sum[:]) {
		t.Error("the digest of 5,000 episodes is not the SHA-256 of their capture keys' lines")
	}
	if empty := NewScope(nil); empty.Len() != 0 || len(empty.IDs()) != 0 {
		t.Errorf("an empty scope lists %v", empty.IDs())
	}
	big := NewScope(many)
	for i, id := range big.IDs() {
		if at, ok := big.Index(id); !ok || at != i {
			t.Fatalf("Index(%v) = %d, %v in a scope of 5,000; IDs lists it at %d", id, at, ok, i)
		}
	}
}

// BenchmarkCommitBody is what every participant does with a commit's body
// besides exporting: decode it, build the scope and its digest, and encode
// the reply's capture keys.
func BenchmarkCommitBody(b *testing.B) {
	for _, n := range []int{16_000, 100_000} {
		b.Run(fmt.Sprintf("%dk", n/1000), func(b *testing.B) {
			ids := make([]rollout.EpisodeID, n)
			keys := make([]string, n)
			for i := range ids {
				ids[i] = rollout.EpisodeID{RolloutID: fmt.Sprintf("w%06d", i)}
				keys[i] = ids[i].CaptureKey()
			}
			body, err := codec.Marshal(CommitRequest{CheckpointID: "bench", DeadlineTS: 1e9, CheckpointDir: "/ckpt", EpisodeIDs: ids})
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				var req CommitRequest
				if err := codec.UnmarshalStrictFast(body, &req); err != nil {
					b.Fatal(err)
				}
				scope := NewScope(req.EpisodeIDs)
				_ = scopeDigest(scope)
				if _, err := codec.Marshal(CommitReply{Phase: PhaseCommitted, EpisodeIDs: keys}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkScopeHas is a lookup of an episode in a scope of 100,000, half
// of them present: an export and an install ask once per session.
func BenchmarkScopeHas(b *testing.B) {
	ids := make([]rollout.EpisodeID, 100_000)
	for i := range ids {
		ids[i] = rollout.EpisodeID{RolloutID: fmt.Sprintf("w%06d", i), Attempt: i % 2}
	}
	s := NewScope(ids[:len(ids)/2])
	i := 0
	for b.Loop() {
		_ = s.Has(ids[i])
		i = (i + 7919) % len(ids)
	}
}
