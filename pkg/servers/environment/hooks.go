package environment

import (
	"context"

	tracking "github.com/gymfleet/gymfleet/pkg/episode"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// runHooks are the points where a /run meets checkpointing. handleRun,
// decodeRun, runEpisode and episodeError call every one of them
// unconditionally; with checkpointing off they are noHooks, and with it on
// the participant (checkpoint.go). The server picks one when it is built
// and never changes it.
type runHooks interface {
	// admitRun refuses a /run of an attempt the controller retired (a /run
	// names its episode in the body, which the fence middleware does not
	// read).
	admitRun(id rollout.EpisodeID) error
	// taskDigest is what a replacement attempt of the row's task must
	// match; "" when nothing is matched.
	taskDigest(row Row) (string, error)
	// begin starts the episode: the tracker episode its stages record
	// boundaries with (nil records nothing; pkg/episode's methods take a nil
	// Episode) and the boundary it starts from. cancel stops it (a retire).
	begin(ep *episode, cancel context.CancelFunc) (*tracking.Episode, *Boundary, error)
	// retired reports whether the controller retired the attempt.
	retired(id rollout.EpisodeID) bool
	// close stops the control plane.
	close()
}

// noHooks are the run hooks with checkpointing off: every episode starts
// from its input and nothing is tracked.
type noHooks struct{}

var _ runHooks = noHooks{}

func (noHooks) admitRun(rollout.EpisodeID) error { return nil }
func (noHooks) taskDigest(Row) (string, error)   { return "", nil }
func (noHooks) retired(rollout.EpisodeID) bool   { return false }
func (noHooks) close()                           {}

func (noHooks) begin(*episode, context.CancelFunc) (*tracking.Episode, *Boundary, error) {
	return nil, freshStart(), nil
}

// freshStart is the boundary an episode with nothing to continue starts
// from.
func freshStart() *Boundary { return &Boundary{Next: StageSeed, Handles: newHandles()} }
