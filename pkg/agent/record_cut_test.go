package agent

import (
	"reflect"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/codec"
)

const (
	cutHead      = `{"type":"session","episode_id":{"rollout_id":"r1","attempt":1},"session_id":"s-1","session":{"request":{"x":[1,"}"]},"resources_session_id":"rs-1","activations":1,"completed_activation":0,"completed_reply":null,"observations":{"activations":0,"steps":0,"model_calls":0,"tool_calls":0,"usage":null,"resources_session_id":"rs-1"}},`
	cutBoundaryV = `{"step":1,"pending_tools":false,"new_outputs":[{"type":"message","content":"a \"}\" b"}],"usage":null,"last_model_response":null,"turns":[],"tool_records":[],"model_calls":1}`
)

func TestCutBoundary(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		boundary   string // "" when the record is not cut
	}{
		{"as Export writes it", cutHead + `"boundary":` + cutBoundaryV + `}`, cutBoundaryV},
		{"null boundary", cutHead + `"boundary":null}`, `null`},
		{"spaces around", " " + cutHead + ` "boundary" : ` + cutBoundaryV + " }\n", cutBoundaryV},
		{"boundary not last", `{"boundary":null,"type":"session"}`, ""},
		{"boundary twice", `{"boundary":{},"boundary":null}`, ""},
		{"another spelling first", `{"Boundary":{},"boundary":null}`, ""},
		{"escaped key", `{"type":"session","bound\u0061ry":null}`, ""},
		{"key with a control character", "{\"type\x01\":\"session\",\"boundary\":null}", ""},
		{"key not UTF-8", "{\"type\xff\":\"session\",\"boundary\":null}", ""},
		{"another spelling last", `{"type":"session","BOUNDARY":null}`, ""},
		{"no boundary", `{"type":"session"}`, ""},
		{"trailing data", cutHead + `"boundary":null} x`, ""},
		{"unterminated", cutHead + `"boundary":{"a":"}`, ""},
		{"not an object", `["boundary",null]`, ""},
		{"empty", ``, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			head, boundary, ok := cutBoundary([]byte(tc.data))
			if ok != (tc.boundary != "") {
				t.Fatalf("ok = %v, want %v", ok, tc.boundary != "")
			}
			if !ok {
				return
			}
			if string(boundary) != tc.boundary {
				t.Errorf("boundary = %s, want %s", boundary, tc.boundary)
			}
			if !codec.Valid(head) {
				t.Errorf("head is not JSON: %s", head)
			}
		})
	}
}

// FuzzDecodeSessionFields: the cut decode accepts exactly what the strict
// decode of the whole record accepts, as the same record.
func FuzzDecodeSessionFields(f *testing.F) {
	f.Add([]byte(cutHead + `"boundary":` + cutBoundaryV + `}`))
	f.Add([]byte(cutHead + `"boundary":null}`))
	f.Add([]byte(cutHead + `"boundary":{"step":1,}}`))
	f.Add([]byte(cutHead + `"extra":1,"boundary":null}`))
	f.Add([]byte(`{"type":"session","boundary":[1,2]  }`))
	f.Add([]byte(`{"type":"session","session":{"request":{"a":"\u00e9"}},"boundary":"\ud800"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var want sessionRecord
		wantErr := codec.UnmarshalStrictFast(data, &want)
		got, err := decodeSessionFields(data)
		switch {
		case wantErr != nil && err == nil:
			t.Fatalf("the cut decode accepts %q, the strict one refuses it: %v", data, wantErr)
		case wantErr == nil && err != nil:
			t.Fatalf("the cut decode refuses %q: %v", data, err)
		case wantErr == nil && !reflect.DeepEqual(got, want):
			t.Fatalf("the cut decode of %q is\n %+v\nthe strict one's\n %+v", data, got, want)
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
