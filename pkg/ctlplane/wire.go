package ctlplane

import "github.com/gymfleet/gymfleet/pkg/wire/control"

// The control API's requests and replies are the wire contract's
// (pkg/wire/control), named here too so the servers' participants keep one import.
type (
	CheckpointRequest = control.CheckpointRequest
	PrepareReply      = control.PrepareReply
	CommitRequest     = control.CommitRequest
	CommitReply       = control.CommitReply
	RestoreRequest    = control.RestoreRequest
	ReplicaPlan       = control.ReplicaPlan
	RestoreReply      = control.RestoreReply
	ResumeReply       = control.ResumeReply
	RetireRequest     = control.RetireRequest
	ForgetRequest     = control.ForgetRequest
	EpisodeIDs        = control.EpisodeIDs
)

// Route prefixes: our own, and the reference's, so its Python coordination
// can drive a gymfleet fleet.
const (
	RoutePrefix          = control.RoutePrefix
	ReferenceRoutePrefix = control.ReferenceRoutePrefix
)

// newScope builds a scope; owned says ids are a decoded body's list, which
// the scope may sort in place and keep rather than copy.
func newScope(ids EpisodeIDs, owned bool) Scope {
	if owned {
		return control.ScopeOf(ids)
	}
	return control.NewScope(ids)
}
