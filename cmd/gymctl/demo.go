package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/gymfleet/gymfleet/pkg/collect"
	"github.com/gymfleet/gymfleet/pkg/fleet"
)

// demoOptions are gymctl demo's flags.
type demoOptions struct {
	config      string
	input       string
	concurrency int
	noProgress  bool
}

func parseDemoFlags(args []string, stderr io.Writer) (demoOptions, error) {
	var o demoOptions
	fs := newFlagSet("demo", stderr)
	fs.StringVar(&o.config, "config", "configs/local.yaml", "fleet file")
	fs.StringVar(&o.input, "input", "data/demo.jsonl", "dataset to collect")
	fs.IntVar(&o.concurrency, "concurrency", 32, "rows in flight at once")
	fs.BoolVar(&o.noProgress, "no-progress", false, "do not draw the progress bar")
	if err := parse(fs, args); err != nil {
		return o, err
	}
	if o.concurrency < 1 {
		return o, fmt.Errorf("demo: --concurrency %d must be at least 1", o.concurrency)
	}
	return o, nil
}

func runDemo(ctx context.Context, args []string, _ func(string) string, stdout, stderr io.Writer) error {
	opts, err := parseDemoFlags(args, stderr)
	if err != nil {
		return err
	}
	return newDemo(opts, stdout, stderr).run(ctx)
}

// demo is the demo as a sequence of steps over shared state. Later steps
// (checkpoint, crash, restore) slot into steps().
type demo struct {
	opts           demoOptions
	stdout, stderr io.Writer

	cfg      *fleet.Config
	launcher *fleet.Launcher
	envURL   string
	output   string
	summary  *collect.Summary
}

// demoStep is one named step.
type demoStep struct {
	name string
	run  func(context.Context) error
}

func newDemo(opts demoOptions, stdout, stderr io.Writer) *demo {
	return &demo{opts: opts, stdout: stdout, stderr: stderr}
}

func (d *demo) steps() []demoStep {
	return []demoStep{
		{"load the fleet file", d.loadFleet},
		{"start the fleet", d.startFleet},
		{"collect the demo dataset", d.collect},
		{"report", d.report},
		{"stop the fleet", func(context.Context) error { return d.stopFleet() }},
		{"check every reward is 1.0", d.checkRewards},
	}
}

// run runs the steps in order and always stops the fleet, whatever step
// failed.
func (d *demo) run(ctx context.Context) (err error) {
	defer func() {
		if stopErr := d.stopFleet(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
	}()
	steps := d.steps()
	for i, s := range steps {
		fmt.Fprintf(d.stdout, "[%d/%d] %s\n", i+1, len(steps), s.name)
		start := time.Now()
		if err := s.run(ctx); err != nil {
			return fmt.Errorf("demo step %q: %w", s.name, err)
		}
		fmt.Fprintf(d.stdout, "      done in %s\n", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

func (d *demo) loadFleet(context.Context) error {
	cfg, err := fleet.Load(d.opts.config)
	if err != nil {
		return err
	}
	envs := cfg.Endpoints(fleet.KindEnvironment)
	if len(envs) == 0 {
		return fmt.Errorf("fleet file %s has no environment endpoint", d.opts.config)
	}
	if _, err := os.Stat(d.opts.input); err != nil {
		return fmt.Errorf("demo dataset: %w", err)
	}
	d.cfg, d.envURL = cfg, envs[0].URL
	d.output = filepath.Join(cfg.Path(cfg.RunDir), "demo", "results.jsonl")
	return os.MkdirAll(filepath.Dir(d.output), 0o755)
}

func (d *demo) startFleet(ctx context.Context) error {
	d.launcher = fleet.NewLauncher(d.cfg, fleet.Options{})
	if err := d.launcher.StartAll(ctx); err != nil {
		return err
	}
	for _, e := range d.cfg.Endpoints("") {
		fmt.Fprintf(d.stdout, "      %-14s %-13s %s\n", e.Name, e.Kind, e.URL)
	}
	return nil
}

func (d *demo) collect(ctx context.Context) error {
	opts := collect.Options{EnvURL: d.envURL, Concurrency: d.opts.concurrency}
	if !d.opts.noProgress {
		opts.Progress = d.stderr
	}
	c, err := collect.New(opts)
	if err != nil {
		return err
	}
	d.summary, err = c.CollectFile(ctx, d.opts.input, d.output)
	if err != nil {
		return err
	}
	fmt.Fprintf(d.stdout, "      results in %s\n", d.output)
	return nil
}

func (d *demo) report(context.Context) error {
	d.summary.WriteText(d.stdout)
	fmt.Fprintln(d.stdout)
	d.summary.WriteTable(d.stdout)
	return nil
}

// stopFleet stops what startFleet started; it is safe to call twice.
func (d *demo) stopFleet() error {
	if d.launcher == nil {
		return nil
	}
	l := d.launcher
	d.launcher = nil
	return l.StopAll()
}

func (d *demo) checkRewards(context.Context) error {
	if d.summary == nil {
		return errors.New("nothing was collected")
	}
	if !d.summary.AllRewardsOne() {
		return fmt.Errorf("not every rollout got reward 1.0 (succeeded %d of %d, failed %d)", d.summary.Succeeded, d.summary.Rows, d.summary.Failed)
	}
	fmt.Fprintf(d.stdout, "      all %d rollouts got reward 1.0\n", d.summary.Rows)
	return nil
}
