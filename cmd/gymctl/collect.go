package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/infra/logging"
	"github.com/gymfleet/gymfleet/pkg/ops/collect"
	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

// collectFlags are gymctl collect's flags.
type collectFlags struct {
	envURL       string
	config       string
	token        string
	input        string
	output       string
	concurrency  int
	limit        int
	maxAttempts  int
	skipBadLines bool
	noProgress   bool

	checkpointDir     string
	stateDir          string
	checkpointEvery   time.Duration
	checkpointTimeout time.Duration
	resume            bool
}

func parseCollectFlags(args []string, stderr io.Writer) (collectFlags, error) {
	var f collectFlags
	fs := newFlagSet("collect", stderr)
	fs.StringVar(&f.envURL, "env-url", "", "environment server base URL")
	fs.StringVar(&f.config, "config", "", "fleet file; its first environment endpoint is used (instead of --env-url), and its endpoints and control token drive retires and checkpoints")
	fs.StringVar(&f.token, "token", "", "control token (default: the fleet file's, or GYMFLEET_CHECKPOINT_CONTROL_AUTH_TOKEN)")
	fs.StringVar(&f.input, "input", "", "input JSONL dataset (NeMo Gym rows)")
	fs.StringVar(&f.output, "output", "", "output JSONL; failed rows go to <stem>_failures.jsonl")
	fs.IntVar(&f.concurrency, "concurrency", collect.DefaultConcurrency, "rows in flight at once")
	fs.IntVar(&f.limit, "limit", 0, "run only the first K valid rows (0: all)")
	fs.IntVar(&f.maxAttempts, "max-attempts", collect.DefaultMaxAttempts, "attempts of a row whose /run gets no reply before it fails")
	fs.BoolVar(&f.skipBadLines, "skip-bad-lines", false, "run the valid rows of an input with bad lines (default: refuse it before sending anything)")
	fs.BoolVar(&f.noProgress, "no-progress", false, "do not draw the progress bar")
	fs.StringVar(&f.checkpointDir, "checkpoint-dir", "", "checkpoint the collection into this directory, or s3://bucket/prefix with --state-dir (needs --config with checkpointing on): SIGUSR1 checkpoints and continues, SIGTERM checkpoints and exits 75")
	fs.DurationVar(&f.checkpointEvery, "checkpoint-every", 0, "also checkpoint this often while rows are in flight (0: never)")
	fs.DurationVar(&f.checkpointTimeout, "checkpoint-timeout", collect.DefaultCheckpointTimeout, "deadline of a checkpoint's prepare and commit, and of a restore")
	fs.StringVar(&f.stateDir, "state-dir", "", "local directory of the collector's own state (dispatch log, collection.json, LATEST); required when --checkpoint-dir is s3://, where only the servers' records go; --resume needs the same one")
	fs.BoolVar(&f.resume, "resume", false, "continue the previous run of --checkpoint-dir: keep the rows in --output, restore LATEST, start the other rows it sent over")
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
	case f.maxAttempts < 1:
		return f, fmt.Errorf("collect: --max-attempts %d must be at least 1", f.maxAttempts)
	case f.input == f.output:
		return f, errors.New("collect: --output must differ from --input")
	case f.checkpointDir != "" && f.config == "":
		return f, errors.New("collect: --checkpoint-dir needs --config: checkpoints drive every server of the fleet file, not just --env-url")
	case f.checkpointDir == "" && (f.resume || f.checkpointEvery != 0):
		return f, errors.New("collect: --resume and --checkpoint-every need --checkpoint-dir")
	case f.stateDir != "" && f.checkpointDir == "":
		return f, errors.New("collect: --state-dir needs --checkpoint-dir")
	case ckptstore.IsS3(f.checkpointDir) && f.stateDir == "":
		return f, fmt.Errorf("collect: --checkpoint-dir %s is in an object store, so collect needs --state-dir: a local directory for its dispatch log, collection.json and LATEST, which --resume reads", f.checkpointDir)
	case ckptstore.IsS3(f.stateDir):
		return f, fmt.Errorf("collect: --state-dir %s must be a local directory, not s3://", f.stateDir)
	case f.checkpointEvery < 0 || f.checkpointTimeout <= 0:
		return f, fmt.Errorf("collect: --checkpoint-every %v must not be negative and --checkpoint-timeout %v must be positive", f.checkpointEvery, f.checkpointTimeout)
	}
	return f, nil
}

// environmentURL is the first environment endpoint of a fleet file.
func environmentURL(cfg *fleet.Config, path string) (string, error) {
	envs := cfg.Endpoints(fleet.KindEnvironment)
	if len(envs) == 0 {
		return "", fmt.Errorf("fleet file %s has no environment endpoint", path)
	}
	return envs[0].URL, nil
}

// fleetHTTP is the http: section gymctl's clients to a fleet speak: the
// fleet file's http.stack, else GYMFLEET_HTTP_STACK (the variable the
// servers read), else the default (lean); and the CA https:// endpoints
// are verified against, the fleet file's http.tls.ca_file, else
// GYMFLEET_HTTP_TLS_CA_FILE. cfg may be nil (no fleet file).
func fleetHTTP(cfg *fleet.Config, getenv func(string) string) (httpconf.Config, error) {
	hc := httpconf.Config{Stack: httpconf.Stack(getenv("GYMFLEET_HTTP_STACK"))}
	hc.TLS.CAFile = getenv("GYMFLEET_HTTP_TLS_CA_FILE")
	if cfg != nil && cfg.HTTP.Stack != "" {
		hc.Stack = cfg.HTTP.Stack
	}
	if cfg != nil && cfg.HTTP.TLS.CAFile != "" {
		hc.TLS.CAFile = cfg.HTTP.Conf(cfg.BaseDir).TLS.CAFile
	}
	if err := (httpconf.Config{Stack: hc.Stack}).Validate(); err != nil {
		return hc, fmt.Errorf("GYMFLEET_HTTP_STACK: %w", err)
	}
	if err := hc.Validate(); err != nil {
		return hc, fmt.Errorf("the fleet file's http.tls.ca_file or GYMFLEET_HTTP_TLS_CA_FILE: %w", err)
	}
	return hc, nil
}

// fleetEndpoints lists every endpoint of the fleet for discovery.
func fleetEndpoints(cfg *fleet.Config) []coordination.Endpoint {
	var eps []coordination.Endpoint
	for _, e := range cfg.Endpoints("") {
		eps = append(eps, coordination.Endpoint{Name: e.Name, URL: e.URL})
	}
	return eps
}

// collectOptions builds the collector's options from the flags.
func collectOptions(f collectFlags, getenv func(string) string, stdout, stderr io.Writer) (collect.Options, error) {
	opts := collect.Options{
		EnvURL: f.envURL, Concurrency: f.concurrency, Limit: f.limit, MaxAttempts: f.maxAttempts,
		SkipBadLines: f.skipBadLines, Notices: stdout, Logger: logging.New(stderr, slog.LevelWarn, "gymctl", "collect"),
	}
	if !f.noProgress {
		opts.Progress = stderr
		// The bar redraws with carriage returns, which a log keeps.
		opts.PlainProgress = !isTerminal(stderr)
	}
	var cfg *fleet.Config
	if f.config != "" {
		var err error
		if cfg, err = fleet.Load(f.config); err != nil {
			return opts, err
		}
	}
	var err error
	if opts.HTTP, err = fleetHTTP(cfg, getenv); err != nil || cfg == nil {
		return opts, err
	}
	if opts.EnvURL, err = environmentURL(cfg, f.config); err != nil {
		return opts, err
	}
	// Rows spread over every environment replica of the fleet file.
	for _, e := range cfg.Endpoints(fleet.KindEnvironment) {
		opts.EnvURLs = append(opts.EnvURLs, e.URL)
	}
	token := f.token
	if token == "" {
		token = cfg.Checkpoint.ControlAuthToken
	}
	if token == "" {
		token = getenv("GYMFLEET_CHECKPOINT_CONTROL_AUTH_TOKEN")
	}
	if cfg.Checkpoint.Enabled && token != "" {
		opts.Fleet = &collect.FleetControl{Endpoints: fleetEndpoints(cfg), Token: token}
	}
	if f.checkpointDir == "" {
		return opts, nil
	}
	switch {
	case !cfg.Checkpoint.Enabled:
		return opts, fmt.Errorf("collect: --checkpoint-dir needs a fleet with checkpointing on, and %s has checkpoint.enabled false", f.config)
	case token == "":
		return opts, errors.New("collect: --checkpoint-dir needs the control token: checkpoint.control_auth_token in the fleet file, --token or GYMFLEET_CHECKPOINT_CONTROL_AUTH_TOKEN")
	}
	dir, err := checkpointDir(cfg, f.checkpointDir)
	if err != nil {
		return opts, fmt.Errorf("collect: %w", err)
	}
	opts.Checkpoints = &collect.CheckpointOptions{Dir: dir, StateDir: f.stateDir, Timeout: f.checkpointTimeout, Every: f.checkpointEvery, Resume: f.resume}
	return opts, nil
}

func runCollect(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f, err := parseCollectFlags(args, stderr)
	if err != nil {
		return err
	}
	opts, err := collectOptions(f, getenv, stdout, stderr)
	if err != nil {
		return err
	}
	tp, err := newTracer(ctx, getenv)
	if err != nil {
		return err
	}
	defer shutdownTracer(tp)
	opts.Tracer = tp
	c, err := collect.New(opts)
	if err != nil {
		return err
	}
	runCtx := ctx
	var watch func(*collect.Collection) (stop func())
	if opts.Checkpoints != nil {
		// SIGTERM must checkpoint, not cancel: the collection runs on a
		// context of its own, cancelled only by an interrupt (or the
		// caller), and SIGUSR1/SIGTERM become checkpoint requests.
		sigs := make(chan os.Signal, 4)
		signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGTERM)
		defer signal.Stop(sigs)
		workCtx, cancelWork := context.WithCancelCause(context.WithoutCancel(ctx))
		defer cancelWork(nil)
		runCtx = workCtx
		watch = func(coll *collect.Collection) func() {
			return watchSignals(ctx, sigs, coll, cancelWork)
		}
	}
	fmt.Fprintf(stdout, "collecting %s through %s into %s (concurrency %d)\n", f.input, opts.EnvURL, f.output, f.concurrency)
	coll, err := c.Open(runCtx, f.input, f.output)
	if err != nil {
		return err
	}
	if watch != nil {
		stop := watch(coll)
		defer stop()
	}
	sum, err := coll.Run(runCtx)
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

// watchSignals turns SIGUSR1 into a checkpoint and SIGTERM into a
// preemption checkpoint; the end of ctx stops the collection, unless
// SIGTERM ended it (main's signal context sees SIGTERM too). The returned
// function stops the watcher and waits for it.
func watchSignals(ctx context.Context, sigs <-chan os.Signal, coll *collect.Collection, cancel context.CancelCauseFunc) func() {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		ctxDone := ctx.Done()
		for {
			select {
			case <-done:
				return
			case s := <-sigs:
				coll.RequestCheckpoint(s == syscall.SIGTERM)
			case <-ctxDone:
				ctxDone = nil
				if cause := context.Cause(ctx); isTerminate(cause) {
					coll.RequestCheckpoint(true)
				} else {
					cancel(cause)
				}
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// isTerminate reports whether a signal.NotifyContext cause is SIGTERM.
func isTerminate(cause error) bool {
	return cause != nil && strings.Contains(cause.Error(), syscall.SIGTERM.String())
}
