// Package scalebench is the scale benchmark of the checkpoint path (SPEC §8,
// issue 6): it starts the fleet as real processes, puts N weather rollouts
// in flight, holds every one at its second model call, checkpoints stage by
// stage, commits, kills every fleet process, restores into fresh processes,
// resumes, releases the calls and waits for every replacement to finish. It
// asserts the controller contract on the way and measures each phase, the
// checkpoint's size, and every process's peak memory and descriptors.
//
// gymctl bench-scale runs it from the command line; tests/e2e runs it at
// 1,000 rollouts as a correctness check.
package scalebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/procfs"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference/fiwire"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/wire/control"
	"github.com/gymfleet/gymfleet/pkg/wire/replica"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Names of the bench's fleet: one weather resources server, one agent, one
// environment route, as the generated topology calls them.
const (
	fakeName     = "fakeinference"
	envName      = "env"
	agentName    = "weather_agent"
	resourceName = "weather"
	// checkpointID names the one checkpoint the bench takes.
	checkpointID = "bench"
	// keptLabel is fakeinference's fleet label: it survives the crash.
	keptLabel = "kept"
	// controlToken is the fleet's control token (a throwaway local fleet).
	controlToken = "scalebench-control-token"
)

// Timeouts of the control calls. Generous on purpose: the bench measures
// how long they take, it never wants one cut short.
const (
	controlDeadline = 10 * time.Minute
	readyTimeout    = 2 * time.Minute
	pollInterval    = 25 * time.Millisecond
	progressEvery   = 5 * time.Second
)

// Options configure a run.
type Options struct {
	// Rollouts is how many rollouts are in flight at the checkpoint (N).
	Rollouts int
	// BinDir holds the server binaries (fakeinference, modelserver,
	// resourceserver, agentserver, envserver).
	BinDir string
	// Dir is the work directory: fleet/ (configurations, logs, capture),
	// ckpt/ (the checkpoint) and profiles/. Empty means a new temporary
	// directory.
	Dir string
	// Keep keeps fleet/ and ckpt/ after a successful run (a failed run
	// always keeps them, for its logs).
	Keep bool
	// Profile writes CPU profiles of every server and of the bench taken
	// during prepare, commit and restore (and one during the dispatch, once
	// half the rollouts are held), and heap profiles of both fleets, into
	// Dir/profiles (kept whatever Keep says). The fleet then runs with its
	// pprof key on.
	Profile bool
	// ProfileSeconds is the length of each CPU profile; 0 means
	// DefaultProfileSeconds(Rollouts). A phase longer than it is profiled
	// only for its first ProfileSeconds.
	ProfileSeconds int
	// MaxRSSBytes aborts the run when the resident memory of the fleet and
	// the bench together passes it; 0 means no limit.
	MaxRSSBytes uint64
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// Stack is the HTTP stack of every server of the fleet and of the
	// bench's own clients (empty: the default, lean).
	Stack httpconf.Stack
	// S3Root, when set (s3://bucket/prefix), is where the fleet
	// checkpoints instead of Dir/ckpt: every server's checkpoint.root,
	// the checkpoint beneath it under a run's own prefix. S3 says how to
	// reach the store; credentials come from the AWS environment, which
	// the servers inherit.
	S3Root string
	S3     ckptstore.S3Options
	// Tuning is every server's runtime.tuning (empty: the servers'
	// default), to compare a fleet steering the Go runtime with one on
	// Go's own behaviour.
	Tuning runtimetune.Mode
	// Replicas is how many processes of each participant kind the fleet
	// runs (0 means 1): rollouts are spread over the environment replicas
	// by replica.Pick, as gymctl collect spreads rows.
	Replicas int
	// Ports chooses the fleet's ports (nil: the kernel's free ports).
	Ports fleet.PortSource
}

// DefaultProfileSeconds is a CPU profile window long enough for the
// prepare, commit and restore of n rollouts on a small machine.
func DefaultProfileSeconds(n int) int { return 3 + n/5000 }

// stallTimeout fails the waits whose length grows with the rollout count
// (the boundary, the replacements) when nothing moves for this long: a
// slow fleet is a figure, a stuck one an error.
const stallTimeout = 2 * time.Minute

// originalsTimeout bounds the wait for the original /run calls to fail
// once the crash cut their connections.
const originalsTimeout = 2 * time.Minute

// Run runs the bench. It returns the result measured so far together with
// any error, so a failed run still reports how far it got. A violation of
// the controller contract is an error.
func Run(ctx context.Context, opts Options) (*Result, error) {
	if opts.Rollouts < 1 {
		return nil, fmt.Errorf("rollouts must be at least 1, got %d", opts.Rollouts)
	}
	if opts.BinDir == "" {
		return nil, errors.New("the directory of the server binaries is not set")
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	if opts.ProfileSeconds <= 0 {
		opts.ProfileSeconds = DefaultProfileSeconds(opts.Rollouts)
	}
	binDir, err := filepath.Abs(opts.BinDir)
	if err != nil {
		return nil, err
	}
	tempDir := opts.Dir == ""
	if tempDir {
		if opts.Dir, err = os.MkdirTemp("", "gymfleet-bench-scale-"); err != nil {
			return nil, err
		}
	}
	if opts.Dir, err = filepath.Abs(opts.Dir); err != nil {
		return nil, err
	}
	if !tempDir {
		if err := unused(opts.Dir); err != nil {
			return nil, err
		}
	}
	b := &bench{
		opts:   opts,
		binDir: binDir,
		res:    newResult(opts),
		log:    opts.Log,

		fleetLabel: "first",
		statsTaken: map[string]bool{},
	}
	runErr := b.run(ctx)
	if b.sampler != nil {
		b.res.Bench = benchStats(b.sampler)
	}
	if b.cfg != nil {
		b.summarizeLogs()
	}
	if runErr != nil {
		b.res.Error = runErr.Error()
	}
	b.res.Violations = b.violations
	b.res.ProcessKinds = b.res.KindSums()
	if runErr == nil && len(b.violations) > 0 {
		runErr = fmt.Errorf("the controller contract was violated: %s", strings.Join(b.violations, "; "))
	}
	b.cleanup(runErr, tempDir)
	return b.res, runErr
}

// bench is one run's state.
type bench struct {
	opts   Options
	binDir string
	res    *Result
	log    io.Writer

	topo fleet.Topology
	cfg  *fleet.Config
	// s3 is the object store checkpointed to; nil on the local disk.
	s3       *ckptstore.S3
	launcher *fleet.Launcher
	fake     *fiwire.Control
	// envURLs are the environment replicas' base URLs, replica i at i.
	envURLs []string
	ckptDir string
	// client carries every /run, one h2c pool for all of them.
	client *http.Client
	// ctl carries fakeinference control calls and profile requests.
	ctl      *http.Client
	sampler  *sampler
	profiler *profiler
	// atBoundary is each server's runtime figures with every rollout held.
	atBoundary map[string]runtimeStat
	// recordFileSizes are the committed records files' sizes, in the
	// order the participants were listed: the disk floor writes the same.
	recordFileSizes []int64
	// fleetLabel names the fleet running now ("first", then "fresh");
	// statsTaken records whose process figures are in the result.
	fleetLabel string
	statsTaken map[string]bool

	mu         sync.Mutex
	violations []string
}

// pauseBenchGC quiets the bench's own process for a timed phase, as
// testing.B collects before it times: a collection now, then none until the
// returned function is called after the phase. The bench holds a goroutine
// per rollout it dispatched, so a collection its own allocations started
// inside a phase marked every one of those stacks on the two cores the
// fleet is timed on, and after a collection the runtime's scavenger
// returned the freed memory to the kernel during the phase. A phase is one control call whose replies are
// a few megabytes, so the heap it grows by meanwhile is small.
func pauseBenchGC() (resume func()) {
	runtime.GC()
	percent := debug.SetGCPercent(-1)
	return func() { debug.SetGCPercent(percent) }
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "bench-scale: "+format+"\n", args...)
}

// violate records a breach of the controller contract.
func (b *bench) violate(format string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.violations = append(b.violations, fmt.Sprintf(format, args...))
}

func (b *bench) run(parent context.Context) (runErr error) {
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	// When the run was aborted (a process exited, memory passed the
	// limit), the abort's reason is the error, not the call it cut short.
	defer func() {
		if runErr != nil && ctx.Err() != nil {
			if cause := context.Cause(ctx); !errors.Is(runErr, cause) {
				runErr = fmt.Errorf("%w (then: %v)", cause, runErr)
			}
		}
	}()
	n := b.opts.Rollouts

	if err := b.startFleet(ctx); err != nil {
		return err
	}
	defer func() { _ = b.launcher.KillAll() }()
	// A failed run still reports the memory of the fleet it failed in.
	defer func() {
		if runErr != nil && b.sampler != nil && !b.statsTaken[b.fleetLabel] {
			b.res.Processes = append(b.res.Processes, b.processStats(b.fleetLabel, false)...)
		}
	}()
	b.client = httpclient.New(httpclient.Options{H2C: true, HTTP: b.httpConf()})
	defer b.client.CloseIdleConnections()
	b.ctl = httpclient.New(httpclient.Options{H2C: true, MaxConnsPerHost: 16, HTTP: b.httpConf()})
	defer b.ctl.CloseIdleConnections()
	b.fake = fiwire.NewControl(b.url(fakeName), b.ctl)
	b.profiler = newProfiler(b, filepath.Join(b.opts.Dir, "profiles"))

	b.sampler = newSampler(b.opts.MaxRSSBytes, func(err error) { cancel(err) })
	defer b.sampler.stop()
	b.sampler.track(b.processes("first"))
	stopWatch := b.watchFleet(ctx, cancel)
	defer func() { stopWatch() }()

	// Every rollout's first call returns, its second is held: all N are
	// then in flight at the same boundary.
	if _, err := b.fake.HoldAfterCallsPerRollout(ctx, 1); err != nil {
		return fmt.Errorf("placing the per-rollout hold: %w", err)
	}
	rows := weatherRows(n)
	if err := b.warm(ctx); err != nil {
		return err
	}
	b.logf("dispatching %d rollouts", n)
	// The dispatch's CPU is the fleet's cost of running the rollouts to
	// their second call: what a trainer pays on every step.
	dispatchCPU := b.snapshotCPU()
	dispatchGC := b.snapshotGC(ctx)
	originals := dispatch(ctx, b.client, runRouter(b.envURLs), rows, 0)
	defer originals.close()
	if err := b.awaitBoundary(ctx, originals); err != nil {
		return err
	}
	pc := dispatchCPU.since("dispatch", b.snapshotCPU())
	pc.GCCycles, pc.AllocBytes = dispatchGC.since(b.snapshotGC(ctx))
	b.res.PhaseCPU = append(b.res.PhaseCPU, pc)
	b.sampler.markBoundary()
	b.atBoundary = b.readRuntimeStats(ctx)
	// What each held rollout keeps alive, with the dispatch's garbage
	// collected (profiled runs only: a collection per server).
	b.profiler.heap(ctx, "boundary")

	coord, err := b.discover(ctx)
	if err != nil {
		return err
	}
	scope := make([]rollout.EpisodeID, n)
	for i, r := range rows {
		scope[i] = rollout.EpisodeID{RolloutID: r.id}
	}

	// Prepare, stage by stage; every stage must be prepared.
	b.logf("preparing")
	var prep *coordination.PrepareResult
	err = b.timedPhase(ctx, "prepare", &b.res.Prepare.Seconds, func() (err error) {
		prep, err = coord.Prepare(ctx, checkpointID, time.Now().Add(controlDeadline))
		return err
	})
	if err != nil {
		b.recordPrepare(prep)
		return fmt.Errorf("prepare: %w", err)
	}
	b.recordPrepare(prep)
	if !prep.Prepared {
		return fmt.Errorf("prepare did not prepare every stage; blockers by server: %v", prep.Blockers())
	}
	if got := originals.replied(); got > 0 {
		b.violate("%d original /run replied before the commit: %s", got, originals.example())
	}

	// Commit the whole scope.
	b.logf("committing %d episodes", n)
	var cm *coordination.CommitResult
	err = b.timedPhase(ctx, "commit", &b.res.Commit.Seconds, func() (err error) {
		cm, err = coord.Commit(ctx, checkpointID, b.ckptDir, scope, time.Now().Add(controlDeadline), false)
		return err
	})
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if err := b.recordCommit(ctx, coord, cm); err != nil {
		return err
	}
	continued := b.checkExported(cm, rows)
	if err := b.measureDiskFloor(); err != nil {
		return fmt.Errorf("measuring the disk's floor: %w", err)
	}

	// The crash: every fleet process but fakeinference, at once.
	b.sampler.markBoundary()
	b.res.Processes = append(b.res.Processes, b.processStats("first", true)...)
	b.statsTaken["first"] = true
	b.profiler.heap(ctx, "first")
	if got := originals.replied(); got > 0 {
		b.violate("%d original /run replied while the fleet was prepared: %s", got, originals.example())
	}
	stopWatch()
	b.logf("killing the fleet")
	start := time.Now()
	if err := b.kill(); err != nil {
		return err
	}
	b.client.CloseIdleConnections()
	b.ctl.CloseIdleConnections()
	if err := b.restart(ctx); err != nil {
		return err
	}
	b.res.KillToReadySeconds = seconds(time.Since(start))
	b.fleetLabel = "fresh"
	b.sampler.track(b.processes("fresh"))
	stopWatch = b.watchFleet(ctx, cancel)

	coord, err = b.discover(ctx)
	if err != nil {
		return err
	}
	b.logf("restoring %d episodes", len(continued))
	var rr *coordination.RestoreResult
	err = b.timedPhase(ctx, "restore", &b.res.RestoreSeconds, func() (err error) {
		rr, err = coord.Restore(ctx, checkpointID, b.ckptDir, continued, time.Now().Add(controlDeadline))
		return err
	})
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	b.recordRestore(coord, rr, len(continued))
	start = time.Now()
	if err := coord.Resume(ctx, checkpointID, time.Now().Add(controlDeadline)); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	b.res.ResumeSeconds = seconds(time.Since(start))
	if _, err := b.fake.Release(ctx); err != nil {
		return fmt.Errorf("releasing the held calls: %w", err)
	}

	// Every original /run was cut off by the crash.
	if err := originals.wait(ctx, originalsTimeout); err != nil {
		return fmt.Errorf("waiting for the original /run calls to end: %w", err)
	}
	b.checkOriginals(originals)

	// The replacements: attempt 1 of every continued rollout.
	isContinued := make(map[string]bool, len(continued))
	for _, id := range continued {
		isContinued[id.RolloutID] = true
	}
	var again []row
	for _, r := range rows {
		if isContinued[r.id] {
			again = append(again, r)
		}
	}
	if err := b.warm(ctx); err != nil {
		return err
	}
	b.logf("dispatching %d replacements", len(again))
	// The first seconds of the replacements are profiled: the fresh fleet
	// continuing every restored rollout at once.
	var profileWait func()
	if b.opts.Profile {
		if profileWait, err = b.profiler.startCPU(ctx, "replacements"); err != nil {
			return err
		}
	}
	start = time.Now()
	// The same router as the originals': a replacement reaches the replica
	// that restored its episode (same replica count, same hash).
	replacements := dispatch(ctx, b.client, runRouter(b.envURLs), again, 1)
	defer replacements.close()
	if err := b.awaitReplacements(ctx, replacements); err != nil {
		return err
	}
	if profileWait != nil {
		profileWait()
	}
	b.res.ReplacementsSeconds = seconds(time.Since(start))
	b.checkReplacements(replacements)
	if err := b.awaitSessionsClosed(ctx); err != nil {
		return fmt.Errorf("waiting for the sessions to close: %w", err)
	}

	b.res.Processes = append(b.res.Processes, b.processStats("fresh", false)...)
	b.statsTaken["fresh"] = true
	b.profiler.heap(ctx, "fresh")
	stopWatch()
	return context.Cause(ctx)
}

// recordsSize is the size of a committed records file.
func (b *bench) recordsSize(ctx context.Context, dir, file string) (int64, error) {
	if b.s3 != nil {
		return b.s3.Size(ctx, dir, file)
	}
	st, err := os.Stat(filepath.Join(dir, file))
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// httpConf is the http: section of the bench's clients: the fleet's stack.
func (b *bench) httpConf() httpconf.Config { return httpconf.Config{Stack: b.opts.Stack} }

// startFleet generates the weather-only topology and starts it.
func (b *bench) startFleet(ctx context.Context) error {
	fleetDir := filepath.Join(b.opts.Dir, "fleet")
	b.ckptDir = filepath.Join(b.opts.Dir, "ckpt", checkpointID)
	root := filepath.Dir(b.ckptDir)
	if b.opts.S3Root != "" {
		// A prefix of the run's own: the bucket may hold other runs.
		root = ckptstore.JoinDir(b.opts.S3Root, "run-"+time.Now().UTC().Format("20060102T150405.000000000"))
		b.ckptDir = ckptstore.JoinDir(root, checkpointID)
		store, err := ckptstore.OpenS3(ctx, root, b.opts.S3)
		if err != nil {
			return err
		}
		b.s3 = store
		if err := store.EnsureBucket(ctx); err != nil {
			return err
		}
	}
	b.topo = benchTopology(b.opts, b.binDir, fleetDir, root)
	cfg, err := fleet.Generate(b.topo)
	if err != nil {
		return fmt.Errorf("generating the fleet: %w", err)
	}
	b.cfg = cfg
	b.launcher = fleet.NewLauncher(cfg, fleet.Options{ReadyTimeout: readyTimeout, StopGrace: 5 * time.Second})
	for _, name := range b.replicaNames(envName) {
		e, _ := cfg.Endpoint(name)
		b.envURLs = append(b.envURLs, e.URL)
	}
	b.logf("starting the fleet in %s", fleetDir)
	start := time.Now()
	if err := b.launcher.StartAll(ctx); err != nil {
		return fmt.Errorf("starting the fleet: %w", err)
	}
	b.res.FleetStartSeconds = seconds(time.Since(start))
	return nil
}

// benchTopology is the weather-only fleet the bench runs: one resources
// server, one agent and one route, each kind in opts.Replicas replicas.
// One fakeinference serves every model replica (InferenceWorkers stays 0):
// the bench holds and counts model calls through its control API, which
// sees one process's calls, and the inference stand-in survives the crash
// and is not what the bench measures.
func benchTopology(opts Options, binDir, fleetDir, root string) fleet.Topology {
	return fleet.Topology{
		Dir: fleetDir, BinDir: binDir, Token: controlToken,
		CheckpointRoot: root, S3Endpoint: opts.S3.Endpoint, S3PathStyle: opts.S3.PathStyle,
		// A whole run must never see its checkpoint reopen under it.
		LeaseGraceSeconds: 3600,
		GenerationCuts:    true,
		// No pacing: the bench measures the fleet, not the fake model.
		TokensPerSecond: 0, MinCallSeconds: 0,
		Replicas:  fleet.Each(max(opts.Replicas, 1)),
		Resources: []fleet.ResourcesSpec{{Name: resourceName, Type: "weather"}},
		Agents:    []fleet.AgentSpec{{Name: agentName, Resources: resourceName, MaxSteps: 10}},
		Routes:    []fleet.RouteSpec{{Name: agentName, Agent: agentName, Protocol: "single_agent_turn"}},
		// A line per request at 100,000 rollouts costs more than the work.
		LogLevel:      "warn",
		Pprof:         opts.Profile,
		HTTPStack:     opts.Stack,
		RuntimeTuning: opts.Tuning,
		Ports:         opts.Ports,
	}
}

// replicaNames are the instance names of a server of the bench's fleet.
func (b *bench) replicaNames(base string) []string {
	return replica.Names(base, max(b.opts.Replicas, 1))
}

// url is an endpoint's base URL.
func (b *bench) url(endpoint string) string {
	e, _ := b.cfg.Endpoint(endpoint)
	return e.URL
}

// fleetNames are the processes the crash kills: all but fakeinference,
// which survives as a real inference server would.
func (b *bench) fleetNames() []string {
	var out []string
	for _, name := range b.cfg.Names() {
		if name != fakeName {
			out = append(out, name)
		}
	}
	return out
}

// processes lists every running process of the fleet, labelled with the
// fleet it belongs to; fakeinference, which the crash spares, is "kept".
func (b *bench) processes(fleetLabel string) []target {
	var out []target
	for _, name := range b.cfg.Names() {
		label := fleetLabel
		if name == fakeName {
			label = keptLabel
		}
		if pid := b.launcher.PID(name); pid > 0 && b.launcher.Running(name) {
			out = append(out, target{name: name, fleet: label, pid: pid})
		}
	}
	return out
}

// watchFleet cancels the run when a fleet process exits on its own. The
// returned stop must be called before the bench kills the fleet itself.
func (b *bench) watchFleet(ctx context.Context, cancel context.CancelCauseFunc) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, name := range b.cfg.Names() {
		exited := b.launcher.Exited(name)
		if exited == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-exited:
				cancel(fmt.Errorf("process %s exited during the run (%v)\n--- last lines of its log ---\n%s",
					name, b.launcher.ExitErr(name), b.launcher.Logs(name)))
			case <-done:
			case <-ctx.Done():
			}
		}()
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			wg.Wait()
		})
	}
}

// awaitBoundary polls fakeinference's counters until exactly one call per
// rollout returned and every second call is held. It fails when nothing
// moves for stallTimeout. A profiled run also profiles every server once
// half the rollouts are held, the dispatch at its busiest.
func (b *bench) awaitBoundary(ctx context.Context, originals *batch) error {
	n := b.opts.Rollouts
	start := time.Now()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	lastLog := start
	var last fiwire.CallCount
	var lastSent int64
	lastMove := start
	var profileWait func()
	defer func() {
		if profileWait != nil {
			profileWait()
		}
	}()
	for {
		cc, err := b.fake.CallCount(ctx)
		if err != nil {
			return fmt.Errorf("reading fakeinference's call count: %w", err)
		}
		if sent := originals.sent.Load(); cc != last || sent != lastSent {
			last, lastSent, lastMove = cc, sent, time.Now()
		}
		if b.res.DispatchSentSeconds == 0 && originals.allSent() {
			b.res.DispatchSentSeconds = seconds(originals.sentAt.Sub(originals.start))
		}
		if cc.Returned == n && cc.Held == n {
			b.res.DispatchSeconds = seconds(time.Since(start))
			if b.res.DispatchSentSeconds == 0 && originals.allSent() {
				b.res.DispatchSentSeconds = seconds(originals.sentAt.Sub(originals.start))
			}
			b.res.InFlight = cc.Held
			b.logf("all %d rollouts at their second model call after %.2fs", n, b.res.DispatchSeconds)
			return nil
		}
		if cc.Returned > n || cc.Held > n || cc.Failed > 0 {
			return fmt.Errorf("fakeinference counted %+v before the boundary, want returned = held = %d and none failed", cc, n)
		}
		if got := originals.replied(); got > 0 {
			return fmt.Errorf("%d /run replied before every rollout reached its second model call: %s", got, originals.example())
		}
		if b.opts.Profile && profileWait == nil && cc.Held >= n/2 {
			if profileWait, err = b.profiler.startCPU(ctx, "dispatch"); err != nil {
				return err
			}
		}
		if time.Since(lastLog) >= progressEvery {
			lastLog = time.Now()
			b.logf("  %.0fs: %d /run sent, model calls received %d returned %d held %d, fleet RSS %s",
				time.Since(start).Seconds(), originals.sent.Load(), cc.Received, cc.Returned, cc.Held, mib(b.sampler.totalRSS()))
		}
		if time.Since(lastMove) > stallTimeout {
			return fmt.Errorf("the rollouts stopped moving towards their second model call: nothing changed for %v; %d /run sent, fakeinference counted %+v",
				stallTimeout, lastSent, last)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-tick.C:
		}
	}
}

// streamsPerConn is the env server's HTTP/2 MaxConcurrentStreams
// (httpserver.DefaultMaxConcurrentStreams).
// warm opens the dispatcher's first connection to the env server, so the
// burst that follows finds one whose SETTINGS (its stream limit) are known.
func (b *bench) warm(ctx context.Context) error {
	for _, u := range b.envURLs {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u+"/healthz", nil)
		if err != nil {
			return err
		}
		resp, err := b.client.Do(req)
		if err != nil {
			return fmt.Errorf("opening the dispatcher's connection to the env server %s: %w", u, err)
		}
		resp.Body.Close()
	}
	return nil
}

// discover finds the fleet's participants (fakeinference is none).
func (b *bench) discover(ctx context.Context) (*coordination.Coordinator, error) {
	var eps []coordination.Endpoint
	for _, e := range b.cfg.Endpoints("") {
		if e.Kind != fleet.KindFakeInference {
			eps = append(eps, coordination.Endpoint{Name: e.Name, URL: e.URL})
		}
	}
	c, err := coordination.Discover(ctx, eps, coordination.Options{Token: controlToken, HTTP: b.httpConf()})
	if err != nil {
		return nil, fmt.Errorf("discovering the participants: %w", err)
	}
	return c, nil
}

// timedPhase runs one timed phase: the bench's collector paused, the
// phase's wall time written to *secs (the control call alone, not the
// profiler's wait) and each process's CPU time and collections recorded.
func (b *bench) timedPhase(ctx context.Context, phase string, secs *float64, call func() error) error {
	resumeGC := pauseBenchGC()
	defer resumeGC()
	gcBefore := b.snapshotGC(ctx)
	before := b.snapshotCPU()
	err := b.profiled(ctx, phase, func() error {
		start := time.Now()
		err := call()
		*secs = seconds(time.Since(start))
		return err
	})
	pc := before.since(phase, b.snapshotCPU())
	pc.GCCycles, pc.AllocBytes = gcBefore.since(b.snapshotGC(ctx))
	b.res.PhaseCPU = append(b.res.PhaseCPU, pc)
	return err
}

// profiled runs a phase, with CPU profiles of every server around it when
// profiling is on.

func (b *bench) profiled(ctx context.Context, phase string, fn func() error) error {
	if !b.opts.Profile {
		return fn()
	}
	wait, err := b.profiler.startCPU(ctx, phase)
	if err != nil {
		return err
	}
	phaseErr := fn()
	wait()
	return phaseErr
}

func (b *bench) recordPrepare(prep *coordination.PrepareResult) {
	if prep == nil {
		return
	}
	b.res.Prepare.Prepared = prep.Prepared
	for _, s := range prep.Stages {
		st := PrepareStage{Kind: s.Kind, Seconds: seconds(s.Duration), Servers: len(s.Replies)}
		for name, rep := range s.Replies {
			if rep.Phase != control.PhasePrepared {
				st.Blockers = append(st.Blockers, fmt.Sprintf("%s: phase %s, %d blocker(s) %v", name, rep.Phase, rep.Report.BlockerCount, rep.Report.Blockers))
			}
		}
		sort.Strings(st.Blockers)
		b.res.Prepare.Stages = append(b.res.Prepare.Stages, st)
	}
}

// recordCommit sums records and bytes per participant kind, from each
// commit reply's manifest and its records file on disk.
func (b *bench) recordCommit(ctx context.Context, coord *coordination.Coordinator, cm *coordination.CommitResult) error {
	byKind := map[string]*CommitKind{}
	for _, m := range coord.Members() {
		rep, ok := cm.Replies[m.Name]
		if !ok {
			return fmt.Errorf("commit: no reply from %s", m.Name)
		}
		man, ok := rep["manifest"].(map[string]any)
		if !ok {
			return fmt.Errorf("commit: the reply of %s has no manifest: %v", m.Name, rep)
		}
		count, _ := man["record_count"].(float64)
		file, _ := man["records_file"].(string)
		if file == "" || filepath.Base(file) != file {
			return fmt.Errorf("commit: the manifest of %s names records file %q", m.Name, file)
		}
		dir := ckptstore.Target{Dir: b.ckptDir, Kind: m.Kind, Instance: m.Instance}.ParticipantDir()
		size, err := b.recordsSize(ctx, dir, file)
		if err != nil {
			return fmt.Errorf("commit: records of %s: %w", m.Name, err)
		}
		b.recordFileSizes = append(b.recordFileSizes, size)
		k := byKind[m.Kind]
		if k == nil {
			k = &CommitKind{Kind: m.Kind}
			byKind[m.Kind] = k
		}
		k.Participants++
		if secs, _ := rep["write_seconds"].(float64); secs > k.Seconds {
			k.Seconds = secs
		}
		k.Records += int(count)
		k.Bytes += size
		k.Exported += len(cm.ExportedBy(m.Name))
	}
	b.res.Commit.Kinds = inPrepareOrder(byKind)
	for _, k := range b.res.Commit.Kinds {
		b.res.Commit.Records += k.Records
		b.res.Commit.Bytes += k.Bytes
	}
	return nil
}

// inPrepareOrder lists per-kind figures in the order the fleet prepares.
func inPrepareOrder[T any](byKind map[string]*T) []T {
	var out []T
	for _, kind := range coordination.PrepareOrder {
		if k := byKind[kind]; k != nil {
			out = append(out, *k)
		}
	}
	return out
}

// checkExported requires the environment to have exported every rollout:
// each was held at its second model call, so none can have finished. The
// continued set is what the environment exported.
func (b *bench) checkExported(cm *coordination.CommitResult, rows []row) []rollout.EpisodeID {
	var exported []string
	for _, name := range b.replicaNames(envName) {
		exported = append(exported, cm.ExportedBy(name)...)
	}
	b.res.Exported = len(exported)
	set := make(map[string]bool, len(exported))
	for _, k := range exported {
		set[k] = true
	}
	var missing []string
	for _, r := range rows {
		if !set[r.id] {
			missing = append(missing, r.id)
		}
	}
	if len(missing) > 0 {
		b.violate("the environment exported %d of %d rollouts; missing %s", len(exported), len(rows), sample(missing))
	}
	out := make([]rollout.EpisodeID, 0, len(exported))
	for _, k := range exported {
		id, err := rollout.ParseCaptureKey(k)
		if err != nil || id.Attempt != 0 {
			b.violate("the environment exported %q, which is not an attempt 0 of the scope", k)
			continue
		}
		out = append(out, id)
	}
	slices.SortFunc(out, func(a, c rollout.EpisodeID) int { return strings.Compare(a.RolloutID, c.RolloutID) })
	return out
}

func (b *bench) recordRestore(coord *coordination.Coordinator, rr *coordination.RestoreResult, want int) {
	byKind := map[string]*RestoreKind{}
	for _, m := range coord.Members() {
		rep, ok := rr.Replies[m.Name]
		if !ok {
			continue
		}
		k := byKind[m.Kind]
		if k == nil {
			k = &RestoreKind{Kind: m.Kind}
			byKind[m.Kind] = k
		}
		k.Participants++
		k.ReadSeconds = max(k.ReadSeconds, rep.ReadSeconds)
		k.InstallSeconds = max(k.InstallSeconds, rep.InstallSeconds)
		k.CallSeconds = max(k.CallSeconds, rr.Seconds[m.Name])
	}
	b.res.RestoreKinds = inPrepareOrder(byKind)
	for _, name := range b.replicaNames(envName) {
		if rep, ok := rr.Replies[name]; ok {
			b.res.Restored += len(rep.Restored)
		}
	}
	if b.res.Restored != want {
		b.violate("the environment restored %d episodes, want %d", b.res.Restored, want)
	}
}

// kill SIGKILLs every fleet process but fakeinference at once.
func (b *bench) kill() error {
	names := b.fleetNames()
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = b.launcher.Kill(name)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// restart starts fresh processes of every killed server, all at once (none
// needs another to become ready), and returns when all are ready.
func (b *bench) restart(ctx context.Context) error {
	names := b.fleetNames()
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = b.launcher.Start(ctx, name)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("starting the fresh fleet: %w", err)
	}
	return nil
}

// checkOriginals: every original /run was exported, so none may have
// replied; each must have been cut off by the crash.
func (b *bench) checkOriginals(originals *batch) {
	st := originals.summary()
	b.res.OriginalsReplied = st.replied
	b.res.OriginalsCutOff = st.transportErrors
	if st.replied > 0 {
		b.violate("%d original /run replied although every rollout was exported: %s", st.replied, originals.example())
	}
}

// awaitReplacements waits until every replacement replied, failing when
// none replies for stallTimeout.
func (b *bench) awaitReplacements(ctx context.Context, reps *batch) error {
	start := time.Now()
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	var lastDone int64
	lastMove := start
	for {
		select {
		case <-reps.finished:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("waiting for the replacements: %w", context.Cause(ctx))
		case <-tick.C:
			done := reps.done.Load()
			if done != lastDone {
				lastDone, lastMove = done, time.Now()
			}
			b.logf("  %.0fs: %d of %d replacements replied, fleet RSS %s", time.Since(start).Seconds(), done, len(reps.rows), mib(b.sampler.totalRSS()))
			if time.Since(lastMove) > stallTimeout {
				return fmt.Errorf("the replacements stopped replying: %d of %d replied, none in the last %v", done, len(reps.rows), stallTimeout)
			}
		}
	}
}

// checkReplacements: every continued rollout finished with reward 1.0.
func (b *bench) checkReplacements(reps *batch) {
	st := reps.summary()
	b.res.Replacements = len(reps.rows)
	b.res.ReplacementFailures = st.failed()
	b.res.RewardsNotOne = st.rewardNotOne
	if st.failed() > 0 {
		b.violate("%d of %d replacements failed: %s", st.failed(), len(reps.rows), reps.example())
	}
	if st.rewardNotOne > 0 {
		b.violate("%d replacements finished with a reward other than 1.0: %s", st.rewardNotOne, reps.example())
	}
}

// unused refuses a work directory an earlier run left its fleet or
// checkpoint in: the checkpoint id is the same every run, and a commit into
// the same directory and id holding other records is refused, which the
// bench would report as a failed commit rather than as the reuse it is.
func unused(dir string) error {
	for _, name := range []string{"fleet", "ckpt"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return fmt.Errorf("the work directory %s holds %s/ from an earlier run: remove it or give another directory", dir, name)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// cleanup removes what the run does not keep. A failed run keeps its
// directory, for the logs. A checkpoint in an object store stays there.
func (b *bench) cleanup(runErr error, tempDir bool) {
	if b.s3 != nil {
		_ = b.s3.Close()
	}
	keepProfiles := b.opts.Profile && b.res.ProfilesDir != ""
	switch {
	case runErr != nil || b.opts.Keep:
		b.res.Dir = b.opts.Dir
		if runErr != nil {
			b.logf("kept %s for its logs (fleet/run/logs)", b.opts.Dir)
		}
	case tempDir && !keepProfiles:
		_ = os.RemoveAll(b.opts.Dir)
	default:
		_ = os.RemoveAll(filepath.Join(b.opts.Dir, "fleet"))
		_ = os.RemoveAll(filepath.Join(b.opts.Dir, "ckpt"))
	}
}

func seconds(d time.Duration) float64 { return d.Seconds() }

// sample lists at most five items.
func sample(items []string) string {
	if len(items) > 5 {
		return strings.Join(items[:5], ", ") + fmt.Sprintf(" and %d more", len(items)-5)
	}
	return strings.Join(items, ", ")
}

func newResult(opts Options) *Result {
	host, _ := os.Hostname()
	var load string
	if pfs, err := procfs.NewDefaultFS(); err == nil {
		if l, err := pfs.LoadAvg(); err == nil {
			// As /proc/loadavg writes them.
			load = fmt.Sprintf("%.2f %.2f %.2f", l.Load1, l.Load5, l.Load15)
		}
	}
	return &Result{
		Rollouts:  opts.Rollouts,
		Replicas:  max(opts.Replicas, 1),
		Stack:     string(httpconf.Config{Stack: opts.Stack}.EffectiveStack()),
		Tuning:    string(runtimetune.Config{Tuning: opts.Tuning}.EffectiveMode()),
		StartedAt: time.Now().UTC(),
		Host:      Host{Name: host, CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH, LoadAverage: load},
		Profiled:  opts.Profile,
		Store:     opts.S3Root,
	}
}
