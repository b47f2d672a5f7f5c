package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ops/scalebench"
)

// runBenchCompare is `gymctl bench-compare`: two builds' own `gymctl
// bench-scale` at the same rollout count, one run of each per pair, the
// order alternating from pair to pair (base first, then this build first)
// so that a drift in the machine's load falls on both; then one Markdown
// table of medians and ratios (scalebench.WriteBuildComparison). Each
// build's gymctl runs its own servers, so an older build is measured as it
// was, with the flags it knows.
func runBenchCompare(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench-compare", stderr)
	baseBin := fs.String("base-bin", "", "directory of the base build's binaries (scripts/build-ref.sh builds a commit's)")
	baseLabel := fs.String("base-label", "base", "the base build's name in the table")
	binDir := fs.String("bin-dir", "", "directory of this build's binaries; empty: gymctl's own directory")
	label := fs.String("label", "this", "this build's name in the table")
	rollouts := fs.Int("rollouts", 16000, "rollouts in flight at the checkpoint, every run")
	pairs := fs.Int("pairs", 3, "runs of each build, alternating")
	stack := fs.String("stack", "lean", "HTTP stack of every run (a build without the --stacks flag runs its only stack)")
	ports := fs.String("ports", "", "every run's port block (lo-hi); empty, or a build without --ports: free ports the kernel chooses")
	outDir := fs.String("out", "", "directory for each run's JSON and log, and the table (compare.md); empty: a new one under the system's temporary directory")
	minAvail := fs.Float64("min-available-gib", 0, "wait before each run until the machine has this much memory available (GiB); 0: 14 GiB per 100,000 rollouts, at least 2")
	memWait := fs.Duration("memory-wait", 15*time.Minute, "how long to wait for that memory before failing")
	extra := fs.String("args", "", "more bench-scale flags for both builds, space-separated")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *baseBin == "" {
		return errors.New("bench-compare: --base-bin is required")
	}
	if *pairs < 1 || *rollouts < 1 {
		return fmt.Errorf("bench-compare: --pairs and --rollouts must be at least 1")
	}
	if *binDir == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("bench-compare: finding gymctl's directory (pass --bin-dir): %w", err)
		}
		*binDir = filepath.Dir(exe)
	}
	need := *minAvail
	if need == 0 {
		need = max(2, 14*float64(*rollouts)/100000)
	}
	if *outDir == "" {
		d, err := os.MkdirTemp("", "gymfleet-bench-compare-")
		if err != nil {
			return err
		}
		*outDir = d
	} else if err := os.MkdirAll(*outDir, 0o755); err != nil {
		return err
	}
	sides := []*compareSide{
		{label: *baseLabel, bin: *baseBin, prefix: "base"},
		{label: *label, bin: *binDir, prefix: "this"},
	}
	for _, s := range sides {
		var err error
		if s.flags, err = benchScaleFlags(ctx, s.bin); err != nil {
			return fmt.Errorf("bench-compare: %s: %w", s.label, err)
		}
	}
	fmt.Fprintf(stderr, "bench-compare: %d pairs at %d rollouts, %s (%s) against %s (%s); runs in %s\n",
		*pairs, *rollouts, *label, *binDir, *baseLabel, *baseBin, *outDir)
	var failed []string
	for i := range *pairs {
		order := []*compareSide{sides[0], sides[1]}
		if i%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, s := range order {
			if err := awaitMemory(ctx, need, *memWait, stderr); err != nil {
				return fmt.Errorf("bench-compare: %w", err)
			}
			res, err := s.runOnce(ctx, i+1, *rollouts, *stack, *ports, strings.Fields(*extra), *outDir, stderr)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				failed = append(failed, fmt.Sprintf("%s run %d: %v", s.label, i+1, err))
				fmt.Fprintf(stderr, "bench-compare: %s run %d: %v\n", s.label, i+1, err)
			}
			if res != nil {
				s.runs = append(s.runs, res)
			}
		}
	}
	var table bytes.Buffer
	fmt.Fprintf(&table, "%s against %s, %d alternating pairs, %s stack, `gymctl bench-compare` (runs in %s)\n\n", *label, *baseLabel, *pairs, *stack, *outDir)
	if err := scalebench.WriteBuildComparison(&table, scalebench.Build{Label: *baseLabel, Runs: sides[0].runs}, scalebench.Build{Label: *label, Runs: sides[1].runs}); err != nil {
		return fmt.Errorf("bench-compare: %w", err)
	}
	fmt.Fprintln(&table)
	fmt.Fprintln(&table, "| run | build | load at start | load at end | wall (s) |")
	fmt.Fprintln(&table, "|---|---|---|---|---|")
	for _, l := range runLog(sides) {
		fmt.Fprintln(&table, l)
	}
	if err := os.WriteFile(filepath.Join(*outDir, "compare.md"), table.Bytes(), 0o644); err != nil {
		return err
	}
	if _, err := stdout.Write(table.Bytes()); err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("bench-compare: %d run(s) failed: %s", len(failed), strings.Join(failed, "; "))
	}
	return nil
}

// compareSide is one build of a comparison.
type compareSide struct {
	label, bin, prefix string
	// flags are the flags its bench-scale knows.
	flags map[string]bool
	runs  []*scalebench.Result
	log   []runRecord
}

type runRecord struct {
	pair           int
	start, end     string
	wall           time.Duration
	startedAtNanos int64
}

// runOnce runs the side's bench-scale once and reads its JSON.
func (s *compareSide) runOnce(ctx context.Context, pair, rollouts int, stack, ports string, extra []string, outDir string, stderr io.Writer) (*scalebench.Result, error) {
	base := filepath.Join(outDir, fmt.Sprintf("%s-%d", s.prefix, pair))
	args := []string{"bench-scale", "--rollouts", strconv.Itoa(rollouts), "--json", base + ".json", "--bin-dir", s.bin}
	if s.flags["stacks"] {
		args = append(args, "--stacks", stack)
	}
	switch {
	case ports != "" && s.flags["ports"]:
		args = append(args, "--ports", ports)
	case ports != "":
		// An older build takes the kernel's free ports, which are outside
		// any block handed out by hand (the ephemeral range).
		fmt.Fprintf(stderr, "bench-compare: %s's bench-scale has no --ports flag: its fleet takes the kernel's free ports\n", s.label)
	}
	args = append(args, extra...)
	logFile, err := os.Create(base + ".log")
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, "gymctl"), args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Go's own runtime for every build: no GOGC or GOMEMLIMIT inherited.
	cmd.Env = withoutRuntimeEnv(os.Environ())
	rec := runRecord{pair: pair, start: loadNow(), startedAtNanos: time.Now().UnixNano()}
	fmt.Fprintf(stderr, "bench-compare: pair %d, %s: gymctl %s\n", pair, s.label, strings.Join(args, " "))
	start := time.Now()
	runErr := cmd.Run()
	rec.wall, rec.end = time.Since(start), loadNow()
	s.log = append(s.log, rec)
	fmt.Fprintf(stderr, "bench-compare: pair %d, %s: %.0fs, load %s at start, %s at end\n", pair, s.label, rec.wall.Seconds(), rec.start, rec.end)
	b, err := os.ReadFile(base + ".json")
	if err != nil {
		return nil, errors.Join(runErr, fmt.Errorf("no figures (log in %s.log): %w", base, err))
	}
	var res scalebench.Result
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, fmt.Errorf("reading %s.json: %w", base, err)
	}
	if runErr != nil {
		return &res, fmt.Errorf("%w (log in %s.log)", runErr, base)
	}
	return &res, nil
}

// runLog lists every run in the order they ran.
func runLog(sides []*compareSide) []string {
	type entry struct {
		label string
		rec   runRecord
	}
	var all []entry
	for _, s := range sides {
		for _, r := range s.log {
			all = append(all, entry{s.label, r})
		}
	}
	for i := 1; i < len(all); i++ {
		for j := i; j > 0 && all[j].rec.startedAtNanos < all[j-1].rec.startedAtNanos; j-- {
			all[j], all[j-1] = all[j-1], all[j]
		}
	}
	out := make([]string, len(all))
	for i, e := range all {
		out[i] = fmt.Sprintf("| %d (pair %d) | %s | %s | %s | %.0f |", i+1, e.rec.pair, e.label, e.rec.start, e.rec.end, e.rec.wall.Seconds())
	}
	return out
}

var flagLine = regexp.MustCompile(`^\s+-{1,2}([a-z0-9-]+)`)

// benchScaleFlags lists the flags a build's bench-scale knows, from its
// usage text.
func benchScaleFlags(ctx context.Context, bin string) (map[string]bool, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "gymctl"), "bench-scale", "-h")
	out, _ := cmd.CombinedOutput()
	flags := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if m := flagLine.FindStringSubmatch(sc.Text()); m != nil {
			flags[m[1]] = true
		}
	}
	if !flags["rollouts"] || !flags["json"] {
		return nil, fmt.Errorf("%s/gymctl bench-scale -h lists no --rollouts and --json: %s", bin, firstLine(out))
	}
	return flags, nil
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	return s
}

// withoutRuntimeEnv drops the variables that steer Go's runtime.
func withoutRuntimeEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if strings.HasPrefix(kv, "GOGC=") || strings.HasPrefix(kv, "GOMEMLIMIT=") || strings.HasPrefix(kv, "GODEBUG=") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// loadNow is /proc/loadavg's three averages.
func loadNow() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// awaitMemory polls /proc/meminfo until MemAvailable reaches needGiB,
// failing after wait: a run the machine cannot hold would measure the
// other tenants, or be killed.
func awaitMemory(ctx context.Context, needGiB float64, wait time.Duration, stderr io.Writer) error {
	deadline := time.Now().Add(wait)
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	logged := false
	for {
		avail, err := memAvailableGiB()
		if err != nil || avail >= needGiB {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%.1f GiB available after waiting %v, need %.1f (--min-available-gib)", avail, wait, needGiB)
		}
		if !logged {
			fmt.Fprintf(stderr, "bench-compare: %.1f GiB available, waiting for %.1f\n", avail, needGiB)
			logged = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func memAvailableGiB() (float64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				break
			}
			kb, err := strconv.ParseFloat(f[0], 64)
			if err != nil {
				return 0, err
			}
			return kb / (1 << 20), nil
		}
	}
	return 0, errors.New("no MemAvailable in /proc/meminfo")
}
