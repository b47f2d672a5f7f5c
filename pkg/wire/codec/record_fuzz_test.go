package codec_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/episode"
	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
	"github.com/gymfleet/gymfleet/pkg/servers/resources"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// codec.Valid and codec.UnmarshalStrictFast are goccy's fast paths for
// checkpoint records and control bodies; these targets are the guard that
// they mean exactly what encoding/json means.

// FuzzValid: codec.Valid (goccy) and encoding/json.Valid agree on any input.
func FuzzValid(f *testing.F) {
	for _, s := range append([]string{
		`{"a":[1,2.5e-3,true,false,null,"\u00e9\ud83d\ude00"]}`, `01`, `-`, `1.`, `.5`, `1e`, `+1`, `-0.0E+00`,
		`"\x"`, `"\u12"`, "\"\t\"", "\"\x7f\"", `[1,]`, `{"a":1,}`, `{"a"}`, `{1:2}`, `[`, `]`, `nul`, `truex`,
		"\xef\xbb\xbf{}", "{}\x00", strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
		strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
	}, edgeSeeds...) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if got, want := codec.Valid(data), json.Valid(data); got != want {
			t.Fatalf("codec.Valid(%q) = %v, encoding/json.Valid says %v", data, got, want)
		}
	})
}

// strictDifferential decodes data into a fresh T with UnmarshalStrictFast and
// with UnmarshalStrict: both must accept or refuse it, refuse it with the
// same error, and accept it as the same value.
func strictDifferential[T any](t *testing.T, data []byte) {
	t.Helper()
	var fast, ref T
	errFast := codec.UnmarshalStrictFast(data, &fast)
	errRef := codec.UnmarshalStrict(data, &ref)
	if (errFast == nil) != (errRef == nil) {
		t.Fatalf("decoders disagree on %q:\n UnmarshalStrictFast: %v\n UnmarshalStrict: %v", data, errFast, errRef)
	}
	if errRef != nil {
		if errFast.Error() != errRef.Error() {
			t.Fatalf("errors differ on %q:\n UnmarshalStrictFast: %v\n UnmarshalStrict: %v", data, errFast, errRef)
		}
		return
	}
	if !reflect.DeepEqual(fast, ref) {
		t.Fatalf("decoded values differ for %q:\n UnmarshalStrictFast: %#v\n UnmarshalStrict: %#v", data, fast, ref)
	}
}

// Inputs where a strict decode must refuse or where codecs have differed.
var strictSeeds = []string{
	`{"x":1}`, `{"episode_id":{"rollout_id":"r","attempt":1,"z":2}}`, `{"EPISODE_ID":{"ROLLOUT_ID":"r"}}`,
	`{"episode_id":{"rollout_id":"r","attempt":1.0}}`, `{"episode_id":{"attempt":1e0}}`, `{"episode_id":null}`,
	`{"episode_id":"x"}`, `{} x`, `{}{}`, `{} `, "{\"session_id\":\"\xff\"}", `{"session_id":"\ud800"}`,
	`{"state":null}`, `{"rows":null}`, `{"rows":[{"seq":1.5}]}`, `{"rows":[{"prompt_token_ids":[99999999999999999999]}]}`,
	`{"rows":[{"generation_log_probs":[1e400]}]}`, `{"rows":[{"call_id":"a","call_id":"b"}]}`,
	`{"generation_cuts":[{"continuation":{"staging_keys":[],"extra":1}}]}`, `{"task_digest":"a\u0000b"}`,
}

func FuzzUnmarshalStrictFastCkptstoreLine(f *testing.F) {
	addSeeds(f, append([]string{
		`{"episode_id":{"rollout_id":"w","attempt":1},"record":{"kind":"episode","steps":[{"n":1}]}}`,
		`{"episode_id":{"rollout_id":"3-0","attempt":0},"record":null}`,
		`{"episode_id":{"rollout_id":"x"},"record":{ "spaced" : [ 1 , 2 ] } }`,
	}, append(strictSeeds, edgeSeeds...)...), "")
	f.Fuzz(func(t *testing.T, data []byte) { strictDifferential[ckptstore.Record](t, data) })
}

func FuzzUnmarshalStrictFastEpisode(f *testing.F) {
	addSeeds(f, append([]string{
		`{"episode_id":{"rollout_id":"rollout-000001","attempt":0},"task_digest":"3f0a","boundary":{"next":"invoke_agent","handles":{"resources_session_id":"resources-session-1","agent_session_id":"agent-session-1","resources_verify":"replay"}}}`,
		`{"episode_id":{"rollout_id":"r","attempt":2},"task_digest":"d","boundary":null}`,
	}, append(strictSeeds, edgeSeeds...)...), "")
	f.Fuzz(func(t *testing.T, data []byte) { strictDifferential[episode.Record](t, data) })
}

func FuzzUnmarshalStrictFastResources(f *testing.F) {
	addSeeds(f, append([]string{
		`{"session_id":"resources-session-1","episode_id":{"rollout_id":"r","attempt":0},"state":null}`,
		`{"session_id":"s2","episode_id":{"rollout_id":"r","attempt":0},"state":{"count":1},"owner":"x"}`,
	}, append(strictSeeds, edgeSeeds...)...), "")
	f.Fuzz(func(t *testing.T, data []byte) { strictDifferential[resources.SessionRecord](t, data) })
}

func FuzzUnmarshalStrictFastModel(f *testing.F) {
	addSeeds(f, append([]string{
		`{"rows":[{"call_id":"c1","parent_call_id":"","capture_key":"r","seq":1,"created_at":1796018333.510503,"model":"fake-model","request_digest":"cb0e","prompt_token_ids":[1,3,9],"generation_token_ids":[11,3182],"generation_log_probs":[-0.7936,-2.0686],"finish_reason":"length"}],"generation_cuts":[]}`,
		`{"rows":[],"generation_cuts":[{"model_call_id":"m","request_digest":"d","continuation":{"source_capture_key":"r","source_model_call_id":"m","staging_keys":["k"],"prefix_token_count":3,"prefix_digest":"p"}}]}`,
		`{"rows":[],"generation_cuts":[],"extra":1}`,
	}, append(strictSeeds, edgeSeeds...)...), "")
	f.Fuzz(func(t *testing.T, data []byte) { strictDifferential[modelproxy.ModelRecord](t, data) })
}

// controlSeeds are control bodies as coordination sends them and as a
// careless client might.
var controlSeeds = []string{
	`{"checkpoint_id":"ck-1","deadline_ts":1700000000.25,"checkpoint_dir":"/tmp/ck","episode_ids":[{"rollout_id":"w","attempt":0},{"rollout_id":"c","attempt":2}],"stop":true}`,
	`{"checkpoint_id":"ck-1","deadline_ts":0,"checkpoint_dir":"","episode_ids":[]}`,
	`{"checkpoint_id":"ck-1","deadline_ts":1e9,"episode_ids":null}`, `{"episode_ids":[null,{"attempt":-1}]}`,
	`{"checkpoint_id":"ck-1","stop":"yes"}`, `{"checkpoint_id":"ck-1","Stop":true}`, `{"deadline_ts":"1"}`,
	`{"checkpoint_id":"ck-1","rollout_ids":["a","b"],"deadline_ts":1}`, `{"rollout_ids":[1]}`,
	`{"checkpoint_id":"ck-1","episode_ids":[{"rollout_id":"w","attempt":0}],"extra":{}}`,
}

// The control routes decode every body through httpserver.DecodeJSONStrict,
// hence UnmarshalStrictFast: commit and restore name every episode in scope.
func FuzzUnmarshalStrictFastCommitRequest(f *testing.F) {
	addSeeds(f, append(controlSeeds, append(strictSeeds, edgeSeeds...)...), "")
	f.Fuzz(func(t *testing.T, data []byte) { strictDifferential[ctlplane.CommitRequest](t, data) })
}

func FuzzUnmarshalStrictFastRestoreRequest(f *testing.F) {
	addSeeds(f, append(controlSeeds, append(strictSeeds, edgeSeeds...)...), "")
	f.Fuzz(func(t *testing.T, data []byte) { strictDifferential[ctlplane.RestoreRequest](t, data) })
}

func FuzzUnmarshalStrictFastRetireRequest(f *testing.F) {
	addSeeds(f, append(controlSeeds, append(strictSeeds, edgeSeeds...)...), "")
	f.Fuzz(func(t *testing.T, data []byte) { strictDifferential[ctlplane.RetireRequest](t, data) })
}

func FuzzUnmarshalStrictFastForgetRequest(f *testing.F) {
	addSeeds(f, append(controlSeeds, append(strictSeeds, edgeSeeds...)...), "")
	f.Fuzz(func(t *testing.T, data []byte) { strictDifferential[ctlplane.ForgetRequest](t, data) })
}

// A worker decodes a generation-cut request (every call in flight) through
// gencut.ParseLegacyRequest, hence UnmarshalStrictFast.
func FuzzUnmarshalStrictFastCutRequest(f *testing.F) {
	addSeeds(f, append([]string{
		`{"checkpoint_id":"ck-1","server_name":"policy_model","active":[{"model_call_id":"m1","capture_key":"r-a1"},{"model_call_id":"m2","capture_key":"q-a0"}]}`,
		`{"checkpoint_id":"ck-1","server_name":"s","active":null}`,
		`{"checkpoint_id":"ck-1","server_name":"s","active":[{"model_call_id":"m1","capture_key":"r-a1","extra":1}]}`,
		`{"checkpoint_id":"ck-1","server_name":"s","active":[{"Model_Call_ID":"m1"}],"ACTIVE":[]}`,
	}, append(strictSeeds, edgeSeeds...)...), "")
	f.Fuzz(func(t *testing.T, data []byte) { strictDifferential[gencut.LegacyRequest](t, data) })
}

// gymCutSeeds are NeMo Gym's generation-cut bodies as a model server and
// a worker send them, and as a careless one might.
var gymCutSeeds = []string{
	`{"checkpoint_id":"ck-1","server_name":"policy_model","active_prefixes":[{"ticket_id":"t1","rollout_id":"r","attempt":1,"model_call_id":"m1","admitted_at":1796605409.25}],"inventory_digest":"` + strings.Repeat("a", 64) + `"}`,
	`{"active_prefixes":[{"admitted_at":1796605409.0,"attempt":0,"model_call_id":"m","rollout_id":"r","ticket_id":"t"}],"checkpoint_id":"c","server_name":"s","inventory_digest":"d"}`,
	`{"checkpoint_id":"ck-1","server_name":"s","active_prefixes":null,"inventory_digest":"d"}`,
	`{"checkpoint_id":"ck-1","server_name":"s","active_prefixes":[{"ticket_id":"t","attempt":1.0}],"inventory_digest":"d"}`,
	`{"checkpoint_id":"ck-1","server_name":"s","active_prefixes":[{"Ticket_ID":"t","TICKET_ID":"u"}],"inventory_digest":"d","extra":1}`,
	`{"checkpoint_id":"ck-1","cut_id":"c","inventory_digest":"d","inventory":{"checkpoint_id":"ck-1","server_name":"s","active_prefixes":[{"ticket_id":"t1","rollout_id":"r","attempt":1,"model_call_id":"m1","admitted_at":1796605409.25}],"inventory_digest":"d"},"backend_snapshot_id":"b","prefixes":[{"ticket_id":"t1","rollout_id":"r","attempt":1,"model_call_id":"m1","admitted_at":1796605409.25,"disposition":"durable_prefix","cut_kind":"active_prefix","frozen_buffer_id":"k","staging_keys":["k"],"prefix_token_count":3,"prefix_digest":"p","effective_output_limit":64,"terminal_finish_reason":"stop","terminal_stop_reason":"</s>"}]}`,
	`{"checkpoint_id":"ck-1","cut_id":"c","inventory_digest":"d","inventory":{"checkpoint_id":"ck-1","server_name":"s","active_prefixes":[],"inventory_digest":"d"},"backend_snapshot_id":"b","prefixes":[{"ticket_id":"t1","rollout_id":"r","attempt":1,"model_call_id":"m1","admitted_at":1,"disposition":"durable_failure","cut_kind":null,"frozen_buffer_id":null,"staging_keys":[],"prefix_token_count":null,"prefix_digest":null,"effective_output_limit":null,"terminal_finish_reason":null,"terminal_stop_reason":null}]}`,
	`{"prefixes":[{"terminal_stop_reason":128001,"staging_keys":null,"prefix_token_count":1e2}],"inventory":null}`,
	`{"prefixes":[{"terminal_stop_reason":{"a":[1, "\u2028"]},"cut_kind":"x"}],"inventory":{"active_prefixes":[{"admitted_at":"1"}]}}`,
	`{"prefixes":[{"ticket_id":"a","ticket_id":"b","Prefix_Token_Count":2}],"reason":"x"}`,
}

// A worker decodes an inventory (gencut.ParseInventory) and the model
// server a receipt (gencut.DecodeReceiptFor) through UnmarshalStrictFast:
// each lists every call in flight.
func FuzzUnmarshalStrictFastInventory(f *testing.F) {
	addSeeds(f, append(gymCutSeeds, append(strictSeeds, edgeSeeds...)...), "")
	f.Fuzz(func(t *testing.T, data []byte) { strictDifferential[gencut.Inventory](t, data) })
}

func FuzzUnmarshalStrictFastReceipt(f *testing.F) {
	addSeeds(f, append(gymCutSeeds, append(strictSeeds, edgeSeeds...)...), "")
	// Values that are not JSON, or barely, where a raw value, a string
	// and an integer are read.
	for _, v := range []string{
		`01`, `1.`, `-`, `.5`, `1e`, `+1`, `"\x"`, `"\u12"`, "\"\t\"", "\"\x7f\"", `[1,]`, `{"a":1,}`, `{"a"}`, `{1:2}`, `tru`,
		`truex`, "\"\xff\"", `"\ud800"`, `1 2`, `[1 2]`, `{"a":1 "b":2}`, `-01`, `0x10`, `NaN`, `[[]`, `]`, `"a\u0000"`, "1\x00",
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
	} {
		for _, field := range []string{"terminal_stop_reason", "ticket_id", "attempt"} {
			f.Add([]byte(`{"prefixes":[{"` + field + `":` + v + `}]}`))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) { strictDifferential[gencut.Receipt](t, data) })
}
