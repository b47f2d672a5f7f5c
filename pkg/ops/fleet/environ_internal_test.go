package fleet

import (
	"slices"
	"strings"
	"testing"
)

// The checkpoint block reaches every process as environment variables; the
// signing key goes as its file's path, resolved against the fleet file's
// directory, and only when set.
func TestLauncher_EnvironCheckpointBlock(t *testing.T) {
	cfg := &Config{BaseDir: "/fleet", Checkpoint: Checkpoint{Enabled: true, ControlAuthToken: "tok", Root: "ck"}}
	env := NewLauncher(cfg, Options{}).environ(Process{})
	for _, want := range []string{"GYMFLEET_CHECKPOINT_ENABLED=true", "GYMFLEET_CHECKPOINT_CONTROL_AUTH_TOKEN=tok", "GYMFLEET_CHECKPOINT_ROOT=/fleet/ck"} {
		if !slices.Contains(env, want) {
			t.Errorf("environ %v lacks %s", env, want)
		}
	}
	for _, e := range env {
		if strings.HasPrefix(e, "GYMFLEET_CHECKPOINT_SIGNING_KEY_FILE=") {
			t.Errorf("environ without a key file sets %s", e)
		}
	}
	cfg.Checkpoint.SigningKeyFile = "keys/ckpt.key"
	env = NewLauncher(cfg, Options{}).environ(Process{})
	if !slices.Contains(env, "GYMFLEET_CHECKPOINT_SIGNING_KEY_FILE=/fleet/keys/ckpt.key") {
		t.Errorf("environ %v lacks the key file's path", env)
	}
}

// An s3:// root reaches every process as it is written (not resolved
// against the fleet file's directory), with the endpoint and path style.
func TestLauncher_EnvironS3Root(t *testing.T) {
	cfg := &Config{BaseDir: "/fleet", Checkpoint: Checkpoint{Enabled: true, ControlAuthToken: "tok", Root: "s3://bucket/ck"}}
	env := NewLauncher(cfg, Options{Environ: []string{}}).environ(Process{})
	if !slices.Contains(env, "GYMFLEET_CHECKPOINT_ROOT=s3://bucket/ck") {
		t.Errorf("environ %v lacks the s3:// root as written", env)
	}
	for _, e := range env {
		if strings.HasPrefix(e, "GYMFLEET_CHECKPOINT_S3_") {
			t.Errorf("environ without S3 settings sets %s", e)
		}
	}
	cfg.Checkpoint.S3Endpoint, cfg.Checkpoint.S3PathStyle = "http://127.0.0.1:8333", true
	env = NewLauncher(cfg, Options{Environ: []string{}}).environ(Process{})
	for _, want := range []string{"GYMFLEET_CHECKPOINT_S3_ENDPOINT=http://127.0.0.1:8333", "GYMFLEET_CHECKPOINT_S3_PATH_STYLE=true"} {
		if !slices.Contains(env, want) {
			t.Errorf("environ %v lacks %s", env, want)
		}
	}
}

// The fleet's http.stack reaches every process as GYMFLEET_HTTP_STACK, after
// the launcher's own environment and before the process's entries.
func TestLauncher_EnvironHTTPStack(t *testing.T) {
	cfg := &Config{BaseDir: "/fleet"}
	env := NewLauncher(cfg, Options{Environ: []string{"PATH=/bin"}}).environ(Process{})
	for _, e := range env {
		if strings.HasPrefix(e, "GYMFLEET_HTTP_STACK=") {
			t.Errorf("environ without http.stack sets %s", e)
		}
	}
	cfg.HTTP.Stack = "nethttp"
	env = NewLauncher(cfg, Options{Environ: []string{"GYMFLEET_HTTP_STACK=lean"}}).environ(Process{Env: []EnvVar{{Name: "X", Value: "1"}}})
	want := []string{"GYMFLEET_HTTP_STACK=lean", "GYMFLEET_HTTP_STACK=nethttp", "X=1"}
	if !slices.Equal(env, want) {
		t.Errorf("environ = %v, want %v (the fleet's stack after the launcher's)", env, want)
	}
}

// The fleet's http.tls reaches every process as GYMFLEET_HTTP_TLS_*, its
// relative paths resolved against the fleet file's directory.
func TestLauncher_EnvironHTTPTLS(t *testing.T) {
	cfg := &Config{BaseDir: "/fleet", HTTP: HTTP{TLS: TLS{CertFile: "pki/cert.pem", KeyFile: "/abs/key.pem", CAFile: "pki/ca.pem"}}}
	env := NewLauncher(cfg, Options{Environ: []string{}}).environ(Process{})
	want := []string{"GYMFLEET_HTTP_TLS_CERT_FILE=/fleet/pki/cert.pem", "GYMFLEET_HTTP_TLS_KEY_FILE=/abs/key.pem", "GYMFLEET_HTTP_TLS_CA_FILE=/fleet/pki/ca.pem"}
	if !slices.Equal(env, want) {
		t.Errorf("environ = %v, want %v", env, want)
	}
}
