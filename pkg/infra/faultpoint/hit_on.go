//go:build gymfleet_faults && unix

package faultpoint

import (
	"os"
	"strings"
	"syscall"
	"time"
)

// Enabled reports whether this build compiles the points in.
const Enabled = true

// Hit is point p: it records p in the trace file, if any, and kills the
// process with SIGKILL if the arm file names p.
func Hit(p Point) {
	if path := os.Getenv(EnvTrace); path != "" {
		if f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644); err == nil {
			_, _ = f.WriteString(string(p) + "\n")
			_ = f.Close()
		}
	}
	path := os.Getenv(EnvFile)
	if path == "" {
		return
	}
	b, err := os.ReadFile(path)
	if err != nil || strings.TrimSpace(string(b)) != string(p) {
		return
	}
	_, _ = os.Stderr.WriteString(FiredPrefix + string(p) + "\n")
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	// The signal is delivered asynchronously: nothing after the point may
	// run meanwhile.
	for {
		time.Sleep(time.Hour)
	}
}
