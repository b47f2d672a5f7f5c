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

	"go.uber.org/goleak"
	"gopkg.in/yaml.v3"

	"github.com/gymfleet/gymfleet/cmd/internal/configload"
	"github.com/gymfleet/gymfleet/cmd/internal/configtest"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func noEnv(string) string { return "" }

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "fakeinference.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestShippedConfigLoads(t *testing.T) {
	cfg, err := loadConfig(configload.Flags{Config: "../../configs/fakeinference.yaml"}, noEnv)
	if err != nil {
		t.Fatalf("configs/fakeinference.yaml: %v", err)
	}
	want := fakeinference.DefaultConfig()
	// The file names the default stack rather than leaving it empty.
	want.HTTP.Stack = httpconf.StackLean
	if cfg != want {
		t.Errorf("shipped config %+v, want the defaults %+v", cfg, want)
	}
}

// The shipped model server asks for the model the shipped stand-in serves:
// any other name is a 404, as from vLLM.
func TestShippedModelServerAsksForTheServedModel(t *testing.T) {
	cfg, err := loadConfig(configload.Flags{Config: "../../configs/fakeinference.yaml"}, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("../../configs/modelserver.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ms struct {
		Upstream struct {
			Model string `yaml:"model"`
		} `yaml:"upstream"`
	}
	if err := yaml.Unmarshal(b, &ms); err != nil {
		t.Fatal(err)
	}
	if ms.Upstream.Model != cfg.Model {
		t.Errorf("configs/modelserver.yaml upstream.model %q, configs/fakeinference.yaml model %q", ms.Upstream.Model, cfg.Model)
	}
}

// Every key of the shipped file is documented by a comment line above it.
func TestShippedConfigDocumentsEveryKey(t *testing.T) {
	b, err := os.ReadFile("../../configs/fakeinference.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	keys := 0
	for i, line := range lines {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		keys++
		if i == 0 || !strings.HasPrefix(lines[i-1], "#") {
			t.Errorf("key line %q has no comment above it", line)
		}
	}
	// The 11 of fakeinference.Config, http: taking a line for itself, one
	// for its stack and four for tls: and its three files.
	if keys != 16 {
		t.Errorf("%d keys in the shipped file, want the 16 lines of fakeinference.Config's keys", keys)
	}
}

func TestUnknownKeyFails(t *testing.T) {
	_, err := loadConfig(configload.Flags{Config: writeConfig(t, "listen: 127.0.0.1:0\ntokens_per_sec: 5\n")}, noEnv)
	if err == nil || !strings.Contains(err.Error(), "tokens_per_sec") {
		t.Errorf("loadConfig = %v, want an error naming tokens_per_sec", err)
	}
}

func TestInvalidConfigFails(t *testing.T) {
	for name, text := range map[string]string{
		"negative rate": "tokens_per_second: -1\n",
		"small vocab":   "vocab_size: 10\n",
		"bad script":    "script: '{\"tool_roundz\": 1}'\n",
		"bad log level": "log_level: loud\n",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := loadConfig(configload.Flags{Config: writeConfig(t, text)}, noEnv); err == nil {
				t.Error("loadConfig accepted an invalid configuration")
			}
		})
	}
}

func TestEnvAndListenOverride(t *testing.T) {
	env := func(k string) string {
		return map[string]string{"GYMFLEET_TOKENS_PER_SECOND": "50", "GYMFLEET_CONTROL_AUTH_TOKEN": "s3cret"}[k]
	}
	cfg, err := loadConfig(configload.Flags{Config: "../../configs/fakeinference.yaml", Listen: "127.0.0.1:7"}, env)
	if err != nil || cfg.TokensPerSecond != 50 || cfg.ControlAuthToken != "s3cret" || cfg.Listen != "127.0.0.1:7" {
		t.Errorf("overrides: %v %+v", err, cfg)
	}
}

func TestRun_Help(t *testing.T) {
	if err := run(context.Background(), []string{"-h"}, noEnv, io.Discard, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("run -h = %v, want flag.ErrHelp", err)
	}
}

func TestRun_ServesUntilCancelled(t *testing.T) {
	addrFile := filepath.Join(t.TempDir(), "addrs")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--config", writeConfig(t, "log_level: warn\n"), "--listen", "127.0.0.1:0", "--addr-file", addrFile}, noEnv, &stdout, &stderr)
	}()
	addr := waitAddr(t, addrFile, done)
	client := &http.Client{}
	defer client.CloseIdleConnections()
	resp, err := client.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(`{"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), fakeinference.Greeting) {
		t.Errorf("chat: %d %s", resp.StatusCode, b)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v (stderr %s)", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "fakeinference listening on http://"+addr) {
		t.Errorf("stdout %q does not announce the server", stdout.String())
	}
	if !strings.Contains(stderr.String(), "control_auth_token is empty") {
		t.Errorf("stderr %q does not warn that cuts are disabled", stderr.String())
	}
}

// waitAddr polls the address file lifecycle writes once the server listens.
func waitAddr(t *testing.T, path string, done <-chan error) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			t.Fatalf("run returned early: %v", err)
		case <-tick.C:
		}
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		if n, addr, ok := strings.Cut(strings.TrimSpace(string(b)), " "); ok && n == "fakeinference" {
			return addr
		}
	}
	t.Fatal("the address file never named the server")
	return ""
}

// http.tls loads from the environment; a file that cannot be read stops
// the start with an error naming its key.
func TestHTTPTLSFiles(t *testing.T) {
	configtest.HTTPTLS(t, func(getenv func(string) string) (httpconf.TLS, error) {
		cfg, err := loadConfig(configload.Flags{Config: "../../configs/fakeinference.yaml"}, getenv)
		return cfg.HTTP.TLS, err
	})
}

func TestRuntimeTuning(t *testing.T) {
	configtest.RuntimeTuning(t, func(getenv func(string) string) (runtimetune.Config, error) {
		cfg, err := loadConfig(configload.Flags{Config: "../../configs/fakeinference.yaml"}, getenv)
		return cfg.Runtime, err
	})
}

// Ensure --version prints the version the build sets (-X main.version).
func TestVersionFlag(t *testing.T) {
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"--version"}, func(string) string { return "" }, &stdout, io.Discard); err != nil {
		t.Fatal(err)
	}
	if got, want := stdout.String(), "fakeinference "+version+"\n"; got != want {
		t.Errorf("--version printed %q, want %q", got, want)
	}
}
