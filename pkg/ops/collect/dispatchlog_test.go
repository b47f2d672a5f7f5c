package collect_test

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ops/collect"
)

func TestReadDispatchLog(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		runID    string
		attempts map[string]int
		torn     bool
		err      string
	}{
		{name: "empty", in: "", attempts: map[string]int{}},
		{name: "header only", in: `{"run_id":"abc"}` + "\n", runID: "abc", attempts: map[string]int{}},
		{name: "torn header", in: `{"run_i`, attempts: map[string]int{}, torn: true},
		{
			name:     "entries, highest attempt wins",
			in:       `{"run_id":"abc"}` + "\n" + `{"r1":0}` + "\n" + `{"r2":0}` + "\n" + `{"r1":1}` + "\n" + `{"r1":0}` + "\n",
			runID:    "abc",
			attempts: map[string]int{"r1": 1, "r2": 0},
		},
		{
			name:     "torn last line is ignored",
			in:       `{"run_id":"abc"}` + "\n" + `{"r1":0}` + "\n" + `{"r2":`,
			runID:    "abc",
			attempts: map[string]int{"r1": 0},
			torn:     true,
		},
		{
			name:     "a torn line that happens to parse is still torn",
			in:       `{"run_id":"abc"}` + "\n" + `{"r1":0}` + "\n" + `{"r2":1}`,
			runID:    "abc",
			attempts: map[string]int{"r1": 0},
			torn:     true,
		},
		{
			name:     "an unreadable last complete line is taken as torn",
			in:       `{"run_id":"abc"}` + "\n" + `{"r1":0}` + "\n" + `{"r2"` + "\n",
			runID:    "abc",
			attempts: map[string]int{"r1": 0},
			torn:     true,
		},
		{name: "a bad middle line is an error", in: `{"run_id":"abc"}` + "\n" + `garbage` + "\n" + `{"r1":0}` + "\n", err: "line 2"},
		{name: "two keys on a line", in: `{"run_id":"abc"}` + "\n" + `{"a":0,"b":1}` + "\n" + `{"r1":0}` + "\n", err: "line 2"},
		{name: "an invalid rollout id", in: `{"run_id":"abc"}` + "\n" + `{"bad id":0}` + "\n" + `{"r1":0}` + "\n", err: "line 2"},
		{name: "a negative attempt", in: `{"run_id":"abc"}` + "\n" + `{"r":-1}` + "\n" + `{"r1":0}` + "\n", err: "line 2"},
		{name: "no run id first", in: `{"r1":0}` + "\n" + `{"r2":0}` + "\n", err: "line 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log, err := collect.ReadDispatchLog(strings.NewReader(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one naming %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if log.RunID != tc.runID || log.Torn != tc.torn || !maps.Equal(log.Attempts, tc.attempts) {
				t.Errorf("got run %q torn %v attempts %v, want %q %v %v", log.RunID, log.Torn, log.Attempts, tc.runID, tc.torn, tc.attempts)
			}
		})
	}
}

func TestLoadDispatchLog_MissingIsNil(t *testing.T) {
	log, err := collect.LoadDispatchLog(filepath.Join(t.TempDir(), collect.DispatchLogName))
	if err != nil || log != nil {
		t.Fatalf("missing log: %v, %v", log, err)
	}
	path := filepath.Join(t.TempDir(), collect.DispatchLogName)
	if err := os.WriteFile(path, []byte("x\ny\nz\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := collect.LoadDispatchLog(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("a corrupt log: %v", err)
	}
}

func FuzzReadDispatchLog(f *testing.F) {
	for _, s := range []string{
		"",
		`{"run_id":"abc"}` + "\n",
		`{"run_id":"abc"}` + "\n" + `{"r1":0}` + "\n" + `{"r1":`,
		`{"run_id":"abc"}` + "\n" + `{"r1":999999999999}` + "\n",
		"\n\n\n",
		`{"run_id":""}` + "\n",
		`{"run_id":"a","x":1}` + "\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		log, err := collect.ReadDispatchLog(strings.NewReader(in))
		if err != nil {
			return
		}
		for id, a := range log.Attempts {
			if a < 0 || id == "" {
				t.Fatalf("invalid entry %q: %d", id, a)
			}
		}
		if !strings.HasSuffix(in, "\n") && in != "" && !log.Torn {
			t.Fatal("an input without a final newline must be reported torn")
		}
	})
}
