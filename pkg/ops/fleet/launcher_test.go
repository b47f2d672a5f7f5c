package fleet_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
)

// testFleet builds a fleet of helper processes in a temp dir. Each process
// gets a free port written into its --config file.
type testFleet struct {
	cfg  *fleet.Config
	urls map[string]string
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func newTestFleet(t *testing.T, procs ...fleet.Process) *testFleet {
	t.Helper()
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(self, filepath.Join(dir, "bin", "helper")); err != nil {
		t.Fatal(err)
	}
	tf := &testFleet{urls: map[string]string{}}
	cfg := &fleet.Config{RunDir: "run", BinDir: "bin", BaseDir: dir}
	for _, p := range procs {
		addr := freeAddr(t)
		conf := filepath.Join("conf", p.Name+".addr")
		if err := os.MkdirAll(filepath.Join(dir, "conf"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, conf), []byte(addr), 0o644); err != nil {
			t.Fatal(err)
		}
		if p.Binary == "" {
			p.Binary = "helper"
		}
		p.Config = conf
		p.Endpoints = []fleet.Endpoint{{Name: p.Name, Kind: fleet.KindResources, URL: "http://" + addr}}
		tf.urls[p.Name] = "http://" + addr
		cfg.Processes = append(cfg.Processes, p)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	tf.cfg = cfg
	return tf
}

func helperProc(name, mode string, env ...fleet.EnvVar) fleet.Process {
	return fleet.Process{Name: name, Env: append([]fleet.EnvVar{{Name: "GYMFLEET_FLEET_TEST_HELPER", Value: mode}}, env...)}
}

func newLauncher(t *testing.T, tf *testFleet, opts fleet.Options) *fleet.Launcher {
	t.Helper()
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 20 * time.Second
	}
	if opts.StopGrace == 0 {
		opts.StopGrace = 5 * time.Second
	}
	l := fleet.NewLauncher(tf.cfg, opts)
	t.Cleanup(func() {
		if err := l.KillAll(); err != nil {
			t.Errorf("KillAll: %v", err)
		}
	})
	return l
}

func get(t *testing.T, url string) int {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// gone reports whether pid no longer exists or is a zombie awaiting a reaper.
func gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && len(s) > i+2 && s[i+2] == 'Z'
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		<-tick.C
	}
}

func TestLauncher_StartReadyLogsStop(t *testing.T) {
	tf := newTestFleet(t, helperProc("svc", "serve", fleet.EnvVar{Name: "GYMFLEET_TEST_ECHO", Value: "hello"}))
	l := newLauncher(t, tf, fleet.Options{})
	if err := l.Start(t.Context(), "svc"); err != nil {
		t.Fatal(err)
	}
	if !l.Running("svc") {
		t.Fatal("not running after Start")
	}
	if got := get(t, tf.urls["svc"]); got != 200 {
		t.Fatalf("/readyz after Start = %d", got)
	}
	addrs, err := l.Addresses("svc")
	if err != nil || "http://"+addrs["svc"] != tf.urls["svc"] {
		t.Errorf("Addresses = %v, %v; want svc at %s", addrs, err, tf.urls["svc"])
	}
	if err := l.Start(t.Context(), "svc"); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Errorf("second Start = %v, want already running", err)
	}
	if err := l.Stop("svc"); err != nil {
		t.Fatal(err)
	}
	if l.Running("svc") {
		t.Fatal("running after Stop")
	}
	if err := l.ExitErr("svc"); err != nil {
		t.Errorf("a graceful stop exited with %v", err)
	}
	logs := l.Logs("svc")
	for _, want := range []string{"gymfleet launcher: starting", `echo=\"hello\"`, "--config", "helper stopping on SIGTERM", `"exit":"exited with status 0"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
	// Log files hold JSON lines only: the helper's plain lines are wrapped.
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("a log line is not JSON: %q", line)
		}
	}
	if got := l.ExitReason("svc"); got != "exited with status 0" {
		t.Errorf("ExitReason = %q", got)
	}
	if err := l.Stop("svc"); err != nil {
		t.Errorf("Stop of a stopped process = %v", err)
	}
}

func TestLauncher_KillTakesTheGroupAndRestartIsFresh(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "grandchild")
	tf := newTestFleet(t, helperProc("svc", "serve", fleet.EnvVar{Name: "HELPER_GRANDCHILD_FILE", Value: pidFile}))
	l := newLauncher(t, tf, fleet.Options{})
	if err := l.Start(t.Context(), "svc"); err != nil {
		t.Fatal(err)
	}
	first := l.PID("svc")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	grandchild, _ := strconv.Atoi(string(b))
	if gone(grandchild) {
		t.Fatal("the grandchild is not running before the kill")
	}
	exited := l.Exited("svc")
	if err := l.Kill("svc"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	default:
		t.Fatal("Kill returned before the process was reaped")
	}
	if l.Running("svc") {
		t.Fatal("running after Kill")
	}
	var exitErr interface{ Sys() any }
	if err := l.ExitErr("svc"); !errors.As(err, &exitErr) || !exitErr.Sys().(syscall.WaitStatus).Signaled() {
		t.Errorf("ExitErr = %v, want killed by a signal", err)
	}
	waitUntil(t, "the grandchild in the same group is gone", func() bool { return gone(grandchild) })
	waitUntil(t, "the endpoint stops answering", func() bool { return get(t, tf.urls["svc"]) == 0 })

	if err := l.Restart(t.Context(), "svc"); err != nil {
		t.Fatal(err)
	}
	if l.PID("svc") == first || !l.Running("svc") {
		t.Errorf("Restart did not start a fresh process (pid %d, was %d)", l.PID("svc"), first)
	}
	if got := get(t, tf.urls["svc"]); got != 200 {
		t.Errorf("/readyz after Restart = %d", got)
	}
	if n := strings.Count(l.Logs("svc"), "gymfleet launcher: starting"); n != 2 {
		t.Errorf("log has %d start headers, want 2 (appending across restarts)", n)
	}
	// Restart of a running process stops it first.
	second := l.PID("svc")
	if err := l.Restart(t.Context(), "svc"); err != nil {
		t.Fatal(err)
	}
	if l.PID("svc") == second {
		t.Error("Restart of a running process kept it")
	}
}

func TestLauncher_StopEscalatesToKill(t *testing.T) {
	tf := newTestFleet(t, helperProc("svc", "serve", fleet.EnvVar{Name: "HELPER_IGNORE_TERM", Value: "1"}))
	l := newLauncher(t, tf, fleet.Options{StopGrace: 200 * time.Millisecond})
	if err := l.Start(t.Context(), "svc"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := l.Stop("svc"); err != nil {
		t.Fatal(err)
	}
	if l.Running("svc") {
		t.Fatal("running after Stop")
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("Stop took %v, less than the grace: the process ignored SIGTERM", d)
	}
	if strings.Contains(l.Logs("svc"), "helper stopping") {
		t.Error("the process handled SIGTERM it was told to ignore")
	}
}

func TestLauncher_StartFailures(t *testing.T) {
	t.Run("crash before ready", func(t *testing.T) {
		tf := newTestFleet(t, helperProc("svc", "crash"))
		l := newLauncher(t, tf, fleet.Options{})
		err := l.Start(t.Context(), "svc")
		if err == nil || !strings.Contains(err.Error(), "exited before endpoint svc was ready") || !strings.Contains(err.Error(), "helper crashing on purpose") {
			t.Fatalf("Start = %v, want the exit and the log tail", err)
		}
		if l.Running("svc") {
			t.Error("running after a failed start")
		}
		if got := l.ExitReason("svc"); got != "exited with status 3: helper crashing on purpose" {
			t.Errorf("ExitReason = %q, want the status and the error line", got)
		}
	})
	t.Run("never ready", func(t *testing.T) {
		tf := newTestFleet(t, helperProc("svc", "never-ready"))
		l := newLauncher(t, tf, fleet.Options{ReadyTimeout: 300 * time.Millisecond})
		err := l.Start(t.Context(), "svc")
		if err == nil || !strings.Contains(err.Error(), "not ready") || !strings.Contains(err.Error(), "503") {
			t.Fatalf("Start = %v, want not ready with the last probe", err)
		}
		if l.Running("svc") {
			t.Error("a process that never got ready was left running")
		}
	})
	t.Run("missing binary", func(t *testing.T) {
		tf := newTestFleet(t, fleet.Process{Name: "svc", Binary: "no-such-server"})
		l := newLauncher(t, tf, fleet.Options{})
		err := l.Start(t.Context(), "svc")
		if err == nil || !strings.Contains(err.Error(), filepath.Join("bin", "no-such-server")+" not found") {
			t.Fatalf("Start = %v, want the missing binary's path", err)
		}
	})
	t.Run("unknown process", func(t *testing.T) {
		tf := newTestFleet(t, helperProc("svc", "serve"))
		l := newLauncher(t, tf, fleet.Options{})
		if err := l.Start(t.Context(), "nope"); !errors.Is(err, fleet.ErrUnknownProcess) {
			t.Fatalf("Start = %v, want ErrUnknownProcess", err)
		}
	})
	t.Run("endpoint already taken", func(t *testing.T) {
		tf := newTestFleet(t, helperProc("svc", "serve"))
		l1 := newLauncher(t, tf, fleet.Options{})
		if err := l1.Start(t.Context(), "svc"); err != nil {
			t.Fatal(err)
		}
		l2 := newLauncher(t, tf, fleet.Options{})
		if err := l2.Start(t.Context(), "svc"); err == nil || !strings.Contains(err.Error(), "already answers") {
			t.Fatalf("Start over a running fleet = %v, want already answers", err)
		}
	})
	t.Run("remote host", func(t *testing.T) {
		tf := newTestFleet(t, helperProc("svc", "serve"))
		tf.cfg.Processes[0].Host = "node-b"
		l := newLauncher(t, tf, fleet.Options{})
		if err := l.Start(t.Context(), "svc"); err == nil || !strings.Contains(err.Error(), "runs on host node-b") {
			t.Fatalf("Start = %v", err)
		}
		if err := l.StartAll(t.Context()); err != nil {
			t.Fatalf("StartAll with only remote processes = %v, want nothing to do", err)
		}
	})
	t.Run("cancelled context", func(t *testing.T) {
		tf := newTestFleet(t, helperProc("svc", "never-ready"))
		l := newLauncher(t, tf, fleet.Options{})
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := l.Start(ctx, "svc"); err == nil {
			t.Fatal("Start with a cancelled context succeeded")
		}
	})
}

func TestLauncher_StartAllInOrderAndKillAll(t *testing.T) {
	tf := newTestFleet(t, helperProc("a", "serve"), helperProc("b", "serve"), helperProc("c", "serve"))
	tf.cfg.Checkpoint = fleet.Checkpoint{Enabled: true, ControlAuthToken: "tok"}
	l := newLauncher(t, tf, fleet.Options{})
	if err := l.StartAll(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b", "c"} {
		if !l.Running(n) {
			t.Errorf("%s not running", n)
		}
		if !strings.Contains(l.Logs(n), `checkpoint=\"true\"`) {
			t.Errorf("%s did not get the fleet's checkpoint block: %s", n, l.Logs(n))
		}
	}
	// Started in order: each started after the previous was ready, so pids grow.
	if !(l.PID("a") < l.PID("b") && l.PID("b") < l.PID("c")) {
		t.Logf("pids a=%d b=%d c=%d (pid wraparound can reorder)", l.PID("a"), l.PID("b"), l.PID("c"))
	}
	if err := l.KillAll(); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b", "c"} {
		if l.Running(n) {
			t.Errorf("%s running after KillAll", n)
		}
	}
}

func TestLauncher_StartAllStopsWhatItStartedOnFailure(t *testing.T) {
	tf := newTestFleet(t, helperProc("a", "serve"), helperProc("b", "crash"), helperProc("c", "serve"))
	l := newLauncher(t, tf, fleet.Options{})
	err := l.StartAll(t.Context())
	if err == nil || !strings.Contains(err.Error(), "process b") {
		t.Fatalf("StartAll = %v, want process b's failure", err)
	}
	if l.Running("a") || l.Running("c") || l.PID("c") != 0 {
		t.Errorf("after a failed StartAll: a running %v, c pid %d", l.Running("a"), l.PID("c"))
	}
	if !strings.Contains(l.Logs("a"), "helper stopping on SIGTERM") {
		t.Error("a was not stopped gracefully")
	}
	if err := l.StopAll(); err != nil {
		t.Errorf("StopAll = %v", err)
	}
}
