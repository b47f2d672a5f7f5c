// Package interoptest is what the interop suites (tests/interop/gym,
// tests/interop/vllm) share: child processes a test owns, NeMo Gym's server
// processes started as Gym's RunHelper starts them from the pinned gym
// environment, and the comparison of a Gym server's Responses reply with
// our model server's.
package interoptest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ErrTimeout is what a wait that ran out of time wraps.
var ErrTimeout = errors.New("timed out")

// WaitTick is the pause between two polls of a condition.
func WaitTick() { <-time.After(100 * time.Millisecond) }

// Process is a child process of a test in its own process group, its
// output written straight into a file (not a pipe to the test: a child
// outliving a killed test would die of SIGPIPE before it cleaned up).
type Process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// StartProcess runs argv in dir with env added, until the test ends: then
// SIGINT (every server the suites start stops on it: gymctl up stops its
// fleet, uvicorn its app), and SIGKILL to its group after a grace. A test
// binary that dies without cleaning up (a -timeout panic) sends the SIGINT
// through the parent-death signal.
func StartProcess(t *testing.T, name, dir string, env []string, argv ...string) *Process {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGINT}
	logPath := filepath.Join(t.TempDir(), name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	p := &Process{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	// The parent-death signal follows the thread that forked: keep it
	// until the child has started.
	runtime.LockOSThread()
	err = cmd.Start()
	runtime.UnlockOSThread()
	logFile.Close()
	if err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Stop(20 * time.Second)
		if t.Failed() {
			t.Logf("--- %s (last lines)\n%s", name, p.Tail())
		}
	})
	return p
}

// Name is the name the process was started under.
func (p *Process) Name() string { return p.name }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Stop sends SIGINT, then SIGKILL to the group if it has not exited
// within grace.
func (p *Process) Stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// Output is everything the process has printed so far.
func (p *Process) Output() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// WaitFor polls the process's output until it contains s, the process
// exits or timeout passes.
func (p *Process) WaitFor(s string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if strings.Contains(p.Output(), s) {
			return nil
		}
		select {
		case <-p.done:
			if strings.Contains(p.Output(), s) {
				return nil
			}
			return fmt.Errorf("%s exited (%v) before printing %q", p.name, p.cmd.ProcessState, s)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s printed no %q in %v", ErrTimeout, p.name, s, timeout)
		}
		WaitTick()
	}
}

// Tail is the end of the process's output.
func (p *Process) Tail() string {
	lines := strings.Split(strings.TrimRight(p.Output(), "\n"), "\n")
	if len(lines) > 60 {
		lines = lines[len(lines)-60:]
	}
	return strings.Join(lines, "\n")
}
