//go:build gymfleet_faults && unix

package faultpoint_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/infra/faultpoint"
)

// envChild makes the test binary, run again by TestHit_KillsWhenArmed,
// hit a point and report that it lived on.
const envChild = "FAULTPOINT_TEST_CHILD"

// TestHit_KillsWhenArmed runs this test binary again as a child that hits
// two points, the second armed: the child records both in the trace, says
// the second fired, and dies of SIGKILL before the line after it.
func TestHit_KillsWhenArmed(t *testing.T) {
	if os.Getenv(envChild) != "" {
		faultpoint.Hit(faultpoint.AtomicRenamed)
		faultpoint.Hit(faultpoint.AtomicLinked)
		os.Stdout.WriteString("survived\n")
		os.Exit(0)
	}
	if !faultpoint.Enabled {
		t.Fatal("not Enabled in a build with the tag")
	}
	dir := t.TempDir()
	arm, trace := filepath.Join(dir, "arm"), filepath.Join(dir, "trace")
	if err := os.WriteFile(arm, []byte(faultpoint.AtomicLinked+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHit_KillsWhenArmed$")
	cmd.Env = append(os.Environ(), envChild+"=1", faultpoint.EnvFile+"="+arm, faultpoint.EnvTrace+"="+trace)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("the child exited normally: %v\n%s", err, out)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the child ended with %v, want SIGKILL\n%s", ee, out)
	}
	if strings.Contains(string(out), "survived") || !strings.Contains(string(out), faultpoint.FiredPrefix+string(faultpoint.AtomicLinked)) {
		t.Fatalf("child output %q", out)
	}
	b, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(b); got != string(faultpoint.AtomicRenamed)+"\n"+string(faultpoint.AtomicLinked)+"\n" {
		t.Fatalf("trace %q", got)
	}
}

// TestHit_UnarmedPointsPass hits every point with another armed.
func TestHit_UnarmedPointsPass(t *testing.T) {
	arm := filepath.Join(t.TempDir(), "arm")
	if err := os.WriteFile(arm, []byte("no.such-point"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(faultpoint.EnvFile, arm)
	for _, p := range faultpoint.All() {
		faultpoint.Hit(p)
	}
}
