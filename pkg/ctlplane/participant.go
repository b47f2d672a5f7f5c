package ctlplane

import (
	"context"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/wire/control"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Participant kinds (pkg/wire/control's).
const (
	KindEnvironment = control.KindEnvironment
	KindModel       = control.KindModel
	KindAgent       = control.KindAgent
	KindResources   = control.KindResources
)

// Participant is what a server implements to take part in checkpoints. The
// Controller owns phases, the lease, the fence, admission for the data routes
// and storage; a participant only knows its own state.
//
// Calls come from the Controller one operation at a time, except Ready,
// ReadyChanged and Report, which may be called at any time and must be cheap.
type Participant interface {
	// Kind is environment, model, agent or resources; Instance names this
	// server among those of its kind (a path component of the checkpoint).
	Kind() string
	Instance() string

	// CloseAdmission stops new work from starting: what "new work" means and
	// whether it waits or is refused is the participant's (SPEC §6). It must
	// return quickly; ctx carries the operation's deadline, for work the
	// participant starts in the background (a generation cut). If it fails,
	// the Controller reopens and refuses the prepare.
	CloseAdmission(ctx context.Context) error
	// OpenAdmission lets work start again and releases what was held.
	OpenAdmission()

	// Ready reports whether everything in flight is at a point the checkpoint
	// can capture. It must be a cheap check (a count), never a scan.
	Ready() bool
	// ReadyChanged returns a channel closed the next time readiness may have
	// changed. Get it before calling Ready, so no change is missed.
	ReadyChanged() <-chan struct{}
	// Report builds the readiness report for a reply: at most limit blockers
	// (sorted capture keys), their full count, counts by kind and restarts.
	// Called once per reply, never in a loop.
	Report(limit int) Report

	// Export writes one record per episode in scope that this participant
	// holds state for, by calling emit. It returns extras for the manifest
	// and for the commit reply (both may be nil). emit does not retain
	// Record.Data after it returns (the store copies it into its line), so
	// an Export may reuse a record's buffer for the next record.
	Export(ctx context.Context, scope Scope, emit func(Record) error) (Extras, error)
	// Committed runs after the commit's write is durable: a participant
	// deletes restored state the scope left out (SPEC §6) and may free
	// resources when stop is set.
	Committed(ctx context.Context, scope Scope, stop bool) error

	// Fresh returns nil if this process has served nothing (no episodes,
	// sessions or calls), which restore requires.
	Fresh() error
	// Install validates every record, then installs every one under its
	// episode's next attempt (all or nothing). Each record's data is one
	// JSON value: the store checked each as it wrote it, and the records
	// file's digest, checked as it read them, proves they are the bytes
	// written (ckptstore.Read). So Install checks what the value holds, not
	// its syntax again. scope names the checkpointed
	// attempts the controller continues (records are already filtered by
	// it); a participant may use it to clear what dead executions left for
	// episodes that have no record. It returns the next attempts installed.
	// Admission is closed while it runs.
	Install(ctx context.Context, records []Record, scope Scope, manifest Extras) ([]rollout.EpisodeID, error)

	// Retire stops the work of the given attempts (and earlier ones of the
	// same rollouts), waits until it has stopped, and frees their live and
	// restored state. The fence is already raised when it is called.
	Retire(ctx context.Context, ids []rollout.EpisodeID) error
	// Forget drops whatever the participant keeps for retired rollouts; it
	// may refuse with retire_incomplete while a retire has not finished.
	Forget(ctx context.Context, rolloutIDs []string) error

	// StatusExtra adds kind-specific fields to GET status.
	StatusExtra() map[string]any
}

// Holder is a participant that can name every episode it holds state for:
// each one its Export would write were the scope to name them all. It
// takes a commit without a scope (episode_ids null), which NeMo Gym's
// participants read as "everything held" (control.py CommitRequest;
// environment.py, agent.py, resources.py export every live episode and
// every restored one); the scope is then what Held names. A participant
// that is no Holder refuses such a commit with checkpoint_error, as Gym's
// model participant does: its ledger keeps every episode it ever served.
// Held is called with admission closed, the participant prepared.
type Holder interface {
	Held() []rollout.EpisodeID
}

// Record is one participant record of one episode, opaque to the control
// plane: a line of the records file.
type Record = ckptstore.Record

// Extras are participant-specific fields of a manifest or reply.
type Extras struct {
	// Manifest fields are written into manifest.json and handed back to
	// Install on restore.
	Manifest map[string]any
	// Reply fields are added to the commit reply (e.g. staging keys).
	Reply map[string]any
	// Aliases, on Install, maps former instances with no live replica of
	// their name to the live replica that took their records (a restore
	// into a different set of replicas): a participant that records which
	// replica of a callee owns a rollout routes through it.
	Aliases map[string]string
}

// Report is a participant's readiness report (pkg/wire/control's).
type Report = control.Report

// MaxBlockers is how many blockers a reply lists; the count is always full.
const MaxBlockers = control.MaxBlockers

// Blockers sorts keys and keeps at most limit of them, the way every report
// lists its blockers.
func Blockers(keys []string, limit int) (listed []string, count int) {
	return control.Blockers(keys, limit)
}

// Scope is the set of episodes a commit continues or a restore installs
// (pkg/wire/control's).
type Scope = control.Scope

// NewScope builds a scope from episode ids.
func NewScope(ids []rollout.EpisodeID) Scope { return control.NewScope(ids) }
