package ctlplane

import "github.com/gymfleet/gymfleet/pkg/ctlplane/ctlwire"

// The control API's requests and replies are the wire contract's
// (ctlwire), named here too so the servers' participants keep one import.
type (
	CheckpointRequest = ctlwire.CheckpointRequest
	PrepareReply      = ctlwire.PrepareReply
	CommitRequest     = ctlwire.CommitRequest
	CommitReply       = ctlwire.CommitReply
	RestoreRequest    = ctlwire.RestoreRequest
	ReplicaPlan       = ctlwire.ReplicaPlan
	RestoreReply      = ctlwire.RestoreReply
	ResumeReply       = ctlwire.ResumeReply
	RetireRequest     = ctlwire.RetireRequest
	ForgetRequest     = ctlwire.ForgetRequest
	EpisodeIDs        = ctlwire.EpisodeIDs
)

// Route prefixes: our own, and the reference's, so its Python coordination
// can drive a gymfleet fleet.
const (
	RoutePrefix          = ctlwire.RoutePrefix
	ReferenceRoutePrefix = ctlwire.ReferenceRoutePrefix
)

// newScope builds a scope; owned says ids are a decoded body's list, which
// the scope may sort in place and keep rather than copy.
func newScope(ids EpisodeIDs, owned bool) Scope {
	if owned {
		return ctlwire.ScopeOf(ids)
	}
	return ctlwire.NewScope(ids)
}
