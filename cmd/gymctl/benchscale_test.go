package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runBench(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), append([]string{"bench-scale"}, args...), func(string) string { return "" }, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

func TestBenchScaleFlags(t *testing.T) {
	if _, stderr, err := runBench(t, "-h"); !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr, "-rollouts") || !strings.Contains(stderr, "-profile") {
		t.Errorf("-h: %v, %q", err, stderr)
	}
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--rollouts", "0"}, "--rollouts must be at least 1"},
		{[]string{"--rollouts", "many"}, "invalid value"},
		{[]string{"--max-rss-gib", "-1"}, "--max-rss-gib must be >= 0"},
		{[]string{"--tuning", "sometimes"}, "--tuning: runtime.tuning"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"--stacks", "lean,quic"}, `"quic" is not lean or nethttp`},
		{[]string{"--stacks", "lean,lean"}, "lean is named twice"},
		{[]string{"--stacks", ""}, "is not lean or nethttp"},
		{[]string{"--replicas", "0"}, "--replicas must be at least 1"},
		{[]string{"--ports", "13000"}, "--ports: port block"},
	}
	for _, tc := range tests {
		if _, _, err := runBench(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}

// Without the server binaries the bench fails at the start, and still
// prints its (empty) table and writes its JSON with the error in it.
func TestBenchScaleWithoutBinariesReportsTheFailure(t *testing.T) {
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "bench.json")
	stdout, _, err := runBench(t, "--rollouts", "3", "--bin-dir", filepath.Join(dir, "nobin"), "--dir", filepath.Join(dir, "work"), "--json", jsonPath)
	if err == nil || !strings.Contains(err.Error(), "starting the fleet") {
		t.Fatalf("error %v, want a start failure", err)
	}
	if !strings.Contains(stdout, "scale bench: 3 weather rollouts") || !strings.Contains(stdout, "ERROR:") {
		t.Errorf("stdout lacks the table and the error:\n%s", stdout)
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Rollouts int    `json:"rollouts"`
		Error    string `json:"error"`
	}
	if err := json.Unmarshal(b, &res); err != nil || res.Rollouts != 3 || !strings.Contains(res.Error, "starting the fleet") {
		t.Fatalf("JSON %s: %+v, %v", b, res, err)
	}
}

// With several stacks the bench runs once per stack, each into its own
// work directory and JSON file, and prints both runs side by side.
func TestBenchScaleTwoStacks(t *testing.T) {
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "bench.json")
	stdout, _, err := runBench(t, "--rollouts", "3", "--stacks", "lean,nethttp", "--bin-dir", filepath.Join(dir, "nobin"), "--dir", filepath.Join(dir, "work"), "--json", jsonPath)
	if err == nil || !strings.Contains(err.Error(), "lean stack") || !strings.Contains(err.Error(), "nethttp stack") {
		t.Fatalf("error %v, want both runs' start failures", err)
	}
	for _, want := range []string{"=== lean HTTP stack", "=== nethttp HTTP stack", "lean HTTP stack (", "scale bench side by side"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	for _, st := range []string{"lean", "nethttp"} {
		b, err := os.ReadFile(filepath.Join(dir, "bench-"+st+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var res struct {
			Stack string `json:"stack"`
		}
		if err := json.Unmarshal(b, &res); err != nil || res.Stack != st {
			t.Errorf("bench-%s.json: stack %q, %v", st, res.Stack, err)
		}
	}
}
