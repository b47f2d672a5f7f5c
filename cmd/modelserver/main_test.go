package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gymfleet/gymfleet/cmd/internal/configload"
	"github.com/gymfleet/gymfleet/cmd/internal/configtest"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func noEnv(string) string { return "" }

func TestShippedConfigLoadsAndValidates(t *testing.T) {
	cfg, err := loadConfig(configload.Flags{Config: "../../configs/modelserver.yaml"}, noEnv)
	if err != nil {
		t.Fatalf("configs/modelserver.yaml: %v", err)
	}
	if cfg.Listen != "127.0.0.1:18010" || cfg.Name != "policy_model" || !cfg.ReturnTokenIDs {
		t.Errorf("unexpected config: %+v", cfg)
	}
	if u := cfg.Upstream; u.BaseURL != "http://127.0.0.1:18000/v1" || u.Model != "fake-model" || u.H2C || u.Protocol != "auto" || u.APIKey != "" {
		t.Errorf("upstream = %+v", u)
	}
	if cfg.Capture.Dir != ".gymfleet/capture/policy_model" || cfg.Checkpoint.Enabled || cfg.Checkpoint.LeaseGraceSeconds != 600 {
		t.Errorf("capture %+v, checkpoint %+v", cfg.Capture, cfg.Checkpoint)
	}
	if g := cfg.GenerationCuts; !g.Enabled || g.ControlAuthToken != "" {
		t.Errorf("generation_cuts = %+v", g)
	}
}

func TestUnknownKeyFailsNamingIt(t *testing.T) {
	for _, tc := range []struct{ name, yaml, key string }{
		{"top level", "listen: 127.0.0.1:0\nreturn_token_id_information: true\n", "return_token_id_information"},
		{"inside upstream", "upstream:\n  base_url: http://x:1/v1\n  modle: m\n", "modle"},
		{"inside generation_cuts", "generation_cuts:\n  enable: true\n", "enable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "model.yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := loadConfig(configload.Flags{Config: path}, noEnv)
			if err == nil || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("loadConfig = %v, want an error naming %q", err, tc.key)
			}
		})
	}
}

func TestEnvironmentOverrides(t *testing.T) {
	env := map[string]string{
		"GYMFLEET_UPSTREAM_BASE_URL":                  "http://gpu1:8000/v1",
		"GYMFLEET_UPSTREAM_PROTOCOL":                  "http1",
		"GYMFLEET_RETURN_TOKEN_IDS":                   "false",
		"GYMFLEET_GENERATION_CUTS_CONTROL_AUTH_TOKEN": "cut-secret",
	}
	cfg, err := loadConfig(configload.Flags{Config: "../../configs/modelserver.yaml", Listen: "127.0.0.1:0"}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Upstream.BaseURL != "http://gpu1:8000/v1" || cfg.Upstream.Protocol != "http1" || cfg.ReturnTokenIDs || cfg.Listen != "127.0.0.1:0" ||
		cfg.GenerationCuts.ControlAuthToken != "cut-secret" {
		t.Errorf("overrides not applied: %+v", cfg)
	}
}

// upstream.base_urls lists several workers, in a file or in the
// environment (comma-separated); with upstream.base_url as well it is
// refused.
func TestUpstreamBaseURLs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "model.yaml")
	if err := os.WriteFile(path, []byte("upstream:\n  base_urls: [http://gpu1:8000/v1, http://gpu2:8000/v1]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(configload.Flags{Config: path}, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"http://gpu1:8000/v1", "http://gpu2:8000/v1"}
	if !slices.Equal(cfg.Upstream.Workers(), want) || cfg.Upstream.BaseURL != "" {
		t.Fatalf("workers %v (base_url %q), want %v", cfg.Upstream.Workers(), cfg.Upstream.BaseURL, want)
	}
	env := map[string]string{"GYMFLEET_UPSTREAM_BASE_URLS": "http://gpu3:8000/v1,http://gpu4:8000/v1"}
	cfg, err = loadConfig(configload.Flags{}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Upstream.Workers(); !slices.Equal(got, []string{"http://gpu3:8000/v1", "http://gpu4:8000/v1"}) {
		t.Fatalf("workers from the environment = %v", got)
	}
	env["GYMFLEET_UPSTREAM_BASE_URL"] = "http://gpu1:8000/v1"
	if _, err := loadConfig(configload.Flags{}, func(k string) string { return env[k] }); err == nil || !strings.Contains(err.Error(), "exclusive") {
		t.Fatalf("base_url with base_urls: %v, want them refused as exclusive", err)
	}
}

func TestInvalidConfigFails(t *testing.T) {
	env := map[string]string{"GYMFLEET_CHECKPOINT_ENABLED": "true"}
	_, err := loadConfig(configload.Flags{Config: "../../configs/modelserver.yaml"}, func(k string) string { return env[k] })
	if err == nil || !strings.Contains(err.Error(), "control_auth_token") {
		t.Fatalf("checkpointing without a token: %v", err)
	}
}

func TestHelpAndBadFlags(t *testing.T) {
	var stderr bytes.Buffer
	if err := run(t.Context(), []string{"-h"}, noEnv, io.Discard, &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("run -h = %v, want flag.ErrHelp", err)
	}
	if err := run(t.Context(), []string{"--nope"}, noEnv, io.Discard, &stderr); err == nil {
		t.Error("run --nope succeeded")
	}
}

// syncBuffer is a buffer the server goroutine and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestRunServesUntilCancelled(t *testing.T) {
	dir := t.TempDir()
	addrFile := filepath.Join(dir, "addr")
	env := map[string]string{"GYMFLEET_CAPTURE_DIR": filepath.Join(dir, "capture")}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	errc := make(chan error, 1)
	var stdout, stderr syncBuffer
	go func() {
		errc <- run(ctx, []string{"--config", "../../configs/modelserver.yaml", "--listen", "127.0.0.1:0", "--addr-file", addrFile},
			func(k string) string { return env[k] }, &stdout, &stderr)
	}()
	var addr string
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for addr == "" {
		if b, err := os.ReadFile(addrFile); err == nil {
			if f := strings.Fields(string(b)); len(f) == 2 && f[0] == "policy_model" {
				addr = f[1]
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no address file; stderr: %s", stderr.String())
		}
		select {
		case err := <-errc:
			t.Fatalf("run ended early: %v; stderr: %s", err, stderr.String())
		case <-tick.C:
		}
	}
	resp, err := http.Get("http://" + addr + "/capture/rollouts/r/manifest")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != `{"rollout_id":"r","records":[],"failures":[]}` {
		t.Errorf("manifest = %d %s", resp.StatusCode, body)
	}
	if _, err := os.Stat(filepath.Join(dir, "capture", "LOCK")); err != nil {
		t.Errorf("capture dir not used: %v", err)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("run = %v", err)
	}
	if !strings.Contains(stdout.String(), "policy_model listening on http://"+addr) {
		t.Errorf("stdout = %q", stdout.String())
	}
}

// checkpoint.signing_key_file is a key of the checkpoint block, checked as
// every server checks it.
func TestCheckpointSigningKeyFile(t *testing.T) {
	configtest.SigningKeyFile(t, func(getenv func(string) string) (string, error) {
		cfg, err := loadConfig(configload.Flags{Config: "../../configs/modelserver.yaml"}, getenv)
		return cfg.Checkpoint.SigningKeyFile, err
	})
}

// http.tls loads from the environment; a file that cannot be read stops
// the start with an error naming its key.
func TestHTTPTLSFiles(t *testing.T) {
	configtest.HTTPTLS(t, func(getenv func(string) string) (httpconf.TLS, error) {
		cfg, err := loadConfig(configload.Flags{Config: "../../configs/modelserver.yaml"}, getenv)
		return cfg.HTTP.TLS, err
	})
}

func TestRuntimeTuning(t *testing.T) {
	configtest.RuntimeTuning(t, func(getenv func(string) string) (runtimetune.Config, error) {
		cfg, err := loadConfig(configload.Flags{Config: "../../configs/modelserver.yaml"}, getenv)
		return cfg.Runtime, err
	})
}

// Ensure --version prints the version the build sets (-X main.version).
func TestVersionFlag(t *testing.T) {
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"--version"}, func(string) string { return "" }, &stdout, io.Discard); err != nil {
		t.Fatal(err)
	}
	if got, want := stdout.String(), "modelserver "+version+"\n"; got != want {
		t.Errorf("--version printed %q, want %q", got, want)
	}
}
