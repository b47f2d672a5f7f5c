// Package e2e is the process-level suite: it builds the fleet's binaries,
// starts every server as its own process group on free ports, drives
// checkpoints through the coordination package, kills processes with SIGKILL,
// restores into fresh processes, and asserts on the exact model calls
// fakeinference saw. fakeinference is started once per test and survives the
// crash, as a real inference server and token store would.
package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/replica"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// binDir holds the binaries TestMain built (or GYMFLEET_BIN named).
var binDir string

// stack is the HTTP stack every process of every fleet and the suite's own
// clients speak: GYMFLEET_E2E_STACK (lean or nethttp), empty for the
// default (lean). `make test-e2e` runs the suite once on each.
var stack httpconf.Stack

// ports hands every fleet of this run its ports: GYMFLEET_E2E_PORTS
// ("lo-hi"), else a block of the stack's own, so the runs on both stacks
// side by side (and any process drawing kernel-chosen ports) never take
// each other's.
var ports *fleet.PortBlock

// stackPorts is each stack's default block, below the ephemeral range.
var stackPorts = map[httpconf.Stack]string{
	httpconf.StackLean:    "20000-25999",
	httpconf.StackNetHTTP: "26000-31999",
}

// httpConf is the http: section of the suite's clients.
func httpConf() httpconf.Config { return httpconf.Config{Stack: stack} }

var binaries = []string{"fakeinference", "modelserver", "resourceserver", "agentserver", "envserver", "gymctl"}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	binDir = os.Getenv("GYMFLEET_BIN")
	stack = httpconf.Stack(os.Getenv("GYMFLEET_E2E_STACK"))
	if err := httpConf().Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: GYMFLEET_E2E_STACK:", err)
		return 1
	}
	block := os.Getenv("GYMFLEET_E2E_PORTS")
	if block == "" {
		block = stackPorts[httpConf().EffectiveStack()]
	}
	var err error
	if ports, err = fleet.ParsePortBlock(block); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: GYMFLEET_E2E_PORTS:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "e2e: every process on the %s HTTP stack, ports %s\n", httpConf().EffectiveStack(), block)
	if binDir == "" {
		dir, err := os.MkdirTemp("", "gymfleet-e2e-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		args := []string{"build", "-o", dir + "/"}
		for _, b := range binaries {
			args = append(args, "./cmd/"+b)
		}
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building the fleet's binaries:", err)
			return 1
		}
		binDir = dir
	}
	// A missing binary fails the suite; it never skips.
	for _, b := range binaries {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: binary %s missing in %s: %v\n", b, binDir, err)
			return 1
		}
	}
	defer removeFaultBinaries()
	return m.Run()
}

const token = "e2e-control-token"

// Fleet is one test's fleet of real processes.
type Fleet struct {
	t    *testing.T
	topo fleet.Topology
	Cfg  *fleet.Config
	L    *fleet.Launcher
	// Fake drives every fakeinference worker at once.
	Fake   fakes
	client *http.Client
	ctl    *http.Client
	// EnvURL is the first environment replica; Start sends each row to
	// the replica replica.Pick names for its rollout, of EnvURLs.
	EnvURL  string
	EnvURLs []string
	// CkptDir is where the test's checkpoints go.
	CkptDir string
}

// startFleet generates a standard topology (mutate may change it), starts
// every process and registers the dump of every log if the test fails.
func startFleet(t *testing.T, mutate func(*fleet.Topology)) *Fleet {
	t.Helper()
	return startFleetWith(t, fleetOptions{topo: mutate})
}

// shape is how many inference workers the model server balances over and
// how many replicas of each participant kind a fleet runs (0 means 1).
type shape struct {
	workers, replicas int
}

// startFleetOn is startFleet in a shape.
func startFleetOn(t *testing.T, sh shape, mutate func(*fleet.Topology)) *Fleet {
	t.Helper()
	return startFleetWith(t, fleetOptions{topo: func(tp *fleet.Topology) {
		tp.InferenceWorkers = sh.workers
		tp.Replicas = fleet.Each(sh.replicas)
		if mutate != nil {
			mutate(tp)
		}
	}})
}

// fleetOptions are what startFleetWith changes of the standard fleet.
type fleetOptions struct {
	// bin holds the binaries (binDir when empty).
	bin string
	// topo changes the topology, cfg the configuration generated from it
	// (each may be nil).
	topo func(*fleet.Topology)
	cfg  func(*fleet.Config)
	// noInference leaves the fakeinference workers unstarted: the fleet
	// uses another fleet's, on the same ports.
	noInference bool
}

// startFleetWith is startFleet with options.
func startFleetWith(t *testing.T, o fleetOptions) *Fleet {
	t.Helper()
	dir := t.TempDir()
	bin := o.bin
	if bin == "" {
		bin = binDir
	}
	topo := fleet.Standard(dir, bin, token)
	topo.LogLevel = "debug"
	topo.HTTPStack = stack
	topo.Ports = ports
	// The temp directory: the collect tests checkpoint into workspaces of
	// their own subtests' (t.TempDir), which lie beneath it and not
	// beneath dir.
	topo.CheckpointRoot = os.TempDir()
	if o.topo != nil {
		o.topo(&topo)
	}
	cfg, err := fleet.Generate(topo)
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg != nil {
		o.cfg(cfg)
	}
	// The test's clients speak the fleet's stack and verify its CA.
	hc := cfg.HTTP.Conf(cfg.BaseDir)
	hc.TLS = httpconf.TLS{CAFile: hc.TLS.CAFile}
	f := &Fleet{
		t: t, topo: topo, Cfg: cfg,
		L:       fleet.NewLauncher(cfg, fleet.Options{StopGrace: 5 * time.Second}),
		client:  httpclient.New(httpclient.Options{H2C: true, HTTP: hc}),
		ctl:     httpclient.New(httpclient.Options{H2C: true, HTTP: hc}),
		CkptDir: filepath.Join(dir, "checkpoints"),
	}
	for _, p := range cfg.Processes {
		if p.Binary == "fakeinference" {
			f.Fake = append(f.Fake, fakeinference.NewControl(p.Endpoints[0].URL, f.ctl))
		}
	}
	for _, env := range cfg.Endpoints(fleet.KindEnvironment) {
		f.EnvURLs = append(f.EnvURLs, env.URL)
	}
	f.EnvURL = f.EnvURLs[0]
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range cfg.Names() {
				t.Logf("--- log of %s ---\n%s", name, f.L.Logs(name))
			}
		}
		_ = f.L.KillAll()
		f.client.CloseIdleConnections()
		f.ctl.CloseIdleConnections()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, name := range cfg.Names() {
		if o.noInference && f.inferenceWorker(name) {
			continue
		}
		if err := f.L.Start(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// Crash kills every fleet process except the fakeinference workers with
// SIGKILL.
func (f *Fleet) Crash() {
	f.t.Helper()
	for _, name := range f.Cfg.Names() {
		if f.inferenceWorker(name) {
			continue
		}
		if err := f.L.Kill(name); err != nil {
			f.t.Fatal(err)
		}
	}
	// Connections to the dead servers are gone; drop them from the pools.
	f.client.CloseIdleConnections()
	f.ctl.CloseIdleConnections()
}

// inferenceWorker reports whether the process is a fakeinference worker.
func (f *Fleet) inferenceWorker(name string) bool {
	p, ok := f.Cfg.Process(name)
	return ok && p.Binary == "fakeinference"
}

// Restart starts fresh processes for every fleet server but the
// fakeinference workers, on the same ports and configuration.
func (f *Fleet) Restart() {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, name := range f.Cfg.Names() {
		if f.inferenceWorker(name) {
			continue
		}
		if err := f.L.Start(ctx, name); err != nil {
			f.t.Fatal(err)
		}
	}
}

// Coord discovers the fleet's participants.
func (f *Fleet) Coord() *coordination.Coordinator {
	f.t.Helper()
	var eps []coordination.Endpoint
	for _, p := range f.Cfg.Processes {
		for _, e := range p.Endpoints {
			eps = append(eps, coordination.Endpoint{Name: e.Name, URL: e.URL})
		}
	}
	c, err := coordination.Discover(context.Background(), eps, coordination.Options{Token: token, Client: f.ctl})
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

// Reply is a /run reply.
type Reply struct {
	Status int
	Body   map[string]any
	Err    error
}

// Code is the reply's error code, if any.
func (r Reply) Code() string {
	if e, ok := r.Body["error"].(map[string]any); ok {
		c, _ := e["code"].(string)
		return c
	}
	return ""
}

// Reward is the reply's reward (-1 if absent).
func (r Reply) Reward() float64 {
	if v, ok := r.Body["reward"].(float64); ok {
		return v
	}
	return -1
}

// Run is one /run in flight.
type Run struct {
	Row  map[string]any
	done chan Reply
	mu   sync.Mutex
	rep  *Reply
}

// Wait returns the reply, failing the test after timeout.
func (r *Run) Wait(t *testing.T, timeout time.Duration) Reply {
	t.Helper()
	r.mu.Lock()
	if r.rep != nil {
		defer r.mu.Unlock()
		return *r.rep
	}
	r.mu.Unlock()
	select {
	case rep := <-r.done:
		r.mu.Lock()
		r.rep = &rep
		r.mu.Unlock()
		return rep
	case <-time.After(timeout):
		t.Fatalf("/run of %v did not reply within %v", r.Row[rollout.FieldRolloutID], timeout)
		return Reply{}
	}
}

// Replied reports whether the reply arrived (without waiting).
func (r *Run) Replied() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rep != nil {
		return true
	}
	select {
	case rep := <-r.done:
		r.rep = &rep
		return true
	default:
		return false
	}
}

// Start sends one /run, once and never again (a /run cut off by a crash is
// never resent as a second execution of the same attempt).
func (f *Fleet) Start(row map[string]any) *Run {
	run := &Run{Row: row, done: make(chan Reply, 1)}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		id, _ := row[rollout.FieldRolloutID].(string)
		url := f.EnvURL
		if len(f.EnvURLs) > 0 {
			url = f.EnvURLs[replica.Pick(id, len(f.EnvURLs))]
		}
		rep, err := httpclient.Do(ctx, f.client, http.MethodPost, url+"/run", nil, row)
		if err != nil {
			run.done <- Reply{Err: err}
			return
		}
		var body map[string]any
		_ = codec.Unmarshal(rep.Body, &body)
		run.done <- Reply{Status: rep.Status, Body: body}
	}()
	return run
}

// RunOK runs a row to completion and requires status 200.
func (f *Fleet) RunOK(row map[string]any) Reply {
	f.t.Helper()
	rep := f.Start(row).Wait(f.t, 2*time.Minute)
	if rep.Err != nil || rep.Status != http.StatusOK {
		f.t.Fatalf("/run %v: status %d %v %v", row[rollout.FieldRolloutID], rep.Status, rep.Err, rep.Body)
	}
	return rep
}

// Calls is fakeinference's call log of one rollout (every attempt), in order.
func (f *Fleet) Calls(rolloutID string) []fakeinference.CallInfo {
	f.t.Helper()
	all, err := f.Fake.Calls(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	var out []fakeinference.CallInfo
	for _, c := range all {
		if c.RolloutID != nil && *c.RolloutID == rolloutID {
			out = append(out, c)
		}
	}
	return out
}

// MessageCounts is the n_messages of each of a rollout's model calls.
func (f *Fleet) MessageCounts(rolloutID string) []int {
	var out []int
	for _, c := range f.Calls(rolloutID) {
		out = append(out, c.NMessages)
	}
	return out
}

// WaitFor polls cond until it holds, failing after timeout.
func (f *Fleet) WaitFor(what string, timeout time.Duration, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		<-time.After(10 * time.Millisecond)
	}
}

// WaitReceived waits until fakeinference received n calls of a rollout.
func (f *Fleet) WaitReceived(rolloutID string, n int) {
	f.t.Helper()
	f.WaitFor(fmt.Sprintf("%d model calls of %s", n, rolloutID), 60*time.Second, func() bool {
		return len(f.Calls(rolloutID)) >= n
	})
}

// Manifest reads the capture ledger of a capture key from the model server
// replica that has it (the first answer other than 404).
func (f *Fleet) Manifest(key string) (int, map[string]any) {
	f.t.Helper()
	status, m := http.StatusNotFound, map[string]any(nil)
	for _, ep := range f.Cfg.Endpoints(fleet.KindModel) {
		rep, err := httpclient.Do(context.Background(), f.ctl, http.MethodGet, ep.URL+"/capture/rollouts/"+key+"/manifest", nil, nil)
		if err != nil {
			f.t.Fatal(err)
		}
		status, m = rep.Status, nil
		_ = codec.Unmarshal(rep.Body, &m)
		if rep.Status != http.StatusNotFound {
			break
		}
	}
	return status, m
}

// Status reads every participant's status.
func (f *Fleet) Status(c *coordination.Coordinator) map[string]map[string]any {
	f.t.Helper()
	st, err := c.Status(context.Background())
	if err != nil {
		f.t.Fatal(err)
	}
	return st
}

func deadline(d time.Duration) time.Time { return time.Now().Add(d) }

// Rows.

var weatherTool = map[string]any{
	"type": "function", "name": "get_weather", "description": "Get the current weather of a city.", "strict": true,
	"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}},
}

var counterTools = []any{
	map[string]any{"type": "function", "name": "increment", "description": "Add to the counter.", "strict": true,
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"by": map[string]any{"type": "integer"}}, "required": []string{"by"}}},
	map[string]any{"type": "function", "name": "get_counter_value", "description": "Read the counter.", "strict": true,
		"parameters": map[string]any{"type": "object", "properties": map[string]any{}}},
}

// weatherRow is a one-tool-round weather task on route (an env agent name).
func weatherRow(id, route, city string) map[string]any {
	return map[string]any{
		"responses_create_params": map[string]any{
			"input": []any{
				map[string]any{"role": "developer", "content": "You are a weather assistant."},
				map[string]any{"role": "user", "content": fmt.Sprintf(`What is the weather in %s? Call get_weather with {"city": %q}.`, city, city)},
			},
			"tools": []any{weatherTool},
		},
		"city":                 city,
		rollout.FieldRolloutID: id,
		rollout.FieldAgentRef:  map[string]any{"type": "responses_api_agents", "name": route},
	}
}

// counterRow starts the counter at start and increments it by each inc.
func counterRow(id, route string, start int, incs ...int) map[string]any {
	var b strings.Builder
	fmt.Fprintf(&b, "The counter starts at %d.", start)
	total := start
	for i, inc := range incs {
		if i == 0 {
			fmt.Fprintf(&b, ` Call increment with {"by": %d}`, inc)
		} else {
			fmt.Fprintf(&b, `, then increment with {"by": %d}`, inc)
		}
		total += inc
	}
	fmt.Fprintf(&b, ", so that it ends at %d.", total)
	return map[string]any{
		"responses_create_params": map[string]any{
			"input": []any{
				map[string]any{"role": "developer", "content": "You operate a counter through its tools."},
				map[string]any{"role": "user", "content": b.String()},
			},
			"tools": counterTools,
		},
		"initial_count":        start,
		"expected_count":       total,
		rollout.FieldRolloutID: id,
		rollout.FieldAgentRef:  map[string]any{"type": "responses_api_agents", "name": route},
	}
}

// withAttempt returns a copy of row as attempt n.
func withAttempt(row map[string]any, n int) map[string]any {
	out := make(map[string]any, len(row)+1)
	for k, v := range row {
		out[k] = v
	}
	out[rollout.FieldAttemptIndex] = n
	return out
}
