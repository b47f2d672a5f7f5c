package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The Slurm batch script (deploy/slurm/gymfleet.sbatch) run outside Slurm:
// a fake scontrol names two nodes that are both this host (localhost and
// 127.0.0.1), a fake srun logs its options and runs the command here, and
// fakeinference stands in for vLLM. Everything else is the script as an
// operator submits it.

// fakeSlurm writes srun and scontrol into a directory for PATH; srun
// appends each call's arguments to log.
func fakeSlurm(t *testing.T, log string) string {
	t.Helper()
	dir := t.TempDir()
	scripts := map[string]string{
		"scontrol": `#!/bin/sh
[ "$1 $2" = "show hostnames" ] || { echo "fake scontrol: $*" >&2; exit 1; }
printf 'localhost\n127.0.0.1\n'
`,
		// srun's options come first, each as one --name=value word (how
		// the script writes them); the command and its arguments follow.
		"srun": `#!/bin/sh
echo "$*" >>"` + log + `"
while [ $# -gt 0 ]; do
	case $1 in
	-*) shift ;;
	*) break ;;
	esac
done
exec "$@"
`,
	}
	for name, body := range scripts {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// slurmJob is one run of the batch script.
type slurmJob struct {
	cmd             *exec.Cmd
	out             *bytes.Buffer
	done            chan error
	runDir, srunLog string
	envURL, model   string
}

func startSlurmJob(t *testing.T, extraEnv ...string) *slurmJob {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "deploy", "slurm", "gymfleet.sbatch")
	dir := t.TempDir()
	j := &slurmJob{out: &bytes.Buffer{}, done: make(chan error, 1), runDir: filepath.Join(dir, "run"), srunLog: filepath.Join(dir, "srun.log")}
	p, err := ports.Take(7)
	if err != nil {
		t.Fatal(err)
	}
	j.envURL = fmt.Sprintf("http://127.0.0.1:%d", p[6])
	j.model = fmt.Sprintf("http://127.0.0.1:%d", p[1])
	j.cmd = exec.Command("bash", script)
	j.cmd.Env = append(os.Environ(),
		"PATH="+fakeSlurm(t, j.srunLog)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"SLURM_JOB_NODELIST=node[1-2]", "SLURM_JOB_ID=e2e", "SLURM_SUBMIT_DIR="+dir,
		"FLEET_BIN_DIR="+binDir, "FLEET_RUN_DIR="+j.runDir, "FLEET_INFERENCE=fake",
		"FLEET_LISTEN_HOST=127.0.0.1", "FLEET_TOKEN="+token, "FLEET_READY_TIMEOUT=60",
		"FLEET_PORT_INFERENCE="+strconv.Itoa(p[0]), "FLEET_PORT_MODEL="+strconv.Itoa(p[1]),
		"FLEET_PORT_WEATHER="+strconv.Itoa(p[2]), "FLEET_PORT_COUNTER="+strconv.Itoa(p[3]),
		"FLEET_PORT_WEATHER_AGENT="+strconv.Itoa(p[4]), "FLEET_PORT_COUNTER_AGENT="+strconv.Itoa(p[5]),
		"FLEET_PORT_ENV="+strconv.Itoa(p[6]),
	)
	if stack != "" {
		j.cmd.Env = append(j.cmd.Env, "GYMFLEET_HTTP_STACK="+string(stack))
	}
	j.cmd.Env = append(j.cmd.Env, extraEnv...)
	j.cmd.Stdout, j.cmd.Stderr = j.out, j.out
	// Its own process group, so a failed test stops every process it began.
	j.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := j.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { j.done <- j.cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-j.cmd.Process.Pid, syscall.SIGKILL)
		if t.Failed() {
			t.Logf("script output:\n%s", j.out)
			for _, name := range []string{"inference.log", "fleet.log", "logs/policy_model.log", "logs/agents.log", "logs/env.log"} {
				if b, err := os.ReadFile(filepath.Join(j.runDir, name)); err == nil {
					t.Logf("%s:\n%s", name, b)
				}
			}
		}
	})
	return j
}

// wait waits for the script to exit and returns its exit code.
func (j *slurmJob) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case err := <-j.done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(timeout):
		t.Fatalf("the script did not exit within %v", timeout)
		return -1
	}
}

// checkPlacement checks the script started inference on the first node and
// the fleet on the last, each as one task.
func (j *slurmJob) checkPlacement(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(j.srunLog)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 ||
		!strings.Contains(lines[0], "--nodelist=localhost") || !strings.Contains(lines[0], "/fakeinference --config") ||
		!strings.Contains(lines[1], "--nodelist=127.0.0.1") || !strings.Contains(lines[1], "/gymctl up --config") {
		t.Fatalf("srun calls:\n%s\nwant fakeinference on localhost, then gymctl up on 127.0.0.1", b)
	}
}

func get(url string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TestSlurm_CollectsThroughTheFleet runs the script with a dataset: it
// starts inference and the fleet, collects every row, stops everything and
// exits 0.
func TestSlurm_CollectsThroughTheFleet(t *testing.T) {
	t.Parallel()
	ws := newWorkspace(t, weatherRow("slurm-1", "weather_agent", "Paris"), weatherRow("slurm-2", "weather_agent", "Oslo"),
		weatherRow("slurm-3", "weather_agent", "Lima"))
	j := startSlurmJob(t, "FLEET_INPUT="+ws.input, "FLEET_OUTPUT="+ws.output, "FLEET_CONCURRENCY=2")
	if code := j.wait(t, 3*time.Minute); code != 0 {
		t.Fatalf("the script exited %d", code)
	}
	j.checkPlacement(t)
	rows := ws.finishedOutput()
	if len(rows) != 3 {
		t.Fatalf("%d rows collected, want 3", len(rows))
	}
	for _, r := range rows {
		if r["reward"] != 1.0 {
			t.Errorf("row %v: reward %v, want 1.0", r["_ng_rollout_id"], r["reward"])
		}
	}
	// Every server was stopped with the job.
	if _, err := get(j.envURL + "/readyz"); err == nil {
		t.Error("the environment server still answers after the script exited")
	}
}

// TestSlurm_ServesUntilTerminated runs the script without a dataset: the
// fleet comes up and answers, and SIGTERM (scancel, or the time limit's
// --signal) stops every server and the script with 75.
func TestSlurm_ServesUntilTerminated(t *testing.T) {
	t.Parallel()
	j := startSlurmJob(t)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		code, err := get(j.envURL + "/readyz")
		if err == nil && code == http.StatusOK {
			break
		}
		select {
		case err := <-j.done:
			t.Fatalf("the script exited before the fleet was ready: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the environment server was not ready within 2 minutes: %d %v", code, err)
		}
		<-time.After(50 * time.Millisecond)
	}
	// The model server is ready only while it reaches its upstream.
	if code, err := get(j.model + "/readyz"); err != nil || code != http.StatusOK {
		t.Fatalf("model server /readyz: %d %v", code, err)
	}
	j.checkPlacement(t)
	if err := j.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := j.wait(t, time.Minute); code != 75 {
		t.Fatalf("the script exited %d after SIGTERM, want 75", code)
	}
	for _, u := range []string{j.envURL, j.model} {
		host := strings.TrimPrefix(u, "http://")
		if c, err := net.DialTimeout("tcp", host, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after the script exited", host)
		}
	}
}
