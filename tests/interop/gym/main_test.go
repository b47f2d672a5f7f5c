// Package gym is the interop suite under NeMo Gym's own code: the nemo-gym
// package from PyPI (tests/interop/envs/gym, on this machine's Python 3.11)
// driving our fleet and mixed with it. It starts our binaries and Gym's
// server processes, runs Gym's rollout collection (NeMo RL's call of it and
// `gym eval run --no-serve`) against them, and checks what the callers read.
// Python helpers in py/ do what only Gym's Python API can.
//
// Environment:
//
//	GYMFLEET_BIN               the fleet's binaries (built when unset)
//	GYMFLEET_GYM_PYENV         the gym environment (scripts/pyenv.sh gym when unset)
//	GYMFLEET_INTEROP_PORTS     the port block, lo-hi (14000-14999); Ray takes its top 100,
//	                           Gym's RunHelper the 100 below
//	GYMFLEET_INTEROP_CLEANUP   set: only remove what a killed run left, and exit
//
// Every Gym server that calls ray.init joins one Ray head the suite starts
// for itself, in its own process group and temp dir, and kills when done,
// passed or failed; a run that was killed leaves a record the next run
// reads to kill what it left.
package gym

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/tests/interop/interoptest"
)

// The suite's shared state, set by TestMain.
var (
	// binDir holds our binaries.
	binDir string
	// pyenv is the gym environment; python its interpreter; sitePackages
	// where nemo_gym and Gym's server directories are.
	pyenv, python, sitePackages string
	gymEnv                      *interoptest.GymEnv
	// ports hands out the servers' ports: the block less its top 200, of
	// which Gym's RunHelper may pick from the lower 100 (runHelperPorts)
	// and Ray takes the upper.
	ports *fleet.PortBlock
	// runHelperPorts is the port_range NeMo RL's call path gives Gym.
	runHelperPorts [2]int
	// rayAddr is the Ray head's GCS address.
	rayAddr string
	// repoRoot is the checkout.
	repoRoot string
)

const defaultPorts = "14000-14999"

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	_, file, _, _ := runtime.Caller(0)
	repoRoot = filepath.Join(filepath.Dir(file), "..", "..", "..")
	block := os.Getenv("GYMFLEET_INTEROP_PORTS")
	if block == "" {
		block = defaultPorts
	}
	var lo, hi int
	if _, err := fmt.Sscanf(block, "%d-%d", &lo, &hi); err != nil || hi-lo < 400 {
		fmt.Fprintf(os.Stderr, "interop: GYMFLEET_INTEROP_PORTS %q: want lo-hi with at least 400 ports\n", block)
		return 1
	}
	var err error
	ray := &rayHead{dir: filepath.Join(os.TempDir(), "gfray-"+strconv.Itoa(lo)), portLo: hi - 99}
	if os.Getenv("GYMFLEET_INTEROP_CLEANUP") != "" {
		// What a run killed mid-way (a -timeout panic) left of its Ray
		// head; the make target asks for it after every run.
		ray.adopt()
		ray.stop()
		return 0
	}
	runHelperPorts = [2]int{hi - 199, hi - 99}
	if ports, err = fleet.NewPortBlock(lo, hi-199); err != nil {
		fmt.Fprintln(os.Stderr, "interop:", err)
		return 1
	}
	if binDir, err = binaries(); err != nil {
		fmt.Fprintln(os.Stderr, "interop:", err)
		return 1
	}
	if pyenv, err = gymEnvDir(); err != nil {
		fmt.Fprintln(os.Stderr, "interop:", err)
		return 1
	}
	if gymEnv, err = interoptest.OpenGymEnv(pyenv); err != nil {
		fmt.Fprintln(os.Stderr, "interop:", err)
		return 1
	}
	python, sitePackages = gymEnv.Python, gymEnv.SitePackages
	fmt.Fprintf(os.Stderr, "interop: nemo-gym from %s, ports %s\n", sitePackages, block)

	defer ray.stop()
	if err := ray.start(); err != nil {
		fmt.Fprintln(os.Stderr, "interop: starting Ray:", err)
		return 1
	}
	rayAddr = ray.address()
	return m.Run()
}

// binaries returns GYMFLEET_BIN or builds the fleet's binaries.
func binaries() (string, error) {
	names := []string{"fakeinference", "modelserver", "resourceserver", "agentserver", "envserver", "gymctl"}
	dir := os.Getenv("GYMFLEET_BIN")
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "gymfleet-interop-gym-bin-"); err != nil {
			return "", err
		}
		args := []string{"build", "-o", dir + "/"}
		for _, n := range names {
			args = append(args, "./cmd/"+n)
		}
		cmd := exec.Command("go", args...)
		cmd.Dir, cmd.Stdout, cmd.Stderr = repoRoot, os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("building the fleet's binaries: %w", err)
		}
	}
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			return "", fmt.Errorf("binary %s missing in %s: %w", n, dir, err)
		}
	}
	return dir, nil
}

// gymEnvDir returns GYMFLEET_GYM_PYENV or makes the environment
// (scripts/pyenv.sh, cached).
func gymEnvDir() (string, error) {
	if dir := os.Getenv("GYMFLEET_GYM_PYENV"); dir != "" {
		return dir, nil
	}
	cmd := exec.Command(filepath.Join(repoRoot, "scripts", "pyenv.sh"), "gym")
	cmd.Dir, cmd.Stderr = repoRoot, os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("scripts/pyenv.sh gym: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// rayHead is the suite's Ray head: `ray start --head` in its own process
// group, on ports of the block's top 100, with a temp dir of its own. Its
// processes are found by that group and by the temp dir in their command
// lines, never by name (other users' Ray processes share the machine).
type rayHead struct {
	dir    string
	portLo int
	pgid   int
}

func (r *rayHead) record() string { return r.dir + ".pgid" }

func (r *rayHead) address() string { return "127.0.0.1:" + strconv.Itoa(r.portLo) }

// adopt takes the process group a killed run recorded.
func (r *rayHead) adopt() {
	if b, err := os.ReadFile(r.record()); err == nil {
		if pgid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			r.pgid = pgid
		}
	}
}

func (r *rayHead) start() error {
	// What a killed run left: its group, then anything naming its dir.
	r.adopt()
	r.stop()
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return err
	}
	p := r.portLo
	args := []string{"start", "--head", "--disable-usage-stats", "--include-dashboard=false",
		"--node-ip-address=127.0.0.1", "--num-cpus=2", "--object-store-memory=100000000",
		"--temp-dir=" + r.dir,
		"--port=" + strconv.Itoa(p),
		"--node-manager-port=" + strconv.Itoa(p+1),
		"--object-manager-port=" + strconv.Itoa(p+2),
		"--ray-client-server-port=" + strconv.Itoa(p+3),
		"--dashboard-port=" + strconv.Itoa(p+4),
		"--dashboard-agent-listen-port=" + strconv.Itoa(p+5),
		"--dashboard-agent-grpc-port=" + strconv.Itoa(p+6),
		"--runtime-env-agent-port=" + strconv.Itoa(p+7),
		"--metrics-export-port=" + strconv.Itoa(p+8),
		"--min-worker-port=" + strconv.Itoa(p+20),
		"--max-worker-port=" + strconv.Itoa(p+99),
	}
	cmd := exec.Command(filepath.Join(pyenv, "bin", "ray"), args...)
	cmd.Env = append(os.Environ(), "RAY_USAGE_STATS_ENABLED=0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return err
	}
	r.pgid = cmd.Process.Pid
	if err := os.WriteFile(r.record(), []byte(strconv.Itoa(r.pgid)), 0o644); err != nil {
		return err
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("ray start: %v\n%s", err, out.String())
	}
	return nil
}

// stop kills the head's process group and any process whose command line
// names its temp dir (a worker that left the group), waits for them to go,
// and removes the record and the dir.
func (r *rayHead) stop() {
	if r.pgid > 0 && groupNamesDir(r.pgid, r.dir) {
		_ = syscall.Kill(-r.pgid, syscall.SIGKILL)
	}
	for _, pid := range pidsNaming(r.dir) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && len(pidsNaming(r.dir)) > 0 {
		// Poll for the kernel to reap them; SIGKILL cannot be refused.
		waitTick()
	}
	if left := pidsNaming(r.dir); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "interop: Ray processes %v outlived SIGKILL\n", left)
	}
	_ = os.Remove(r.record())
	_ = os.RemoveAll(r.dir)
	r.pgid = 0
}

// groupNamesDir reports whether some process of group pgid names dir in
// its command line: the group is still ours (a pid can be reused).
func groupNamesDir(pgid int, dir string) bool {
	for _, pid := range pidsNaming(dir) {
		if g, err := syscall.Getpgid(pid); err == nil && g == pgid {
			return true
		}
	}
	return false
}

// pidsNaming lists the processes whose command line contains dir.
func pidsNaming(dir string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if bytes.Contains(b, []byte(dir+"/")) || bytes.Contains(b, []byte("="+dir+"\x00")) || bytes.HasSuffix(b, []byte("="+dir)) {
			if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && isZombie(st) {
				continue
			}
			out = append(out, pid)
		}
	}
	return out
}

// isZombie reads the state field of /proc/<pid>/stat.
func isZombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// waitTick is the pause between two polls of a condition.
var waitTick = interoptest.WaitTick
