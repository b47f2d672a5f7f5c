// Package faultpoint names the places on the checkpoint paths where a test
// build kills its own process, so a process-level sweep can crash a real
// server (or gymctl) at each step of a commit or a restore and check that
// the fleet recovers from the last published checkpoint.
//
// A point is compiled in only under the build tag gymfleet_faults. Without
// it Hit is an empty function the compiler removes, and the environment
// variables below are never read: a production binary cannot be made to
// crash through them. With it, Hit reads the file EnvFile names and, if the
// file holds the point's name, logs one line to stderr and sends the
// process SIGKILL: no deferred call, flush or shutdown hook runs, exactly
// as when an operator or the kernel kills it. EnvTrace names a file each
// point reached is appended to, which is how a test proves every point is
// reachable.
package faultpoint

// Point is the stable name of one fault point.
type Point string

// EnvFile is the environment variable naming the arm file: a point fires
// when the file holds its name (surrounding white space ignored). The file
// is read at every hit, so a test arms a point in a running process by
// writing the file, and disarms it by removing it.
const EnvFile = "GYMFLEET_FAULTPOINT_FILE"

// EnvTrace is the environment variable naming a file every point reached
// is appended to, one name a line, before the point may fire.
const EnvTrace = "GYMFLEET_FAULTPOINT_TRACE"

// FiredPrefix starts the line a firing point writes to stderr, followed by
// the point's name.
const FiredPrefix = "faultpoint fired: "

// The points. Each name says where the process dies; what was durable at
// that moment is in the comment.
const (
	// AtomicTempSynced: a durable write's temp file is written, fsynced and
	// closed; it is not yet renamed or linked into place.
	AtomicTempSynced Point = "atomicfile.temp-synced"
	// AtomicRenamed: a replacing write renamed its temp file into place;
	// the directory is not yet fsynced.
	AtomicRenamed Point = "atomicfile.renamed"
	// AtomicLinked: a create-only publish linked its temp file to the
	// target name; the temp name is not yet removed nor the directory
	// fsynced.
	AtomicLinked Point = "atomicfile.linked"

	// StoreRecordsSynced: a participant's records temp file is written and
	// fsynced, not yet renamed to its digest.
	StoreRecordsSynced Point = "ckptstore.records-synced"
	// StoreRecordsCommitted: the records file is renamed to its digest and
	// the directory fsynced; no manifest is written yet.
	StoreRecordsCommitted Point = "ckptstore.records-committed"
	// StoreManifestPublished: the participant's manifest is published; the
	// write has not returned to the control plane.
	StoreManifestPublished Point = "ckptstore.manifest-published"

	// CommitWritten: the control plane's commit write is durable; the
	// participant has not been told (Committed) and nothing was replied.
	CommitWritten Point = "ctlplane.commit-written"
	// CommitAcked: the participant ran Committed; the commit reply is not
	// sent.
	CommitAcked Point = "ctlplane.commit-acked"
	// RestoreRead: a restore read and verified the participant's records;
	// nothing is installed.
	RestoreRead Point = "ctlplane.restore-read"
	// RestoreInstalled: the participant installed the records; the restore
	// reply is not sent.
	RestoreInstalled Point = "ctlplane.restore-installed"

	// EnvExportPartial, AgentExportPartial, ModelExportPartial and
	// ResourcesExportPartial: the participant's export emitted its first
	// record (the records file is partly written) and stops there.
	EnvExportPartial       Point = "environment.export-partial"
	AgentExportPartial     Point = "agent.export-partial"
	ModelExportPartial     Point = "modelproxy.export-partial"
	ResourcesExportPartial Point = "resources.export-partial"
	// EpisodeInstallValidated: an episode tracker (the environment's, or
	// the agent's legacy runs') validated every record, installed none.
	EpisodeInstallValidated Point = "episode.install-validated"
	// AgentInstallPartial and ResourcesInstallPartial: mid-install, part
	// of the records installed in memory.
	AgentInstallPartial     Point = "agent.install-partial"
	ResourcesInstallPartial Point = "resources.install-partial"
	// ModelInstallImported: the model server's restore wrote the next
	// attempts' ledgers (import records); later attempts are not deleted
	// nor the sources retired.
	ModelInstallImported Point = "modelproxy.install-imported"
	// ModelInstallDeleted: later attempts' ledgers are deleted; the source
	// attempts are not retired.
	ModelInstallDeleted Point = "modelproxy.install-deleted"

	// LedgerAppendWritten: a capture ledger row is written to the kernel;
	// the model reply it describes is not delivered ("stage before ack").
	LedgerAppendWritten Point = "tokencapture.append-written"
	// LedgerImportWritten: a restore's import records are written to the
	// ledger; the import has not returned.
	LedgerImportWritten Point = "tokencapture.import-written"
	// LedgerRemoveWritten: a retire or delete record is written; the
	// in-memory index is not yet updated.
	LedgerRemoveWritten Point = "tokencapture.remove-written"

	// CollectManifestWritten: gymctl collect wrote the collection manifest
	// of a checkpoint every participant committed; LATEST still names the
	// previous one.
	CollectManifestWritten Point = "collect.manifest-written"
	// CollectLatestWritten: LATEST names the new checkpoint; the fleet is
	// not resumed and older checkpoints not pruned.
	CollectLatestWritten Point = "collect.latest-written"
)

// All lists every point once, in the order a sweep visits them.
func All() []Point {
	return []Point{
		AtomicTempSynced, AtomicRenamed, AtomicLinked,
		StoreRecordsSynced, StoreRecordsCommitted, StoreManifestPublished,
		CommitWritten, CommitAcked, RestoreRead, RestoreInstalled,
		EnvExportPartial, AgentExportPartial, ModelExportPartial, ResourcesExportPartial,
		EpisodeInstallValidated, AgentInstallPartial, ResourcesInstallPartial,
		ModelInstallImported, ModelInstallDeleted,
		LedgerAppendWritten, LedgerImportWritten, LedgerRemoveWritten,
		CollectManifestWritten, CollectLatestWritten,
	}
}

// AfterFirst returns fn made to hit p after its first successful call (an
// export's emit: the records file is then partly written), or fn itself in
// a build without points.
func AfterFirst[T any](p Point, fn func(T) error) func(T) error {
	if !Enabled {
		return fn
	}
	first := true
	return func(v T) error {
		err := fn(v)
		if err == nil && first {
			first = false
			Hit(p)
		}
		return err
	}
}
