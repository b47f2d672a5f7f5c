// Package configtest holds the configuration checks every server's command
// shares, so that the servers' tests cannot drift apart on them.
package configtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// LoadSigningKeyFile loads a server's configuration with getenv as its
// environment and returns its checkpoint.signing_key_file.
type LoadSigningKeyFile func(getenv func(string) string) (string, error)

// SigningKeyFile checks checkpoint.signing_key_file, set from the
// environment: a file holding a key of 32 bytes loads, a shorter key or a
// missing file fails loading with an error naming the key.
func SigningKeyFile(t *testing.T, load LoadSigningKeyFile) {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{"good": strings.Repeat("k", 32) + "\n", "short": strings.Repeat("k", 31) + "\n"}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	loadKey := func(keyFile string) (string, error) {
		env := map[string]string{"GYMFLEET_CHECKPOINT_ENABLED": "true", "GYMFLEET_CHECKPOINT_CONTROL_AUTH_TOKEN": "tok",
			"GYMFLEET_CHECKPOINT_ROOT": dir, "GYMFLEET_CHECKPOINT_SIGNING_KEY_FILE": keyFile}
		return load(func(k string) string { return env[k] })
	}
	if got, err := loadKey(filepath.Join(dir, "good")); err != nil || got != filepath.Join(dir, "good") {
		t.Errorf("a 32-byte key file: %q, %v", got, err)
	}
	for _, bad := range []string{"short", "missing"} {
		if _, err := loadKey(filepath.Join(dir, bad)); err == nil || !strings.Contains(err.Error(), "checkpoint.signing_key_file") {
			t.Errorf("key file %s: %v, want an error naming checkpoint.signing_key_file", bad, err)
		}
	}
}
