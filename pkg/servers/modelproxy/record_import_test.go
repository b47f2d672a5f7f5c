package modelproxy

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/tokencapture"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// referenceDecodeModelRecord is DecodeModelRecord as it was before Install
// kept the token arrays as JSON: every array decoded into a slice. The
// decoder Install uses now must accept and refuse the same records, with
// the same errors, and DecodeModelRecord must still return the same value.
func referenceDecodeModelRecord(data []byte) (*ModelRecord, error) {
	var m ModelRecord
	if err := codec.UnmarshalStrictFast(data, &m); err != nil {
		return nil, fmt.Errorf("not a model record: %s", codec.DescribeError(err))
	}
	seen := make(map[string]bool, len(m.Rows))
	var lastSeq int64
	for i, r := range m.Rows {
		switch {
		case !validCallID(r.CallID):
			return nil, fmt.Errorf("rows[%d].call_id %q is not a model call id", i, r.CallID)
		case seen[r.CallID]:
			return nil, fmt.Errorf("rows[%d].call_id %q appears twice", i, r.CallID)
		case r.CaptureKey != "" && !validSourceKey(r.CaptureKey):
			return nil, fmt.Errorf("rows[%d].capture_key %q is not a capture key", i, r.CaptureKey)
		case r.ParentCallID != "" && !validCallID(r.ParentCallID):
			return nil, fmt.Errorf("rows[%d].parent_call_id %q is not a model call id", i, r.ParentCallID)
		case r.Seq <= lastSeq:
			return nil, fmt.Errorf("rows[%d].seq %d does not follow %d", i, r.Seq, lastSeq)
		case len(r.GenerationTokenIDs) != len(r.GenerationLogProbs):
			return nil, fmt.Errorf("rows[%d] has %d generation tokens but %d log-probs", i, len(r.GenerationTokenIDs), len(r.GenerationLogProbs))
		case r.ContinuedFrom != "" && !validStagingKey(r.ContinuedFrom):
			return nil, fmt.Errorf("rows[%d].continued_from is not a staging key", i)
		}
		seen[r.CallID] = true
		lastSeq = r.Seq
	}
	if len(m.GenerationCuts) > 1 {
		return nil, fmt.Errorf("a record holds at most one generation cut, this one %d", len(m.GenerationCuts))
	}
	for _, c := range m.GenerationCuts {
		if err := c.validate(); err != nil {
			return nil, fmt.Errorf("generation_cuts[0]: %w", err)
		}
	}
	return &m, nil
}

// importRecordSeeds are model records as checkpoints hold them, and ones
// each check refuses.
func importRecordSeeds() []string {
	digest := strings.Repeat("ab", 32)
	cut := `{"model_call_id":"c2","request_digest":"` + digest + `","continuation":{"source_capture_key":"r","source_model_call_id":"c2","staging_keys":["__generation_cut__/r/c2"],"prefix_token_count":4,"prefix_digest":"p"}}`
	row := func(id string, seq int, arrays string) string {
		return fmt.Sprintf(`{"call_id":%q,"parent_call_id":"","capture_key":"r","seq":%d,"created_at":1796018333.510503,"model":"fake-model","request_digest":"cb0e",%s,"finish_reason":"length"}`, id, seq, arrays)
	}
	plain := `"prompt_token_ids":[1,3,9,151643],"generation_token_ids":[11,3182],"generation_log_probs":[-0.7936,-2.0686]`
	return []string{
		`{"rows":[` + row("c1", 1, plain) + `],"generation_cuts":[` + cut + `]}`,
		`{"rows":[` + row("c1", 1, plain) + `,` + row("c3", 2, `"prompt_token_ids":[-1,0,9223372036854775807],"generation_token_ids":[5,6,7],"generation_log_probs":[-1e-7,0,-0.25]`) + `],"generation_cuts":[]}`,
		`{"rows":[` + row("c1", 1, `"prompt_token_ids":null,"generation_token_ids":null,"generation_log_probs":null`) + `]}`,
		`{"rows":[` + row("c1", 1, `"prompt_token_ids":[ 1 , 2 ],"generation_token_ids":[-0, null],"generation_log_probs":[1E-7 , -0.0]`) + `]}`,
		`{"rows":[` + row("c1", 1, `"prompt_token_ids":[],"generation_token_ids":[1],"generation_log_probs":[-0.00093075251579284668]`) + `]}`,
		`{"rows":[` + row("c1", 1, `"generation_token_ids":[1,2],"generation_log_probs":[-1]`) + `]}`,
		`{"rows":[` + row("c1", 1, `"generation_token_ids":[1],"generation_log_probs":null`) + `]}`,
		`{"rows":[` + row("c1", 1, `"prompt_token_ids":[1.5]`) + `]}`,
		`{"rows":[` + row("c1", 1, `"prompt_token_ids":[99999999999999999999]`) + `]}`,
		`{"rows":[` + row("c1", 1, `"generation_token_ids":[1],"generation_log_probs":[1e400]`) + `]}`,
		`{"rows":[` + row("c1", 1, `"prompt_token_ids":"1"`) + `]}`,
		`{"rows":[` + row("c1", 2, plain) + `,` + row("c2", 1, plain) + `]}`,
		`{"rows":[` + row("c1", 1, plain) + `,` + row("c1", 2, plain) + `]}`,
		`{"rows":[],"generation_cuts":[` + cut + `,` + cut + `]}`,
		`{"rows":[],"generation_cuts":[],"extra":1}`, `{"rows":[{"call_id":"c1","seq":1,"extra":1}]}`,
		`null`, `{}`, `[]`, `{"rows":null}`, `{"rows":[]}`, `{"ROWS":[{"CALL_ID":"c1","Seq":1,"Prompt_Token_IDs":[1]}]}`,
	}
}

// FuzzDecodeImportRecord: the decoder Install uses, which keeps the token
// arrays as JSON, accepts and refuses what the slice-decoding reference
// does, with the same error, and DecodeModelRecord, built on it, returns
// the reference's value.
func FuzzDecodeImportRecord(f *testing.F) {
	for _, s := range importRecordSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		want, wantErr := referenceDecodeModelRecord(data)
		kept, keptErr := decodeImportRecord(data)
		got, gotErr := DecodeModelRecord(data)
		if fmt.Sprint(keptErr) != fmt.Sprint(wantErr) || fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			t.Fatalf("%q:\n reference:          %v\n decodeImportRecord: %v\n DecodeModelRecord:  %v", data, wantErr, keptErr, gotErr)
		}
		if wantErr != nil {
			return
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: DecodeModelRecord\n %#v\nthe reference\n %#v", data, got, want)
		}
		if len(kept.Rows) != len(want.Rows) {
			t.Fatalf("%q: %d rows kept, %d decoded", data, len(kept.Rows), len(want.Rows))
		}
		for i, r := range kept.Rows {
			w := want.Rows[i]
			if r.PromptTokenIDs.Len() != len(w.PromptTokenIDs) || r.GenerationTokenIDs.Len() != len(w.GenerationTokenIDs) || r.GenerationLogProbs.Len() != len(w.GenerationLogProbs) {
				t.Fatalf("%q: rows[%d] array lengths differ from the decoded ones", data, i)
			}
		}
	})
}

func TestDecodeImportRecord_IsTheReference(t *testing.T) {
	accepted := 0
	for _, s := range importRecordSeeds() {
		want, wantErr := referenceDecodeModelRecord([]byte(s))
		_, keptErr := decodeImportRecord([]byte(s))
		got, gotErr := DecodeModelRecord([]byte(s))
		if fmt.Sprint(keptErr) != fmt.Sprint(wantErr) || fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			t.Errorf("%s:\n reference:          %v\n decodeImportRecord: %v\n DecodeModelRecord:  %v", s, wantErr, keptErr, gotErr)
			continue
		}
		if wantErr == nil {
			accepted++
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s: DecodeModelRecord %#v, the reference %#v", s, got, want)
			}
		}
	}
	if accepted < 5 {
		t.Fatalf("only %d seeds are valid records", accepted)
	}
}

// TestCutImportRecord_ReadsExportedRecords: a record as Export writes it
// takes the fast path, and reads as the generic decoder reads it.
func TestCutImportRecord_ReadsExportedRecords(t *testing.T) {
	row := func(id string, seq int64, continued string) codec.RawMessage {
		b, err := codec.Marshal(tokencapture.Row{
			CallID: id, CaptureKey: "r", Seq: seq, CreatedAt: 1796018333.510503, Model: "m", RequestDigest: "d",
			PromptTokenIDs: []int{1, 2}, GenerationTokenIDs: []int{3}, GenerationLogProbs: []float64{-0.25}, FinishReason: "stop",
			ContinuedFrom: continued,
		})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cut := &GenerationCut{ModelCallID: "c9", RequestDigest: strings.Repeat("ab", 32), Continuation: Continuation{
		SourceCaptureKey: "r", SourceModelCallID: "c9", StagingKeys: []string{"__generation_cut__/r/c9"}, PrefixTokenCount: 3, PrefixDigest: "p",
	}}
	for _, tc := range []struct {
		name string
		rows []codec.RawMessage
		cut  *GenerationCut
	}{
		{"no rows", nil, nil},
		{"rows", []codec.RawMessage{row("c1", 1, ""), row("c2", 2, "__generation_cut__/r/c1")}, nil},
		{"rows and a cut", []codec.RawMessage{row("c1", 1, "")}, cut},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, _, err := appendModelRecord(nil, tc.rows, tc.cut)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := cutImportRecord(data)
			if !ok {
				t.Fatalf("an exported record misses the fast path: %s", data)
			}
			var want importRecord
			if err := unmarshalImportRecord(data, &want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*got, want) {
				t.Fatalf("fast path %+v, generic decoder %+v", *got, want)
			}
		})
	}
}
