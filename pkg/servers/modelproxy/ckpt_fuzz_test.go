package modelproxy_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
)

var digest64 = strings.Repeat("ab", 32)

// FuzzDecodeCutReceipt: a worker's receipt never panics the decoder, and
// an accepted one answers the inventory as NeMo Gym's validate_for
// requires: every ticket exactly once, with its identity, each ack's
// evidence consistent with its disposition.
func FuzzDecodeCutReceipt(f *testing.F) {
	inv := gencut.BuildInventory("c1", "policy_model", []gencut.ActivePrefix{
		{TicketID: "a", RolloutID: "r", Attempt: 1, ModelCallID: "a", AdmittedAt: 1796605409.5},
		{TicketID: "b", RolloutID: "q", ModelCallID: "b", AdmittedAt: 1796605410.25},
	})
	good, err := gencut.EncodeReceipt(gencut.Receipt{
		CheckpointID: "c1", CutID: "x", InventoryDigest: inv.InventoryDigest, Inventory: inv, BackendSnapshotID: "s",
		Prefixes: []gencut.PrefixAck{gencut.DurablePrefix(inv.ActivePrefixes[0], "__generation_cut__/r-a1/a", 3, digest64, 8), gencut.Failure(inv.ActivePrefixes[1])},
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	for _, s := range []string{
		strings.Replace(string(good), `"durable_failure"`, `"durable_prefix"`, 1),
		strings.Replace(string(good), `"staging_keys":[]`, `"staging_keys":["k"]`, 1),
		strings.Replace(string(good), `"attempt":1`, `"attempt":2`, 1),
		`{"prefixes":null}`, `null`, `[]`, `{"prefixes":[{"prefix_token_count":-1}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		rc, err := modelproxy.DecodeCutReceipt(body, inv)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, p := range rc.Prefixes {
			if seen[p.TicketID] {
				t.Fatalf("accepted ticket %s twice", p.TicketID)
			}
			seen[p.TicketID] = true
			switch p.Disposition {
			case modelproxy.DispositionDurablePrefix:
				if len(p.StagingKeys) == 0 || p.PrefixTokenCount == nil || p.PrefixDigest == nil || p.EffectiveOutputLimit == nil {
					t.Fatalf("accepted a durable_prefix without its evidence: %+v", p)
				}
			case modelproxy.DispositionDurableFailure:
				if len(p.StagingKeys) != 0 || p.PrefixTokenCount != nil {
					t.Fatalf("accepted a durable_failure with evidence: %+v", p)
				}
			default:
				t.Fatalf("accepted disposition %q", p.Disposition)
			}
		}
		if len(seen) != len(inv.ActivePrefixes) {
			t.Fatalf("accepted a receipt answering %d of %d calls", len(seen), len(inv.ActivePrefixes))
		}
	})
}

// FuzzDecodeModelRecord: a record read back from a checkpoint never panics
// the decoder; an accepted one re-encodes to a record that decodes the same.
func FuzzDecodeModelRecord(f *testing.F) {
	cut := `{"model_call_id":"c2","request_digest":"` + digest64 + `","continuation":{"source_capture_key":"r","source_model_call_id":"c2","staging_keys":["__generation_cut__/r/c2"],"prefix_token_count":4,"prefix_digest":"p"}}`
	row := `{"call_id":"c1","parent_call_id":"","capture_key":"r","seq":1,"created_at":1.5,"model":"m","request_digest":"d","prompt_token_ids":[1,2],"generation_token_ids":[3],"generation_log_probs":[-0.5],"finish_reason":"stop"}`
	for _, s := range []string{
		`{"rows":[` + row + `],"generation_cuts":[` + cut + `]}`,
		`{"rows":[],"generation_cuts":[]}`,
		`{"rows":[` + row + `,` + row + `],"generation_cuts":[]}`,
		`{"rows":[],"generation_cuts":[` + cut + `,` + cut + `]}`,
		`{"rows":[{"call_id":"c","seq":0}],"generation_cuts":[]}`,
		`{"rows":[],"generation_cuts":[],"extra":1}`,
		`null`, `{}`, `{"rows":[{"call_id":"c","seq":1,"generation_token_ids":[1],"generation_log_probs":[]}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := modelproxy.DecodeModelRecord(data)
		if err != nil {
			return
		}
		if len(m.GenerationCuts) > 1 {
			t.Fatalf("accepted %d cuts", len(m.GenerationCuts))
		}
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("re-encoding: %v", err)
		}
		again, err := modelproxy.DecodeModelRecord(b)
		if err != nil {
			t.Fatalf("a re-encoded record no longer decodes: %v\n%s", err, b)
		}
		if len(again.Rows) != len(m.Rows) || !reflect.DeepEqual(again.GenerationCuts, m.GenerationCuts) {
			t.Fatalf("round trip changed the record: %+v vs %+v", again, m)
		}
	})
}

func TestDecodeModelRecord_Refusals(t *testing.T) {
	row := func(id string, seq int) string {
		return `{"call_id":"` + id + `","seq":` + string(rune('0'+seq)) + `,"generation_token_ids":[1],"generation_log_probs":[-1]}`
	}
	cut := func(mutate string) string {
		c := map[string]any{"model_call_id": "c", "request_digest": digest64, "continuation": map[string]any{
			"source_capture_key": "r", "source_model_call_id": "c", "staging_keys": []string{"k"}, "prefix_token_count": 2, "prefix_digest": "p"}}
		switch mutate {
		case "digest":
			c["request_digest"] = "short"
		case "keys":
			c["continuation"].(map[string]any)["staging_keys"] = []string{"a", "b"}
		case "count":
			c["continuation"].(map[string]any)["prefix_token_count"] = 0
		case "source":
			c["continuation"].(map[string]any)["source_capture_key"] = "bad/key"
		}
		b, _ := json.Marshal(c)
		return string(b)
	}
	for _, tc := range []struct{ name, record, want string }{
		{"duplicate call", `{"rows":[` + row("a", 1) + `,` + row("a", 2) + `]}`, "appears twice"},
		{"seq order", `{"rows":[` + row("a", 2) + `,` + row("b", 1) + `]}`, "does not follow"},
		{"logprobs", `{"rows":[{"call_id":"a","seq":1,"generation_token_ids":[1,2],"generation_log_probs":[-1]}]}`, "log-probs"},
		{"two cuts", `{"rows":[],"generation_cuts":[` + cut("") + `,` + cut("") + `]}`, "at most one generation cut"},
		{"bad digest", `{"generation_cuts":[` + cut("digest") + `]}`, "request_digest"},
		{"two staging keys", `{"generation_cuts":[` + cut("keys") + `]}`, "exactly one staging key"},
		{"empty prefix", `{"generation_cuts":[` + cut("count") + `]}`, "prefix_token_count"},
		{"bad source", `{"generation_cuts":[` + cut("source") + `]}`, "source_capture_key"},
		{"unknown field", `{"rows":[],"surprise":true}`, "surprise"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := modelproxy.DecodeModelRecord([]byte(tc.record))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("DecodeModelRecord(%s) = %v, want an error naming %q", tc.record, err, tc.want)
			}
		})
	}
	if _, err := modelproxy.DecodeModelRecord([]byte(`{"rows":[` + row("a", 1) + `,` + row("b", 2) + `],"generation_cuts":[` + cut("") + `]}`)); err != nil {
		t.Fatalf("a valid record is refused: %v", err)
	}
}

func TestConstrainedDecodingIsNotCut(t *testing.T) {
	for _, tc := range []struct {
		body string
		want bool
	}{
		{`{"messages":[]}`, false},
		{`{"messages":[],"tool_choice":"auto"}`, false},
		{`{"messages":[],"tool_choice":"none","response_format":{"type":"text"}}`, false},
		{`{"messages":[],"tool_choice":null,"response_format":null}`, false},
		{`{"messages":[],"tool_choice":"required"}`, true},
		{`{"messages":[],"tool_choice":{"type":"function","function":{"name":"f"}}}`, true},
		{`{"messages":[],"response_format":{"type":"json_object"}}`, true},
		{`{"messages":[],"response_format":{"type":"text","extra":1}}`, true},
		{`{"messages":[],"guided_json":{"type":"object"}}`, true},
		{`{"messages":[],"structured_outputs":{"regex":"a+"}}`, true},
		{`{"messages":[],"guided_regex":null}`, false},
	} {
		f, err := modelproxy.DecodeChatRequest([]byte(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		if got := modelproxy.ConstrainedChat(f); got != tc.want {
			t.Errorf("constrained(%s) = %v, want %v", tc.body, got, tc.want)
		}
	}
	for _, tc := range []struct {
		body string
		want bool
	}{
		{`{"input":"hi"}`, false},
		{`{"input":"hi","text":{"format":{"type":"text"}}}`, false},
		{`{"input":"hi","tool_choice":"required","tools":[{"type":"function","name":"f"}]}`, true},
	} {
		got, err := modelproxy.ConstrainedResponses([]byte(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("constrained(%s) = %v, want %v", tc.body, got, tc.want)
		}
	}
	// A structured text format is refused before it could be cut.
	if _, err := modelproxy.ConstrainedResponses([]byte(`{"input":"hi","text":{"format":{"type":"json_schema","name":"x","schema":{}}}}`)); err == nil || !strings.Contains(err.Error(), "text.format") {
		t.Errorf("json_schema text.format: %v", err)
	}
}
