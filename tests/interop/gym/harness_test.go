package gym

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/gymfleet/gymfleet/tests/interop/interoptest"
)

// Names of the fleets' servers.
const (
	fakeModel = "fake-model"
	// gymAgentType is the agent_ref.type of Gym's dataset rows.
	gymAgentType = "responses_api_agents"
)

// takePorts returns n ports of the suite's block.
func takePorts(t *testing.T, n int) []int {
	t.Helper()
	p, err := ports.Take(n)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func addr(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }
func url(port int) string  { return "http://" + addr(port) }

// writeYAML writes v as YAML into dir/name and returns the path.
func writeYAML(t *testing.T, dir, name string, v any) string {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// agentSpec is one of our agents; resources is its resources server: a URL
// (Gym's) or ours("weather"), resolved when the fleet starts.
type agentSpec struct {
	name, resources string
	maxSteps        int
}

// routeSpec is a route of our environment server: agent is a URL (Gym's)
// or ourAgent(name), resources a URL or ours(type).
type routeSpec struct {
	name, agent, resources, protocol string
	gym                              bool
}

// ours and ourAgent name a server of the fleet being started.
func ours(typ string) string      { return "ours:" + typ }
func ourAgent(name string) string { return "agent:" + name }

// resolve turns ours()/ourAgent() into the fleet's URLs.
func (f *ourFleet) resolve(t *testing.T, ref string) string {
	t.Helper()
	if typ, ok := strings.CutPrefix(ref, "ours:"); ok {
		if u := f.resources[typ]; u != "" {
			return u
		}
		t.Fatalf("the fleet has no %s resources server", typ)
	}
	if name, ok := strings.CutPrefix(ref, "agent:"); ok {
		if u := f.agents[name]; u != "" {
			return u
		}
		t.Fatalf("the fleet has no agent %s", name)
	}
	return ref
}

// fleetSpec is one of our fleets: fakeinference, the policy model server,
// optionally our weather and counter resources servers, agents and an
// environment server, each a process of a fleet file that `gymctl up`
// runs, and Gym's head-server routes when head is set.
type fleetSpec struct {
	ourResources bool
	agents       []agentSpec
	routes       []routeSpec
	head         bool
	// gymConfigPaths are the fleet file's gym.config_paths.
	gymConfigPaths []string
}

// ourFleet is a running fleet of ours.
type ourFleet struct {
	dir       string
	fleetFile string
	fake      string
	model     string
	resources map[string]string // by type
	agents    map[string]string // by name
	env       string
	head      int // the head server's port; 0 without
	up        *process
}

// startFleet writes the fleet's configs and runs `gymctl up` on them until
// the test ends.
func startFleet(t *testing.T, spec fleetSpec) *ourFleet {
	t.Helper()
	dir := t.TempDir()
	f := &ourFleet{dir: dir, resources: map[string]string{}, agents: map[string]string{}}
	p := takePorts(t, 6+len(spec.agents))
	f.fake, f.model, f.env = url(p[0]), url(p[1]), url(p[4])
	if spec.head {
		f.head = p[5]
	}
	for i, a := range spec.agents {
		f.agents[a.name] = url(p[6+i])
	}
	if spec.ourResources {
		f.resources["weather"], f.resources["counter"] = url(p[2]), url(p[3])
	}
	procs := []map[string]any{
		{"name": "fakeinference", "binary": "fakeinference", "config": writeYAML(t, dir, "fakeinference.yaml", map[string]any{
			"listen": addr(p[0]), "model": fakeModel, "tokens_per_second": 0, "min_call_seconds": 0,
		}), "endpoints": []map[string]string{{"name": "fakeinference", "kind": "fakeinference", "url": f.fake}}},
		{"name": "policy_model", "binary": "modelserver", "config": writeYAML(t, dir, "modelserver.yaml", map[string]any{
			"listen": addr(p[1]), "name": "policy_model", "return_token_ids": true,
			"upstream": map[string]any{"base_url": f.fake + "/v1", "model": fakeModel},
			"capture":  map[string]any{"dir": filepath.Join(dir, "capture")},
		}), "endpoints": []map[string]string{{"name": "policy_model", "kind": "model", "url": f.model}}},
	}
	if spec.ourResources {
		procs = append(procs, map[string]any{"name": "resources", "binary": "resourceserver", "config": writeYAML(t, dir, "resourceserver.yaml", map[string]any{
			"servers": []map[string]any{{"name": "weather", "type": "weather", "listen": addr(p[2])}, {"name": "counter", "type": "counter", "listen": addr(p[3])}},
		}), "endpoints": []map[string]string{{"name": "weather", "kind": "resources", "url": f.resources["weather"]}, {"name": "counter", "kind": "resources", "url": f.resources["counter"]}}})
	}
	if len(spec.agents) > 0 {
		var agents []map[string]any
		var eps []map[string]string
		for i, a := range spec.agents {
			agents = append(agents, map[string]any{"name": a.name, "listen": addr(p[6+i]), "model_server_url": f.model, "resources_server_url": f.resolve(t, a.resources), "max_steps": a.maxSteps})
			eps = append(eps, map[string]string{"name": a.name, "kind": "agent", "url": f.agents[a.name]})
		}
		procs = append(procs, map[string]any{"name": "agents", "binary": "agentserver", "config": writeYAML(t, dir, "agentserver.yaml", map[string]any{"agents": agents}), "endpoints": eps})
	}
	if len(spec.routes) > 0 {
		var routes []map[string]any
		for _, r := range spec.routes {
			route := map[string]any{"name": r.name, "url": f.resolve(t, r.agent), "resources_url": f.resolve(t, r.resources), "gym": r.gym}
			if r.protocol != "" {
				route["protocol"] = r.protocol
			}
			routes = append(routes, route)
		}
		procs = append(procs, map[string]any{"name": "env", "binary": "envserver", "config": writeYAML(t, dir, "envserver.yaml", map[string]any{
			"listen": addr(p[4]), "name": "env", "agents": routes, "default_agent": spec.routes[0].name,
		}), "endpoints": []map[string]string{{"name": "env", "kind": "environment", "url": f.env}}})
	}
	file := map[string]any{"run_dir": filepath.Join(dir, "run"), "bin_dir": binDir, "processes": procs}
	if spec.head {
		file["gym"] = map[string]any{"head_server": addr(f.head), "config_paths": spec.gymConfigPaths}
	}
	f.fleetFile = writeYAML(t, dir, "fleet.yaml", file)
	f.up = startProcess(t, "gymctl-up", dir, nil, filepath.Join(binDir, "gymctl"), "up", "--config", f.fleetFile)
	if err := f.up.WaitFor("fleet is up", 90*time.Second); err != nil {
		t.Fatalf("gymctl up: %v\n%s", err, f.up.Tail())
	}
	return f
}

// headDocument is what the fleet's head serves at /global_config_dict_yaml:
// the YAML text.
func (f *ourFleet) headDocument(t *testing.T) []byte {
	t.Helper()
	body := httpGet(t, url(f.head)+"/global_config_dict_yaml")
	var text string
	if err := json.Unmarshal(body, &text); err != nil {
		t.Fatalf("/global_config_dict_yaml: %s: %v", body, err)
	}
	return []byte(text)
}

func httpGet(t *testing.T, u string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", u, resp.StatusCode, b)
	}
	return b
}

// process is a child process of the test (interoptest.Process).
type process = interoptest.Process

// startProcess runs argv in dir with env added until the test ends
// (interoptest.StartProcess).
func startProcess(t *testing.T, name, dir string, env []string, argv ...string) *process {
	t.Helper()
	return interoptest.StartProcess(t, name, dir, env, argv...)
}

// startGymServer starts instance name of the config doc, whose
// implementation lives in sitePackages/<dir> (e.g.
// resources_servers/example_single_tool_call), as Gym's RunHelper starts it
// (interoptest.GymEnv.StartServer); waitGymServers waits until it answers.
func startGymServer(t *testing.T, name, dir string, port int, doc []byte) *interoptest.GymServer {
	t.Helper()
	return gymEnv.StartServer(t, name, dir, port, doc)
}

var waitGymServers = interoptest.WaitGymServers

// runPy runs a helper of py/ on the gym environment's interpreter in dir
// and returns its standard output; a failure fails the test with its
// standard error's end.
func runPy(t *testing.T, dir string, script string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	argv := append([]string{filepath.Join(repoRoot, "tests", "interop", "gym", "py", script)}, args...)
	return runCmd(t, ctx, dir, python, argv...)
}

// runGym runs Gym's command line (the gym environment's `gym`).
func runGym(t *testing.T, dir string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	return runCmd(t, ctx, dir, filepath.Join(pyenv, "bin", "gym"), args...)
}

func runCmd(t *testing.T, ctx context.Context, dir, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PYTHONUNBUFFERED=1")
	// SIGINT on the test binary's death: nemo_rl_path.py then shuts
	// RunHelper's servers down. Output goes to files, not pipes to the
	// test, so that shutdown's prints do not fail on a closed pipe.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGINT}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	logDir := t.TempDir()
	stdout, err := os.Create(filepath.Join(logDir, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	stderr, err := os.Create(filepath.Join(logDir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	cmd.Stdout, cmd.Stderr = stdout, stderr
	runErr := cmd.Run()
	out, _ := os.ReadFile(stdout.Name())
	if runErr != nil {
		e, _ := os.ReadFile(stderr.Name())
		t.Fatalf("%s %s: %v\n--- stderr (end)\n%s\n--- stdout (end)\n%s", filepath.Base(name), strings.Join(args, " "), runErr, lastBytes(string(e), 8000), lastBytes(string(out), 4000))
	}
	return out
}

func lastBytes(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// readJSONL reads a JSONL file's objects.
func readJSONL(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, line := range bytes.Split(b, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, m)
	}
	return out
}

// writeJSONL writes rows as a JSONL file.
func writeJSONL(t *testing.T, path string, rows []map[string]any) {
	t.Helper()
	var b bytes.Buffer
	for _, r := range rows {
		line, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// gymDataset reads the example dataset a Gym resources server ships
// (resources_servers/<name>/data/example.jsonl of the installed package).
func gymDataset(t *testing.T, server string) []map[string]any {
	t.Helper()
	return readJSONL(t, filepath.Join(sitePackages, "resources_servers", server, "data", "example.jsonl"))
}

// withAgent returns copies of rows naming agent in agent_ref.
func withAgent(rows []map[string]any, agent string) []map[string]any {
	out := make([]map[string]any, len(rows))
	for i, r := range rows {
		c := deepCopy(r)
		c["agent_ref"] = map[string]any{"type": gymAgentType, "name": agent}
		out[i] = c
	}
	return out
}

func deepCopy(m map[string]any) map[string]any {
	b, _ := json.Marshal(m)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return out
}

// noCleanupFailures fails the test if our environment or agents logged a
// failed cleanup (a close a peer refused): every session a Gym server
// holds for us must close as Gym's own environment closes it.
func (f *ourFleet) noCleanupFailures(t *testing.T) {
	t.Helper()
	for _, name := range []string{"env", "agents"} {
		b, err := os.ReadFile(filepath.Join(f.dir, "run", "logs", name+".log"))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "cleanup step failed") || strings.Contains(line, "closing the resources session failed") {
				t.Errorf("%s: %s", name, lastBytes(line, 600))
			}
		}
	}
}
