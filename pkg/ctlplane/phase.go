// Package ctlplane is the checkpoint control plane every server mounts at
// /_ckpt/ (SPEC §3): the phase machine, the lease, the attempt fence,
// admission, and the routes. A server plugs its own state in through the
// Participant interface, so the HTTP, phase, lease and fence logic exists
// exactly once.
package ctlplane

import (
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/control"
)

// Phase is where a participant is in a checkpoint; the type is the wire's
// (pkg/wire/control), the transitions between its values are this package's.
type Phase = control.Phase

// The phases of SPEC §3. idle → preparing → prepared → committed, and
// idle → restored; resume (also abort) and lease expiry return to idle.
const (
	PhaseIdle      = control.PhaseIdle
	PhasePreparing = control.PhasePreparing
	PhasePrepared  = control.PhasePrepared
	PhaseCommitted = control.PhaseCommitted
	PhaseRestored  = control.PhaseRestored
)

// Op is an input of the phase machine: a control call, or an event the
// participant or the lease reports.
type Op uint8

// Operations and events.
const (
	OpPrepare Op = iota
	OpRenew
	OpCommit
	OpRestore
	OpResume
	OpRetire
	OpForget
	// OpReady: the participant reported ready while preparing.
	OpReady
	// OpCommitDone and OpRestoreDone: the write or install finished (OK says
	// whether it succeeded).
	OpCommitDone
	OpRestoreDone
	// OpLeaseExpired: the lease of the open checkpoint ran out.
	OpLeaseExpired
)

var opNames = [...]string{"prepare", "renew", "commit", "restore", "resume", "retire", "forget", "ready", "commit_done", "restore_done", "lease_expired"}

func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return "unknown"
}

// Action is what the caller of Step must do after a transition.
type Action uint8

// Actions.
const (
	// ActNone: nothing beyond replying.
	ActNone Action = iota
	// ActCloseAndWait: close admission, then wait for readiness.
	ActCloseAndWait
	// ActWaitReady: admission is already closed; wait for readiness again.
	ActWaitReady
	// ActReplay: reply with the cached result of this operation.
	ActReplay
	// ActWrite: export and write the commit.
	ActWrite
	// ActAwaitWrite: a write of this commit is running; await it.
	ActAwaitWrite
	// ActInstall: read and install the restore.
	ActInstall
	// ActAwaitInstall: an install of this restore is running; await it.
	ActAwaitInstall
	// ActReopen: stop any unfinished write, reopen admission.
	ActReopen
	// ActRetire / ActForget: raise the fence and stop work / drop the marks.
	ActRetire
	ActForget
)

var actionNames = [...]string{"none", "close_and_wait", "wait_ready", "replay", "write", "await_write", "install", "await_install", "reopen", "retire", "forget"}

func (a Action) String() string {
	if int(a) < len(actionNames) {
		return actionNames[a]
	}
	return "unknown"
}

// RecentlyResumed is how many resumed checkpoint ids a participant
// remembers, so a delayed call of an aborted checkpoint is refused.
const RecentlyResumed = 64

// State is the phase machine's whole state. It is a value: Step never
// mutates its input.
type State struct {
	Phase        Phase
	CheckpointID string
	// Dir and Scope identify the commit or restore running or done for this
	// checkpoint; a retry with other values is a conflict.
	Dir   string
	Scope string
	// Busy is set while a commit write or a restore install runs.
	Busy bool
	// Resumed are the last RecentlyResumed resumed ids, oldest first.
	Resumed []string
}

// Input is one operation or event.
type Input struct {
	Op           Op
	CheckpointID string
	Dir          string
	// Scope is a canonical digest of the commit or restore scope.
	Scope string
	// Ready is the participant's readiness, for commit (which re-checks it).
	Ready bool
	// OK is the outcome of a finished write or install.
	OK bool
}

// Decision is Step's result.
type Decision struct {
	Next   State
	Action Action
	// Err is set when the operation is refused; Next is then the unchanged state.
	Err *apierror.Error
	// Idempotent marks a resume that found nothing to do.
	Idempotent bool
}

func (s State) resumed(id string) bool {
	for _, r := range s.Resumed {
		if r == id {
			return true
		}
	}
	return false
}

// withResumed returns the resumed list with id appended, bounded.
func (s State) withResumed(id string) []string {
	if id == "" || s.resumed(id) {
		return s.Resumed
	}
	out := make([]string, 0, len(s.Resumed)+1)
	out = append(out, s.Resumed...)
	out = append(out, id)
	if len(out) > RecentlyResumed {
		out = out[len(out)-RecentlyResumed:]
	}
	return out
}

func (s State) open() bool { return s.Phase != PhaseIdle || s.Busy }

func refuse(s State, code apierror.Code, format string, args ...any) Decision {
	return Decision{Next: s, Err: apierror.New(code, format, args...)}
}

// Step is the pure transition function of the control plane: no clock, no
// I/O, no map iteration. The Controller calls it under its lock and carries
// out the returned action.
func Step(s State, in Input) Decision {
	id := in.CheckpointID
	// A checkpoint already resumed never comes back: its delayed calls are
	// refused, except a resume, which is idempotent.
	if id != "" && s.resumed(id) && in.Op != OpResume && in.Op != OpRetire && in.Op != OpForget {
		if in.Op == OpReady || in.Op == OpCommitDone || in.Op == OpRestoreDone || in.Op == OpLeaseExpired {
			return Decision{Next: s}
		}
		return refuse(s, apierror.StaleCheckpoint, "checkpoint %s was already resumed", id)
	}
	switch in.Op {
	case OpPrepare:
		return stepPrepare(s, in)
	case OpRenew:
		if !s.open() {
			return refuse(s, apierror.InvalidPhase, "no checkpoint is open to renew")
		}
		if id != s.CheckpointID {
			return refuse(s, apierror.CheckpointConflict, "checkpoint %s is open, not %s", s.CheckpointID, id)
		}
		return Decision{Next: s}
	case OpCommit:
		return stepCommit(s, in)
	case OpRestore:
		return stepRestore(s, in)
	case OpResume:
		return stepResume(s, in)
	case OpRetire, OpForget:
		act := ActRetire
		if in.Op == OpForget {
			act = ActForget
		}
		switch {
		case s.Phase == PhaseIdle && !s.Busy:
			return Decision{Next: s, Action: act}
		case s.Phase == PhaseRestored && !s.Busy && (id == "" || id == s.CheckpointID):
			return Decision{Next: s, Action: act}
		case s.Phase == PhaseRestored && !s.Busy:
			return refuse(s, apierror.CheckpointConflict, "checkpoint %s is restored, not %s", s.CheckpointID, id)
		}
		return refuse(s, apierror.InvalidPhase, "%s is refused while checkpoint %s is %s: resume first", in.Op, s.CheckpointID, s.Phase)
	case OpReady:
		if s.Phase == PhasePreparing && id == s.CheckpointID {
			n := s
			n.Phase = PhasePrepared
			return Decision{Next: n}
		}
		return Decision{Next: s}
	case OpCommitDone:
		if s.Phase != PhasePrepared || id != s.CheckpointID || !s.Busy {
			return Decision{Next: s}
		}
		n := s
		n.Busy = false
		if in.OK {
			n.Phase = PhaseCommitted
		} else {
			// A failed write leaves the checkpoint prepared; the controller
			// may retry the commit or resume.
			n.Dir, n.Scope = "", ""
		}
		return Decision{Next: n}
	case OpRestoreDone:
		if s.Phase != PhaseIdle || id != s.CheckpointID || !s.Busy {
			return Decision{Next: s}
		}
		if in.OK {
			n := s
			n.Busy = false
			n.Phase = PhaseRestored
			return Decision{Next: n}
		}
		return Decision{Next: State{Resumed: s.Resumed}}
	case OpLeaseExpired:
		if !s.open() || id != s.CheckpointID {
			return Decision{Next: s}
		}
		// Expiry reopens exactly as a resume would.
		return Decision{Next: State{Resumed: s.withResumed(id)}, Action: ActReopen}
	}
	return refuse(s, apierror.InvalidRequest, "unknown operation %d", in.Op)
}

func stepPrepare(s State, in Input) Decision {
	id := in.CheckpointID
	switch {
	case !s.open():
		return Decision{Next: State{Phase: PhasePreparing, CheckpointID: id, Resumed: s.Resumed}, Action: ActCloseAndWait}
	case s.CheckpointID != id:
		return refuse(s, apierror.CheckpointConflict, "checkpoint %s is open (%s); cannot prepare %s", s.CheckpointID, s.Phase, id)
	case s.Phase == PhasePreparing:
		return Decision{Next: s, Action: ActWaitReady}
	case s.Phase == PhasePrepared && !s.Busy:
		return Decision{Next: s, Action: ActReplay}
	}
	return refuse(s, apierror.InvalidPhase, "cannot prepare checkpoint %s: it is %s", id, s.Phase)
}

func stepCommit(s State, in Input) Decision {
	id := in.CheckpointID
	if !s.open() {
		return refuse(s, apierror.InvalidPhase, "cannot commit checkpoint %s: nothing is prepared", id)
	}
	if s.CheckpointID != id {
		return refuse(s, apierror.CheckpointConflict, "checkpoint %s is open (%s); cannot commit %s", s.CheckpointID, s.Phase, id)
	}
	switch s.Phase {
	case PhasePrepared:
		if s.Busy {
			if s.Dir != in.Dir || s.Scope != in.Scope {
				return refuse(s, apierror.CheckpointConflict, "checkpoint %s is being committed with another directory or scope", id)
			}
			return Decision{Next: s, Action: ActAwaitWrite}
		}
		if !in.Ready {
			return refuse(s, apierror.InvalidPhase, "participant is no longer ready to commit checkpoint %s", id)
		}
		n := s
		n.Busy, n.Dir, n.Scope = true, in.Dir, in.Scope
		return Decision{Next: n, Action: ActWrite}
	case PhaseCommitted:
		if s.Dir != in.Dir || s.Scope != in.Scope {
			return refuse(s, apierror.CheckpointConflict, "checkpoint %s was committed with another directory or scope", id)
		}
		return Decision{Next: s, Action: ActReplay}
	}
	return refuse(s, apierror.InvalidPhase, "cannot commit checkpoint %s: it is %s", id, s.Phase)
}

func stepRestore(s State, in Input) Decision {
	id := in.CheckpointID
	switch {
	case !s.open():
		return Decision{Next: State{CheckpointID: id, Dir: in.Dir, Scope: in.Scope, Busy: true, Resumed: s.Resumed}, Action: ActInstall}
	case s.CheckpointID != id:
		return refuse(s, apierror.CheckpointConflict, "checkpoint %s is open (%s); cannot restore %s", s.CheckpointID, s.Phase, id)
	case s.Phase == PhaseIdle && s.Busy, s.Phase == PhaseRestored:
		if s.Dir != in.Dir || s.Scope != in.Scope {
			return refuse(s, apierror.CheckpointConflict, "checkpoint %s is restored with another directory or scope", id)
		}
		if s.Busy {
			return Decision{Next: s, Action: ActAwaitInstall}
		}
		return Decision{Next: s, Action: ActReplay}
	}
	return refuse(s, apierror.InvalidPhase, "cannot restore checkpoint %s: it is %s", id, s.Phase)
}

func stepResume(s State, in Input) Decision {
	id := in.CheckpointID
	if !s.open() {
		// Nothing open: remember the id, so a delayed prepare of an aborted
		// checkpoint cannot close admission later.
		n := s
		n.Resumed = s.withResumed(id)
		return Decision{Next: n, Idempotent: true}
	}
	if s.CheckpointID != id {
		if s.resumed(id) {
			return Decision{Next: s, Idempotent: true}
		}
		return refuse(s, apierror.CheckpointConflict, "checkpoint %s is open (%s); cannot resume %s", s.CheckpointID, s.Phase, id)
	}
	return Decision{Next: State{Resumed: s.withResumed(id)}, Action: ActReopen}
}
