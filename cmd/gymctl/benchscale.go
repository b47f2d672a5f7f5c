package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/ops/scalebench"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

// runBenchScale is `gymctl bench-scale`: the scale benchmark of the
// checkpoint path (pkg/ops/scalebench). It prints one table per HTTP stack
// (--stacks), one after the other, then with several stacks their figures
// side by side; with --json it writes the same figures for comparing runs
// (with several stacks, one file per stack: --json's name with -<stack>
// before its extension).
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
	stacksFlag := fs.String("stacks", string(httpconf.StackLean), "comma-separated HTTP stacks (lean, nethttp) to run the bench on, one run after the other, every server and the bench on the run's stack")
	s3Root := fs.String("s3-root", "", "checkpoint to this object store location (s3://bucket/prefix; the bucket is created if missing) instead of the work directory; credentials from the AWS environment")
	s3Endpoint := fs.String("s3-endpoint", "", "with --s3-root: the S3 server's base URL (empty: AWS)")
	s3PathStyle := fs.Bool("s3-path-style", true, "with --s3-root: address buckets as <endpoint>/<bucket>")
	tuning := fs.String("tuning", "", "every server's runtime.tuning (on: steer the Go runtime, off: Go's own behaviour); empty: the servers' default")
	replicas := fs.Int("replicas", 1, "processes of each participant kind (environment, agent, resources, model); rollouts are spread over the environment replicas by rollout id")
	portsFlag := fs.String("ports", "", "take the fleet's ports from this block (lo-hi, e.g. 13000-13999); empty: free ports the kernel chooses")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *replicas < 1 {
		return fmt.Errorf("bench-scale: --replicas must be at least 1, got %d", *replicas)
	}
	var ports fleet.PortSource
	if *portsFlag != "" {
		block, err := fleet.ParsePortBlock(*portsFlag)
		if err != nil {
			return fmt.Errorf("bench-scale: --ports: %w", err)
		}
		ports = block
	}
	if *s3Root != "" && !ckptstore.IsS3(*s3Root) {
		return fmt.Errorf("bench-scale: --s3-root %q is not an s3:// URL", *s3Root)
	}
	stacks, err := parseStacks(*stacksFlag)
	if err != nil {
		return fmt.Errorf("bench-scale: --stacks: %w", err)
	}
	if err := (runtimetune.Config{Tuning: runtimetune.Mode(*tuning)}).Validate(); err != nil {
		return fmt.Errorf("bench-scale: --tuning: %w", err)
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
	var runs []*scalebench.Result
	var errs []error
	for _, st := range stacks {
		opts := scalebench.Options{
			Rollouts:       *rollouts,
			BinDir:         *binDir,
			Dir:            *dir,
			Keep:           *keep,
			Profile:        *profile,
			ProfileSeconds: *profileSeconds,
			MaxRSSBytes:    uint64(*maxRSS * (1 << 30)),
			Log:            stderr,
			Stack:          st,
			S3Root:         *s3Root,
			S3:             ckptstore.S3Options{Endpoint: *s3Endpoint, PathStyle: *s3PathStyle},
			Tuning:         runtimetune.Mode(*tuning),
			Replicas:       *replicas,
			Ports:          ports,
		}
		path := *jsonPath
		if len(stacks) > 1 {
			if opts.Dir != "" {
				opts.Dir = filepath.Join(opts.Dir, string(st))
			}
			if path != "" {
				ext := filepath.Ext(path)
				path = strings.TrimSuffix(path, ext) + "-" + string(st) + ext
			}
			fmt.Fprintf(stdout, "=== %s HTTP stack\n", st)
		}
		res, err := runBenchOnce(ctx, opts, path, stdout)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s stack: %w", st, err))
		}
		if res != nil {
			runs = append(runs, res)
		}
		if ctx.Err() != nil {
			break
		}
	}
	if len(runs) > 1 {
		fmt.Fprintln(stdout)
		if err := scalebench.WriteComparison(stdout, runs); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// parseStacks reads --stacks: known stacks, each once.
func parseStacks(s string) ([]httpconf.Stack, error) {
	var out []httpconf.Stack
	for _, name := range strings.Split(s, ",") {
		st := httpconf.Stack(strings.TrimSpace(name))
		if err := (httpconf.Config{Stack: st}).Validate(); err != nil || st == "" {
			return nil, fmt.Errorf("%q is not lean or nethttp", name)
		}
		if slices.Contains(out, st) {
			return nil, fmt.Errorf("%s is named twice", st)
		}
		out = append(out, st)
	}
	return out, nil
}

// runBenchOnce runs the bench on one stack, prints its table and writes
// its JSON to jsonPath (unless empty).
func runBenchOnce(ctx context.Context, opts scalebench.Options, jsonPath string, stdout io.Writer) (*scalebench.Result, error) {
	res, err := scalebench.Run(ctx, opts)
	if res == nil {
		return nil, err
	}
	if werr := res.WriteTable(stdout); werr != nil {
		err = errors.Join(err, werr)
	}
	if jsonPath != "" {
		if werr := res.WriteJSON(jsonPath); werr != nil {
			err = errors.Join(err, fmt.Errorf("writing %s: %w", jsonPath, werr))
		} else {
			fmt.Fprintln(stdout, "figures written to", jsonPath)
		}
	}
	return res, err
}
