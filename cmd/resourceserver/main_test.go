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

	"github.com/gymfleet/gymfleet/cmd/internal/configload"
	"github.com/gymfleet/gymfleet/cmd/internal/configtest"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func noEnv(string) string { return "" }

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "resourceserver.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestShippedConfigLoads(t *testing.T) {
	cfg, err := loadConfig(configload.Flags{Config: "../../configs/resourceserver.yaml"}, noEnv)
	if err != nil {
		t.Fatalf("configs/resourceserver.yaml: %v", err)
	}
	var got []string
	for _, s := range cfg.ServerConfigs() {
		got = append(got, s.Name+"="+s.Type+"@"+s.Listen+"/"+s.EffectiveCheckpointMode()+"/"+s.EffectiveVerifyMode())
	}
	want := "weather=weather@127.0.0.1:18020/stateless/replay counter=counter@127.0.0.1:18021/saved/replay"
	if strings.Join(got, " ") != want {
		t.Errorf("servers = %s\nwant %s", strings.Join(got, " "), want)
	}
}

func TestUnknownKeysFail(t *testing.T) {
	for name, text := range map[string]string{
		"top level":   "bogus_key: 1\nservers:\n  - {name: w, type: weather, listen: 127.0.0.1:0}\n",
		"in a server": "servers:\n  - {name: w, type: weather, listen: 127.0.0.1:0, colour_key: red}\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := loadConfig(configload.Flags{Config: writeConfig(t, text)}, noEnv)
			if err == nil || !strings.Contains(err.Error(), "_key") {
				t.Errorf("loadConfig = %v, want an error naming the unknown key", err)
			}
		})
	}
}

func TestListenFlag(t *testing.T) {
	one := writeConfig(t, "servers:\n  - {name: w, type: weather, listen: 127.0.0.1:1}\n")
	cfg, err := loadConfig(configload.Flags{Config: one, Listen: "127.0.0.1:0"}, noEnv)
	if err != nil || cfg.Servers[0].Listen != "127.0.0.1:0" {
		t.Errorf("--listen with one server: %v %+v", err, cfg.Servers)
	}
	_, err = loadConfig(configload.Flags{Config: "../../configs/resourceserver.yaml", Listen: "127.0.0.1:0"}, noEnv)
	if err == nil || !strings.Contains(err.Error(), "exactly one") {
		t.Errorf("--listen with two servers: %v", err)
	}
}

func TestEnvOverride(t *testing.T) {
	env := func(k string) string {
		if k == "GYMFLEET_LOG_LEVEL" {
			return "debug"
		}
		return ""
	}
	cfg, err := loadConfig(configload.Flags{Config: "../../configs/resourceserver.yaml"}, env)
	if err != nil || cfg.LogLevel != "debug" {
		t.Errorf("log level from env: %v %q", err, cfg.LogLevel)
	}
}

func TestRun_Help(t *testing.T) {
	if err := run(context.Background(), []string{"-h"}, noEnv, io.Discard, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("run -h = %v, want flag.ErrHelp", err)
	}
}

func TestRun_ServesUntilCancelled(t *testing.T) {
	cfgPath := writeConfig(t, "log_level: warn\nservers:\n  - {name: w, type: weather, listen: 127.0.0.1:0}\n  - {name: c, type: counter, listen: 127.0.0.1:0}\n")
	addrFile := filepath.Join(t.TempDir(), "addrs")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--config", cfgPath, "--addr-file", addrFile}, noEnv, &stdout, &stderr)
	}()
	addrs := waitAddrs(t, addrFile, done)
	client := &http.Client{}
	defer client.CloseIdleConnections()
	for name, addr := range addrs {
		resp, err := client.Post("http://"+addr+"/seed_session", "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s seed: %d", name, resp.StatusCode)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v (stderr %s)", err, stderr.String())
	}
}

// waitAddrs polls the address file lifecycle writes once every server listens.
func waitAddrs(t *testing.T, path string, done <-chan error) map[string]string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			t.Fatalf("run returned early: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		out := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if name, addr, ok := strings.Cut(line, " "); ok {
				out[name] = addr
			}
		}
		return out
	}
	t.Fatal("address file never appeared")
	return nil
}

// TestRun_CheckpointEnabled: with the checkpoint block on (from the
// environment), every server answers the control API as its own instance.
func TestRun_CheckpointEnabled(t *testing.T) {
	cfgPath := writeConfig(t, "log_level: warn\nservers:\n  - {name: w, type: weather, listen: 127.0.0.1:0}\n  - {name: c, type: counter, listen: 127.0.0.1:0, checkpoint_mode: restart_only}\n")
	env := map[string]string{"GYMFLEET_CHECKPOINT_ENABLED": "true", "GYMFLEET_CHECKPOINT_CONTROL_AUTH_TOKEN": "tok", "GYMFLEET_CHECKPOINT_ROOT": t.TempDir()}
	addrFile := filepath.Join(t.TempDir(), "addrs")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--config", cfgPath, "--addr-file", addrFile}, func(k string) string { return env[k] }, &stdout, &stderr)
	}()
	addrs := waitAddrs(t, addrFile, done)
	client := &http.Client{}
	defer client.CloseIdleConnections()
	want := map[string]string{"w": `"mode":"stateless"`, "c": `"mode":"restart_only"`}
	for name, addr := range addrs {
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/_ckpt/status", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), `"instance":"`+name+`"`) || !strings.Contains(string(body), `"kind":"resources"`) || !strings.Contains(string(body), want[name]) {
			t.Errorf("%s status: %d %s", name, resp.StatusCode, body)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v (stderr %s)", err, stderr.String())
	}
}

func TestCheckpointWithoutTokenFails(t *testing.T) {
	cfgPath := writeConfig(t, "checkpoint: {enabled: true}\nservers:\n  - {name: w, type: weather, listen: 127.0.0.1:0}\n")
	if _, err := loadConfig(configload.Flags{Config: cfgPath}, noEnv); err == nil || !strings.Contains(err.Error(), "control_auth_token") {
		t.Errorf("loadConfig = %v, want an error naming control_auth_token", err)
	}
}

// checkpoint.signing_key_file is a key of the checkpoint block, checked as
// every server checks it.
func TestCheckpointSigningKeyFile(t *testing.T) {
	configtest.SigningKeyFile(t, func(getenv func(string) string) (string, error) {
		cfg, err := loadConfig(configload.Flags{Config: "../../configs/resourceserver.yaml"}, getenv)
		return cfg.Checkpoint.SigningKeyFile, err
	})
}

// http.tls loads from the environment; a file that cannot be read stops
// the start with an error naming its key.
func TestHTTPTLSFiles(t *testing.T) {
	configtest.HTTPTLS(t, func(getenv func(string) string) (httpconf.TLS, error) {
		cfg, err := loadConfig(configload.Flags{Config: "../../configs/resourceserver.yaml"}, getenv)
		return cfg.HTTP.TLS, err
	})
}

func TestRuntimeTuning(t *testing.T) {
	configtest.RuntimeTuning(t, func(getenv func(string) string) (runtimetune.Config, error) {
		cfg, err := loadConfig(configload.Flags{Config: "../../configs/resourceserver.yaml"}, getenv)
		return cfg.Runtime, err
	})
}

// Ensure --version prints the version the build sets (-X main.version).
func TestVersionFlag(t *testing.T) {
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"--version"}, func(string) string { return "" }, &stdout, io.Discard); err != nil {
		t.Fatal(err)
	}
	if got, want := stdout.String(), "resourceserver "+version+"\n"; got != want {
		t.Errorf("--version printed %q, want %q", got, want)
	}
}
