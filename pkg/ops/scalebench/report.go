package scalebench

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gymfleet/gymfleet/pkg/infra/atomicfile"
	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/wire/replica"
)

// Result is one run's figures. Times are in seconds, sizes in bytes; the
// JSON form is for comparing runs.
type Result struct {
	Rollouts int `json:"rollouts"`
	// Replicas is how many processes of each participant kind the fleet
	// ran (reports from before replicas read 0: one).
	Replicas int `json:"replicas"`
	// Stack is the HTTP stack the fleet and the bench spoke (lean or
	// nethttp, see pkg/transport/httpconf).
	Stack string `json:"stack"`
	// Tuning is the fleet's runtime.tuning (on or off, see
	// pkg/infra/runtimetune).
	Tuning    string    `json:"tuning"`
	StartedAt time.Time `json:"started_at"`
	Host      Host      `json:"host"`
	// Profiled runs are slower: the servers record CPU profiles during
	// prepare, commit and restore.
	Profiled    bool   `json:"profiled"`
	ProfilesDir string `json:"profiles_dir,omitempty"`
	// Dir is the work directory when it was kept.
	Dir string `json:"dir,omitempty"`
	// Store is the object store root the fleet checkpointed to; empty for
	// the local disk.
	Store string `json:"store,omitempty"`

	FleetStartSeconds float64 `json:"fleet_start_seconds"`
	// DispatchSentSeconds is until every /run was written.
	DispatchSentSeconds float64 `json:"dispatch_sent_seconds"`
	// DispatchSeconds is until every rollout was held at its second call.
	DispatchSeconds float64 `json:"dispatch_seconds"`
	// InFlight is the rollouts held at the checkpoint.
	InFlight int `json:"in_flight"`

	Prepare Prepare `json:"prepare"`
	Commit  Commit  `json:"commit"`
	// DiskFloor is this disk's time for the commit's bytes (nil for an
	// object store, and in reports from before it was measured).
	DiskFloor *DiskFloor `json:"disk_floor,omitempty"`
	// Exported is how many rollouts the environment exported (the
	// continued set).
	Exported int `json:"exported"`

	// KillToReadySeconds is from the first SIGKILL until every fresh
	// process answers /readyz.
	KillToReadySeconds float64 `json:"kill_to_ready_seconds"`
	RestoreSeconds     float64 `json:"restore_seconds"`
	// RestoreKinds splits the restore by participant kind.
	RestoreKinds []RestoreKind `json:"restore_kinds"`
	// Restored is how many episodes the environment restored.
	Restored      int     `json:"restored"`
	ResumeSeconds float64 `json:"resume_seconds"`
	// ReplacementsSeconds is from the first replacement /run until the
	// last one replied.
	ReplacementsSeconds float64 `json:"replacements_seconds"`
	Replacements        int     `json:"replacements"`
	ReplacementFailures int     `json:"replacement_failures"`
	RewardsNotOne       int     `json:"rewards_not_one"`
	// Sessions is what the fresh fleet held open after the replacements.
	Sessions Sessions `json:"sessions"`
	// OriginalsReplied counts original /run calls that got any HTTP reply
	// (the contract wants 0); OriginalsCutOff those the crash cut off.
	OriginalsReplied int `json:"originals_replied"`
	OriginalsCutOff  int `json:"originals_cut_off"`

	// Processes are the fleet's servers: the first fleet's read just
	// before the kill, the fresh fleet's (and fakeinference's) at the end.
	Processes []ProcessStat `json:"processes"`
	Bench     ProcessStat   `json:"bench"`
	// ProcessKinds sums Processes per fleet and participant kind: with
	// replicas, a kind's memory and descriptors are its replicas' together.
	ProcessKinds []KindSum `json:"process_kinds"`
	// PhaseCPU is the CPU time spent in prepare, commit and restore.
	PhaseCPU []PhaseCPU `json:"phase_cpu"`

	// Logs counts the warnings and errors each process logged (the fleet
	// runs at log level warn), across both fleets.
	Logs []LogSummary `json:"logs"`

	// Violations of the controller contract; empty on a passing run.
	Violations []string `json:"violations"`
	// Error is the error the run ended with, if any.
	Error string `json:"error,omitempty"`
}

// Host describes the machine a run measured.
type Host struct {
	Name      string `json:"name"`
	CPUs      int    `json:"cpus"`
	GoVersion string `json:"go_version"`
	OS        string `json:"os"`
	Arch      string `json:"arch"`
	// LoadAverage is /proc/loadavg's 1, 5 and 15 minute averages when the
	// run started: other work on the machine skews the figures.
	LoadAverage string `json:"load_average"`
}

// Prepare is the coordinated prepare: one stage per participant kind.
type Prepare struct {
	Seconds  float64        `json:"seconds"`
	Prepared bool           `json:"prepared"`
	Stages   []PrepareStage `json:"stages"`
}

// PrepareStage is one stage of prepare (all its servers in parallel).
type PrepareStage struct {
	Kind     string   `json:"kind"`
	Seconds  float64  `json:"seconds"`
	Servers  int      `json:"servers"`
	Blockers []string `json:"blockers,omitempty"`
}

// Commit is the commit of the whole scope.
type Commit struct {
	Seconds float64      `json:"seconds"`
	Records int          `json:"records"`
	Bytes   int64        `json:"bytes"`
	Kinds   []CommitKind `json:"kinds"`
}

// CommitKind sums one participant kind's part of the checkpoint.
type CommitKind struct {
	Kind string `json:"kind"`
	// Seconds is the slowest participant's export and write.
	Seconds      float64 `json:"seconds"`
	Participants int     `json:"participants"`
	Records      int     `json:"records"`
	Bytes        int64   `json:"bytes"`
	// Exported is how many capture keys the kind's participants exported.
	Exported int `json:"exported"`
}

// RestoreKind is one participant kind's part of the restore: its slowest
// participant's read (and verify) of its records and install of them.
type RestoreKind struct {
	Kind string `json:"kind"`
	// Participants is the kind's replicas that replied.
	Participants   int     `json:"participants"`
	ReadSeconds    float64 `json:"read_seconds"`
	InstallSeconds float64 `json:"install_seconds"`
	// CallSeconds is the restore call as the bench saw it, request sent
	// to reply decoded: the rest is the request's and the reply's
	// transfer and decoding, outside the participant's read and install.
	CallSeconds float64 `json:"call_seconds"`
}

// LogSummary counts one process's warning and error lines.
type LogSummary struct {
	Process  string `json:"process"`
	Warnings int    `json:"warnings"`
	Errors   int    `json:"errors"`
	// First is the first warning or error line, shortened.
	First string `json:"first,omitempty"`
}

// ProcessStat is one process's peak resident memory and descriptors.
type ProcessStat struct {
	Name string `json:"name"`
	// Kind is the participant kind the process serves (fleet.Kind*).
	Kind string `json:"kind,omitempty"`
	// Fleet is "first" (before the crash), "fresh" (after it) or "kept"
	// (fakeinference, which the crash spares).
	Fleet        string `json:"fleet"`
	PID          int    `json:"pid"`
	PeakRSSBytes uint64 `json:"peak_rss_bytes"`
	// PeakRSSAtBoundaryBytes is the peak resident set up to the moment
	// every rollout was held (first fleet): the dispatch's share of
	// PeakRSSBytes, before prepare and commit.
	PeakRSSAtBoundaryBytes uint64 `json:"peak_rss_at_boundary_bytes,omitempty"`
	// PeakFDs is the most descriptors a sample saw; FDsAtBoundary the
	// count with every rollout in flight (first fleet).
	PeakFDs       int `json:"peak_fds"`
	FDsAtBoundary int `json:"fds_at_boundary"`
	// StackBytesAtBoundary and GoroutinesAtBoundary are the runtime's
	// figures with every rollout in flight (first fleet): goroutine stacks
	// are memory a heap profile leaves out.
	StackBytesAtBoundary uint64 `json:"stack_bytes_at_boundary,omitempty"`
	GoroutinesAtBoundary int    `json:"goroutines_at_boundary,omitempty"`
	// HeapBytesAtBoundary is the runtime's heap in use with every rollout
	// in flight (first fleet): live objects and the garbage not yet
	// collected.
	HeapBytesAtBoundary uint64 `json:"heap_bytes_at_boundary,omitempty"`
	// CPUSeconds is the process's user and system CPU time over its life.
	CPUSeconds float64 `json:"cpu_seconds"`
	Error      string  `json:"error,omitempty"`
}

// KindSum is one participant kind's processes of one fleet together.
// The replicas peak at different moments, so the sum of their peaks bounds
// the kind's peak from above.
type KindSum struct {
	Fleet                string  `json:"fleet"`
	Kind                 string  `json:"kind"`
	Processes            int     `json:"processes"`
	PeakRSSBytes         uint64  `json:"peak_rss_bytes"`
	PeakRSSAtBoundary    uint64  `json:"peak_rss_at_boundary_bytes,omitempty"`
	PeakFDs              int     `json:"peak_fds"`
	FDsAtBoundary        int     `json:"fds_at_boundary"`
	StackBytesAtBoundary uint64  `json:"stack_bytes_at_boundary,omitempty"`
	GoroutinesAtBoundary int     `json:"goroutines_at_boundary,omitempty"`
	HeapBytesAtBoundary  uint64  `json:"heap_bytes_at_boundary,omitempty"`
	CPUSeconds           float64 `json:"cpu_seconds"`
}

// processKind is a process's participant kind: its own record, else (a
// report from before kinds were recorded) read from its process name.
func processKind(p ProcessStat) string {
	if p.Kind != "" {
		return p.Kind
	}
	switch family := replica.Family(p.Name); {
	case family == "env":
		return fleet.KindEnvironment
	case family == "agents":
		return fleet.KindAgent
	case family == "resources":
		return fleet.KindResources
	case family == "policy_model":
		return fleet.KindModel
	case strings.HasPrefix(p.Name, "fakeinference"):
		return fleet.KindFakeInference
	}
	return p.Name
}

// KindSums sums the processes per fleet and kind, in the order the
// processes are listed.
func (r *Result) KindSums() []KindSum {
	var out []KindSum
	at := map[[2]string]int{}
	for _, p := range r.Processes {
		key := [2]string{p.Fleet, processKind(p)}
		i, ok := at[key]
		if !ok {
			i = len(out)
			at[key] = i
			out = append(out, KindSum{Fleet: key[0], Kind: key[1]})
		}
		k := &out[i]
		k.Processes++
		k.PeakRSSBytes += p.PeakRSSBytes
		k.PeakRSSAtBoundary += p.PeakRSSAtBoundaryBytes
		k.PeakFDs += p.PeakFDs
		k.FDsAtBoundary += p.FDsAtBoundary
		k.StackBytesAtBoundary += p.StackBytesAtBoundary
		k.GoroutinesAtBoundary += p.GoroutinesAtBoundary
		k.HeapBytesAtBoundary += p.HeapBytesAtBoundary
		k.CPUSeconds += p.CPUSeconds
	}
	return out
}

// kindSum is one fleet's sums of a kind.
func (r *Result) kindSum(fleetLabel, kind string) (KindSum, bool) {
	for _, k := range r.KindSums() {
		if k.Fleet == fleetLabel && k.Kind == kind {
			return k, true
		}
	}
	return KindSum{}, false
}

// replicas is the replica count, one for reports that predate it.
func (r *Result) replicas() int { return max(r.Replicas, 1) }

// stacksAtBoundary is a process's goroutine stacks with every rollout in
// flight, and per rollout in flight. The bench reads them only once every
// rollout is held, so inFlight is then the rollouts.
func stacksAtBoundary(p ProcessStat, inFlight int) string {
	if p.StackBytesAtBoundary == 0 || inFlight == 0 {
		return "-"
	}
	return fmt.Sprintf("%s, %d goroutines (%.1f KiB per rollout)", fmtBytes(int64(p.StackBytesAtBoundary)), p.GoroutinesAtBoundary, float64(p.StackBytesAtBoundary)/float64(inFlight)/1024)
}

// FleetPeakRSS sums the peak resident memory of one fleet's processes
// ("first" or "fresh"; fakeinference stands in for the inference servers
// and is not counted). The processes peak at different moments, so the sum
// bounds the fleet's peak from above.
func (r *Result) FleetPeakRSS(fleetLabel string) uint64 {
	var sum uint64
	for _, p := range r.Processes {
		if p.Fleet == fleetLabel {
			sum += p.PeakRSSBytes
		}
	}
	return sum
}

// WriteJSON writes the result as indented JSON to path, atomically.
func (r *Result) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(atomicfile.OS, path, append(b, '\n'))
}

// WriteTable prints the result as one table of phases, then one of
// processes.
func (r *Result) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "scale bench: %d weather rollouts on single_agent_turn, %d replica(s) of each kind, checkpointing and generation cuts on, %s HTTP stack (%s, %d CPUs, %s, load %s), runtime tuning %s\n",
		r.Rollouts, r.replicas(), r.Stack, r.Host.Name, r.Host.CPUs, r.Host.GoVersion, r.Host.LoadAverage, r.Tuning)
	if r.Profiled {
		fmt.Fprintln(w, "profiled run: CPU profiling slows prepare, commit and restore")
	}
	if r.Store != "" {
		fmt.Fprintln(w, "checkpoint in an object store:", r.Store)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(name string, secs float64, detail string) {
		fmt.Fprintf(tw, "%s\t%9s\t%s\n", name, fmtSeconds(secs), detail)
	}
	fmt.Fprintf(tw, "phase\t%9s\tdetail\n", "seconds")
	row("fleet start", r.FleetStartSeconds, "")
	row("dispatch: every /run sent", r.DispatchSentSeconds, "")
	row("dispatch: every rollout at its 2nd call", r.DispatchSeconds, fmt.Sprintf("%d in flight", r.InFlight))
	for _, s := range r.Prepare.Stages {
		detail := fmt.Sprintf("%d server(s)", s.Servers)
		if len(s.Blockers) > 0 {
			detail += "; NOT PREPARED: " + strings.Join(s.Blockers, "; ")
		}
		row("prepare "+s.Kind, s.Seconds, detail)
	}
	row("prepare total", r.Prepare.Seconds, prepared(r.Prepare.Prepared))
	row("commit", r.Commit.Seconds, fmt.Sprintf("%d records, %s; the environment exported %d", r.Commit.Records, fmtBytes(r.Commit.Bytes), r.Exported))
	for _, k := range r.Commit.Kinds {
		row("  "+k.Kind, k.Seconds, fmt.Sprintf("%d records, %s, %d exported", k.Records, fmtBytes(k.Bytes), k.Exported))
	}
	if r.DiskFloor != nil {
		row("disk floor", r.DiskFloor.Seconds, fmt.Sprintf("%s in %d files written and fsynced in sequence; commit %.1f× it, restore %.1f× it",
			fmtBytes(r.DiskFloor.Bytes), r.DiskFloor.Files, r.OverFloor(r.Commit.Seconds), r.OverFloor(r.RestoreSeconds)))
	}
	row("kill to ready (fresh fleet)", r.KillToReadySeconds, "")
	row("restore", r.RestoreSeconds, fmt.Sprintf("%d restored by the environment", r.Restored))
	for _, k := range r.RestoreKinds {
		row("  "+k.Kind, k.ReadSeconds+k.InstallSeconds, fmt.Sprintf("read and verify %s, install %s, replied after %s", fmtSeconds(k.ReadSeconds), fmtSeconds(k.InstallSeconds), fmtSeconds(k.CallSeconds)))
	}
	row("resume", r.ResumeSeconds, "")
	row("replacements: every one finished", r.ReplacementsSeconds, fmt.Sprintf("%d sent, %d failed, %d reward != 1.0", r.Replacements, r.ReplacementFailures, r.RewardsNotOne))
	row("sessions: every one closed", r.Sessions.Seconds, fmt.Sprintf("%d resources and %d agent sessions open; cleanup steps sent again: %d answered, %d abandoned, %d pending",
		r.Sessions.ResourcesOpen, r.Sessions.AgentOpen, r.Sessions.RetriesDone, r.Sessions.RetriesAbandoned, r.Sessions.RetriesPending))
	for _, pc := range r.PhaseCPU {
		row("CPU in "+pc.Phase, pc.Seconds, pc.detail())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "originals: %d replied (want 0), %d cut off by the crash\n\n", r.OriginalsReplied, r.OriginalsCutOff)

	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "process\tfleet\t%10s\t%15s\t%8s\t%11s\t%s\t\n", "peak RSS", "fds at boundary", "peak fds", "CPU seconds", "stacks at boundary")
	for _, p := range append(append([]ProcessStat(nil), r.Processes...), r.Bench) {
		if p.Name == "" {
			continue
		}
		atBoundary := "-"
		if p.Fleet != "fresh" && p.FDsAtBoundary > 0 {
			atBoundary = fmt.Sprint(p.FDsAtBoundary)
		}
		stacks := stacksAtBoundary(p, r.InFlight)
		if r.replicas() > 1 && processKind(p) != fleet.KindFakeInference && p.StackBytesAtBoundary > 0 {
			// A replica holds only its share of the rollouts: per rollout
			// is on its kind's sum below.
			stacks = fmt.Sprintf("%s, %d goroutines", fmtBytes(int64(p.StackBytesAtBoundary)), p.GoroutinesAtBoundary)
		}
		fmt.Fprintf(tw, "%s\t%s\t%10s\t%15s\t%8d\t%11.1f\t%s\t%s\n", p.Name, p.Fleet, fmtBytes(int64(p.PeakRSSBytes)), atBoundary, p.PeakFDs, p.CPUSeconds, stacks, p.Error)
	}
	for _, k := range r.KindSums() {
		if k.Processes < 2 {
			continue
		}
		atBoundary := "-"
		if k.Fleet != "fresh" && k.FDsAtBoundary > 0 {
			atBoundary = fmt.Sprint(k.FDsAtBoundary)
		}
		stacks := stacksAtBoundary(ProcessStat{StackBytesAtBoundary: k.StackBytesAtBoundary, GoroutinesAtBoundary: k.GoroutinesAtBoundary}, r.InFlight)
		fmt.Fprintf(tw, "%s, sum of %d\t%s\t%10s\t%15s\t%8d\t%11.1f\t%s\t\n", k.Kind, k.Processes, k.Fleet, fmtBytes(int64(k.PeakRSSBytes)), atBoundary, k.PeakFDs, k.CPUSeconds, stacks)
	}
	for _, f := range []string{"first", "fresh"} {
		if sum := r.FleetPeakRSS(f); sum > 0 {
			fmt.Fprintf(tw, "%s fleet, sum of peaks\t\t%10s\t\t\t\t\n", f, fmtBytes(int64(sum)))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, l := range r.Logs {
		if l.Warnings+l.Errors > 0 {
			fmt.Fprintf(w, "log of %s: %d warnings, %d errors; first: %s\n", l.Process, l.Warnings, l.Errors, l.First)
		}
	}
	if len(r.Violations) == 0 && r.Error == "" {
		fmt.Fprintln(w, "contract: every rollout was exported, none replied while prepared, every replacement finished with reward 1.0, every session closed")
	}
	for _, v := range r.Violations {
		fmt.Fprintln(w, "CONTRACT VIOLATED:", v)
	}
	if r.Error != "" {
		fmt.Fprintln(w, "ERROR:", r.Error)
	}
	if r.ProfilesDir != "" {
		fmt.Fprintln(w, "profiles:", r.ProfilesDir)
	}
	if r.Dir != "" {
		fmt.Fprintln(w, "work directory kept:", r.Dir)
	}
	return nil
}

func prepared(ok bool) string {
	if ok {
		return "every stage prepared"
	}
	return "NOT PREPARED"
}

func fmtSeconds(s float64) string {
	if s == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", s)
}

func fmtBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
