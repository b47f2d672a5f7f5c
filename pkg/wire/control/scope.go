package control

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"hash/maphash"
	"slices"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Scope is the set of episodes a commit continues or a restore installs.
type Scope struct {
	// sorted lists the episodes in IDs order, sorted once: a commit and its
	// participants list a scope of 100,000 episodes several times.
	sorted []rollout.EpisodeID
	// slots index sorted by a hash of each episode: slot value i+1 names
	// sorted[i], 0 is empty; linear probing, at most half full. A map of
	// the episodes is several times larger, fresh memory in a fresh
	// process, and building it dominated the work each participant does
	// with a commit's body (BenchmarkCommitBody).
	slots []int32
	seed  maphash.Seed
}

// NewScope builds a scope from episode ids.
func NewScope(ids []rollout.EpisodeID) Scope { return newScope(ids, false) }

// ScopeOf builds the scope of a decoded body's list, which it sorts in
// place and keeps rather than copies (it is as long as the scope): the
// caller must not use ids again.
func ScopeOf(ids EpisodeIDs) Scope { return newScope(ids, true) }

// newScope builds a scope; owned says ids may be sorted in place and kept
// (a control body's list, as long as the scope) rather than copied.
func newScope(ids []rollout.EpisodeID, owned bool) Scope {
	sorted := ids
	if !owned {
		sorted = slices.Clone(ids)
	}
	// A controller sends its scope sorted, which the sort then only checks.
	slices.SortFunc(sorted, compareEpisodes)
	s := Scope{sorted: slices.Compact(sorted), seed: maphash.MakeSeed()}
	size := 1
	for size < 2*len(s.sorted) {
		size *= 2
	}
	s.slots = make([]int32, size)
	mask := uint64(size - 1)
	for i, id := range s.sorted {
		h := s.hash(id) & mask
		for s.slots[h] != 0 {
			h = (h + 1) & mask
		}
		s.slots[h] = int32(i + 1)
	}
	return s
}

func compareEpisodes(a, b rollout.EpisodeID) int {
	return cmp.Or(strings.Compare(a.RolloutID, b.RolloutID), cmp.Compare(a.Attempt, b.Attempt))
}

func (s Scope) hash(id rollout.EpisodeID) uint64 {
	return maphash.String(s.seed, id.RolloutID) ^ uint64(id.Attempt)*0x9e3779b97f4a7c15
}

// Has reports whether the scope names this exact attempt.
func (s Scope) Has(id rollout.EpisodeID) bool {
	_, ok := s.Index(id)
	return ok
}

// Index reports where IDs lists this exact attempt, if the scope names it:
// an export can put its records in scope order by position, without
// comparing ids.
func (s Scope) Index(id rollout.EpisodeID) (int, bool) {
	if len(s.slots) == 0 {
		return 0, false
	}
	mask := uint64(len(s.slots) - 1)
	for h := s.hash(id) & mask; s.slots[h] != 0; h = (h + 1) & mask {
		if i := int(s.slots[h] - 1); s.sorted[i] == id {
			return i, true
		}
	}
	return 0, false
}

// Len is the number of episodes in scope.
func (s Scope) Len() int { return len(s.sorted) }

// IDs lists the scope's episodes sorted by rollout id, then attempt.
func (s Scope) IDs() []rollout.EpisodeID {
	out := make([]rollout.EpisodeID, len(s.sorted))
	copy(out, s.sorted)
	return out
}

// Digest names the scope canonically: the SHA-256 of its capture keys, a
// line each, in IDs order. A participant tells a retried commit or restore
// from a conflicting one by it.
func (s Scope) Digest() string { return scopeDigest(s) }

// scopeDigest is Digest.
// It hashes the keys' lines a window at a time: built whole, they were an
// allocation grown to twice their size and a key each, all fresh memory
// in a fresh process.
func scopeDigest(s Scope) string {
	h := sha256.New()
	window := make([]byte, 0, 16<<10)
	for _, id := range s.sorted {
		window = append(id.AppendCaptureKey(window), '\n')
		if len(window) > cap(window)-256 {
			h.Write(window)
			window = window[:0]
		}
	}
	h.Write(window)
	return hex.EncodeToString(h.Sum(nil))
}
