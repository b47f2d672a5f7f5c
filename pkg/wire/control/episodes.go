package control

import (
	"bytes"
	"unsafe"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// EpisodeIDs is the list of episodes a commit, restore or retire body
// names: every one in flight, 100,000 and more, decoded in every
// participant. A list laid out as the coordinator's encoder writes it,
//
//	[{"rollout_id":"<id>","attempt":<n>},...]
//
// is read without reflection into a slice of its exact length, the ids
// sharing one allocation; any other form (spaces, another key order, escapes)
// is decoded strictly, with the same result. A generic decoder's growth of
// the slice and a string per id are fresh memory in every participant a
// restore starts.
type EpisodeIDs []rollout.EpisodeID

// UnmarshalJSON decodes the list; null leaves it nil.
func (e *EpisodeIDs) UnmarshalJSON(b []byte) error {
	if ids, ok := readEpisodeList(b); ok {
		*e = ids
		return nil
	}
	var ids []rollout.EpisodeID
	if err := codec.UnmarshalStrictFast(b, &ids); err != nil {
		return err
	}
	*e = ids
	return nil
}

// readEpisodeList reads a list in the coordinator's form, or reports ok
// false. It scans the list twice: once to size the slice and the ids'
// bytes, once to fill them.
func readEpisodeList(b []byte) (EpisodeIDs, bool) {
	if len(b) < 2 || b[0] != '[' || b[len(b)-1] != ']' {
		return nil, false
	}
	inner := b[1 : len(b)-1]
	count, nameBytes := 0, 0
	if !eachCanonicalEpisode(inner, func(name []byte, _ int) {
		count++
		nameBytes += len(name)
	}) {
		return nil, false
	}
	ids := make(EpisodeIDs, 0, count)
	// Sized exactly, names never moves, and nothing writes a byte of it
	// again once an id refers to it. An id kept (a fence, a restored
	// episode) keeps all of names: under 1 MB at 100,000 episodes.
	names := make([]byte, 0, nameBytes)
	eachCanonicalEpisode(inner, func(name []byte, attempt int) {
		id := rollout.EpisodeID{Attempt: attempt}
		if len(name) > 0 {
			names = append(names, name...)
			id.RolloutID = unsafe.String(&names[len(names)-len(name)], len(name))
		}
		ids = append(ids, id)
	})
	return ids, true
}

// eachCanonicalEpisode calls fn with every element of the list's inside,
// in order, if each is an episode id as rollout.CutEpisodeIDJSON reads it
// and they are separated by single commas; it reports whether they all
// are. fn may have been called for the elements before one that is not.
func eachCanonicalEpisode(inner []byte, fn func(name []byte, attempt int)) bool {
	for rest := inner; len(rest) > 0; {
		name, attempt, after, ok := rollout.CutEpisodeIDJSON(rest)
		if !ok {
			return false
		}
		fn(name, attempt)
		if rest = after; len(rest) > 0 {
			if rest, ok = bytes.CutPrefix(rest, []byte(",")); !ok || len(rest) == 0 {
				return false
			}
		}
	}
	return true
}
