// Package sdk runs the official OpenAI Python SDK against the model server.
//
// TestOpenAISDK starts fakeinference and two model servers as processes
// (the second one is made a superseded "zombie" by one scenario), then
// runs the pytest suite beside this file with the SDK pinned in
// tests/interop/envs/openai (scripts/pyenv.sh), and reports each pytest
// scenario as a subtest. A scenario pytest skipped fails here: no scenario
// of this suite may pass by not running.
//
// `make test-interop-sdk` runs it; GYMFLEET_SDK_PYTEST adds pytest
// arguments (e.g. "-k chat_stream" for one scenario).
package sdk

import (
	"context"
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
)

// binDir holds the binaries TestMain built (or GYMFLEET_BIN named).
var binDir string

// ports hands out the servers' ports: GYMFLEET_E2E_PORTS ("lo-hi"), else
// defaultPorts, a block no other suite of `make test` uses.
var ports *fleet.PortBlock

const defaultPorts = "13500-13999"

// repoRoot is the checkout this file is in.
var repoRoot = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}()

var binaries = []string{"fakeinference", "modelserver"}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	block := os.Getenv("GYMFLEET_E2E_PORTS")
	if block == "" {
		block = defaultPorts
	}
	var err error
	if ports, err = fleet.ParsePortBlock(block); err != nil {
		fmt.Fprintln(os.Stderr, "sdk: GYMFLEET_E2E_PORTS:", err)
		return 1
	}
	binDir = os.Getenv("GYMFLEET_BIN")
	if binDir == "" {
		dir, err := os.MkdirTemp("", "gymfleet-sdk-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		args := []string{"build", "-o", dir + "/"}
		for _, b := range binaries {
			args = append(args, "./cmd/"+b)
		}
		cmd := exec.Command("go", args...)
		cmd.Dir = repoRoot
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building the servers:", err)
			return 1
		}
		binDir = dir
	}
	for _, b := range binaries {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			fmt.Fprintf(os.Stderr, "sdk: binary %s missing in %s: %v\n", b, binDir, err)
			return 1
		}
	}
	return m.Run()
}

const (
	token       = "sdk-interop-token"
	servedModel = "fake-model"
)

// servers is the running fakeinference and model servers.
type servers struct {
	launcher *fleet.Launcher
	cfg      *fleet.Config
	// env is what the pytest suite reads to reach them.
	env []string
}

// startServers writes the configurations and starts fakeinference, the
// model server and the zombie-to-be, each ready before the next.
func startServers(t *testing.T) *servers {
	t.Helper()
	dir := t.TempDir()
	p, err := ports.Take(3)
	if err != nil {
		t.Fatal(err)
	}
	addr := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", p[i]) }
	url := func(i int) string { return "http://" + addr(i) }
	write := func(name string, v map[string]any) string {
		b, err := yaml.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	fiConf := write("fakeinference.yaml", map[string]any{
		"listen": addr(0), "model": servedModel, "log_level": "debug",
		"tokens_per_second": 2000, "min_call_seconds": 0.002, "control_auth_token": token,
	})
	model := func(name string, i int, epochFile string) string {
		return write(name+".yaml", map[string]any{
			"listen": addr(i), "name": name, "log_level": "debug",
			"upstream": map[string]any{"base_url": url(0) + "/v1", "model": servedModel},
			"capture":  map[string]any{"dir": filepath.Join(dir, name, "capture")},
			"checkpoint": map[string]any{"enabled": true, "control_auth_token": token,
				"root": filepath.Join(dir, name, "checkpoints"), "epoch_file": epochFile},
			"generation_cuts": map[string]any{"enabled": true, "control_auth_token": token},
		})
	}
	zombieEpoch := filepath.Join(dir, "zombie-EPOCH")
	cfg := &fleet.Config{
		RunDir: filepath.Join(dir, "run"), BinDir: binDir, BaseDir: dir,
		Processes: []fleet.Process{
			{Name: "fakeinference", Binary: "fakeinference", Config: fiConf,
				Endpoints: []fleet.Endpoint{{Name: "fakeinference", Kind: fleet.KindFakeInference, URL: url(0)}}},
			{Name: "policy_model", Binary: "modelserver", Config: model("policy_model", 1, filepath.Join(dir, "EPOCH")),
				Endpoints: []fleet.Endpoint{{Name: "policy_model", Kind: fleet.KindModel, URL: url(1)}}},
			{Name: "zombie_model", Binary: "modelserver", Config: model("zombie_model", 2, zombieEpoch),
				Endpoints: []fleet.Endpoint{{Name: "zombie_model", Kind: fleet.KindModel, URL: url(2)}}},
		},
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	l := fleet.NewLauncher(cfg, fleet.Options{StopGrace: 5 * time.Second})
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range cfg.Names() {
				t.Logf("--- log of %s ---\n%s", name, l.Logs(name))
			}
		}
		_ = l.KillAll()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := l.StartAll(ctx); err != nil {
		t.Fatal(err)
	}
	return &servers{launcher: l, cfg: cfg, env: []string{
		"GYMFLEET_SDK_FAKE_URL=" + url(0),
		"GYMFLEET_SDK_MODEL_URL=" + url(1),
		"GYMFLEET_SDK_ZOMBIE_URL=" + url(2),
		"GYMFLEET_SDK_ZOMBIE_EPOCH_FILE=" + zombieEpoch,
		"GYMFLEET_SDK_TOKEN=" + token,
		"GYMFLEET_SDK_SERVED_MODEL=" + servedModel,
	}}
}

// pythonEnv is the pinned SDK environment: GYMFLEET_PYENV_OPENAI (the
// make target sets it), else made or found by scripts/pyenv.sh, which
// fails plainly when PyPI does not answer.
func pythonEnv(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("GYMFLEET_PYENV_OPENAI"); dir != "" {
		return dir
	}
	cmd := exec.Command(filepath.Join(repoRoot, "scripts", "pyenv.sh"), "openai")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("setting up the openai SDK environment (scripts/pyenv.sh openai): %v", err)
	}
	return strings.TrimSpace(string(out))
}

func TestOpenAISDK(t *testing.T) {
	start := time.Now()
	py := filepath.Join(pythonEnv(t), "bin", "python")
	srv := startServers(t)
	t.Logf("servers ready after %v", time.Since(start).Round(time.Millisecond))
	report := filepath.Join(t.TempDir(), "junit.xml")
	args := []string{"-m", "pytest", "-v", "--durations=5", "-p", "no:cacheprovider", "--junitxml", report}
	args = append(args, strings.Fields(os.Getenv("GYMFLEET_SDK_PYTEST"))...)
	here := filepath.Join(repoRoot, "tests", "interop", "sdk")
	args = append(args, here)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, args...)
	cmd.Dir = here
	cmd.Env = append(append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1"), srv.env...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	runErr := cmd.Run()
	t.Logf("pytest done after %v", time.Since(start).Round(time.Millisecond))

	cases, err := readJUnit(report)
	if err != nil {
		t.Fatalf("pytest (%v) left no report: %v", runErr, err)
	}
	if len(cases) == 0 {
		t.Fatalf("pytest ran no scenario (%v)", runErr)
	}
	failed := 0
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			switch {
			case c.Failure != nil:
				t.Errorf("failed: %s\n%s", c.Failure.Message, c.Failure.Text)
			case c.Error != nil:
				t.Errorf("error: %s\n%s", c.Error.Message, c.Error.Text)
			case c.Skipped != nil:
				t.Errorf("skipped (%s): every scenario of this suite must run", c.Skipped.Message)
			}
			if t.Failed() {
				failed++
			}
		})
	}
	if runErr != nil && failed == 0 {
		t.Fatalf("pytest failed outside its scenarios: %v", runErr)
	}
}

// junitCase is one <testcase> of pytest's --junitxml report.
type junitCase struct {
	Name    string        `xml:"name,attr"`
	Failure *junitMessage `xml:"failure"`
	Error   *junitMessage `xml:"error"`
	Skipped *junitMessage `xml:"skipped"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

func readJUnit(path string) ([]junitCase, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc struct {
		Suites []struct {
			Cases []junitCase `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	var out []junitCase
	for _, s := range doc.Suites {
		out = append(out, s.Cases...)
	}
	return out, nil
}
