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
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/cmd/internal/configload"
	"github.com/gymfleet/gymfleet/cmd/internal/configtest"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/servers/environment"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

func noEnv(string) string { return "" }

func TestShippedConfigLoadsAndValidates(t *testing.T) {
	cfg, err := loadConfig(configload.Flags{Config: "../../configs/envserver.yaml"}, noEnv)
	if err != nil {
		t.Fatalf("configs/envserver.yaml: %v", err)
	}
	if cfg.Listen != "127.0.0.1:18040" || cfg.Protocol != environment.ProtocolSingleAgentTurn || len(cfg.Agents) != 2 {
		t.Errorf("unexpected config: %+v", cfg)
	}
	if cfg.Agents[1].Name != "counter_agent" || cfg.Agents[1].ResourcesURL != "http://127.0.0.1:18021" {
		t.Errorf("agents = %+v", cfg.Agents)
	}
	if cfg.EpisodeTimeout != 30*time.Minute || cfg.CleanupTimeout != 30*time.Second || cfg.CleanupRetryWindow != 10*time.Minute {
		t.Errorf("timeouts = %v, %v, %v", cfg.EpisodeTimeout, cfg.CleanupTimeout, cfg.CleanupRetryWindow)
	}
}

func TestCleanupRetryWindow(t *testing.T) {
	const agents = "agents:\n  - name: a\n    url: http://x:1\n    resources_url: http://y:1\n"
	for _, tc := range []struct {
		name, yaml, env string
		want            time.Duration
		err             string
	}{
		{name: "default", yaml: agents, want: environment.DefaultCleanupRetryWindow},
		{name: "from the file", yaml: agents + "cleanup_retry_window: 2m\n", want: 2 * time.Minute},
		{name: "off", yaml: agents + "cleanup_retry_window: 0s\n", want: 0},
		{name: "from the environment", yaml: agents + "cleanup_retry_window: 2m\n", env: "90s", want: 90 * time.Second},
		{name: "negative", yaml: agents + "cleanup_retry_window: -1s\n", err: "cleanup_retry_window"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "env.yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			getenv := func(k string) string {
				if k == "GYMFLEET_CLEANUP_RETRY_WINDOW" {
					return tc.env
				}
				return ""
			}
			cfg, err := loadConfig(configload.Flags{Config: path}, getenv)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("loadConfig = %v, want an error naming %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("loadConfig: %v", err)
			}
			if cfg.CleanupRetryWindow != tc.want {
				t.Errorf("cleanup_retry_window = %v, want %v", cfg.CleanupRetryWindow, tc.want)
			}
		})
	}
}

func TestUnknownKeyFailsNamingIt(t *testing.T) {
	for _, tc := range []struct{ name, yaml, key string }{
		{"top level", "listen: 127.0.0.1:0\nlisten_port: 1\n", "listen_port"},
		{"inside an agent", "agents:\n  - name: a\n    url: http://x:1\n    resource_url: http://y:1\n", "resource_url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "env.yaml")
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
	env := map[string]string{"GYMFLEET_EPISODE_TIMEOUT": "90s", "GYMFLEET_PROTOCOL": "legacy"}
	cfg, err := loadConfig(configload.Flags{Config: "../../configs/envserver.yaml"}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.EpisodeTimeout != 90*time.Second || cfg.Protocol != environment.ProtocolLegacy {
		t.Errorf("overrides not applied: %v %q", cfg.EpisodeTimeout, cfg.Protocol)
	}
}

func TestHelpAndBadFlags(t *testing.T) {
	var stderr bytes.Buffer
	if err := run(t.Context(), []string{"-h"}, noEnv, &bytes.Buffer{}, &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("run -h = %v, want flag.ErrHelp", err)
	}
	if err := run(t.Context(), []string{"--nope"}, noEnv, &bytes.Buffer{}, &stderr); err == nil {
		t.Error("run --nope succeeded")
	}
}

func TestRunServesUntilCancelled(t *testing.T) {
	addrFile := filepath.Join(t.TempDir(), "addr")
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	var stdout, stderr bytes.Buffer
	go func() {
		errc <- run(ctx, []string{"--config", "../../configs/envserver.yaml", "--listen", "127.0.0.1:0", "--addr-file", addrFile}, noEnv, &stdout, &stderr)
	}()
	var addr string
	deadline := time.Now().Add(10 * time.Second)
	for addr == "" {
		if b, err := os.ReadFile(addrFile); err == nil {
			if f := strings.Fields(string(b)); len(f) == 2 && f[0] == "env" {
				addr = f[1]
			}
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("no address file; stderr: %s", stderr.String())
		}
		select {
		case err := <-errc:
			t.Fatalf("run ended early: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/readyz = %d", resp.StatusCode)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("run = %v", err)
	}
}

// checkpoint.signing_key_file is a key of the checkpoint block, checked as
// every server checks it.
func TestCheckpointSigningKeyFile(t *testing.T) {
	configtest.SigningKeyFile(t, func(getenv func(string) string) (string, error) {
		cfg, err := loadConfig(configload.Flags{Config: "../../configs/envserver.yaml"}, getenv)
		return cfg.Checkpoint.SigningKeyFile, err
	})
}

// http.tls loads from the environment; a file that cannot be read stops
// the start with an error naming its key.
func TestHTTPTLSFiles(t *testing.T) {
	configtest.HTTPTLS(t, func(getenv func(string) string) (httpconf.TLS, error) {
		cfg, err := loadConfig(configload.Flags{Config: "../../configs/envserver.yaml"}, getenv)
		return cfg.HTTP.TLS, err
	})
}

func TestRuntimeTuning(t *testing.T) {
	configtest.RuntimeTuning(t, func(getenv func(string) string) (runtimetune.Config, error) {
		cfg, err := loadConfig(configload.Flags{Config: "../../configs/envserver.yaml"}, getenv)
		return cfg.Runtime, err
	})
}

// Ensure --version prints the version the build sets (-X main.version).
func TestVersionFlag(t *testing.T) {
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"--version"}, func(string) string { return "" }, &stdout, io.Discard); err != nil {
		t.Fatal(err)
	}
	if got, want := stdout.String(), "envserver "+version+"\n"; got != want {
		t.Errorf("--version printed %q, want %q", got, want)
	}
}
