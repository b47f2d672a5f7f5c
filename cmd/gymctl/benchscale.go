package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"

	"github.com/gymfleet/gymfleet/pkg/scalebench"
)

// benchGCPercent is the servers' GC goal (lifecycle.ServerGCPercent, which
// a test holds it to), named here so gymctl links no server-running code.
const benchGCPercent = 15

// runBenchScale is `gymctl bench-scale`: the scale benchmark of the
// checkpoint path (pkg/scalebench). It prints one table and, with --json,
// writes the same figures for comparing runs.
func runBenchScale(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench-scale", stderr)
	rollouts := fs.Int("rollouts", 1000, "rollouts in flight at the checkpoint")
	jsonPath := fs.String("json", "", "also write the figures as JSON to this file")
	dir := fs.String("dir", "", "work directory (fleet configs and logs, the checkpoint, profiles); empty: a temporary one")
	keep := fs.Bool("keep", false, "keep the work directory after a successful run")
	profile := fs.Bool("profile", false, "write CPU profiles of every server (and the bench) during dispatch, prepare, commit and restore, and heap profiles of both fleets, into <dir>/profiles")
	profileSeconds := fs.Int("profile-seconds", 0, "length of each CPU profile; 0: 3 + rollouts/5000")
	maxRSS := fs.Float64("max-rss-gib", math.Round(float64(scalebench.DefaultMaxRSSBytes())/(1<<30)*10)/10,
		"abort when the fleet and the bench together hold more resident memory than this (GiB); 0: no limit; default: 90% of this machine's")
	binDir := fs.String("bin-dir", "", "directory of the server binaries; empty: gymctl's own directory")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *rollouts < 1 {
		return fmt.Errorf("bench-scale: --rollouts must be at least 1, got %d", *rollouts)
	}
	if *maxRSS < 0 {
		return fmt.Errorf("bench-scale: --max-rss-gib must be >= 0, got %v", *maxRSS)
	}
	if *binDir == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("bench-scale: finding gymctl's directory (pass --bin-dir): %w", err)
		}
		*binDir = filepath.Dir(exe)
	}
	// The bench holds every rollout's /run call open, as the servers hold
	// theirs; it collects garbage as they do (lifecycle.SetServerGC).
	if getenv("GOGC") == "" {
		defer debug.SetGCPercent(debug.SetGCPercent(benchGCPercent))
	}
	res, err := scalebench.Run(ctx, scalebench.Options{
		Rollouts:       *rollouts,
		BinDir:         *binDir,
		Dir:            *dir,
		Keep:           *keep,
		Profile:        *profile,
		ProfileSeconds: *profileSeconds,
		MaxRSSBytes:    uint64(*maxRSS * (1 << 30)),
		Log:            stderr,
	})
	if res == nil {
		return err
	}
	if werr := res.WriteTable(stdout); werr != nil {
		err = errors.Join(err, werr)
	}
	if *jsonPath != "" {
		if werr := res.WriteJSON(*jsonPath); werr != nil {
			err = errors.Join(err, fmt.Errorf("writing %s: %w", *jsonPath, werr))
		} else {
			fmt.Fprintln(stdout, "figures written to", *jsonPath)
		}
	}
	return err
}
