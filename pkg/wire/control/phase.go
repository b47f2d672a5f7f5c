package control

import "fmt"

// Phase is where a participant is in a checkpoint.
type Phase uint8

// The phases of SPEC §3. idle → preparing → prepared → committed, and
// idle → restored; resume (also abort) and lease expiry return to idle.
const (
	PhaseIdle Phase = iota
	PhasePreparing
	PhasePrepared
	PhaseCommitted
	PhaseRestored
)

var phaseNames = [...]string{"idle", "preparing", "prepared", "committed", "restored"}

func (p Phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return "unknown"
}

// MarshalText writes the phase name.
func (p Phase) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText reads a phase name.
func (p *Phase) UnmarshalText(b []byte) error {
	for i, n := range phaseNames {
		if n == string(b) {
			*p = Phase(i)
			return nil
		}
	}
	return fmt.Errorf("unknown phase %q", b)
}
