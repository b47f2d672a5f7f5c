package ctlplane

// Tuning is the process's runtime steering as the control plane drives it
// (pkg/infra/runtimetune's Tuner; Deps.Tuning). The controller only says where a
// checkpoint stands; what, if anything, the runtime does about it is the
// Tuning's to decide. One Tuning may serve every controller of a process,
// so it counts its starts and finishes.
type Tuning interface {
	// CheckpointStarted: the controller closed admission for a checkpoint
	// (a prepare, or the start of a restore). Every call is matched by one
	// CheckpointFinished.
	CheckpointStarted()
	// RestoreSized: a restore started with CheckpointStarted is about to
	// read, or has read, recordBytes of records into memory to install.
	RestoreSized(recordBytes int64)
	// CheckpointFinished: the checkpoint reopened (resume, abort, lease
	// expiry, a failed restore, Close).
	CheckpointFinished()
	// InstallStarting: a fresh process is about to install recordBytes of
	// records it has read; done is called once the install is over.
	InstallStarting(recordBytes int64) (done func())
	// RequestDecoding: a control request naming every episode (a
	// restore's) is about to be decoded; done is called once it is.
	RequestDecoding() (done func())
}

// noTuning leaves the runtime alone: the default without Deps.Tuning.
type noTuning struct{}

func (noTuning) CheckpointStarted()                  {}
func (noTuning) RestoreSized(int64)                  {}
func (noTuning) CheckpointFinished()                 {}
func (noTuning) InstallStarting(int64) (done func()) { return func() {} }
func (noTuning) RequestDecoding() (done func())      { return func() {} }
