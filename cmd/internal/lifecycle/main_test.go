package lifecycle_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/cmd/internal/configload"
	"github.com/gymfleet/gymfleet/cmd/internal/lifecycle"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
)

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err      error
		code     int
		printed  string
		describe string
	}{
		{nil, 0, "", "success"},
		{flag.ErrHelp, 2, "", "-h"},
		{fmt.Errorf("parse: %w", flag.ErrHelp), 2, "", "-h wrapped"},
		{errors.New("boom"), 1, "srv: boom\n", "failure"},
	} {
		var stderr bytes.Buffer
		if got := lifecycle.ExitCode("srv", tc.err, &stderr); got != tc.code || stderr.String() != tc.printed {
			t.Errorf("%s: ExitCode = %d printing %q, want %d printing %q", tc.describe, got, stderr.String(), tc.code, tc.printed)
		}
	}
}

// testConfig is a configuration as the servers' are: mapstructure tags,
// defaults from a function, Validate on the value.
type testConfig struct {
	Listen   string             `mapstructure:"listen"`
	LogLevel string             `mapstructure:"log_level"`
	Port     int                `mapstructure:"port"`
	Runtime  runtimetune.Config `mapstructure:"runtime"`
}

func (c testConfig) Validate() error {
	if c.Port < 0 {
		return fmt.Errorf("port must be >= 0, got %d", c.Port)
	}
	return c.Runtime.Validate()
}

func writeFile(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func setListen(cfg *testConfig, addr string) error {
	if addr == "refuse" {
		return errors.New("listen refused")
	}
	cfg.Listen = addr
	return nil
}

func noEnv(string) string { return "" }

func TestLoadConfig_FileThenListenThenValidate(t *testing.T) {
	defaults := testConfig{Listen: "127.0.0.1:1", LogLevel: "info"}
	path := writeFile(t, "port: 7\nlisten: 127.0.0.1:2\n")

	cfg, err := lifecycle.LoadConfig(configload.Flags{Config: path}, noEnv, defaults, setListen)
	if err != nil || cfg != (testConfig{Listen: "127.0.0.1:2", LogLevel: "info", Port: 7}) {
		t.Fatalf("LoadConfig = %+v, %v", cfg, err)
	}
	cfg, err = lifecycle.LoadConfig(configload.Flags{Config: path, Listen: "127.0.0.1:3"}, noEnv, defaults, setListen)
	if err != nil || cfg.Listen != "127.0.0.1:3" {
		t.Fatalf("with --listen: LoadConfig = %+v, %v; want listen 127.0.0.1:3", cfg, err)
	}
	if _, err := lifecycle.LoadConfig(configload.Flags{Config: path, Listen: "refuse"}, noEnv, defaults, setListen); err == nil || !strings.Contains(err.Error(), "listen refused") {
		t.Errorf("a refused --listen: err = %v", err)
	}
	if _, err := lifecycle.LoadConfig(configload.Flags{Config: writeFile(t, "port: -1\n")}, noEnv, defaults, setListen); err == nil || !strings.Contains(err.Error(), "port must be") {
		t.Errorf("an invalid configuration: err = %v, want Validate's", err)
	}
	if _, err := lifecycle.LoadConfig(configload.Flags{Config: writeFile(t, "nope: 1\n")}, noEnv, defaults, setListen); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("an unknown key: err = %v, want it named", err)
	}
}

func testCommand(servers []lifecycle.Named, built *slog.Level) lifecycle.Command[testConfig] {
	return lifecycle.Command[testConfig]{
		Name: "testserver",
		Load: func(flags configload.Flags, getenv func(string) string) (testConfig, error) {
			return lifecycle.LoadConfig(flags, getenv, testConfig{LogLevel: "info"}, setListen)
		},
		LogLevel: func(cfg testConfig) string { return cfg.LogLevel },
		Tuning:   func(cfg testConfig) runtimetune.Config { return cfg.Runtime },
		Servers: func(cfg testConfig, rt lifecycle.Runtime) ([]lifecycle.Named, error) {
			*built = rt.Level
			return servers, nil
		},
		Announce: func(cfg testConfig, name, addr string) string {
			return fmt.Sprintf("%s at %s (port %d)", name, addr, cfg.Port)
		},
	}
}

func TestCommand_RunServesAndAnnounces(t *testing.T) {
	srv := newServer("one")
	var level slog.Level
	cmd := testCommand([]lifecycle.Named{{Name: "one", Server: srv}}, &level)
	addrFile := filepath.Join(t.TempDir(), "addrs")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr bytes.Buffer
	ran := make(chan error, 1)
	args := []string{"--config", writeFile(t, "port: 9\nlog_level: warn\n"), "--listen", "127.0.0.1:0", "--addr-file", addrFile}
	go func() { ran <- cmd.Run(ctx, args, noEnv, &stdout, &stderr) }()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(5 * time.Second); ; <-tick.C {
		if _, err := os.Stat(addrFile); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no address file")
		}
	}
	cancel()
	if err := <-ran; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if level != slog.LevelWarn {
		t.Errorf("servers built at level %v, want warn", level)
	}
	if want := fmt.Sprintf("one at %s (port 9)\n", srv.Addr()); stdout.String() != want {
		t.Errorf("stdout = %q, want %q", stdout.String(), want)
	}
}

func TestCommand_RunRefusesBeforeBuilding(t *testing.T) {
	var level slog.Level = -100
	cmd := testCommand(nil, &level)
	if err := cmd.Run(context.Background(), []string{"-h"}, noEnv, io.Discard, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: Run = %v, want flag.ErrHelp", err)
	}
	if err := cmd.Run(context.Background(), []string{"--config", writeFile(t, "log_level: loud\n")}, noEnv, io.Discard, io.Discard); err == nil {
		t.Error("an unknown log level was accepted")
	}
	if err := cmd.Run(context.Background(), []string{"--config", writeFile(t, "port: -1\n")}, noEnv, io.Discard, io.Discard); err == nil {
		t.Error("an invalid configuration was accepted")
	}
	otel := func(k string) string {
		return map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}[k]
	}
	if err := cmd.Run(context.Background(), nil, otel, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "OTEL_TRACES_EXPORTER") {
		t.Errorf("an unknown trace exporter: Run = %v, want it named", err)
	}
	if level != -100 {
		t.Error("servers were built for a refused start")
	}
}

// Ensure the command hands its servers a Tuner as the runtime.tuning key
// says, applies the servers' GC goal only when tuning is on (and GOGC is
// not set), gives the goal back when the run ends, and refuses a mode
// other than on and off. (Not parallel: GC settings belong to the process.)
func TestCommand_RunHandsDownTheRuntimeTuning(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	stop := errors.New("stop after building")
	for _, c := range []struct {
		file   string
		env    map[string]string
		wantOn bool
		gogc   int
	}{
		{"runtime:\n  tuning: on\n", nil, true, runtimetune.ServerGCPercent},
		{"runtime:\n  tuning: off\n", nil, false, 100},
		{"runtime:\n  tuning: on\n", map[string]string{"GOGC": "100"}, true, 100},
		{"log_level: info\n", map[string]string{"GYMFLEET_RUNTIME_TUNING": "off"}, false, 100},
	} {
		var on bool
		gogc := -1
		cmd := lifecycle.Command[testConfig]{
			Name: "testserver",
			Load: func(flags configload.Flags, getenv func(string) string) (testConfig, error) {
				return lifecycle.LoadConfig(flags, getenv, testConfig{LogLevel: "info"}, setListen)
			},
			LogLevel: func(cfg testConfig) string { return cfg.LogLevel },
			Tuning:   func(cfg testConfig) runtimetune.Config { return cfg.Runtime },
			Servers: func(_ testConfig, rt lifecycle.Runtime) ([]lifecycle.Named, error) {
				on = rt.Tuner.On()
				gogc = debug.SetGCPercent(-1)
				debug.SetGCPercent(gogc)
				return nil, stop
			},
		}
		getenv := func(k string) string { return c.env[k] }
		if err := cmd.Run(context.Background(), []string{"--config", writeFile(t, c.file)}, getenv, io.Discard, io.Discard); !errors.Is(err, stop) {
			t.Fatalf("%q %v: Run = %v, want the servers' error", c.file, c.env, err)
		}
		if on != c.wantOn || gogc != c.gogc {
			t.Errorf("%q %v: servers built with tuning on %v at GOGC %d, want %v and %d", c.file, c.env, on, gogc, c.wantOn, c.gogc)
		}
		if p := debug.SetGCPercent(100); p != 100 {
			t.Errorf("%q %v: GOGC %d after the run, want 100 again", c.file, c.env, p)
		}
	}
	var level slog.Level = -100
	err := testCommand(nil, &level).Run(context.Background(), []string{"--config", writeFile(t, "runtime:\n  tuning: sometimes\n")}, noEnv, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "runtime.tuning") {
		t.Errorf("tuning: sometimes: Run = %v, want an error naming runtime.tuning", err)
	}
	err = testCommand(nil, &level).Run(context.Background(), []string{"--config", writeFile(t, "runtime:\n  tunning: on\n")}, noEnv, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "unknown keys: runtime.tunning") {
		t.Errorf("runtime.tunning: Run = %v, want it refused as an unknown key", err)
	}
	if level != -100 {
		t.Error("servers were built for a refused runtime section")
	}
}

func TestCommand_Version(t *testing.T) {
	var level slog.Level = -100
	cmd := testCommand(nil, &level)
	cmd.Version = "v1.2.3-4-gabc"
	var stdout bytes.Buffer
	if err := cmd.Run(context.Background(), []string{"--version"}, noEnv, &stdout, io.Discard); err != nil {
		t.Fatalf("--version: %v", err)
	}
	if got := stdout.String(); got != "testserver v1.2.3-4-gabc\n" {
		t.Errorf("--version printed %q", got)
	}
	if level != -100 {
		t.Error("--version built servers")
	}
}
