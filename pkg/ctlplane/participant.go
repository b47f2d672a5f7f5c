package ctlplane

import (
	"cmp"
	"context"
	"hash/maphash"
	"slices"
	"sort"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/rollout"
)

// Participant kinds.
const (
	KindEnvironment = "environment"
	KindModel       = "model"
	KindAgent       = "agent"
	KindResources   = "resources"
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
}

// Report is a participant's readiness report.
type Report struct {
	Ready        bool           `json:"ready"`
	Blockers     []string       `json:"blockers"`
	BlockerCount int            `json:"blocker_count"`
	Counts       map[string]int `json:"counts"`
	Restarts     []string       `json:"restarts"`
}

// MaxBlockers is how many blockers a reply lists; the count is always full.
const MaxBlockers = 100

// Blockers sorts keys and keeps at most limit of them, the way every report
// lists its blockers.
func Blockers(keys []string, limit int) (listed []string, count int) {
	sort.Strings(keys)
	count = len(keys)
	if limit >= 0 && len(keys) > limit {
		keys = keys[:limit]
	}
	if keys == nil {
		keys = []string{}
	}
	return keys, count
}

// Scope is the set of episodes a commit continues or a restore installs.
type Scope struct {
	// sorted lists the episodes in IDs order, sorted once: a commit and its
	// participants list a scope of 100,000 episodes several times.
	sorted []rollout.EpisodeID
	// slots index sorted by a hash of each episode: slot value i+1 names
	// sorted[i], 0 is empty; linear probing, at most half full. A map of
	// the episodes was 1.15 MB at 16,000 (the table is 128 KB), fresh
	// memory in a fresh process, and building it was a third of the work
	// each participant does with a commit's body (BenchmarkCommitBody).
	slots []int32
	seed  maphash.Seed
}

// NewScope builds a scope from episode ids.
func NewScope(ids []rollout.EpisodeID) Scope { return newScope(ids, false) }

// newScope builds a scope; owned says ids may be sorted in place and kept
// (a control body's list, 384 KB at 16,000 episodes) rather than copied.
func newScope(ids []rollout.EpisodeID, owned bool) Scope {
	sorted := ids
	if !owned {
		sorted = slices.Clone(ids)
	}
	// A controller sends its scope sorted, which the sort then only checks.
	slices.SortFunc(sorted, compareEpisodes)
	s := Scope{sorted: slices.Compact(sorted), seed: maphash.MakeSeed()}
	size := 1
	for size < 2*len(s.sorted) {
		size *= 2
	}
	s.slots = make([]int32, size)
	mask := uint64(size - 1)
	for i, id := range s.sorted {
		h := s.hash(id) & mask
		for s.slots[h] != 0 {
			h = (h + 1) & mask
		}
		s.slots[h] = int32(i + 1)
	}
	return s
}

func compareEpisodes(a, b rollout.EpisodeID) int {
	return cmp.Or(strings.Compare(a.RolloutID, b.RolloutID), cmp.Compare(a.Attempt, b.Attempt))
}

func (s Scope) hash(id rollout.EpisodeID) uint64 {
	return maphash.String(s.seed, id.RolloutID) ^ uint64(id.Attempt)*0x9e3779b97f4a7c15
}

// Has reports whether the scope names this exact attempt.
func (s Scope) Has(id rollout.EpisodeID) bool {
	_, ok := s.Index(id)
	return ok
}

// Index reports where IDs lists this exact attempt, if the scope names it:
// an export can put its records in scope order by position, without
// comparing ids.
func (s Scope) Index(id rollout.EpisodeID) (int, bool) {
	if len(s.slots) == 0 {
		return 0, false
	}
	mask := uint64(len(s.slots) - 1)
	for h := s.hash(id) & mask; s.slots[h] != 0; h = (h + 1) & mask {
		if i := int(s.slots[h] - 1); s.sorted[i] == id {
			return i, true
		}
	}
	return 0, false
}

// Len is the number of episodes in scope.
func (s Scope) Len() int { return len(s.sorted) }

// IDs lists the scope's episodes sorted by rollout id, then attempt.
func (s Scope) IDs() []rollout.EpisodeID {
	out := make([]rollout.EpisodeID, len(s.sorted))
	copy(out, s.sorted)
	return out
}
