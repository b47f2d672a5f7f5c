package environment

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// CPUGateSlots is how many /run handlers the server's CPU gate admits at once.
func CPUGateSlots(s *Server) int { return cap(s.cpu) }

// CPUGateTaken is how many slots of the server's CPU gate are taken.
func CPUGateTaken(s *Server) int { return len(s.cpu) }

// TakeCPUGateSlot takes one slot of the server's CPU gate, as a /run
// decoding its body does, and returns the function that frees it.
func TakeCPUGateSlot(s *Server) (leave func()) {
	if err := s.cpu.enter(context.Background()); err != nil {
		panic(err) // a background context never ends
	}
	return s.cpu.leave
}

// LateCleanupPending is how many final-cleanup steps the server's late
// cleanup has waiting to be sent again or being sent.
func LateCleanupPending(s *Server) int { return s.late.Pending() }

// GatheredValue is the value of the gauge or counter name in reg, of the
// series whose outcome label is outcome (any series when outcome is empty);
// 0 when there is no such series.
func GatheredValue(t testing.TB, reg prometheus.Gatherer, name, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := outcome == ""
			for _, lp := range m.GetLabel() {
				match = match || (lp.GetName() == "outcome" && lp.GetValue() == outcome)
			}
			if !match {
				continue
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// LogBuffer collects a server's log lines while its goroutines write them.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Lines returns the logged lines that contain every one of subs.
func (l *LogBuffer) Lines(subs ...string) []string {
	var out []string
	for line := range strings.Lines(l.String()) {
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}
