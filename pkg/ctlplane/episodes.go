package ctlplane

import (
	"bytes"
	"unsafe"

	"github.com/gymfleet/gymfleet/pkg/codec"
	"github.com/gymfleet/gymfleet/pkg/rollout"
)

// EpisodeIDs is the list of episodes a commit, restore or retire body
// names: every one in flight, 100,000 and more, decoded in every
// participant. A list laid out as the coordinator's encoder writes it,
//
//	[{"rollout_id":"<id>","attempt":<n>},...]
//
// is read without reflection into a slice of its exact length, the ids
// sharing one allocation; any other form (spaces, another key order, escapes)
// is decoded strictly, with the same result. At 16,000 episodes the
// decoder's growth of the slice and a string per id were ~180 of the ~3,500
// page faults each fresh participant took in a restore.
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
// in order, if each is {"rollout_id":"<id>","attempt":<n>} with an id of
// printable ASCII without a backslash and n a plain integer of at most 18
// digits, and they are separated by single commas; it reports whether
// they all are. fn may have been called for the elements before one that
// is not.
func eachCanonicalEpisode(inner []byte, fn func(name []byte, attempt int)) bool {
	for rest := inner; len(rest) > 0; {
		var ok bool
		if rest, ok = bytes.CutPrefix(rest, []byte(`{"rollout_id":"`)); !ok {
			return false
		}
		end := bytes.IndexByte(rest, '"')
		if end < 0 {
			return false
		}
		name := rest[:end]
		for _, c := range name {
			// Escapes, control characters and non-ASCII bytes would decode
			// to other bytes than these.
			if c < 0x20 || c == '\\' || c >= 0x7f {
				return false
			}
		}
		if rest, ok = bytes.CutPrefix(rest[end+1:], []byte(`,"attempt":`)); !ok {
			return false
		}
		digits, attempt := 0, 0
		for digits < len(rest) && rest[digits] >= '0' && rest[digits] <= '9' {
			attempt = attempt*10 + int(rest[digits]-'0')
			digits++
		}
		if digits == 0 || digits > 18 || (digits > 1 && rest[0] == '0') {
			return false
		}
		if rest, ok = bytes.CutPrefix(rest[digits:], []byte("}")); !ok {
			return false
		}
		fn(name, attempt)
		if len(rest) > 0 {
			if rest, ok = bytes.CutPrefix(rest, []byte(",")); !ok || len(rest) == 0 {
				return false
			}
		}
	}
	return true
}
