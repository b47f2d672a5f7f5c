package scalebench

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
)

// PhaseCPU is the CPU time the machine's processes of the bench spent in
// one timed phase: the servers, fakeinference and the bench itself. On a
// shared 2-core machine the phase's wall time moves with other tenants'
// load; its CPU is the work the phase cost, the steadier figure to
// compare builds with.
type PhaseCPU struct {
	Phase string `json:"phase"`
	// Seconds sums ByProcess.
	Seconds float64 `json:"seconds"`
	// ByProcess is each process's user and system CPU time in the phase,
	// at the kernel's 10 ms tick.
	ByProcess map[string]float64 `json:"by_process"`
	// SystemByProcess is the part of each process's ByProcess spent in
	// the kernel.
	SystemByProcess map[string]float64 `json:"system_by_process,omitempty"`
	// GCCycles is the garbage collections each server completed in the
	// phase (its go_gc_duration_seconds_count), left out for a server that
	// did not answer: with every rollout parked one collection scans every
	// parked goroutine's stack, so a phase that one fell into is slow for
	// that reason and no other.
	GCCycles map[string]int64 `json:"gc_cycles,omitempty"`
	// MinorFaults is each process's minor page faults in the phase: a
	// first touch of fresh memory is one, and on the VMs the bench runs on
	// not a cheap one (docs/scale-log.md).
	MinorFaults map[string]int64 `json:"minor_faults,omitempty"`
	// AllocBytes is the heap each server allocated in the phase (its
	// go_memstats_alloc_bytes_total): with Go's own pacing, the more a
	// phase allocates, the likelier a collection of the garbage the
	// dispatch left falls into it.
	AllocBytes map[string]int64 `json:"alloc_bytes,omitempty"`
}

// cpuSnapshot is each process's CPU time and faults at the start of a
// phase.
type cpuSnapshot map[string]procTimes

// snapshotCPU reads the CPU time and faults of every running fleet process
// and the bench's own.
func (b *bench) snapshotCPU() cpuSnapshot {
	snap := cpuSnapshot{}
	for _, t := range b.processes(b.fleetLabel) {
		if st, err := readStat(t.pid); err == nil {
			snap[t.name] = st
		}
	}
	if st, err := readStat(0); err == nil {
		snap["bench"] = st
	}
	return snap
}

// since is the CPU and faults of each process from before to now; a
// process that could not be read at either end is left out.
func (before cpuSnapshot) since(phase string, now cpuSnapshot) PhaseCPU {
	pc := PhaseCPU{Phase: phase, ByProcess: map[string]float64{}, SystemByProcess: map[string]float64{}, MinorFaults: map[string]int64{}}
	for name, end := range now {
		start, ok := before[name]
		if !ok {
			continue
		}
		s := (end.CPU - start.CPU).Seconds()
		pc.ByProcess[name] = s
		pc.SystemByProcess[name] = (end.System - start.System).Seconds()
		pc.Seconds += s
		pc.MinorFaults[name] = end.MinorFaults - start.MinorFaults
	}
	return pc
}

// detail is the table's line: the total, then each process's share and
// the collections it completed, when any.
func (pc PhaseCPU) detail() string {
	names := make([]string, 0, len(pc.ByProcess))
	for n := range pc.ByProcess {
		names = append(names, n)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s %.2f", n, pc.ByProcess[n])
		var notes []string
		if sys := pc.SystemByProcess[n]; sys >= systemWorthNaming {
			notes = append(notes, fmt.Sprintf("%.2f sys", sys))
		}
		if gc := pc.GCCycles[n]; gc > 0 {
			notes = append(notes, fmt.Sprintf("%d GC", gc))
		}
		if f := pc.MinorFaults[n]; f >= faultsWorthNaming {
			notes = append(notes, fmt.Sprintf("%dk faults", (f+500)/1000))
		}
		if a := pc.AllocBytes[n]; a >= allocWorthNaming {
			notes = append(notes, fmt.Sprintf("%d MB allocated", (a+500_000)/1_000_000))
		}
		if len(notes) > 0 {
			parts[i] += " (" + strings.Join(notes, ", ") + ")"
		}
	}
	return strings.Join(parts, ", ")
}

// systemWorthNaming is the least kernel CPU the table names for a process
// in a phase: two of the kernel's ticks.
const systemWorthNaming = 0.02

// faultsWorthNaming is the fewest faults the table names for a process
// in a phase: fewer cost too little to explain a phase's time.
const faultsWorthNaming = 1000

// allocWorthNaming is the least a server allocated in a phase that the
// table names.
const allocWorthNaming = 1_000_000

// gcSnapshot is each server's count of completed collections and of bytes
// allocated.
type gcSnapshot map[string]gcCounts

// gcCounts is one server's collector counters.
type gcCounts struct {
	cycles, allocBytes int64
}

// gcScrapeTimeout bounds reading one server's /metrics at a phase's edge.
const gcScrapeTimeout = 5 * time.Second

// snapshotGC reads every running server's collector counters from its
// /metrics; a server that does not answer is left out.
func (b *bench) snapshotGC(ctx context.Context) gcSnapshot {
	snap := gcSnapshot{}
	for _, r := range b.runtimeURLs() {
		exposition, err := b.scrapeMetrics(ctx, r.url+"/metrics", gcScrapeTimeout)
		if err != nil {
			continue
		}
		if c, err := parseGCCounts(exposition); err == nil {
			snap[r.name] = c
		}
	}
	return snap
}

// scrapeMetrics GETs a server's /metrics exposition within timeout.
func (b *bench) scrapeMetrics(ctx context.Context, url string, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	reply, err := httpclient.Do(ctx, b.ctl, http.MethodGet, url, nil, nil)
	if err != nil {
		return nil, err
	}
	if err := reply.Err("GET " + url); err != nil {
		return nil, err
	}
	return reply.Body, nil
}

// gcCountMetric is the Go collector's count of completed collections, and
// allocBytesMetric its count of bytes allocated.
const (
	gcCountMetric    = "go_gc_duration_seconds_count"
	allocBytesMetric = "go_memstats_alloc_bytes_total"
)

// parseGCCounts finds the collector's counters in a Prometheus text
// exposition.
func parseGCCounts(exposition []byte) (gcCounts, error) {
	names := []string{gcCountMetric, allocBytesMetric}
	values, err := metricValues(exposition, names...)
	if err != nil {
		return gcCounts{}, err
	}
	for i, f := range values {
		if f < 0 {
			return gcCounts{}, fmt.Errorf("%s %v: not a count", names[i], f)
		}
	}
	return gcCounts{cycles: int64(values[0]), allocBytes: int64(values[1])}, nil
}

// metricValues finds unlabelled metrics' values in a Prometheus text
// exposition, parsed once: each a gauge, counter or untyped sample, or the
// _count or _sum of a summary or histogram.
func metricValues(exposition []byte, metrics ...string) ([]float64, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(exposition))
	if err != nil {
		return nil, fmt.Errorf("reading the exposition for %s: %w", strings.Join(metrics, ", "), err)
	}
	values := make([]float64, len(metrics))
	for i, metric := range metrics {
		if values[i], err = familyValue(families, metric); err != nil {
			return nil, err
		}
	}
	return values, nil
}

// familyValue is metricValues' lookup of one metric.
func familyValue(families map[string]*dto.MetricFamily, metric string) (float64, error) {
	for _, m := range families[metric].GetMetric() {
		if len(m.GetLabel()) > 0 {
			continue
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), nil
		case m.Counter != nil:
			return m.GetCounter().GetValue(), nil
		case m.Untyped != nil:
			return m.GetUntyped().GetValue(), nil
		}
	}
	for _, suffix := range []string{"_count", "_sum"} {
		base, ok := strings.CutSuffix(metric, suffix)
		if !ok {
			continue
		}
		for _, m := range families[base].GetMetric() {
			if len(m.GetLabel()) > 0 {
				continue
			}
			switch {
			case m.Summary != nil && suffix == "_count":
				return float64(m.GetSummary().GetSampleCount()), nil
			case m.Summary != nil:
				return m.GetSummary().GetSampleSum(), nil
			case m.Histogram != nil && suffix == "_count":
				return float64(m.GetHistogram().GetSampleCount()), nil
			case m.Histogram != nil:
				return m.GetHistogram().GetSampleSum(), nil
			}
		}
	}
	return 0, fmt.Errorf("no %s in the exposition", metric)
}

// since is the collections each server completed and the bytes it
// allocated from before to now; a server read at one end only is left
// out.
func (before gcSnapshot) since(now gcSnapshot) (cycles, allocBytes map[string]int64) {
	cycles, allocBytes = map[string]int64{}, map[string]int64{}
	for name, end := range now {
		if start, ok := before[name]; ok {
			cycles[name] = end.cycles - start.cycles
			allocBytes[name] = end.allocBytes - start.allocBytes
		}
	}
	return cycles, allocBytes
}
