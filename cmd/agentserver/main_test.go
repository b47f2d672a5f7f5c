package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
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
	"github.com/gymfleet/gymfleet/pkg/servers/agent"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func noEnv(string) string { return "" }

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agentserver.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const oneAgent = "agents:\n  - {name: a, listen: 127.0.0.1:0, model_server_url: http://127.0.0.1:1, resources_server_url: http://127.0.0.1:2}\n"

func TestShippedConfigLoads(t *testing.T) {
	cfg, err := loadConfig(configload.Flags{Config: "../../configs/agentserver.yaml"}, noEnv)
	if err != nil {
		t.Fatalf("configs/agentserver.yaml: %v", err)
	}
	var got []string
	for _, a := range cfg.AgentConfigs() {
		got = append(got, fmt.Sprintf("%s@%s model=%s resources=%s max_steps=%d stream=%v closed_ttl=%v", a.Name, a.Listen, a.ModelServerURL, a.ResourcesServerURL, a.MaxSteps, a.Stream, a.ClosedSessionTTL))
	}
	want := []string{
		"weather_agent@127.0.0.1:18030 model=http://127.0.0.1:18010 resources=http://127.0.0.1:18020 max_steps=10 stream=false closed_ttl=1h0m0s",
		"counter_agent@127.0.0.1:18031 model=http://127.0.0.1:18010 resources=http://127.0.0.1:18021 max_steps=10 stream=false closed_ttl=1h0m0s",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("agents:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestUnknownKeysFail(t *testing.T) {
	for name, text := range map[string]string{
		"top level":    "bogus_key: 1\n" + oneAgent,
		"in an agent":  "agents:\n  - {name: a, listen: 127.0.0.1:0, model_server_url: http://h:1, resources_server_url: http://h:2, max_stepz_key: 3}\n",
		"in the block": "checkpoint: {enabled: false, typo_key: 1}\n" + oneAgent,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := loadConfig(configload.Flags{Config: writeConfig(t, text)}, noEnv)
			if err == nil || !strings.Contains(err.Error(), "_key") {
				t.Errorf("loadConfig = %v, want an error naming the unknown key", err)
			}
		})
	}
}

func TestInvalidConfigFails(t *testing.T) {
	for name, text := range map[string]string{
		"no agents":        "log_level: info\n",
		"bad model url":    "agents:\n  - {name: a, listen: 127.0.0.1:0, model_server_url: nope, resources_server_url: http://h:2}\n",
		"checkpoint token": "checkpoint: {enabled: true}\n" + oneAgent,
		"checkpoint root":  "checkpoint: {enabled: true, control_auth_token: t}\n" + oneAgent,
		"negative ttl":     "closed_session_ttl: -1s\n" + oneAgent,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := loadConfig(configload.Flags{Config: writeConfig(t, text)}, noEnv); err == nil {
				t.Error("loadConfig accepted an invalid configuration")
			}
		})
	}
}

func TestClosedSessionTTL(t *testing.T) {
	cfg, err := loadConfig(configload.Flags{Config: writeConfig(t, "closed_session_ttl: 90s\n"+oneAgent)}, noEnv)
	if err != nil || cfg.AgentConfigs()[0].ClosedSessionTTL != 90*time.Second {
		t.Errorf("closed_session_ttl 90s: %v, agent gets %v", err, cfg.AgentConfigs()[0].ClosedSessionTTL)
	}
	cfg, err = loadConfig(configload.Flags{Config: writeConfig(t, oneAgent)}, noEnv)
	if err != nil || cfg.AgentConfigs()[0].ClosedSessionTTL != agent.DefaultClosedSessionTTL {
		t.Errorf("closed_session_ttl unset: %v, agent gets %v, want the default %v", err, cfg.AgentConfigs()[0].ClosedSessionTTL, agent.DefaultClosedSessionTTL)
	}
}

func TestListenFlag(t *testing.T) {
	cfg, err := loadConfig(configload.Flags{Config: writeConfig(t, oneAgent), Listen: "127.0.0.1:7"}, noEnv)
	if err != nil || cfg.Agents[0].Listen != "127.0.0.1:7" {
		t.Errorf("--listen with one agent: %v %+v", err, cfg.Agents)
	}
	_, err = loadConfig(configload.Flags{Config: "../../configs/agentserver.yaml", Listen: "127.0.0.1:0"}, noEnv)
	if err == nil || !strings.Contains(err.Error(), "exactly one") {
		t.Errorf("--listen with two agents: %v", err)
	}
}

func TestEnvOverride(t *testing.T) {
	env := func(k string) string {
		if k == "GYMFLEET_CHECKPOINT_LEASE_GRACE_SECONDS" {
			return "30"
		}
		return ""
	}
	cfg, err := loadConfig(configload.Flags{Config: "../../configs/agentserver.yaml"}, env)
	if err != nil || cfg.Checkpoint.LeaseGraceSeconds != 30 || cfg.AgentConfigs()[0].Checkpoint.LeaseGraceSeconds != 30 {
		t.Errorf("lease grace from env: %v %+v", err, cfg.Checkpoint)
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
		done <- run(ctx, []string{"--config", writeConfig(t, "log_level: warn\n"+oneAgent), "--addr-file", addrFile}, noEnv, &stdout, &stderr)
	}()
	addr := waitAddr(t, addrFile, "a", done)
	client := &http.Client{}
	defer client.CloseIdleConnections()
	// Served: a session route without a rollout prefix is refused by the agent itself.
	resp, err := client.Post("http://"+addr+"/v1/agent_sessions", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(b), "rollout_id_required") {
		t.Errorf("open without prefix: %d %s", resp.StatusCode, b)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v (stderr %s)", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "a listening on http://"+addr) {
		t.Errorf("stdout %q does not announce the agent", stdout.String())
	}
}

// waitAddr polls the address file lifecycle writes once every server listens.
func waitAddr(t *testing.T, path, name string, done <-chan error) string {
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
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if n, addr, ok := strings.Cut(line, " "); ok && n == name {
				return addr
			}
		}
	}
	t.Fatal("address file never named the agent")
	return ""
}

// With checkpointing on, every agent answers the control API on its own
// listener as an "agent" participant named after itself.
func TestRun_CheckpointEnabled(t *testing.T) {
	text := "log_level: warn\ncheckpoint: {enabled: true, control_auth_token: tok, root: " + t.TempDir() + "}\nagents:\n" +
		"  - {name: a, listen: 127.0.0.1:0, model_server_url: http://127.0.0.1:1, resources_server_url: http://127.0.0.1:2}\n" +
		"  - {name: b, listen: 127.0.0.1:0, model_server_url: http://127.0.0.1:1, resources_server_url: http://127.0.0.1:2}\n"
	addrFile := filepath.Join(t.TempDir(), "addrs")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--config", writeConfig(t, text), "--addr-file", addrFile}, noEnv, &stdout, &stderr)
	}()
	client := &http.Client{}
	defer client.CloseIdleConnections()
	for _, name := range []string{"a", "b"} {
		addr := waitAddr(t, addrFile, name, done)
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/_ckpt/status", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"kind":"agent"`) || !strings.Contains(string(b), `"instance":"`+name+`"`) {
			t.Errorf("%s status: %d %s", name, resp.StatusCode, b)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v (stderr %s)", err, stderr.String())
	}
}

// checkpoint.signing_key_file is a key of the checkpoint block, checked as
// every server checks it.
func TestCheckpointSigningKeyFile(t *testing.T) {
	configtest.SigningKeyFile(t, func(getenv func(string) string) (string, error) {
		cfg, err := loadConfig(configload.Flags{Config: "../../configs/agentserver.yaml"}, getenv)
		return cfg.Checkpoint.SigningKeyFile, err
	})
}

// GYMFLEET_HTTP_STACK chooses every agent's stack; an unknown one fails
// start-up.
func TestHTTPStackFromEnv(t *testing.T) {
	for _, tc := range []struct {
		stack string
		ok    bool
	}{{"nethttp", true}, {"lean", true}, {"quic", false}} {
		env := func(k string) string {
			if k == "GYMFLEET_HTTP_STACK" {
				return tc.stack
			}
			return ""
		}
		cfg, err := loadConfig(configload.Flags{Config: "../../configs/agentserver.yaml"}, env)
		if !tc.ok {
			if err == nil || !strings.Contains(err.Error(), "http.stack") {
				t.Errorf("stack %s: loadConfig = %v, want an error naming http.stack", tc.stack, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("stack %s: %v", tc.stack, err)
		}
		for _, ac := range cfg.AgentConfigs() {
			if string(ac.HTTP.Stack) != tc.stack {
				t.Errorf("stack %s: agent %s has %q", tc.stack, ac.Name, ac.HTTP.Stack)
			}
		}
	}
}

// http.tls loads from the environment; a file that cannot be read stops
// the start with an error naming its key.
func TestHTTPTLSFiles(t *testing.T) {
	configtest.HTTPTLS(t, func(getenv func(string) string) (httpconf.TLS, error) {
		cfg, err := loadConfig(configload.Flags{Config: "../../configs/agentserver.yaml"}, getenv)
		return cfg.HTTP.TLS, err
	})
}

func TestRuntimeTuning(t *testing.T) {
	configtest.RuntimeTuning(t, func(getenv func(string) string) (runtimetune.Config, error) {
		cfg, err := loadConfig(configload.Flags{Config: "../../configs/agentserver.yaml"}, getenv)
		return cfg.Runtime, err
	})
}

// Ensure --version prints the version the build sets (-X main.version).
func TestVersionFlag(t *testing.T) {
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"--version"}, func(string) string { return "" }, &stdout, io.Discard); err != nil {
		t.Fatal(err)
	}
	if got, want := stdout.String(), "agentserver "+version+"\n"; got != want {
		t.Errorf("--version printed %q, want %q", got, want)
	}
}
