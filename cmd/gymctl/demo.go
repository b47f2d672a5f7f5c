package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ops/collect"
	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

// demoOptions are gymctl demo's flags.
type demoOptions struct {
	// config runs the plain demo on a fixed-port fleet file (no
	// checkpoint); empty runs the crash demo on a generated fleet.
	config      string
	input       string
	concurrency int
	binDir      string
	dir         string
	keep        bool
	noProgress  bool
	// Pacing of fakeinference in the crash demo: slow enough that the
	// checkpoint finds most rows in flight.
	tokensPerSecond float64
	minCallSeconds  float64
}

func parseDemoFlags(args []string, stderr io.Writer) (demoOptions, error) {
	var o demoOptions
	fs := newFlagSet("demo", stderr)
	fs.StringVar(&o.config, "config", "", "run the plain demo (no checkpoint) on this fleet file instead of the crash demo")
	fs.StringVar(&o.input, "input", "data/demo.jsonl", "dataset to collect")
	fs.IntVar(&o.concurrency, "concurrency", 72, "rows in flight at once")
	fs.StringVar(&o.binDir, "bin-dir", "", "server binaries of the generated fleet (default: gymctl's own directory)")
	fs.StringVar(&o.dir, "dir", "", "directory for the generated fleet, checkpoints and results (default: a temporary one, removed unless the demo fails or --keep)")
	fs.BoolVar(&o.keep, "keep", false, "keep the demo directory")
	fs.BoolVar(&o.noProgress, "no-progress", false, "do not draw the progress bar")
	fs.Float64Var(&o.tokensPerSecond, "tokens-per-second", 60, "fakeinference generation pace (crash demo)")
	fs.Float64Var(&o.minCallSeconds, "min-call-seconds", 0.25, "fakeinference least seconds per model call (crash demo)")
	if err := parse(fs, args); err != nil {
		return o, err
	}
	if o.concurrency < 1 {
		return o, fmt.Errorf("demo: --concurrency %d must be at least 1", o.concurrency)
	}
	if o.tokensPerSecond < 0 || o.minCallSeconds < 0 {
		return o, errors.New("demo: --tokens-per-second and --min-call-seconds must not be negative")
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

// demoToken is the generated fleet's control token; its servers listen on
// loopback only.
const demoToken = "gymctl-demo-token"

// demo is the demo as a sequence of steps over shared state.
type demo struct {
	opts           demoOptions
	stdout, stderr io.Writer

	cfg      *fleet.Config
	launcher *fleet.Launcher
	envURL   string
	output   string
	summary  *collect.Summary

	// The crash demo's state.
	dir     string
	ckptDir string
	tempDir bool
	rows    int
	before  *collect.Summary // the run the checkpoint stopped
	ckpt    collect.CheckpointStats
	after   *collect.Summary // the resumed run
	saved   int              // model calls a restart would have made again
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
	if d.opts.config != "" {
		return []demoStep{
			{"load the fleet file", d.loadFleet},
			{"start the fleet", d.startFleet},
			{"collect the demo dataset", d.collect},
			{"report", d.report},
			{"stop the fleet", func(context.Context) error { return d.stopFleet() }},
			{"check every reward is 1.0", d.checkRewards},
		}
	}
	return []demoStep{
		{"generate a local fleet with checkpointing on", d.generateFleet},
		{"start the fleet", d.startFleet},
		{"collect until most rows are in flight, then checkpoint with stop (a preemption)", d.collectAndPreempt},
		{"crash: SIGKILL every fleet process but fakeinference", d.crash},
		{"start fresh processes", d.restart},
		{"resume the collection: restore, continue, start over the rest", d.resume},
		{"count the model calls the restore saved", d.countSaved},
		{"stop the fleet", func(context.Context) error { return d.stopFleet() }},
		{"report", d.crashReport},
		{"check every row is written once with reward 1.0", d.checkOutput},
	}
}

// run runs the steps in order and always stops the fleet, whatever step
// failed.
func (d *demo) run(ctx context.Context) (err error) {
	defer func() {
		if stopErr := d.stopFleet(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
		d.cleanup(err)
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

// cleanup removes a temporary demo directory after a success.
func (d *demo) cleanup(err error) {
	if d.dir == "" {
		return
	}
	if err == nil && d.tempDir && !d.opts.keep {
		_ = os.RemoveAll(d.dir)
		return
	}
	fmt.Fprintf(d.stdout, "demo files (fleet configs, logs, checkpoints, results) are in %s\n", d.dir)
}

// httpConf is the http: section the demo's clients speak: the fleet
// file's stack (the generated fleet's is the default) and CA.
func (d *demo) httpConf() httpconf.Config {
	return httpconf.Config{Stack: d.cfg.HTTP.Stack, TLS: httpconf.TLS{CAFile: d.cfg.HTTP.Conf(d.cfg.BaseDir).TLS.CAFile}}
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
	d.launcher = fleet.NewLauncher(d.cfg, fleet.Options{StopGrace: 5 * time.Second})
	if err := d.launcher.StartAll(ctx); err != nil {
		return err
	}
	for _, e := range d.cfg.Endpoints("") {
		fmt.Fprintf(d.stdout, "      %-21s %-13s %s\n", e.Name, e.Kind, e.URL)
	}
	return nil
}

func (d *demo) collect(ctx context.Context) error {
	opts := collect.Options{EnvURL: d.envURL, Concurrency: d.opts.concurrency, HTTP: d.httpConf()}
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

// The crash demo.

func (d *demo) generateFleet(context.Context) error {
	input, err := filepath.Abs(d.opts.input)
	if err != nil {
		return err
	}
	if _, err := os.Stat(input); err != nil {
		return fmt.Errorf("demo dataset: %w", err)
	}
	d.opts.input = input
	binDir := d.opts.binDir
	if binDir == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("finding gymctl's directory (give --bin-dir): %w", err)
		}
		if exe, err = filepath.EvalSymlinks(exe); err != nil {
			return err
		}
		binDir = filepath.Dir(exe)
	}
	if binDir, err = filepath.Abs(binDir); err != nil {
		return err
	}
	if d.opts.dir != "" {
		if d.dir, err = filepath.Abs(d.opts.dir); err != nil {
			return err
		}
		if err := os.MkdirAll(d.dir, 0o755); err != nil {
			return err
		}
	} else {
		if d.dir, err = os.MkdirTemp("", "gymfleet-demo-"); err != nil {
			return err
		}
		d.tempDir = true
	}
	topo := fleet.Standard(filepath.Join(d.dir, "fleet"), binDir, demoToken)
	topo.TokensPerSecond, topo.MinCallSeconds, topo.LogLevel = d.opts.tokensPerSecond, d.opts.minCallSeconds, "warn"
	topo.CheckpointRoot = filepath.Join(d.dir, "checkpoints")
	if d.cfg, err = fleet.Generate(topo); err != nil {
		return err
	}
	env, _ := d.cfg.Endpoint("env")
	d.envURL = env.URL
	d.ckptDir = d.cfg.Checkpoint.Root
	d.output = filepath.Join(d.dir, "results.jsonl")
	fmt.Fprintf(d.stdout, "      %d processes, binaries from %s, files in %s\n", len(d.cfg.Processes), binDir, d.dir)
	return nil
}

// collectOptions are the crash demo's collector options; the fleet is
// reached through its endpoints and control token, as gymctl collect
// --config does.
func (d *demo) collectOptions(resume bool) collect.Options {
	opts := collect.Options{
		EnvURL: d.envURL, Concurrency: d.opts.concurrency, HTTP: d.httpConf(),
		Fleet:       &collect.FleetControl{Endpoints: fleetEndpoints(d.cfg), Token: demoToken},
		Checkpoints: &collect.CheckpointOptions{Dir: d.ckptDir, Timeout: 30 * time.Second, Resume: resume},
		Notices:     prefixWriter{w: d.stdout, prefix: "      "},
	}
	if !d.opts.noProgress {
		opts.Progress = d.stderr
	}
	return opts
}

// collectAndPreempt collects until a few rows have finished, the rest being
// in flight, and takes a checkpoint with stop, as SIGTERM would.
func (d *demo) collectAndPreempt(ctx context.Context) error {
	c, err := collect.New(d.collectOptions(false))
	if err != nil {
		return err
	}
	coll, err := c.Open(ctx, d.opts.input, d.output)
	if err != nil {
		return err
	}
	type runResult struct {
		sum *collect.Summary
		err error
	}
	ran := make(chan runResult, 1)
	go func() {
		sum, err := coll.Run(ctx)
		ran <- runResult{sum, err}
	}()
	// A handful of rows finished, the others in flight: the moment a
	// preemption notice would find a busy collection.
	p := coll.Progress()
	d.rows = p.Rows
	trigger := max(1, p.Rows/16)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(time.Minute)
	for p.Finished < trigger {
		select {
		case res := <-ran:
			return fmt.Errorf("the collection ended before the checkpoint (%d rows finished): %v", res.sum.Succeeded+res.sum.Failed, res.err)
		case <-deadline:
			return fmt.Errorf("only %d rows finished in a minute", p.Finished)
		case <-tick.C:
		}
		p = coll.Progress()
	}
	d.ckpt, err = coll.Checkpoint(ctx, true)
	res := <-ran
	d.before = res.sum
	if err != nil {
		return fmt.Errorf("the checkpoint: %w", err)
	}
	if !errors.Is(res.err, collect.ErrStopped) {
		return fmt.Errorf("the collection did not stop at the checkpoint: %v", res.err)
	}
	fmt.Fprintf(d.stdout, "      %d rows finished before the checkpoint, %d in flight were exported by the environment\n",
		d.before.Succeeded+d.before.Failed, len(d.ckpt.Continued))
	return nil
}

func (d *demo) crash(context.Context) error {
	for _, name := range d.cfg.Names() {
		if name == "fakeinference" {
			continue
		}
		if err := d.launcher.Kill(name); err != nil {
			return err
		}
	}
	return nil
}

func (d *demo) restart(ctx context.Context) error {
	for _, name := range d.cfg.Names() {
		if name == "fakeinference" {
			continue
		}
		if err := d.launcher.Start(ctx, name); err != nil {
			return err
		}
	}
	return nil
}

func (d *demo) resume(ctx context.Context) error {
	c, err := collect.New(d.collectOptions(true))
	if err != nil {
		return err
	}
	d.after, err = c.CollectFile(ctx, d.opts.input, d.output)
	return err
}

// countSaved counts, over the continued rows, the model calls imported
// into the replacement attempt's ledger from before the crash (rows whose
// capture_key names the earlier attempt): calls a restart would have made
// again.
func (d *demo) countSaved(ctx context.Context) error {
	if d.after == nil || d.after.Restore == nil || !d.after.Restore.Restored {
		return nil
	}
	model, ok := d.cfg.Endpoint("policy_model")
	if !ok {
		return errors.New("the fleet has no policy_model endpoint")
	}
	client := httpclient.New(httpclient.Options{H2C: true, HTTP: d.httpConf()})
	defer client.CloseIdleConnections()
	for _, e := range d.after.Restore.Continued {
		var m struct {
			Records []struct {
				CaptureKey string `json:"capture_key"`
			} `json:"records"`
		}
		key := e.Next().CaptureKey()
		if _, err := httpclient.GetJSON(ctx, client, model.URL+"/capture/rollouts/"+key+"/manifest", nil, &m); err != nil {
			return fmt.Errorf("the ledger of %s: %w", key, err)
		}
		for _, rec := range m.Records {
			if rec.CaptureKey != key {
				d.saved++
			}
		}
	}
	return nil
}

func (d *demo) crashReport(context.Context) error {
	if d.before == nil || d.after == nil {
		return errors.New("the collection did not run to the end")
	}
	rs := d.after.Restore
	tw := tabwriter.NewWriter(d.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "")
	fmt.Fprintf(tw, "rows in the dataset\t%d\n", d.rows)
	fmt.Fprintf(tw, "finished before the checkpoint\t%d\n", d.before.Succeeded+d.before.Failed)
	fmt.Fprintf(tw, "in flight at the checkpoint\t%d\n", d.ckpt.InFlight)
	fmt.Fprintf(tw, "continued after the crash\t%d\n", d.after.Continued)
	fmt.Fprintf(tw, "restarted after the crash\t%d\n", d.after.Restarted)
	fmt.Fprintf(tw, "not sent before the checkpoint\t%d\n", d.after.Rows-d.after.Continued-d.after.Restarted)
	fmt.Fprintf(tw, "finished after the restore\t%d\n", d.after.Succeeded+d.after.Failed)
	fmt.Fprintf(tw, "rewards\t%s\n", rewardText(d.before, d.after))
	fmt.Fprintf(tw, "model calls saved vs starting over\t%d (delivered before the crash, imported into the continued attempts' ledgers)\n", d.saved)
	fmt.Fprintf(tw, "checkpoint\t%s\n", d.ckpt.ID)
	for _, s := range d.ckpt.PrepareStages {
		fmt.Fprintf(tw, "  prepare %s\t%.3fs\n", s.Kind, s.Duration.Seconds())
	}
	fmt.Fprintf(tw, "  prepare (all stages)\t%.3fs\n", d.ckpt.Prepare.Seconds())
	fmt.Fprintf(tw, "  commit\t%.3fs\n", d.ckpt.Commit.Seconds())
	fmt.Fprintf(tw, "  publish (collection.json, LATEST)\t%.3fs\n", d.ckpt.Publish.Seconds())
	if rs != nil {
		state := fmt.Sprintf("%.3fs", rs.Duration.Seconds())
		if !rs.Restored {
			state = "failed: " + rs.Error
		}
		fmt.Fprintf(tw, "  restore (%d rows)\t%s\n", rs.Rows, state)
	}
	fmt.Fprintf(tw, "wall time before / after the crash\t%s / %s\n", d.before.Wall.Round(time.Millisecond), d.after.Wall.Round(time.Millisecond))
	return tw.Flush()
}

func rewardText(sums ...*collect.Summary) string {
	counts := map[float64]int{}
	for _, s := range sums {
		for _, rc := range s.Rewards.Distribution {
			counts[rc.Reward] += rc.Count
		}
	}
	keys := make([]float64, 0, len(counts))
	for r := range counts {
		keys = append(keys, r)
	}
	sort.Float64s(keys)
	parts := make([]string, len(keys))
	for i, r := range keys {
		parts[i] = fmt.Sprintf("%g × %d", r, counts[r])
	}
	return strings.Join(parts, ", ")
}

// checkOutput reads the results file: every dataset row exactly once, each
// with reward 1.0.
func (d *demo) checkOutput(context.Context) error {
	f, err := os.Open(d.output)
	if err != nil {
		return err
	}
	defer f.Close()
	seen := map[string]int{}
	var bad []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, collect.MaxLineBytes)
	for sc.Scan() {
		var row struct {
			RolloutID string   `json:"_ng_rollout_id"`
			Reward    *float64 `json:"reward"`
		}
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			return fmt.Errorf("%s: %w", d.output, err)
		}
		seen[row.RolloutID]++
		if row.Reward == nil || *row.Reward != 1 {
			bad = append(bad, row.RolloutID)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	var twice []string
	for id, n := range seen {
		if n > 1 {
			twice = append(twice, id)
		}
	}
	sort.Strings(twice)
	switch {
	case len(twice) > 0:
		return fmt.Errorf("rows written more than once: %v", twice)
	case len(seen) != d.rows:
		return fmt.Errorf("%d rows in %s, want %d", len(seen), d.output, d.rows)
	case len(bad) > 0:
		return fmt.Errorf("rows without reward 1.0: %v", bad)
	}
	fmt.Fprintf(d.stdout, "      all %d rows are in %s exactly once, every reward 1.0\n", d.rows, filepath.Base(d.output))
	return nil
}

// prefixWriter indents each line written to it (the collector's notices
// under a demo step).
type prefixWriter struct {
	w      io.Writer
	prefix string
}

func (p prefixWriter) Write(b []byte) (int, error) {
	lines := strings.SplitAfter(string(b), "\n")
	var sb strings.Builder
	for _, l := range lines {
		if l != "" {
			sb.WriteString(p.prefix + l)
		}
	}
	if _, err := io.WriteString(p.w, sb.String()); err != nil {
		return 0, err
	}
	return len(b), nil
}
