package agent

import (
	"bytes"

	"github.com/gymfleet/gymfleet/pkg/codec"
)

// cutBoundary splits a session record as Export writes it, with the loop
// state as its last member, into the record with a null boundary and the
// boundary's bytes. The caller decodes the small rest strictly and only
// checks the loop state (most of a record's bytes: the strict decode of the
// whole record was most of an agent restore's CPU) before keeping it as it
// is. ok is false for a record of any other shape (the boundary elsewhere or
// twice, a key CutString does not read, malformed JSON): the caller decodes
// that one the general way, which also words its errors. (Of the keys
// CutString refuses, one with escapes may name any field; one with a
// control character makes the record invalid JSON, and one with bytes not
// UTF-8 names no field: the strict decode refuses both records anyway.)
func cutBoundary(data []byte) (head, boundary []byte, ok bool) {
	rest := codec.SkipSpace(data)
	if len(rest) == 0 || rest[0] != '{' {
		return nil, nil, false
	}
	rest = rest[1:]
	for {
		var key, value []byte
		if key, rest, ok = codec.CutString(codec.SkipSpace(rest)); !ok {
			return nil, nil, false
		}
		rest = codec.SkipSpace(rest)
		if len(rest) == 0 || rest[0] != ':' {
			return nil, nil, false
		}
		if value, rest, ok = codec.CutValue(rest[1:]); !ok {
			return nil, nil, false
		}
		valueStart := len(data) - len(rest) - len(value)
		rest = codec.SkipSpace(rest)
		if len(rest) == 0 {
			return nil, nil, false
		}
		last := rest[0] == '}'
		if !last && rest[0] != ',' {
			return nil, nil, false
		}
		// encoding/json matches member names without regard to case: any
		// spelling of boundary but the last member's is the general way's.
		if bytes.EqualFold(key, []byte("boundary")) {
			if !last || string(key) != "boundary" {
				return nil, nil, false
			}
			if len(codec.SkipSpace(rest[1:])) != 0 {
				return nil, nil, false
			}
			head = append(append(make([]byte, 0, valueStart+len("null}")), data[:valueStart]...), "null}"...)
			return head, value, true
		}
		if last {
			return nil, nil, false
		}
		rest = rest[1:]
	}
}
