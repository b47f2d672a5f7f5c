package scalebench

import (
	"fmt"
	"slices"
	"strings"
	"time"
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
}

// cpuSnapshot is each process's CPU time at the start of a phase.
type cpuSnapshot map[string]time.Duration

// snapshotCPU reads the CPU time of every running fleet process and the
// bench's own.
func (b *bench) snapshotCPU() cpuSnapshot {
	snap := cpuSnapshot{}
	for _, t := range b.processes(b.fleetLabel) {
		if cpu, err := readCPU(t.pid); err == nil {
			snap[t.name] = cpu
		}
	}
	if cpu, err := readCPU(0); err == nil {
		snap["bench"] = cpu
	}
	return snap
}

// since is the CPU each process spent from before to now; a process that
// could not be read at either end is left out.
func (before cpuSnapshot) since(phase string, now cpuSnapshot) PhaseCPU {
	pc := PhaseCPU{Phase: phase, ByProcess: map[string]float64{}}
	for name, end := range now {
		start, ok := before[name]
		if !ok {
			continue
		}
		s := (end - start).Seconds()
		pc.ByProcess[name] = s
		pc.Seconds += s
	}
	return pc
}

// detail is the table's line: the total, then each process's share.
func (pc PhaseCPU) detail() string {
	names := make([]string, 0, len(pc.ByProcess))
	for n := range pc.ByProcess {
		names = append(names, n)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s %.2f", n, pc.ByProcess[n])
	}
	return strings.Join(parts, ", ")
}
