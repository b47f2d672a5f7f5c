package tokencapture

import (
	"bytes"
	"fmt"
	"math"
	"reflect"
	"slices"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// referenceImportRecord is how the ledger encoded an import record before
// ImportRow: the rows decoded, copied with an empty capture_key filled in
// and nil arrays made empty, and the record encoded with codec.Marshal. The
// log format is that encoding: appendImportRecord must write its bytes.
func referenceImportRecord(key string, rows []Row) (line []byte, lastSeq int64, err error) {
	if err := checkKey(key); err != nil {
		return nil, 0, err
	}
	rows = slices.Clone(rows)
	for i := range rows {
		if rows[i].CallID == "" {
			return nil, 0, fmt.Errorf("tokencapture: import %s: row %d has no call_id", key, i)
		}
		if rows[i].CaptureKey == "" {
			rows[i].CaptureKey = key
		}
		rows[i].PromptTokenIDs = orEmpty(rows[i].PromptTokenIDs)
		rows[i].GenerationTokenIDs = orEmpty(rows[i].GenerationTokenIDs)
		rows[i].GenerationLogProbs = orEmptyF(rows[i].GenerationLogProbs)
		lastSeq = max(lastSeq, rows[i].Seq)
	}
	line, err = encodeRecord(record{Op: opImport, Key: key, Rows: rows})
	return line, lastSeq, err
}

// importRowSeeds are rows as checkpoint records carry them: as the ledger
// writes them, and in the forms a re-encode rewrites.
var importRowSeeds = []string{
	`{"call_id":"c1","parent_call_id":"","capture_key":"r-a0","seq":1,"created_at":1796018333.510503,"model":"fake-model","request_digest":"cb0e","prompt_token_ids":[1,3,9,151643],"generation_token_ids":[11,3182],"generation_log_probs":[-0.7936,-2.0686],"finish_reason":"length"}`,
	`{"call_id":"c2","parent_call_id":"c1","capture_key":"","seq":2,"created_at":0,"model":"m<&>\u2028","request_digest":"d","prompt_token_ids":[-1,0,9223372036854775807,-9223372036854775808],"generation_token_ids":[5,6,7,8],"generation_log_probs":[-1e-7,0,-0.25,-1.5e-300],"finish_reason":"stop","continued_from":"__generation_cut__/r/c1"}`,
	`{"call_id":"c3","seq":3,"prompt_token_ids":null,"generation_token_ids":null,"generation_log_probs":null}`,
	`{"call_id":"c4","seq":4,"prompt_token_ids":[ 1 , 2 ],"generation_token_ids":[-0, null],"generation_log_probs":[1E-7 , -0.0, 1.50]}`,
	`{"call_id":"c5","seq":5,"prompt_token_ids":[],"generation_token_ids":[1],"generation_log_probs":[-0.00093075251579284668]}`,
	`{"call_id":"c6","seq":6,"generation_log_probs":[1e21,1e+21,1e20,0.000001,0.0000001,1e2,-12.5e-1,5e-324,1.7976931348623157e308]}`,
	`{"call_id":"c7","seq":7,"created_at":1e-7,"model":"\ud83d\ude00 \u00e9","generation_log_probs":[-1.2345678901234567,-0.30000000000000004,-0.1]}`,
	`{"call_id":"c8","seq":-3,"prompt_token_ids":[1.5]}`,
	`{"call_id":"c9","prompt_token_ids":[99999999999999999999]}`,
	`{"call_id":"c10","generation_log_probs":[1e400]}`,
	`{"call_id":"","seq":1}`,
	`{"call_id":"c11","surprise":1}`,
}

// decodeBoth decodes a row as the restore decodes it (an ImportRow) and as
// the ledger's rows decode (a Row): the two must accept and refuse alike.
func decodeBoth(t *testing.T, data []byte) (Row, ImportRow, bool) {
	t.Helper()
	var row Row
	var imp ImportRow
	errRow, errImp := codec.UnmarshalStrictFast(data, &row), codec.UnmarshalStrictFast(data, &imp)
	if fmt.Sprint(errRow) != fmt.Sprint(errImp) {
		t.Fatalf("%s: a Row decodes with %v, an ImportRow with %v", data, errRow, errImp)
	}
	return row, imp, errRow == nil
}

// checkCut checks that CutImportRow reads data, a row the decoders read as
// decoded (or refuse, !ok), as they do or not at all.
func checkCut(t *testing.T, data []byte, decoded ImportRow, ok bool) {
	t.Helper()
	cut, rest, cutOK := CutImportRow(append(slices.Clip(data), ",more"...))
	switch {
	case !cutOK:
	case !ok:
		t.Fatalf("%s: CutImportRow reads a row the decoders refuse: %+v", data, cut)
	case string(rest) != ",more":
		t.Fatalf("%s: CutImportRow left %q", data, rest)
	case !reflect.DeepEqual(cut, decoded):
		t.Fatalf("%s: CutImportRow reads\n %+v\nthe decoders\n %+v", data, cut, decoded)
	}
}

// sameImportRecord checks that key's import of rows (decoded) and of imps
// (kept) write the same record, or fail alike.
func sameImportRecord(t *testing.T, key string, rows []Row, imps []ImportRow) {
	t.Helper()
	want, wantSeq, wantErr := referenceImportRecord(key, rows)
	im := Import{Key: key, Rows: imps}
	gotSeq, gotErr := checkImport(im)
	var got []byte
	if gotErr == nil {
		got, gotErr = appendImportRecord([]byte("prefix:"), im)
	}
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("import of %+v: err %v, the reference %v", rows, gotErr, wantErr)
	}
	if wantErr != nil {
		return
	}
	got = bytes.TrimPrefix(got, []byte("prefix:"))
	if !bytes.Equal(got, want) || gotSeq != wantSeq {
		t.Fatalf("import record (last seq %d)\n %s\nthe reference (last seq %d)\n %s", gotSeq, got, wantSeq, want)
	}
}

// TestAppendImportRecord_IsTheReference: for rows as a restore reads them
// from a record, and for rows made in Go (Import's), the import record has
// the reference's bytes, key by key, one row or several or none.
func TestAppendImportRecord_IsTheReference(t *testing.T) {
	var rows []Row
	var imps []ImportRow
	for _, s := range importRowSeeds {
		row, imp, ok := decodeBoth(t, []byte(s))
		checkCut(t, []byte(s), imp, ok)
		if !ok {
			continue
		}
		sameImportRecord(t, "r-a1", []Row{row}, []ImportRow{imp})
		rows, imps = append(rows, row), append(imps, imp)
	}
	if len(rows) < 5 {
		t.Fatalf("only %d seeds decode", len(rows))
	}
	sameImportRecord(t, "r-a1", rows, imps)
	sameImportRecord(t, "empty", nil, nil)
	sameImportRecord(t, "../bad", rows, imps)

	made := []Row{
		{CallID: "<&>", CaptureKey: "x\xff\u2029", Model: "\x00\x1f\"\\", CreatedAt: 1700000000.123456, Seq: 9},
		{CallID: "a", PromptTokenIDs: []int{}, GenerationTokenIDs: []int{-5}, GenerationLogProbs: []float64{math.Copysign(0, -1), 1e-7, 123456789.125, math.SmallestNonzeroFloat64, math.MaxFloat64}},
		{CallID: "b", CreatedAt: 1e21, ContinuedFrom: "k"},
	}
	var madeImps []ImportRow
	for _, r := range made {
		imp, err := ImportRowOf(r)
		if err != nil {
			t.Fatal(err)
		}
		madeImps = append(madeImps, imp)
	}
	sameImportRecord(t, "made", made, madeImps)
	sameImportRecord(t, "made", append(made, Row{}), append(madeImps, ImportRow{}))
	if _, err := ImportRowOf(Row{CallID: "nan", GenerationLogProbs: []float64{math.NaN()}}); err == nil {
		t.Fatal("ImportRowOf accepted a NaN log-prob")
	}
	nan, _ := ImportRowOf(Row{CallID: "nan"})
	nan.CreatedAt = math.Inf(1)
	sameImportRecord(t, "nan", []Row{{CallID: "nan", CreatedAt: math.Inf(1)}}, []ImportRow{nan})
}

// FuzzImportRecord: a row read from a checkpoint record, whatever its
// fields and arrays, is refused as an ImportRow exactly when it is refused
// as a Row, and an accepted one is imported with the bytes the reference
// writes for the Row; so is a row made in Go from any strings and floats.
func FuzzImportRecord(f *testing.F) {
	for i, s := range importRowSeeds {
		var fields map[string]codec.RawMessage
		_ = codec.Unmarshal([]byte(s), &fields)
		str := func(k string) string {
			var v string
			_ = codec.Unmarshal(fields[k], &v)
			return v
		}
		arr := func(k string) []byte {
			if v, ok := fields[k]; ok {
				return v
			}
			return []byte("null")
		}
		f.Add(str("call_id"), str("capture_key"), int64(i), 1796018333.510503-float64(i), str("model")+str("continued_from"),
			arr("prompt_token_ids"), arr("generation_token_ids"), arr("generation_log_probs"))
	}
	f.Add("c", "", int64(1), math.Copysign(0, -1), "\xff<\u2028>", []byte("[ ]"), []byte("\t[1,\n2]"), []byte("[null,-0,0.1e1]"))
	f.Fuzz(func(t *testing.T, callID, captureKey string, seq int64, createdAt float64, text string, prompt, generated, logProbs []byte) {
		// A row as a checkpoint record holds it: the ledger's layout, if
		// the arrays are.
		data := []byte(`{"call_id":`)
		data = codec.AppendString(data, callID)
		data = append(data, `,"parent_call_id":`...)
		data = codec.AppendString(data, captureKey)
		data = append(data, `,"capture_key":`...)
		data = codec.AppendString(data, captureKey)
		data = fmt.Appendf(data, `,"seq":%d,"created_at":`, seq)
		if v, err := codec.AppendFloat(nil, createdAt); err == nil {
			data = append(data, v...)
		} else {
			data = append(data, '0')
		}
		data = append(data, `,"model":`...)
		data = codec.AppendString(data, text)
		data = append(data, `,"request_digest":`...)
		data = codec.AppendString(data, callID)
		data = append(data, `,"prompt_token_ids":`...)
		data = append(data, prompt...)
		data = append(data, `,"generation_token_ids":`...)
		data = append(data, generated...)
		data = append(data, `,"generation_log_probs":`...)
		data = append(data, logProbs...)
		data = append(data, `,"finish_reason":`...)
		data = codec.AppendString(data, text)
		if text != "" {
			data = append(data, `,"continued_from":`...)
			data = codec.AppendString(data, text)
		}
		data = append(data, '}')
		row, imp, ok := decodeBoth(t, data)
		checkCut(t, data, imp, ok)
		if !ok {
			return
		}
		if imp.PromptTokenIDs.Len() != len(row.PromptTokenIDs) || imp.GenerationTokenIDs.Len() != len(row.GenerationTokenIDs) ||
			imp.GenerationLogProbs.Len() != len(row.GenerationLogProbs) {
			t.Fatalf("%s: ImportRow lengths %d %d %d, Row's %d %d %d", data, imp.PromptTokenIDs.Len(), imp.GenerationTokenIDs.Len(),
				imp.GenerationLogProbs.Len(), len(row.PromptTokenIDs), len(row.GenerationTokenIDs), len(row.GenerationLogProbs))
		}
		sameImportRecord(t, "r-a1", []Row{row, row}, []ImportRow{imp, imp})

		// The same row made in Go, its strings as they came (invalid
		// UTF-8 included) and its created_at any float.
		row.CallID, row.CaptureKey, row.Model, row.FinishReason, row.CreatedAt = callID, captureKey, text, text, createdAt
		made, err := ImportRowOf(row)
		if err != nil {
			t.Fatal(err)
		}
		sameImportRecord(t, "r-a1", []Row{row}, []ImportRow{made})
	})
}

// TestCutImportRow_ReadsTheLedgersRows: the fast path reads rows as the
// ledger writes them (codec.Marshal of the Row, what ReadRawRows gives),
// strings without escapes, as the rows they are.
func TestCutImportRow_ReadsTheLedgersRows(t *testing.T) {
	for _, r := range []Row{
		{CallID: "c1", CaptureKey: "r-a0", Seq: 1, CreatedAt: 1796018333.510503, Model: "fake-model", RequestDigest: "cb0e",
			PromptTokenIDs: []int{1, 3, -9, 151643}, GenerationTokenIDs: []int{11, 3182}, GenerationLogProbs: []float64{-0.7936, -1e-7}, FinishReason: "length"},
		{CallID: "c2", ParentCallID: "c1", CaptureKey: "r-a0", Seq: 2, Model: "Qwen/Qwen3-8B é", GenerationTokenIDs: []int{}, GenerationLogProbs: []float64{},
			FinishReason: "stop", ContinuedFrom: "__generation_cut__/r/c1"},
		{CallID: "c3", Seq: -4, CreatedAt: -0.5, GenerationLogProbs: []float64{-0.00093075251579284668, 1e21, 0}},
	} {
		b, err := codec.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		want, err := ImportRowOf(r)
		if err != nil {
			t.Fatal(err)
		}
		got, rest, ok := CutImportRow(b)
		if !ok || len(rest) != 0 || !reflect.DeepEqual(got, want) {
			t.Fatalf("CutImportRow(%s) = %+v, %q, %v; want %+v", b, got, rest, ok, want)
		}
	}
}

// FuzzCutImportRow: whatever the input, the fast path never reads a row
// that the decoders would refuse or read otherwise, and leaves the rest of
// its input after the row.
func FuzzCutImportRow(f *testing.F) {
	for _, s := range importRowSeeds {
		f.Add([]byte(s + `,{"call_id":"next"}`))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		row, rest, ok := CutImportRow(data)
		if !ok {
			if len(rest) != len(data) {
				t.Fatalf("a refused row consumed %d bytes", len(data)-len(rest))
			}
			return
		}
		var decoded ImportRow
		if err := codec.UnmarshalStrictFast(data[:len(data)-len(rest)], &decoded); err != nil {
			t.Fatalf("%s: CutImportRow reads a row the decoder refuses: %v", data, err)
		}
		if !reflect.DeepEqual(row, decoded) {
			t.Fatalf("%s: CutImportRow reads\n %+v\nthe decoder\n %+v", data, row, decoded)
		}
	})
}
