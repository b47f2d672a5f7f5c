package agent

import (
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

const (
	cutHead      = `{"type":"session","episode_id":{"rollout_id":"r1","attempt":1},"session_id":"s-1","session":{"request":{"x":[1,"}"]},"resources_session_id":"rs-1","activations":1,"completed_activation":0,"completed_reply":null,"observations":{"activations":0,"steps":0,"model_calls":0,"tool_calls":0,"usage":null,"resources_session_id":"rs-1"}},`
	cutBoundaryV = `{"step":1,"pending_tools":false,"new_outputs":[{"type":"message","content":"a \"}\" b"}],"usage":null,"last_model_response":null,"turns":[],"tool_records":[],"model_calls":1}`
)

func TestCutSessionRecord(t *testing.T) {
	const (
		request = `{"x":[1,"}"]}`
		reply   = `{"output":[]}`
	)
	for _, tc := range []struct {
		name, data string
		boundary   string // "" when the record is not cut
		request    string // "" when the session has none
		reply      string
	}{
		{"as Export writes it", cutHead + `"boundary":` + cutBoundaryV + `}`, cutBoundaryV, request, "null"},
		{"null boundary", cutHead + `"boundary":null}`, `null`, request, "null"},
		{"spaces around", " " + cutHead + ` "boundary" : ` + cutBoundaryV + " }\n", cutBoundaryV, request, "null"},
		{"a completed reply", `{"session":{"completed_reply": ` + reply + ` ,"request":null},"boundary":null}`, "null", "null", reply},
		{"no session", `{"type":"session","boundary":null}`, "null", "", ""},
		{"an empty session", `{"session":{ },"boundary":null}`, "null", "", ""},
		{"a null session", `{"session":null,"boundary":null}`, "", "", ""},
		{"session twice", `{"session":{},"session":{},"boundary":null}`, "", "", ""},
		{"request twice", `{"session":{"request":1,"request":2},"boundary":null}`, "", "", ""},
		{"another spelling of request", `{"session":{"Request":1},"boundary":null}`, "", "", ""},
		{"another spelling of session", `{"SESSION":{"request":1},"boundary":null}`, "", "", ""},
		{"an escaped key in the session", `{"session":{"r\u0065quest":1},"boundary":null}`, "", "", ""},
		{"a session not closed", `{"session":{"request":1,},"boundary":null}`, "", "", ""},
		{"boundary not last", `{"boundary":null,"type":"session"}`, "", "", ""},
		{"boundary twice", `{"boundary":{},"boundary":null}`, "", "", ""},
		{"another spelling first", `{"Boundary":{},"boundary":null}`, "", "", ""},
		{"escaped key", `{"type":"session","bound\u0061ry":null}`, "", "", ""},
		{"key with a control character", "{\"type\x01\":\"session\",\"boundary\":null}", "", "", ""},
		{"key not UTF-8", "{\"type\xff\":\"session\",\"boundary\":null}", "", "", ""},
		{"another spelling last", `{"type":"session","BOUNDARY":null}`, "", "", ""},
		{"no boundary", `{"type":"session"}`, "", "", ""},
		{"trailing data", cutHead + `"boundary":null} x`, "", "", ""},
		{"unterminated", cutHead + `"boundary":{"a":"}`, "", "", ""},
		{"not an object", `["boundary",null]`, "", "", ""},
		{"empty", ``, "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := []byte(tc.data)
			head, cut, ok := cutSessionRecord([]byte("left over"), data)
			if ok != (tc.boundary != "") {
				t.Fatalf("ok = %v, want %v", ok, tc.boundary != "")
			}
			if !ok {
				return
			}
			for _, v := range []struct {
				name string
				got  []byte
				want string
			}{{"boundary", cut.boundary, tc.boundary}, {"request", cut.request, tc.request}, {"completed_reply", cut.completedReply, tc.reply}} {
				if string(v.got) != v.want || (v.want == "") != (v.got == nil) {
					t.Errorf("%s = %q, want %q", v.name, v.got, v.want)
				}
				if v.got != nil && !inBuffer(data, v.got) {
					t.Errorf("%s is a copy, want it cut from the record's bytes", v.name)
				}
			}
			if !codec.Valid(head) {
				t.Fatalf("head is not JSON: %s", head)
			}
			var got, want map[string]any
			if err := codec.Unmarshal(head, &got); err != nil {
				t.Fatal(err)
			}
			if err := codec.Unmarshal(data, &want); err != nil {
				t.Fatal(err)
			}
			want["boundary"] = nil
			if s, ok := want["session"].(map[string]any); ok {
				for _, k := range []string{"request", "completed_reply"} {
					if _, ok := s[k]; ok {
						s[k] = nil
					}
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("head = %s, want the record with its cut values null", head)
			}
		})
	}
}

// inBuffer reports whether sub lies in buf's bytes.
func inBuffer(buf, sub []byte) bool {
	if len(sub) == 0 || len(buf) == 0 {
		return false
	}
	b, s := uintptr(unsafe.Pointer(unsafe.SliceData(buf))), uintptr(unsafe.Pointer(unsafe.SliceData(sub)))
	return s >= b && s+uintptr(len(sub)) <= b+uintptr(len(buf))
}

// FuzzDecodeSessionFields: of JSON values, the cut decode accepts exactly
// what the strict decode of the whole record accepts, as the same record,
// and what it decodes does not share the scratch buffer the head was cut
// into.
func FuzzDecodeSessionFields(f *testing.F) {
	f.Add([]byte(cutHead + `"boundary":` + cutBoundaryV + `}`))
	f.Add([]byte(cutHead + `"boundary":null}`))
	f.Add([]byte(cutHead + `"boundary":{"step":1,}}`))
	f.Add([]byte(cutHead + `"extra":1,"boundary":null}`))
	f.Add([]byte(`{"type":"session","boundary":[1,2]  }`))
	f.Add([]byte(`{"type":"session","session":{"request":{"a":"\u00e9"}},"boundary":"\ud800"}`))
	f.Add([]byte(`{"session":{"request":{"a":1,},"completed_reply":{"b":"c"}},"boundary":null}`))
	f.Add([]byte(`{"session":{"completed_reply":{"b":"\u00e9"},"resources_session_id":"rs-1"},"boundary":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if !codec.Valid(data) {
			// Not a record as Install gets them (the store checks each is
			// one JSON value); the cut decode must only not panic on it.
			_, _, _ = decodeSessionFields(data, nil)
			return
		}
		var want sessionRecord
		wantErr := codec.UnmarshalStrictFast(data, &want)
		scratch := []byte("a head from the record before")
		got, _, err := decodeSessionFields(data, &scratch)
		for i := range scratch[:cap(scratch)] {
			scratch[:cap(scratch)][i] = 'x'
		}
		switch {
		case wantErr != nil && err == nil:
			t.Fatalf("the cut decode accepts %q, the strict one refuses it: %v", data, wantErr)
		case wantErr == nil && err != nil:
			t.Fatalf("the cut decode refuses %q: %v", data, err)
		case wantErr == nil && !reflect.DeepEqual(got, want):
			t.Fatalf("the cut decode of %q is\n %+v\nthe strict one's\n %+v", data, got, want)
		}
		// The boundary's shape read while cutting it is what
		// checkLoopShape would read of the boundary cut.
		if _, shape, err := decodeSessionFields(data, nil); err == nil && shape != nil {
			again, ok := cutLoopShape(got.Boundary)
			if !ok || shapeRead(*shape) != shapeRead(again) {
				t.Fatalf("the cut of %q read the boundary's shape as %+v; cutLoopShape of %s reads %+v, %v", data, *shape, got.Boundary, again, ok)
			}
		}
	})
}

// shapeRead is what checkLoopShape reads of a loopShape: new_outputs is
// only checked to be objects.
func shapeRead(st loopShape) [4]int {
	b := func(v bool) int {
		if v {
			return 1
		}
		return 0
	}
	return [4]int{st.Step, b(st.PendingTools), b(bool(st.LastModelResponse)), st.ModelCalls}
}

func TestCutLoopShape(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want loopShape
		ok   bool
	}{
		{cutBoundaryV, loopShape{Step: 1, NewOutputs: nil, ModelCalls: 1}, true},
		{`{}`, loopShape{}, true},
		{` { "step" : 3 , "pending_tools" : true , "last_model_response" : {"id":"r"} , "model_calls" : 2 } `, loopShape{Step: 3, PendingTools: true, LastModelResponse: true, ModelCalls: 2}, true},
		{`{"step":1,"step":null,"model_calls":-4}`, loopShape{Step: 1, ModelCalls: -4}, true},
		{`{"last_model_response":{},"last_model_response":null}`, loopShape{}, true},
		{`{"new_outputs":[{},{"a":[1,{"b":"]"}]}],"other":[1,"x",{}]}`, loopShape{}, true},
		{`{"new_outputs":null,"pending_tools":null}`, loopShape{}, true},
		// What the decoder reads differently or refuses: the general way.
		{`{"Step":1}`, loopShape{}, false},
		{`{"st\u0065p":1}`, loopShape{}, false},
		{`{"ſtep":1}`, loopShape{}, false},
		{`{"step":1.0}`, loopShape{}, false},
		{`{"step":1e2}`, loopShape{}, false},
		{`{"step":"1"}`, loopShape{}, false},
		{`{"step":12345678901234567890}`, loopShape{}, false},
		{`{"pending_tools":1}`, loopShape{}, false},
		{`{"new_outputs":[{},1]}`, loopShape{}, false},
		{`{"new_outputs":[null]}`, loopShape{}, false},
		{`{"new_outputs":{}}`, loopShape{}, false},
		{`[]`, loopShape{}, false},
	} {
		got, ok := cutLoopShape([]byte(tc.raw))
		if ok != tc.ok || (ok && shapeRead(got) != shapeRead(tc.want)) {
			t.Errorf("cutLoopShape(%s) = %+v, %v; want %+v, %v", tc.raw, got, ok, tc.want, tc.ok)
		}
		// At the front of a record, followed by more of it: the same
		// shape, its bytes, and what follows.
		var front loopShape
		value, rest, ok := cutLoopShapeFront(&front, []byte(tc.raw+`,"x":1}`))
		if ok != tc.ok || (ok && (shapeRead(front) != shapeRead(tc.want) ||
			string(value) != strings.TrimSpace(tc.raw) || string(rest) != strings.TrimLeft(tc.raw, " ")[len(strings.TrimSpace(tc.raw)):]+`,"x":1}`)) {
			t.Errorf("cutLoopShapeFront(%s + more) = %+v, %q, %q, %v; want %+v, %v", tc.raw, front, value, rest, ok, tc.want, tc.ok)
		}
	}
}

// FuzzCutLoopShape: on valid JSON, whatever cutLoopShape reads, the
// decoder reads as the same values, without error.
func FuzzCutLoopShape(f *testing.F) {
	f.Add([]byte(cutBoundaryV))
	f.Add([]byte(`{"step":-0,"pending_tools":true,"last_model_response":[],"model_calls":0}`))
	f.Add([]byte(`{"new_outputs":[{"type":"function_call","arguments":"{\"a\":1}"}],"usage":{"input_tokens":3}}`))
	f.Add([]byte(`{"STEP":1,"Model_Calls":2}`))
	f.Add([]byte(`{"step":9223372036854775807}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !codec.Valid(raw) {
			return
		}
		got, ok := cutLoopShape(raw)
		if !ok {
			return
		}
		var want loopShape
		if err := decodeLoopObject(raw, &want); err != nil {
			t.Fatalf("cutLoopShape reads %s, the decoder refuses it: %v", raw, err)
		}
		if shapeRead(got) != shapeRead(want) {
			t.Fatalf("cutLoopShape reads %s as %+v, the decoder as %+v", raw, got, want)
		}
	})
}

// Ensure a session record's request, completed reply and loop state are
// kept in the records file's buffer, not copied out of it into fresh
// memory.
func TestDecodeSessionFields_KeepsRawValuesInTheRecord(t *testing.T) {
	data := []byte(`{"type":"session","session":{"request":{"input":"hi"},"completed_reply":{"output":[]}},"boundary":` + cutBoundaryV + `}`)
	r, _, err := decodeSessionFields(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, raw := range map[string][]byte{"request": r.Session.Request, "completed_reply": r.Session.CompletedReply, "boundary": r.Boundary} {
		if !inBuffer(data, raw) {
			t.Errorf("%s %s is a copy, want it in the record's bytes", name, raw)
		}
	}
}

// Ensure a record as Export writes it has its loop state's shape read in
// the walk that cuts the state off (no second walk over it), and that the
// shape is the one checkLoopShape reads.
func TestDecodeSessionFields_ReadsTheShapeInTheCut(t *testing.T) {
	data := []byte(cutHead + `"boundary":` + cutBoundaryV + `}`)
	_, shape, err := decodeSessionFields(data, nil)
	if err != nil || shape == nil {
		t.Fatalf("decodeSessionFields = shape %v, %v; want the boundary's shape", shape, err)
	}
	want, ok := cutLoopShape([]byte(cutBoundaryV))
	if !ok || shapeRead(*shape) != shapeRead(want) {
		t.Fatalf("the cut read the shape %+v, cutLoopShape %+v, %v", *shape, want, ok)
	}
}
