package fleet_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
)

const minimal = `
processes:
  - name: env
    binary: envserver
    config: configs/envserver.yaml
    env: [{name: GYMFLEET_LOG_LEVEL, value: debug}]
    endpoints: [{name: env, kind: environment, url: "http://127.0.0.1:18040"}]
`

func TestDecode_DefaultsAndFields(t *testing.T) {
	cfg, err := fleet.Decode(strings.NewReader(minimal))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RunDir != ".gymfleet" || cfg.BinDir != "bin" {
		t.Errorf("defaults: run_dir %q bin_dir %q", cfg.RunDir, cfg.BinDir)
	}
	p, ok := cfg.Process("env")
	if !ok || p.Binary != "envserver" || p.Config != "configs/envserver.yaml" || len(p.Env) != 1 || p.Env[0].Value != "debug" {
		t.Errorf("process = %+v", p)
	}
	if e, ok := cfg.Endpoint("env"); !ok || e.Kind != fleet.KindEnvironment {
		t.Errorf("endpoint = %+v", e)
	}
}

func TestDecode_UnknownKeysAreNamed(t *testing.T) {
	for _, tc := range []struct{ name, yaml, key string }{
		{"top level", "run_dirs: x\n" + minimal, "run_dirs"},
		{"process", strings.Replace(minimal, "binary:", "binry:", 1), "binry"},
		{"endpoint", strings.Replace(minimal, "kind:", "knd:", 1), "knd"},
		{"checkpoint", "checkpoint: {enable: true}\n" + minimal, "enable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := fleet.Decode(strings.NewReader(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), "field "+tc.key+" not found") {
				t.Fatalf("Decode = %v, want an error naming %q", err, tc.key)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"empty file", "", "empty"},
		{"no processes", "run_dir: x\n", "processes is empty"},
		{"bad kind", strings.Replace(minimal, "kind: environment", "kind: env", 1), `kind "env"`},
		{"bad url", strings.Replace(minimal, `"http://127.0.0.1:18040"`, "127.0.0.1:18040", 1), "not an absolute http(s) URL"},
		{"no binary", strings.Replace(minimal, "binary: envserver", "binary: ''", 1), "binary is empty"},
		{"binary path", strings.Replace(minimal, "binary: envserver", "binary: bin/envserver", 1), "must be a name in bin_dir"},
		{"bad env name", strings.Replace(minimal, "GYMFLEET_LOG_LEVEL", "1X", 1), "not a valid variable name"},
		{"duplicate process", minimal + strings.Replace(strings.TrimPrefix(minimal, "\nprocesses:\n"), "name: env\n", "name: env\n", 1), "used twice"},
		{"checkpoint without token", "checkpoint: {enabled: true}\n" + minimal, "control_auth_token"},
		{"unknown http stack", "http: {stack: quic}\n" + minimal, `http.stack "quic"`},
		{"tls cert without key", "http: {tls: {cert_file: c.pem}}\n" + minimal, "http.tls"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := fleet.Decode(strings.NewReader(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Decode = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestShippedFleetFiles(t *testing.T) {
	local, err := fleet.Load("../../../configs/local.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(local.Names(), ","); got != "fakeinference,policy_model,resources,agents,env" {
		t.Errorf("local process order = %s", got)
	}
	envs := local.Endpoints(fleet.KindEnvironment)
	if len(envs) != 1 || envs[0].URL != "http://127.0.0.1:18040" {
		t.Errorf("environment endpoints = %+v", envs)
	}
	if n := len(local.Endpoints("")); n != 7 {
		t.Errorf("local fleet has %d endpoints, want 7", n)
	}
	for _, p := range local.Processes {
		if !p.Local() {
			t.Errorf("local process %s is not local", p.Name)
		}
		if _, err := os.Stat(filepath.Join("../../..", p.Config)); err != nil {
			t.Errorf("process %s config: %v", p.Name, err)
		}
	}
	if got := local.LogPath("env"); !filepath.IsAbs(got) || !strings.HasSuffix(got, filepath.Join(".gymfleet", "logs", "env.log")) {
		t.Errorf("LogPath = %s", got)
	}

	multi, err := fleet.Load("../../../deploy/fleet-multihost.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(multi.Endpoints(fleet.KindEnvironment)) != 2 || !multi.Checkpoint.Enabled {
		t.Errorf("multihost fleet = %+v", multi)
	}
	for _, p := range multi.Processes {
		if p.Local() {
			t.Errorf("multihost process %s has no host", p.Name)
		}
		if got := multi.BinaryPath(p); got != "/usr/local/bin/"+p.Binary {
			t.Errorf("BinaryPath = %s", got)
		}
	}
}
