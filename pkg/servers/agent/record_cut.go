package agent

import (
	"bytes"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// sessionCut is what cutSessionRecord cuts off a session record: values as
// they stand in the record's bytes. request and completedReply are nil
// where the session has no such member.
type sessionCut struct {
	boundary, request, completedReply []byte
	// shape is what checkLoopShape reads of the boundary, read while
	// finding where the boundary ends (cutLoopShapeFront), or nil where
	// that walk could not read it and CutValue found its end.
	shape *loopShape
}

// cutSessionRecord splits a session record as Export writes it, with the
// loop state as its last member, into the record's raw values (the loop
// state, the session's request and completed reply) and a head: the record
// with those values as null, appended to dst. The caller decodes the small
// head strictly and keeps the raw values where they are, in the buffer of
// the records file: the strict decode of the whole record was most of an
// agent restore's CPU, and copying the head and the raw values out of the
// buffer, into memory the restoring process faults in fresh, another sixth
// of it at 100,000 sessions. data must be one JSON value (Export's encoder
// writes it, held to codec.Marshal's bytes by record_encode_test.go, and
// the store checks the digest of what it reads): CutValue finds where each
// value ends without validating it, so only then are the cut values valid
// JSON.
//
// ok is false for a record of any other shape (the boundary elsewhere or
// twice, a session that is not an object, a cut member twice or spelled
// another way, a key CutString does not read): the caller decodes that one
// the general way, which also words its errors. encoding/json matches
// member names without regard to case, so a name that matches one of ours
// only that way is such a record. (Of the keys CutString refuses, one with
// escapes may name any field; one with a control character makes the
// record invalid JSON, and one with bytes not UTF-8 names no field: the
// strict decode refuses both records anyway.)
func cutSessionRecord(dst, data []byte) (head []byte, cut sessionCut, ok bool) {
	var spans [3][]byte // the cut values, in the order they stand in data
	n := 0
	take := func(slot *[]byte, key, value []byte, name string) bool {
		if *slot != nil || string(key) != name {
			return false
		}
		*slot = value
		spans[n] = value
		n++
		return true
	}
	sawSession := false
	// The loop state is most of a record's bytes: its shape is read in the
	// walk that finds its end, rather than after, in a second walk.
	var shape loopShape
	valueOf := func(key, b []byte) (value, rest []byte, ok bool) {
		if string(key) == "boundary" && cut.shape == nil {
			if value, rest, ok = cutLoopShapeFront(&shape, b); ok {
				cut.shape = &shape
				return value, rest, true
			}
		}
		return codec.CutValue(b)
	}
	rest, ok := eachMember(data, valueOf, func(key, value []byte, last bool) bool {
		switch {
		case bytes.EqualFold(key, []byte("boundary")):
			return last && take(&cut.boundary, key, value, "boundary")
		case bytes.EqualFold(key, []byte("session")):
			if sawSession || string(key) != "session" || value[0] != '{' {
				return false
			}
			sawSession = true
			inner, ok := eachMember(value, nil, func(key, value []byte, _ bool) bool {
				switch {
				case bytes.EqualFold(key, []byte("request")):
					return take(&cut.request, key, value, "request")
				case bytes.EqualFold(key, []byte("completed_reply")):
					return take(&cut.completedReply, key, value, "completed_reply")
				}
				return true
			})
			return ok && len(inner) == 0
		}
		return true
	})
	if !ok || cut.boundary == nil || len(codec.SkipSpace(rest)) != 0 {
		return nil, sessionCut{}, false
	}
	head = dst[:0]
	from := 0
	for _, v := range spans[:n] {
		at := offsetIn(data, v)
		head = append(append(head, data[from:at]...), "null"...)
		from = at + len(v)
	}
	return append(head, data[from:]...), cut, true
}

// offsetIn is where sub, a slice of data taken without a capacity limit,
// starts in data.
func offsetIn(data, sub []byte) int { return cap(data) - cap(sub) }

// eachMember walks the members of the JSON object b starts with (after
// white space) as CutString and CutValue read them, calling fn with each
// member's key and value (in b) and whether it is the object's last member,
// and returns what follows the object. ok is false where they cannot read
// it or fn returns false. valueOf, if not nil, reads each value in place of
// CutValue: given the member's key and what follows its ':', it returns
// the value and what follows it, as CutValue does.
func eachMember(b []byte, valueOf func(key, b []byte) (value, rest []byte, ok bool), fn func(key, value []byte, last bool) bool) (rest []byte, ok bool) {
	if valueOf == nil {
		valueOf = func(_, b []byte) ([]byte, []byte, bool) { return codec.CutValue(b) }
	}
	rest = codec.SkipSpace(b)
	if len(rest) == 0 || rest[0] != '{' {
		return nil, false
	}
	rest = codec.SkipSpace(rest[1:])
	if len(rest) > 0 && rest[0] == '}' {
		return rest[1:], true
	}
	for {
		var key, value []byte
		if key, rest, ok = codec.CutString(codec.SkipSpace(rest)); !ok {
			return nil, false
		}
		rest = codec.SkipSpace(rest)
		if len(rest) == 0 || rest[0] != ':' {
			return nil, false
		}
		if value, rest, ok = valueOf(key, rest[1:]); !ok || len(value) == 0 {
			return nil, false
		}
		rest = codec.SkipSpace(rest)
		if len(rest) == 0 || (rest[0] != '}' && rest[0] != ',') {
			return nil, false
		}
		last := rest[0] == '}'
		if !fn(key, value, last) {
			return nil, false
		}
		rest = rest[1:]
		if last {
			return rest, true
		}
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
// over its members without copying them, where the generic decoder
// copies every new_outputs item for its UnmarshalJSON. ok is false for anything
// it does not read exactly as the decoder does: a field name matching one
// of ours only without regard to case, or not ASCII; a count that is not a
// plain integer; a pending_tools that is not a boolean; a new_outputs that
// is not null or an array of objects. The caller then decodes the boundary
// the general way, which also words its errors.
func cutLoopShape(raw []byte) (st loopShape, ok bool) {
	_, rest, ok := cutLoopShapeFront(&st, raw)
	if !ok || len(codec.SkipSpace(rest)) != 0 {
		return loopShape{}, false
	}
	return st, true
}

// cutLoopShapeFront reads the loop boundary at the front of b (after white
// space) into st as cutLoopShape does, and returns its bytes and what
// follows them. st is left as it was where ok is false.
func cutLoopShapeFront(st *loopShape, b []byte) (value, rest []byte, ok bool) {
	start := codec.SkipSpace(b)
	if len(start) == 0 || start[0] != '{' {
		return nil, b, false
	}
	var read loopShape
	rest = codec.SkipSpace(start[1:])
	if len(rest) > 0 && rest[0] == '}' {
		*st = read
		return start[:len(start)-len(rest)+1], rest[1:], true
	}
	for {
		var key []byte
		if key, rest, ok = codec.CutString(rest); !ok {
			return nil, b, false
		}
		field := loopShapeField(key)
		if field < -1 {
			return nil, b, false
		}
		rest = codec.SkipSpace(rest)
		if len(rest) == 0 || rest[0] != ':' {
			return nil, b, false
		}
		rest = codec.SkipSpace(rest[1:])
		if rest, ok = cutLoopShapeValue(&read, field, rest); !ok {
			return nil, b, false
		}
		rest = codec.SkipSpace(rest)
		switch {
		case len(rest) == 0:
			return nil, b, false
		case rest[0] == '}':
			*st = read
			return start[:len(start)-len(rest)+1], rest[1:], true
		case rest[0] != ',':
			return nil, b, false
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
