package collect_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ops/collect"
)

func TestReadRows_AssignsIndices(t *testing.T) {
	input := strings.Join([]string{
		`{"responses_create_params":{"input":"a"}}`,
		`{"responses_create_params":{"input":"a"}}`,
		`{"responses_create_params":{"input":"b"}}`,
		`{"responses_create_params":{"input":"c"},"_ng_task_index":1}`,
		`{"responses_create_params":{"input":"c"},"_ng_task_index":1}`,
		`{"responses_create_params":{"input":"a"}}`,
		`{"responses_create_params":{"input":"d"},"_ng_task_index":5,"_ng_rollout_index":1}`,
		`{"responses_create_params":{"input":"d"},"_ng_task_index":5}`,
		`{"responses_create_params":{"input":"d"},"_ng_task_index":5}`,
		`{"responses_create_params":{"input":"e"},"_ng_rollout_id":"custom","_ng_attempt_index":2}`,
	}, "\n")
	rows, issues, err := collect.ReadRows(strings.NewReader(input), 0)
	if err != nil || len(issues) != 0 {
		t.Fatalf("ReadRows: %v %v", err, issues)
	}
	var got []string
	for _, r := range rows {
		got = append(got, fmt.Sprintf("L%d t%d r%d %s", r.Line, r.TaskIndex, r.RolloutIndex, r.Episode.CaptureKey()))
	}
	want := []string{
		"L1 t0 r0 0-0", // "a": first free index
		"L2 t0 r1 0-1", // identical raw line: same task, next rollout
		"L3 t2 r0 2-0", // "b": 1 is taken by an explicit task index
		"L4 t1 r0 1-0",
		"L5 t1 r1 1-1",
		"L6 t0 r2 0-2",
		"L7 t5 r1 5-1",
		"L8 t5 r0 5-0", // rollout 1 of task 5 is explicit: skipped
		"L9 t5 r2 5-2",
		"L10 t3 r0 custom-a2", // _ng_rollout_id wins for the episode
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if string(rows[0].Fields["_ng_task_index"]) != "0" || string(rows[0].Fields["_ng_rollout_index"]) != "0" {
		t.Errorf("assigned indices are not in the /run body: %s %s", rows[0].Fields["_ng_task_index"], rows[0].Fields["_ng_rollout_index"])
	}
}

func TestReadRows_ReportsBadLines(t *testing.T) {
	input := strings.Join([]string{
		`{"responses_create_params":{"input":"a"}}`,
		`not json`,
		``,
		`[1,2,3]`,
		`{"input":"no params"}`,
		`{"responses_create_params":"a string"}`,
		`{"responses_create_params":{},"_ng_task_index":-1}`,
		`{"responses_create_params":{},"_ng_rollout_id":"bad id"}`,
		`{"responses_create_params":{"x":1},"_ng_rollout_id":"0-0"}`,
		`{"responses_create_params":{"input":"ok"}`,
		"{\"responses_create_params\":{\"input\":\"crlf\"}}\r",
	}, "\n")
	rows, issues, err := collect.ReadRows(strings.NewReader(input), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Line != 1 || rows[1].Line != 11 {
		t.Errorf("rows = %+v, want lines 1 and 11", rows)
	}
	want := map[int]string{
		2:  "not a JSON object",
		4:  "not a JSON object",
		5:  "no responses_create_params",
		6:  "no responses_create_params",
		7:  "non-negative integer",
		8:  "invalid id",
		9:  "repeats line 1",
		10: "not a JSON object",
	}
	if len(issues) != len(want) {
		t.Errorf("issues = %v", issues)
	}
	for _, is := range issues {
		if w, ok := want[is.Line]; !ok || !strings.Contains(is.Reason, w) {
			t.Errorf("line %d: %q, want %q", is.Line, is.Reason, w)
		}
	}
}

func TestReadRows_Limit(t *testing.T) {
	input := "bad\n" + strings.Repeat(`{"responses_create_params":{}}`+"\n", 5)
	rows, issues, err := collect.ReadRows(strings.NewReader(input), 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || len(issues) != 1 || rows[2].RolloutIndex != 2 {
		t.Errorf("rows %d issues %v", len(rows), issues)
	}
}

func FuzzReadRows(f *testing.F) {
	for _, s := range []string{
		`{"responses_create_params":{}}` + "\n" + `{"responses_create_params":{}}`,
		`{"responses_create_params":{},"_ng_task_index":3,"_ng_rollout_index":3}`,
		`{"responses_create_params":{},"_ng_rollout_id":"x"}` + "\n" + `{"responses_create_params":{},"_ng_rollout_id":"x"}`,
		`{"responses_create_params":{},"_ng_attempt_index":1.5}`,
		"\n\n{}\n[]\nnull\n",
		`{"responses_create_params":{},"_ng_task_index":99999999999999999999}`,
	} {
		f.Add(s, 0)
	}
	f.Fuzz(func(t *testing.T, input string, limit int) {
		if limit < 0 || limit > 100 {
			limit = 0
		}
		rows, _, err := collect.ReadRows(strings.NewReader(input), limit)
		if err != nil {
			t.Fatal(err)
		}
		if limit > 0 && len(rows) > limit {
			t.Fatalf("%d rows over the limit %d", len(rows), limit)
		}
		keys := map[string]bool{}
		for _, r := range rows {
			if err := r.Episode.Validate(); err != nil {
				t.Fatalf("invalid episode %+v: %v", r.Episode, err)
			}
			if keys[r.Episode.CaptureKey()] {
				t.Fatalf("two rows run %s", r.Episode.CaptureKey())
			}
			keys[r.Episode.CaptureKey()] = true
			if _, ok := r.Fields["responses_create_params"]; !ok {
				t.Fatal("a row without responses_create_params")
			}
		}
	})
}
