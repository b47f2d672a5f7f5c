package configload_test

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/cmd/internal/configload"
)

type limits struct {
	MaxCalls int           `mapstructure:"max_calls"`
	Timeout  time.Duration `mapstructure:"timeout"`
	Ratio    float64       `mapstructure:"ratio"`
}

type checkpoint struct {
	Enabled bool   `mapstructure:"enabled"`
	Token   string `mapstructure:"control_auth_token"`
	Limits  limits `mapstructure:"limits"`
}

type testConfig struct {
	Listen     string        `mapstructure:"listen"`
	Verbose    bool          `mapstructure:"verbose"`
	Workers    int           `mapstructure:"workers"`
	Rate       float64       `mapstructure:"rate"`
	Timeout    time.Duration `mapstructure:"timeout"`
	Tags       []string      `mapstructure:"tags"`
	Checkpoint checkpoint    `mapstructure:"checkpoint"`
	Ignored    string        `mapstructure:"-"`
	//lint:ignore U1000 the loader must skip an unexported field, so one is here unused
	unexported int
}

func defaults() testConfig {
	return testConfig{
		Listen:  "127.0.0.1:0",
		Workers: 4,
		Rate:    0.5,
		Timeout: 3 * time.Second,
		Tags:    []string{"a"},
		Checkpoint: checkpoint{
			Limits: limits{MaxCalls: 10, Timeout: time.Minute, Ratio: 0.25},
		},
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "server.yaml")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func load(t *testing.T, path string, vars map[string]string) (testConfig, error) {
	t.Helper()
	cfg := defaults()
	err := configload.Load(path, env(vars), &cfg)
	return cfg, err
}

func TestLoad_Defaults(t *testing.T) {
	got, err := load(t, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := defaults(); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want the defaults %+v", got, want)
	}
}

func TestLoad_FileOverrides(t *testing.T) {
	path := writeFile(t, `
listen: 0.0.0.0:8080
verbose: true
rate: 2.5
timeout: 90s
tags: [x, y]
checkpoint:
  enabled: true
  control_auth_token: secret
  limits:
    timeout: 1h30m
`)
	got, err := load(t, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := defaults()
	want.Listen, want.Verbose, want.Rate, want.Timeout, want.Tags = "0.0.0.0:8080", true, 2.5, 90*time.Second, []string{"x", "y"}
	want.Checkpoint.Enabled, want.Checkpoint.Token = true, "secret"
	want.Checkpoint.Limits.Timeout = 90 * time.Minute
	// Keys the file does not name keep their defaults, nested ones too.
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

func TestLoad_EnvOverridesEveryKey(t *testing.T) {
	vars := map[string]string{
		"GYMFLEET_LISTEN":                        "10.0.0.1:9",
		"GYMFLEET_VERBOSE":                       "true",
		"GYMFLEET_WORKERS":                       "12",
		"GYMFLEET_RATE":                          "1.75",
		"GYMFLEET_TIMEOUT":                       "250ms",
		"GYMFLEET_TAGS":                          "p,q",
		"GYMFLEET_CHECKPOINT_ENABLED":            "1",
		"GYMFLEET_CHECKPOINT_CONTROL_AUTH_TOKEN": "from-env",
		"GYMFLEET_CHECKPOINT_LIMITS_MAX_CALLS":   "99",
		"GYMFLEET_CHECKPOINT_LIMITS_TIMEOUT":     "2m",
		"GYMFLEET_CHECKPOINT_LIMITS_RATIO":       "0.125",
		"GYMFLEET_IGNORED":                       "never read",
	}
	want := testConfig{
		Listen: "10.0.0.1:9", Verbose: true, Workers: 12, Rate: 1.75, Timeout: 250 * time.Millisecond, Tags: []string{"p", "q"},
		Checkpoint: checkpoint{Enabled: true, Token: "from-env", Limits: limits{MaxCalls: 99, Timeout: 2 * time.Minute, Ratio: 0.125}},
	}
	t.Run("over defaults", func(t *testing.T) {
		got, err := load(t, "", vars)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("got %+v\nwant %+v", got, want)
		}
	})
	t.Run("over the file", func(t *testing.T) {
		path := writeFile(t, `
listen: file:1
verbose: false
workers: 2
rate: 9.5
timeout: 9s
tags: [f]
checkpoint:
  enabled: false
  control_auth_token: from-file
  limits: {max_calls: 3, timeout: 9s, ratio: 0.9}
`)
		got, err := load(t, path, vars)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("got %+v\nwant %+v", got, want)
		}
	})
	// Each variable on its own changes exactly its own field, so no key is
	// covered only by accident.
	for name, value := range vars {
		if name == "GYMFLEET_IGNORED" {
			continue
		}
		t.Run(name, func(t *testing.T) {
			got, err := load(t, "", map[string]string{name: value})
			if err != nil {
				t.Fatal(err)
			}
			if reflect.DeepEqual(got, defaults()) {
				t.Fatalf("%s=%s changed nothing", name, value)
			}
		})
	}
}

func TestLoad_BadValues(t *testing.T) {
	tests := []struct {
		name string
		file string
		vars map[string]string
		want string // the key the error names
	}{
		{name: "env int", vars: map[string]string{"GYMFLEET_WORKERS": "many"}, want: "workers"},
		{name: "env duration", vars: map[string]string{"GYMFLEET_CHECKPOINT_LIMITS_TIMEOUT": "soon"}, want: "timeout"},
		{name: "file bool", file: "verbose: [1]\n", want: "verbose"},
		{name: "file struct", file: "checkpoint: 7\n", want: "checkpoint"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := ""
			if tt.file != "" {
				path = writeFile(t, tt.file)
			}
			_, err := load(t, path, tt.vars)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one naming %q", err, tt.want)
			}
		})
	}
}

func TestLoad_UnknownKeys(t *testing.T) {
	tests := []struct {
		name string
		file string
		want []string
	}{
		{"top level", "listen: x\nlisten_addr: y\n", []string{"listen_addr"}},
		{"nested", "checkpoint:\n  enabeld: true\n", []string{"checkpoint.enabeld"}},
		{"deeply nested", "checkpoint:\n  limits:\n    max_call: 1\n", []string{"checkpoint.limits.max_call"}},
		{"several", "bogus: 1\ncheckpoint:\n  typo: 2\n", []string{"bogus", "checkpoint.typo"}},
		{"ignored field", "ignored: x\n", []string{"ignored"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := load(t, writeFile(t, tt.file), nil)
			if err == nil {
				t.Fatal("an unknown key loaded")
			}
			for _, key := range tt.want {
				if !strings.Contains(err.Error(), key) {
					t.Errorf("error %q does not name %q", err, key)
				}
			}
			if !strings.Contains(err.Error(), "unknown keys") {
				t.Errorf("error %q does not say the keys are unknown", err)
			}
		})
	}
}

func TestLoad_FileErrors(t *testing.T) {
	if _, err := load(t, filepath.Join(t.TempDir(), "missing.yaml"), nil); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	if _, err := load(t, writeFile(t, "listen: [unclosed\n"), nil); err == nil || !strings.Contains(err.Error(), "server.yaml") {
		t.Fatalf("malformed YAML: %v, want an error naming the file", err)
	}
}

func TestParseFlags(t *testing.T) {
	var stderr bytes.Buffer
	f, err := configload.ParseFlags("modelserver", []string{"-config", "c.yaml", "--listen", ":8080", "-addr-file=/tmp/a"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if want := (configload.Flags{Config: "c.yaml", Listen: ":8080", AddrFile: "/tmp/a"}); f != want {
		t.Fatalf("flags = %+v, want %+v", f, want)
	}
	if f, err := configload.ParseFlags("x", nil, &stderr); err != nil || f != (configload.Flags{}) {
		t.Fatalf("no flags: %+v, %v", f, err)
	}

	stderr.Reset()
	if _, err := configload.ParseFlags("modelserver", []string{"-h"}, &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v, want flag.ErrHelp", err)
	}
	if !strings.Contains(stderr.String(), "Usage of modelserver") || !strings.Contains(stderr.String(), "-addr-file") {
		t.Fatalf("usage text: %q", stderr.String())
	}
	if _, err := configload.ParseFlags("x", []string{"-nope"}, &stderr); err == nil || errors.Is(err, flag.ErrHelp) {
		t.Fatalf("unknown flag: %v", err)
	}
	if _, err := configload.ParseFlags("x", []string{"-config", "c.yaml", "extra"}, &stderr); err == nil || !strings.Contains(err.Error(), "extra") {
		t.Fatalf("positional argument: %v", err)
	}
}

func TestEnvNames_NamesEveryLeafKeyAndNothingElse(t *testing.T) {
	got := configload.EnvNames(&testConfig{})
	want := []string{
		"GYMFLEET_CHECKPOINT_CONTROL_AUTH_TOKEN", "GYMFLEET_CHECKPOINT_ENABLED",
		"GYMFLEET_CHECKPOINT_LIMITS_MAX_CALLS", "GYMFLEET_CHECKPOINT_LIMITS_RATIO", "GYMFLEET_CHECKPOINT_LIMITS_TIMEOUT",
		"GYMFLEET_LISTEN", "GYMFLEET_RATE", "GYMFLEET_TAGS", "GYMFLEET_TIMEOUT", "GYMFLEET_VERBOSE", "GYMFLEET_WORKERS",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("EnvNames = %v\nwant %v", got, want)
	}
	// Each name is one Load reads.
	var cfg testConfig
	env := map[string]string{"GYMFLEET_CHECKPOINT_LIMITS_MAX_CALLS": "7"}
	if err := configload.Load("", func(k string) string { return env[k] }, &cfg); err != nil || cfg.Checkpoint.Limits.MaxCalls != 7 {
		t.Fatalf("Load with %v: %+v, %v", env, cfg.Checkpoint.Limits, err)
	}
}

type envConfig struct {
	Checkpoint struct {
		Enabled bool `mapstructure:"enabled"`
		Grace   int  `mapstructure:"grace"`
	} `mapstructure:"checkpoint"`
	Listen string `mapstructure:"listen"`
}

// Ensure a value from the environment that does not decode is reported
// under its variable's name, and a file's under the file.
func TestLoad_BadEnvValueNamesTheVariable(t *testing.T) {
	env := map[string]string{"GYMFLEET_CHECKPOINT_ENABLED": "yes please"}
	var c envConfig
	err := configload.Load("", func(k string) string { return env[k] }, &c)
	if err == nil || !strings.Contains(err.Error(), `GYMFLEET_CHECKPOINT_ENABLED="yes please"`) || strings.Contains(err.Error(), "config") {
		t.Errorf("err = %v, want the variable named and no file", err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(path, []byte("checkpoint:\n  grace: soon\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = configload.Load(path, func(string) string { return "" }, &c)
	if err == nil || !strings.Contains(err.Error(), "config "+path) || strings.Contains(err.Error(), "GYMFLEET_") {
		t.Errorf("a bad file value: err = %v, want the file named", err)
	}
}

func TestMisspelled(t *testing.T) {
	got := configload.Misspelled([]string{
		"GYMFLEET_CHECKPOINT_ENABLD=true",  // a typo
		"GYMFLEET_CHECKPOINT_ENABLED=true", // a setting
		"GYMFLEET_E2E_PORTS=17000-17999",   // far from every setting
		"PATH=/bin", "GYMFLEET_LISTEN=:1", "GYMFLEET_LISTN=:1",
	}, &envConfig{})
	want := []string{
		"GYMFLEET_CHECKPOINT_ENABLD is not a setting (did you mean GYMFLEET_CHECKPOINT_ENABLED?)",
		"GYMFLEET_LISTN is not a setting (did you mean GYMFLEET_LISTEN?)",
	}
	if !slices.Equal(got, want) {
		t.Errorf("Misspelled = %q, want %q", got, want)
	}
}
