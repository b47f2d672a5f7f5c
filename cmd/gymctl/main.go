// Command gymctl is the operator's command line for a gymfleet fleet: start
// a local fleet (up), collect rollouts from a JSONL dataset (collect), run
// the demo (demo), and drive checkpoints (ckpt).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/gymfleet/gymfleet/pkg/ops/collect"
)

// version is the build's (the Makefile sets it with -X main.version).
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	}
	if errors.Is(err, collect.ErrStopped) {
		// A preemption checkpoint: Slurm's "requeue me" status.
		fmt.Fprintln(os.Stderr, "gymctl:", err)
		os.Exit(collect.ExitPreempted)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gymctl:", err)
		os.Exit(1)
	}
}

// command is one gymctl subcommand.
type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"up", "start the fleet of a fleet file and keep it running until Ctrl-C", runUp},
		{"collect", "run a JSONL dataset through an environment server", runCollect},
		{"demo", "start the local fleet, collect the demo dataset, report, stop", runDemo},
		{"top", "show rollouts in flight, requests per second and checkpoint phase per server, redrawn until Ctrl-C", runTop},
		{"ckpt", "drive checkpoints: status, prepare, commit, resume, restore, retire, forget, verify", runCkpt},
		{"gym-head", "serve NeMo Gym's head-server routes for a fleet file's servers started elsewhere, until Ctrl-C", runGymHead},
		{"gym-config", "print the NeMo Gym global config naming a fleet file's servers", runGymConfig},
		{"bench-scale", "checkpoint, crash and restore N rollouts in flight on a local fleet; print the figures", runBenchScale},
		{"bench-compare", "run two builds' bench-scale in alternating pairs; print medians and ratios as a Markdown table", runBenchCompare},
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		usage(stderr)
		return errors.New("no subcommand")
	}
	if args[0] == "--version" || args[0] == "-version" || args[0] == "version" {
		fmt.Fprintln(stdout, "gymctl", version)
		return nil
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		return flag.ErrHelp
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, args[1:], getenv, stdout, stderr)
		}
	}
	usage(stderr)
	return fmt.Errorf("unknown subcommand %q", args[0])
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: gymctl <subcommand> [flags]")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "run gymctl <subcommand> -h for its flags")
}

// newFlagSet returns a flag set that reports errors instead of exiting.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("gymctl "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parse parses args and refuses positional arguments.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected arguments %v", fs.Name(), fs.Args())
	}
	return nil
}
