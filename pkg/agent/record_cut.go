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

// The loop boundary's fields that checkLoopShape reads, as indexes of
// loopShapeFields.
const (
	shapeStep = iota
	shapePendingTools
	shapeNewOutputs
	shapeLastModelResponse
	shapeModelCalls
)

var loopShapeFields = [...]string{
	shapeStep:              "step",
	shapePendingTools:      "pending_tools",
	shapeNewOutputs:        "new_outputs",
	shapeLastModelResponse: "last_model_response",
	shapeModelCalls:        "model_calls",
}

// cutLoopShape reads what checkLoopShape needs of a loop boundary, which
// must be valid JSON (decodeSessionFields has validated it), in one walk
// over its members without copying them. That was a fifth of a 100,000-
// session restore's CPU in the agent, mostly the generic decoder copying
// every new_outputs item for its UnmarshalJSON. ok is false for anything
// it does not read exactly as the decoder does: a field name matching one
// of ours only without regard to case, or not ASCII; a count that is not a
// plain integer; a pending_tools that is not a boolean; a new_outputs that
// is not null or an array of objects. The caller then decodes the boundary
// the general way, which also words its errors.
func cutLoopShape(raw []byte) (st loopShape, ok bool) {
	rest := codec.SkipSpace(raw)
	if len(rest) == 0 || rest[0] != '{' {
		return loopShape{}, false
	}
	rest = codec.SkipSpace(rest[1:])
	if len(rest) > 0 && rest[0] == '}' {
		return st, true
	}
	for {
		var key []byte
		if key, rest, ok = codec.CutString(rest); !ok {
			return loopShape{}, false
		}
		field := loopShapeField(key)
		if field < -1 {
			return loopShape{}, false
		}
		rest = codec.SkipSpace(rest)
		if len(rest) == 0 || rest[0] != ':' {
			return loopShape{}, false
		}
		rest = codec.SkipSpace(rest[1:])
		if rest, ok = cutLoopShapeValue(&st, field, rest); !ok {
			return loopShape{}, false
		}
		rest = codec.SkipSpace(rest)
		switch {
		case len(rest) == 0:
			return loopShape{}, false
		case rest[0] == '}':
			return st, len(codec.SkipSpace(rest[1:])) == 0
		case rest[0] != ',':
			return loopShape{}, false
		}
		rest = codec.SkipSpace(rest[1:])
	}
}

// loopShapeField is the index in loopShapeFields of the field key names,
// -1 for a key naming none of them, -2 for one the decoder might match to
// one of them though it is not spelled the same (case, or bytes beyond
// ASCII, which its case folding also reads).
func loopShapeField(key []byte) int {
	for _, c := range key {
		if c >= 0x80 {
			return -2
		}
	}
	for i, f := range loopShapeFields {
		if string(key) == f {
			return i
		}
		if bytes.EqualFold(key, []byte(f)) {
			return -2
		}
	}
	return -1
}

// cutLoopShapeValue reads the value of field (an index of loopShapeFields,
// or -1 for one checkLoopShape does not read) into st.
func cutLoopShapeValue(st *loopShape, field int, b []byte) (rest []byte, ok bool) {
	if field >= 0 && isNullPrefix(b) {
		// null leaves a field as it is, in the decoder too; for
		// last_model_response it is the absence presence records.
		if field == shapeLastModelResponse {
			st.LastModelResponse = false
		}
		return b[len("null"):], true
	}
	switch field {
	case shapeStep, shapeModelCalls:
		n, rest, ok := codec.CutInt64(b)
		if !ok || int64(int(n)) != n {
			return b, false
		}
		if field == shapeStep {
			st.Step = int(n)
		} else {
			st.ModelCalls = int(n)
		}
		return rest, true
	case shapePendingTools:
		switch {
		case bytes.HasPrefix(b, []byte("true")):
			st.PendingTools = true
			return b[len("true"):], true
		case bytes.HasPrefix(b, []byte("false")):
			st.PendingTools = false
			return b[len("false"):], true
		}
		return b, false
	case shapeNewOutputs: // an array of objects
		return cutObjectArray(b)
	case shapeLastModelResponse: // present unless null
		_, rest, ok := codec.CutValue(b)
		st.LastModelResponse = presence(ok)
		return rest, ok
	}
	_, rest, ok = codec.CutValue(b)
	return rest, ok
}

// cutObjectArray reads an array whose every element is an object.
func cutObjectArray(b []byte) (rest []byte, ok bool) {
	if len(b) == 0 || b[0] != '[' {
		return b, false
	}
	rest = codec.SkipSpace(b[1:])
	if len(rest) > 0 && rest[0] == ']' {
		return rest[1:], true
	}
	for {
		if len(rest) == 0 || rest[0] != '{' {
			return b, false
		}
		if _, rest, ok = codec.CutValue(rest); !ok {
			return b, false
		}
		rest = codec.SkipSpace(rest)
		switch {
		case len(rest) == 0:
			return b, false
		case rest[0] == ']':
			return rest[1:], true
		case rest[0] != ',':
			return b, false
		}
		rest = codec.SkipSpace(rest[1:])
	}
}

// isNullPrefix reports whether b starts with the literal null.
func isNullPrefix(b []byte) bool { return bytes.HasPrefix(b, []byte("null")) }
