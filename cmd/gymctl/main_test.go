package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/transport/httpserver/h2ctest"
)

func noEnv(string) string { return "" }

func runArgs(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), args, noEnv, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

func TestSubcommands(t *testing.T) {
	if _, stderr, err := runArgs(t); err == nil || !strings.Contains(stderr, "usage: gymctl") {
		t.Errorf("no args: %v, %q", err, stderr)
	}
	for _, help := range []string{"-h", "--help", "help"} {
		if _, _, err := runArgs(t, help); !errors.Is(err, flag.ErrHelp) {
			t.Errorf("%s: %v, want flag.ErrHelp", help, err)
		}
	}
	if _, _, err := runArgs(t, "nope"); err == nil || !strings.Contains(err.Error(), `unknown subcommand "nope"`) {
		t.Errorf("unknown subcommand: %v", err)
	}
	for _, sub := range []string{"up", "collect", "demo"} {
		if _, stderr, err := runArgs(t, sub, "-h"); !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr, "-config") {
			t.Errorf("%s -h: %v, %q", sub, err, stderr)
		}
	}
}

func TestParseCollectFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string // error substring; empty = valid
	}{
		{[]string{"--env-url", "http://x", "--input", "a", "--output", "b"}, ""},
		{[]string{"--config", "f.yaml", "--input", "a", "--output", "b", "--concurrency", "8", "--limit", "3"}, ""},
		{[]string{"--env-url", "http://x", "--output", "b"}, "--input and --output are required"},
		{[]string{"--input", "a", "--output", "b"}, "--env-url or --config is required"},
		{[]string{"--env-url", "http://x", "--config", "f", "--input", "a", "--output", "b"}, "not both"},
		{[]string{"--env-url", "http://x", "--input", "a", "--output", "b", "--concurrency", "0"}, "at least 1"},
		{[]string{"--env-url", "http://x", "--input", "a", "--output", "b", "--limit", "-1"}, "must not be negative"},
		{[]string{"--env-url", "http://x", "--input", "a", "--output", "a"}, "must differ"},
		{[]string{"--env-url", "http://x", "--input", "a", "--output", "b", "extra"}, "unexpected arguments"},
		{[]string{"--concurrency", "many"}, "invalid value"},
		{[]string{"--config", "f", "--input", "a", "--output", "b", "--checkpoint-dir", "d", "--checkpoint-every", "1m", "--resume", "--max-attempts", "5", "--skip-bad-lines"}, ""},
		{[]string{"--env-url", "http://x", "--input", "a", "--output", "b", "--checkpoint-dir", "d"}, "needs --config"},
		{[]string{"--config", "f", "--input", "a", "--output", "b", "--resume"}, "need --checkpoint-dir"},
		{[]string{"--config", "f", "--input", "a", "--output", "b", "--checkpoint-every", "1s"}, "need --checkpoint-dir"},
		{[]string{"--config", "f", "--input", "a", "--output", "b", "--checkpoint-dir", "d", "--checkpoint-timeout", "0s"}, "must be positive"},
		{[]string{"--env-url", "http://x", "--input", "a", "--output", "b", "--max-attempts", "0"}, "at least 1"},
	}
	for _, tc := range tests {
		f, err := parseCollectFlags(tc.args, io.Discard)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
		if tc.want == "" && f.concurrency < 1 {
			t.Errorf("%v: concurrency %d", tc.args, f.concurrency)
		}
	}
	f, _ := parseCollectFlags([]string{"--env-url", "http://x", "--input", "a", "--output", "b"}, io.Discard)
	if f.concurrency != 16 || f.limit != 0 || f.maxAttempts != 3 || f.checkpointTimeout != 300*time.Second || f.skipBadLines {
		t.Errorf("defaults: %+v", f)
	}
}

func TestParseDemoFlags(t *testing.T) {
	o, err := parseDemoFlags(nil, io.Discard)
	if err != nil || o.config != "" || o.input != "data/demo.jsonl" || o.concurrency != 72 || o.binDir != "" || o.minCallSeconds <= 0 {
		t.Errorf("defaults (the crash demo on a generated fleet): %+v %v", o, err)
	}
	if _, err := parseDemoFlags([]string{"--min-call-seconds", "-1"}, io.Discard); err == nil {
		t.Error("a negative pace accepted")
	}
	if _, err := parseDemoFlags([]string{"--concurrency", "0"}, io.Discard); err == nil {
		t.Error("--concurrency 0 accepted")
	}
}

// h2cServer is an environment stand-in answering /run with reward 1.
func h2cServer(t *testing.T, h http.HandlerFunc) *httptest.Server {
	return h2ctest.Start(t, h)
}

func TestCollect_EndToEndThroughRun(t *testing.T) {
	env := h2cServer(t, func(w http.ResponseWriter, r *http.Request) {
		var row map[string]any
		_ = json.NewDecoder(r.Body).Decode(&row)
		if row["fail"] == true {
			w.WriteHeader(502)
			_, _ = io.WriteString(w, `{"error":{"code":"upstream_error","detail":"no"}}`)
			return
		}
		_, _ = io.WriteString(w, `{"reward":1.0,"observations":{"model_calls":2}}`)
	})
	dir := t.TempDir()
	input := filepath.Join(dir, "in.jsonl")
	output := filepath.Join(dir, "out.jsonl")
	rows := `{"responses_create_params":{"input":"a"}}` + "\n" + `{"responses_create_params":{"input":"b"}}` + "\n"
	if err := os.WriteFile(input, []byte(rows), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, _, err := runArgs(t, "collect", "--env-url", env.URL, "--input", input, "--output", output, "--no-progress")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout, "rows: 2  succeeded: 2  failed: 0") || !strings.Contains(stdout, "model calls: 4") {
		t.Errorf("stdout:\n%s", stdout)
	}
	b, _ := os.ReadFile(output)
	if strings.Count(string(b), "\n") != 2 {
		t.Errorf("output:\n%s", b)
	}

	// Through a fleet file, with a failing row: exit status is an error.
	fleetFile := filepath.Join(dir, "fleet.yaml")
	if err := os.WriteFile(fleetFile, []byte("processes:\n  - name: env\n    binary: envserver\n    endpoints: [{name: env, kind: environment, url: \""+env.URL+"\"}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(input, []byte(rows+`{"responses_create_params":{},"fail":true}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = runArgs(t, "collect", "--config", fleetFile, "--input", input, "--output", output, "--no-progress")
	if err == nil || !strings.Contains(err.Error(), "1 of 3 rows failed") || !strings.Contains(err.Error(), "out_failures.jsonl") {
		t.Errorf("collect with a failing row = %v", err)
	}
}

func TestCollect_FleetWithoutEnvironment(t *testing.T) {
	fleetFile := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(fleetFile, []byte("processes:\n  - name: m\n    binary: modelserver\n    endpoints: [{name: m, kind: model, url: \"http://127.0.0.1:1\"}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := runArgs(t, "collect", "--config", fleetFile, "--input", "a", "--output", "b")
	if err == nil || !strings.Contains(err.Error(), "no environment endpoint") {
		t.Errorf("err = %v", err)
	}
}

func TestUpAndDemoFailCleanly(t *testing.T) {
	dir := t.TempDir()
	fleetFile := filepath.Join(dir, "fleet.yaml")
	yaml := "bin_dir: " + filepath.Join(dir, "bin") + "\nrun_dir: " + filepath.Join(dir, "run") + "\nprocesses:\n  - name: env\n    binary: envserver\n    endpoints: [{name: env, kind: environment, url: \"http://127.0.0.1:1\"}]\n"
	if err := os.WriteFile(fleetFile, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runArgs(t, "up", "--config", filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("up with a missing fleet file succeeded")
	}
	if _, _, err := runArgs(t, "up", "--config", fleetFile); err == nil || !strings.Contains(err.Error(), "envserver not found") {
		t.Errorf("up without binaries = %v", err)
	}
	input := filepath.Join(dir, "demo.jsonl")
	if err := os.WriteFile(input, []byte(`{"responses_create_params":{}}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, _, err := runArgs(t, "demo", "--config", fleetFile, "--input", input)
	if err == nil || !strings.Contains(err.Error(), `demo step "start the fleet"`) || !strings.Contains(stdout, "[2/6] start the fleet") {
		t.Errorf("demo without binaries = %v\n%s", err, stdout)
	}
	if _, _, err := runArgs(t, "demo", "--config", fleetFile, "--input", filepath.Join(dir, "none.jsonl")); err == nil || !strings.Contains(err.Error(), "demo dataset") {
		t.Errorf("demo without a dataset = %v", err)
	}
}

func TestCollect_CheckpointsNeedACheckpointingFleet(t *testing.T) {
	dir := t.TempDir()
	fleetFile := filepath.Join(dir, "fleet.yaml")
	if err := os.WriteFile(fleetFile, []byte("processes:\n  - name: env\n    binary: envserver\n    endpoints: [{name: env, kind: environment, url: \"http://127.0.0.1:1\"}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := runArgs(t, "collect", "--config", fleetFile, "--input", "a", "--output", "b", "--checkpoint-dir", filepath.Join(dir, "ckpt"))
	if err == nil || !strings.Contains(err.Error(), "checkpoint.enabled false") {
		t.Errorf("checkpoints on a fleet without checkpointing: %v", err)
	}
}

// A checkpoint directory outside the fleet's checkpoint root is refused
// before any server is called, by collect and by ckpt alike.
func TestCheckpointDirOutsideTheRoot(t *testing.T) {
	dir := t.TempDir()
	fleetFile := filepath.Join(dir, "fleet.yaml")
	text := "checkpoint: {enabled: true, control_auth_token: tok, root: ckroot}\nprocesses:\n  - name: env\n    binary: envserver\n    endpoints: [{name: env, kind: environment, url: \"http://127.0.0.1:1\"}]\n"
	if err := os.WriteFile(fleetFile, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(dir, "ckroot-not", "c1")
	_, _, err := runArgs(t, "collect", "--config", fleetFile, "--input", "a", "--output", "b", "--checkpoint-dir", outside)
	if err == nil || !strings.Contains(err.Error(), "checkpoint.root") {
		t.Errorf("collect into %s: %v, want a refusal naming checkpoint.root", outside, err)
	}
	_, _, err = runArgs(t, "ckpt", "verify", "--config", fleetFile, "--id", "c1", "--dir", outside)
	if err == nil || !strings.Contains(err.Error(), "checkpoint.root") {
		t.Errorf("ckpt verify of %s: %v, want a refusal naming checkpoint.root", outside, err)
	}
	// An object store location is outside a local root, and a local
	// directory (or another bucket or prefix) outside an s3:// root.
	_, _, err = runArgs(t, "ckpt", "verify", "--config", fleetFile, "--id", "c1", "--dir", "s3://bucket/ckroot/c1")
	if err == nil || !strings.Contains(err.Error(), "checkpoint.root") {
		t.Errorf("ckpt verify of an s3:// dir under a local root: %v, want a refusal naming checkpoint.root", err)
	}
	s3Fleet := filepath.Join(dir, "s3fleet.yaml")
	if err := os.WriteFile(s3Fleet, []byte(strings.Replace(text, "root: ckroot", "root: \"s3://bucket/ckroot\"", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Join(dir, "ckroot", "c1"), "s3://other/ckroot/c1", "s3://bucket/ckroot-not/c1", "s3://bucket/ckroot/../x"} {
		_, _, err = runArgs(t, "ckpt", "verify", "--config", s3Fleet, "--id", "c1", "--dir", d)
		if err == nil || !strings.Contains(err.Error(), "checkpoint.root") {
			t.Errorf("ckpt verify of %s under an s3:// root: %v, want a refusal naming checkpoint.root", d, err)
		}
	}
}

// collect keeps its own state on a filesystem: an s3:// --checkpoint-dir
// without --state-dir, or an s3:// --state-dir, is refused with a reason,
// not half-used.
func TestCollectS3CheckpointDirNeedsAStateDir(t *testing.T) {
	dir := t.TempDir()
	fleetFile := filepath.Join(dir, "fleet.yaml")
	text := "checkpoint: {enabled: true, control_auth_token: tok, root: \"s3://bucket/ck\"}\nprocesses:\n  - name: env\n    binary: envserver\n    endpoints: [{name: env, kind: environment, url: \"http://127.0.0.1:1\"}]\n"
	if err := os.WriteFile(fleetFile, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := runArgs(t, "collect", "--config", fleetFile, "--input", "a", "--output", "b", "--checkpoint-dir", "s3://bucket/ck/run1")
	if err == nil || !strings.Contains(err.Error(), "needs --state-dir") {
		t.Errorf("collect into s3:// without --state-dir: %v, want a refusal naming --state-dir", err)
	}
	_, _, err = runArgs(t, "collect", "--config", fleetFile, "--input", "a", "--output", "b", "--checkpoint-dir", "s3://bucket/ck/run1", "--state-dir", "s3://bucket/ck/state")
	if err == nil || !strings.Contains(err.Error(), "must be a local directory") {
		t.Errorf("collect with an s3:// --state-dir: %v, want a refusal", err)
	}
}

func TestIsTerminate(t *testing.T) {
	// signal.NotifyContext's cause names the signal.
	if !isTerminate(errors.New("terminated signal received")) || isTerminate(errors.New("interrupt signal received")) || isTerminate(nil) {
		t.Error("isTerminate does not tell SIGTERM from the rest")
	}
}

// Ensure --version prints the version the build sets (-X main.version).
func TestVersionFlag(t *testing.T) {
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"--version"}, func(string) string { return "" }, &stdout, io.Discard); err != nil {
		t.Fatal(err)
	}
	if got, want := stdout.String(), "gymctl "+version+"\n"; got != want {
		t.Errorf("--version printed %q, want %q", got, want)
	}
}
