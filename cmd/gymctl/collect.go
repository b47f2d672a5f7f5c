package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/gymfleet/gymfleet/pkg/collect"
	"github.com/gymfleet/gymfleet/pkg/fleet"
)

// collectFlags are gymctl collect's flags.
type collectFlags struct {
	envURL      string
	config      string
	input       string
	output      string
	concurrency int
	limit       int
	noProgress  bool
}

func parseCollectFlags(args []string, stderr io.Writer) (collectFlags, error) {
	var f collectFlags
	fs := newFlagSet("collect", stderr)
	fs.StringVar(&f.envURL, "env-url", "", "environment server base URL")
	fs.StringVar(&f.config, "config", "", "fleet file; its first environment endpoint is used (instead of --env-url)")
	fs.StringVar(&f.input, "input", "", "input JSONL dataset (NeMo Gym rows)")
	fs.StringVar(&f.output, "output", "", "output JSONL; failed rows go to <stem>_failures.jsonl")
	fs.IntVar(&f.concurrency, "concurrency", collect.DefaultConcurrency, "rows in flight at once")
	fs.IntVar(&f.limit, "limit", 0, "run only the first K valid rows (0: all)")
	fs.BoolVar(&f.noProgress, "no-progress", false, "do not draw the progress bar")
	if err := parse(fs, args); err != nil {
		return f, err
	}
	switch {
	case f.input == "" || f.output == "":
		return f, errors.New("collect: --input and --output are required")
	case f.envURL == "" && f.config == "":
		return f, errors.New("collect: --env-url or --config is required")
	case f.envURL != "" && f.config != "":
		return f, errors.New("collect: give --env-url or --config, not both")
	case f.concurrency < 1:
		return f, fmt.Errorf("collect: --concurrency %d must be at least 1", f.concurrency)
	case f.limit < 0:
		return f, fmt.Errorf("collect: --limit %d must not be negative", f.limit)
	case f.input == f.output:
		return f, errors.New("collect: --output must differ from --input")
	}
	return f, nil
}

// environmentURL is the first environment endpoint of a fleet file.
func environmentURL(path string) (string, error) {
	cfg, err := fleet.Load(path)
	if err != nil {
		return "", err
	}
	envs := cfg.Endpoints(fleet.KindEnvironment)
	if len(envs) == 0 {
		return "", fmt.Errorf("fleet file %s has no environment endpoint", path)
	}
	return envs[0].URL, nil
}

func runCollect(ctx context.Context, args []string, _ func(string) string, stdout, stderr io.Writer) error {
	f, err := parseCollectFlags(args, stderr)
	if err != nil {
		return err
	}
	url := f.envURL
	if f.config != "" {
		if url, err = environmentURL(f.config); err != nil {
			return err
		}
	}
	opts := collect.Options{EnvURL: url, Concurrency: f.concurrency, Limit: f.limit}
	if !f.noProgress {
		opts.Progress = stderr
	}
	c, err := collect.New(opts)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "collecting %s through %s into %s (concurrency %d)\n", f.input, url, f.output, f.concurrency)
	sum, err := c.CollectFile(ctx, f.input, f.output)
	if sum != nil {
		sum.WriteText(stdout)
	}
	if err != nil {
		return err
	}
	if sum.Failed > 0 {
		return fmt.Errorf("%d of %d rows failed (see %s)", sum.Failed, sum.Rows, sum.FailuresFile)
	}
	return nil
}
