// Package control is the wire contract of the checkpoint control API
// (SPEC §3), NeMo Gym's nemo_gym/_checkpoint/control.py, whose names it
// carries (CheckpointRequest, CommitRequest, RestoreRequest,
// RetireRequest, ForgetRequest, CheckpointRoutePrefix): its routes,
// requests, replies, phases, participant kinds, episode lists and
// readiness reports. Servers (pkg/ctlplane) and
// controllers (pkg/checkpoint/coordination, gymctl) both speak it; it holds no
// server code, so a controller links no HTTP server, router or metrics.
package control

import (
	"fmt"
	"maps"
	"slices"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/replica"
)

// Route prefixes. CheckpointRoutePrefix is NeMo Gym's
// CHECKPOINT_ROUTE_PREFIX (control.py), the one our coordinator calls and
// NeMo RL's adapter reaches through Gym's coordination; our servers also
// mount the same routes under RoutePrefix, our own earlier prefix.
const (
	CheckpointRoutePrefix = "/ng-control/v1/checkpoint"
	RoutePrefix           = "/_ckpt"
	// ReferenceRoutePrefix is CheckpointRoutePrefix, by its former name.
	ReferenceRoutePrefix = CheckpointRoutePrefix
)

// Participant kinds.
const (
	KindEnvironment = "environment"
	KindModel       = "model"
	KindAgent       = "agent"
	KindResources   = "resources"
)

// ManifestLegacyRuns is the agent manifest's count of legacy /run
// episodes, written only when there are some. A legacy /run reaches its
// agent replica by rollout id while a restore places agent records by
// former owner, so a coordinator refuses to restore such a checkpoint into
// a different set of agent replicas.
const ManifestLegacyRuns = "legacy_runs"

// CheckpointRequest is the body of prepare, renew and resume.
type CheckpointRequest struct {
	CheckpointID string  `json:"checkpoint_id"`
	DeadlineTS   float64 `json:"deadline_ts"`
}

// PrepareReply is prepare's reply.
type PrepareReply struct {
	Phase  Phase  `json:"phase"`
	Report Report `json:"report"`
}

// CommitRequest is commit's body. EpisodeIDs is the scope: every episode the
// controller continues.
type CommitRequest struct {
	CheckpointID  string     `json:"checkpoint_id"`
	DeadlineTS    float64    `json:"deadline_ts"`
	CheckpointDir string     `json:"checkpoint_dir"`
	EpisodeIDs    EpisodeIDs `json:"episode_ids"`
	Stop          bool       `json:"stop"`
}

// CommitReply is commit's reply: the manifest, the capture keys actually
// exported, and the participant's reply extras.
type CommitReply struct {
	Phase      Phase
	Manifest   ckptstore.Manifest
	EpisodeIDs []string
	Extras     map[string]any
	Records    int
	Bytes      int64
	// WriteSeconds is how long this participant took to export and write
	// its part, so a slow commit names the participant that made it slow.
	WriteSeconds float64
}

// MarshalJSON flattens the extras next to the fixed fields (a fixed field
// wins over an extra of the same name), keys sorted as encoding/json sorts a
// map's. The episode ids, one per episode in scope, are appended by hand:
// through encoding/json they were a visible part of every participant's
// commit at scale (docs/scale-log.md). The other values are few and small
// and keep encoding/json's encoding.
func (r CommitReply) MarshalJSON() ([]byte, error) {
	values := make(map[string]any, len(r.Extras)+4)
	for k, v := range r.Extras {
		values[k] = v
	}
	values["phase"] = r.Phase
	values["manifest"] = r.Manifest
	values["write_seconds"] = r.WriteSeconds
	values[commitReplyEpisodeIDs] = nil
	names := slices.Sorted(maps.Keys(values))

	size := 256
	for _, k := range r.EpisodeIDs {
		size += len(k) + 3
	}
	out := make([]byte, 0, size)
	out = append(out, '{')
	for i, name := range names {
		if i > 0 {
			out = append(out, ',')
		}
		out = codec.AppendString(out, name)
		out = append(out, ':')
		if name == commitReplyEpisodeIDs {
			out = appendStrings(out, r.EpisodeIDs)
			continue
		}
		v, err := codec.MarshalStable(values[name])
		if err != nil {
			return nil, fmt.Errorf("commit reply field %q: %w", name, err)
		}
		out = append(out, v...)
	}
	return append(out, '}'), nil
}

// commitReplyEpisodeIDs is the reply key of the capture keys exported.
const commitReplyEpisodeIDs = "episode_ids"

// appendStrings appends ss as a JSON array of strings ([] for nil).
func appendStrings(dst []byte, ss []string) []byte {
	dst = append(dst, '[')
	for i, s := range ss {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = codec.AppendString(dst, s)
	}
	return append(dst, ']')
}

// RestoreRequest is restore's body: the checkpointed attempts to continue.
type RestoreRequest struct {
	CheckpointID  string     `json:"checkpoint_id"`
	DeadlineTS    float64    `json:"deadline_ts"`
	CheckpointDir string     `json:"checkpoint_dir"`
	EpisodeIDs    EpisodeIDs `json:"episode_ids"`
	// Epoch is the fleet's next epoch, higher than any participant's; the
	// restored processes adopt it and fence every earlier incarnation.
	// Absent (0): join the fleet's current epoch, fencing nothing.
	Epoch uint64 `json:"epoch,omitempty"`
	// Replicas, when present, is this participant's part of a restore
	// into a different set of replicas (docs/CHECKPOINTS.md, "Replicas").
	// Absent: the participant installs its own instance's records.
	Replicas *ReplicaPlan `json:"replicas,omitempty"`
}

// ReplicaPlan is one participant's part of a restore across replicas.
type ReplicaPlan struct {
	// Sources are the former instances (of this participant's kind) whose
	// records it installs; empty installs none (a replica the checkpoint
	// did not have).
	Sources []string `json:"sources"`
	// Aliases maps every former instance, of any kind, that has no live
	// replica of its name to the live replica that took its records.
	Aliases map[string]string `json:"aliases,omitempty"`
	// Partition, for a kind its callers reach by rollout id (environment,
	// resources, model), keeps of the sources only the records of the
	// rollouts replica.Pick now sends to this replica. Absent: every
	// record of the sources.
	Partition *replica.Partition `json:"partition,omitempty"`
}

// RestoreReply is restore's reply: the next attempts installed.
type RestoreReply struct {
	Phase              Phase    `json:"phase"`
	SourceCheckpointID string   `json:"source_checkpoint_id"`
	Restored           []string `json:"restored"`
	// ReadSeconds is how long reading and verifying the records took,
	// InstallSeconds how long the participant took to install them.
	ReadSeconds    float64 `json:"read_seconds"`
	InstallSeconds float64 `json:"install_seconds"`
	Records        int     `json:"-"`
}

// ResumeReply is resume's reply.
type ResumeReply struct {
	Phase      Phase `json:"phase"`
	Idempotent bool  `json:"idempotent"`
}

// RetireRequest is retire's body.
type RetireRequest struct {
	CheckpointID string     `json:"checkpoint_id,omitempty"`
	DeadlineTS   float64    `json:"deadline_ts"`
	EpisodeIDs   EpisodeIDs `json:"episode_ids"`
}

// ForgetRequest is forget's body.
type ForgetRequest struct {
	CheckpointID string   `json:"checkpoint_id,omitempty"`
	DeadlineTS   float64  `json:"deadline_ts"`
	RolloutIDs   []string `json:"rollout_ids"`
}

// Record is one participant record of one episode, opaque to the control
// plane: a line of the records file.
type Record = ckptstore.Record
