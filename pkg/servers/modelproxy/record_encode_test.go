package modelproxy

import (
	"bytes"
	"slices"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/tokencapture"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// TestEncodeModelRecordIsMarshal: a record assembled from encoded rows has
// the bytes codec.Marshal writes for the ModelRecord, and names the same
// staging keys.
func TestEncodeModelRecordIsMarshal(t *testing.T) {
	row := func(id, continued string) tokencapture.Row {
		return tokencapture.Row{
			CallID: id, CaptureKey: "r", Seq: 1, CreatedAt: 1796018333.510503, Model: "m<&>", RequestDigest: "d",
			PromptTokenIDs: []int{1, 2}, GenerationTokenIDs: []int{3}, GenerationLogProbs: []float64{-0.25}, FinishReason: "stop",
			ContinuedFrom: continued,
		}
	}
	cut := &GenerationCut{ModelCallID: "m1", RequestDigest: "dd", Continuation: Continuation{
		SourceCaptureKey: "r", SourceModelCallID: "m1", StagingKeys: []string{"__generation_cut__/r/m1"}, PrefixTokenCount: 3, PrefixDigest: "p",
	}}
	for _, tt := range []struct {
		name string
		rows []tokencapture.Row
		cut  *GenerationCut
	}{
		{"one row", []tokencapture.Row{row("c1", "")}, nil},
		{"rows and a cut", []tokencapture.Row{row("c1", ""), row("c2", "k\"2"), row("c3", "continued_from")}, cut},
		{"a cut alone", []tokencapture.Row{}, cut},
		{"a call id naming the field", []tokencapture.Row{row(`"continued_from"`, "")}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			raw := make([]codec.RawMessage, len(tt.rows))
			rec := ModelRecord{Rows: tt.rows, GenerationCuts: []GenerationCut{}}
			for i, r := range tt.rows {
				b, err := codec.Marshal(r)
				if err != nil {
					t.Fatal(err)
				}
				raw[i] = b
			}
			if tt.cut != nil {
				rec.GenerationCuts = append(rec.GenerationCuts, *tt.cut)
			}
			want, err := codec.Marshal(rec)
			if err != nil {
				t.Fatal(err)
			}
			got, staging, err := appendModelRecord(nil, raw, tt.cut)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("encoded\n %s\nMarshal writes\n %s", got, want)
			}
			var wantStaging []string
			for _, r := range tt.rows {
				if r.ContinuedFrom != "" {
					wantStaging = append(wantStaging, r.ContinuedFrom)
				}
			}
			if tt.cut != nil {
				wantStaging = append(wantStaging, tt.cut.Continuation.StagingKeys...)
			}
			slices.Sort(staging)
			slices.Sort(wantStaging)
			if !slices.Equal(staging, wantStaging) {
				t.Fatalf("staging keys %q, want %q", staging, wantStaging)
			}
		})
	}
}

// A row names continued_from wherever its member lies: the search skips
// the token arrays only for a row in the Row's own order.
func TestMayNameContinuedFrom(t *testing.T) {
	for _, tc := range []struct {
		name string
		row  string
		want bool
	}{
		{"Row's order, continued", `{"call_id":"c","prompt_token_ids":[1],"finish_reason":"stop","continued_from":"k"}`, true},
		{"Row's order, not continued", `{"call_id":"c","prompt_token_ids":[1],"finish_reason":"stop"}`, false},
		{"escaped names in values", `{"call_id":"\"continued_from\"","model":",\"finish_reason\":","finish_reason":"stop"}`, false},
		{"another order", `{"continued_from":"k","call_id":"c","finish_reason":"stop"}`, true},
		{"another first member", `{"seq":1,"finish_reason":"stop","call_id":"c","continued_from":"k"}`, true},
		{"no finish_reason", `{"call_id":"c","continued_from":"k"}`, true},
	} {
		if got := mayNameContinuedFrom([]byte(tc.row)); got != tc.want {
			t.Errorf("%s: mayNameContinuedFrom(%s) = %v, want %v", tc.name, tc.row, got, tc.want)
		}
	}
}
