package environment_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/servers/environment"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

func FuzzDecodeRunRequest(f *testing.F) {
	for _, seed := range []string{
		row,
		`{"responses_create_params":{},"_ng_rollout_id":"r","_ng_attempt_index":3}`,
		`{"responses_create_params":{},"_ng_task_index":1,"_ng_rollout_index":2,"agent_ref":{"name":"a"}}`,
		`{"responses_create_params":{},"_ng_task_index":1.5,"_ng_rollout_index":2}`,
		`{"responses_create_params":{},"_ng_rollout_id":"r-a1"}`,
		`{"responses_create_params":{},"_ng_rollout_id":7}`,
		`{"responses_create_params":{},"_ng_rollout_id":"r","agent_ref":null}`,
		`{"responses_create_params":{},"_ng_rollout_id":"r","agent_ref":{"name":7}}`,
		`{"responses_create_params":"x"}`,
		`{"responses_create_params":{},"_rowidx":3}`,
		`{"responses_create_params":{},"_ng_task_index":4,"_rowidx":"1","_ng_attempt_index":"2"}`,
		`{"responses_create_params":{},"_ng_task_index":4,"_ng_rollout_index":0,"_ng_attempt_index":"1"}`,
		`{"responses_create_params":{},"_rowidx":-1}`,
		`{}`, `[]`, `null`, ``, `{`, `{"a":}`, "\x00",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := environment.DecodeRunRequest(context.Background(), body)
		if err != nil {
			if req != nil {
				t.Fatalf("error %v with a request", err)
			}
			return
		}
		if err := req.Episode.Validate(); err != nil {
			t.Fatalf("accepted an invalid episode id %+v: %v", req.Episode, err)
		}
		var params map[string]any
		if err := json.Unmarshal(req.Params, &params); err != nil || params == nil {
			t.Fatalf("accepted responses_create_params that is not an object: %s", req.Params)
		}
		if _, err := rollout.ParseCaptureKey(req.Episode.CaptureKey()); err != nil {
			t.Fatalf("capture key %q does not parse back: %v", req.Episode.CaptureKey(), err)
		}
		if _, ok := req.Row[rollout.FieldParams]; !ok {
			t.Fatal("the row lost responses_create_params")
		}
	})
}
