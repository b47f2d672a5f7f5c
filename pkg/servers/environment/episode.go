package environment

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"sync"
	"time"

	tracking "github.com/gymfleet/gymfleet/pkg/episode"
	"github.com/gymfleet/gymfleet/pkg/infra/park"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Stage names a step of single_agent_turn (protocol.md §4.4). A boundary's
// Next is the stage an episode continues with.
type Stage string

// The stages of single_agent_turn, in order.
const (
	StageSeed        Stage = "seed"
	StageInvokeAgent Stage = "invoke_agent"
	StageCloseAgent  Stage = "close_agent"
	StageVerify      Stage = "verify"
	StageReturn      Stage = "return"
)

// Mode says what a checkpoint does with a stage still running when admission
// closes (SPEC §6).
type Mode string

const (
	// ModeWait: the checkpoint waits for the stage, which is unsafe to run twice.
	ModeWait Mode = "wait"
	// ModeReplay: the checkpoint does not wait; after a crash the stage runs
	// again from the boundary before it.
	ModeReplay Mode = "replay"
)

// Handles are the caller-assigned session ids an episode carries in every
// boundary, so a reseed after a crash names the same sessions.
type Handles struct {
	ResourcesSessionID string `json:"resources_session_id"`
	AgentSessionID     string `json:"agent_session_id"`
	// ResourcesVerify is the mode /verify runs in, as the resources server
	// announced on its seed reply (X-Ng-Checkpoint-Verify); wait when absent.
	ResourcesVerify Mode `json:"resources_verify"`
	// ResourcesCookies are the cookies the seed reply set (a Cookie header
	// value), sent on every later call of the resources session: a NeMo Gym
	// resources server names its sessions by cookie alone. Absent in
	// boundaries recorded before cookies were carried.
	ResourcesCookies string `json:"resources_cookies,omitempty"`
	// AgentInstance is the agent replica holding the episode's agent
	// session (its instance name), when the agent has several: a restored
	// episode continues there, or on the replica the restore's aliases
	// name for it.
	AgentInstance string `json:"agent_instance,omitempty"`
}

// Boundary is where an episode stands between two stages: the stage to run
// next and what that stage needs. It is the value a checkpoint records.
type Boundary struct {
	Next    Stage   `json:"next"`
	Handles Handles `json:"handles"`
	// Response is the agent's reply to the activation (after invoke_agent).
	Response codec.RawMessage `json:"response,omitempty"`
	// Observations is the agent's close reply (after close_agent).
	Observations codec.RawMessage `json:"observations,omitempty"`
	// Result is /verify's reply (after verify).
	Result codec.RawMessage `json:"result,omitempty"`
}

// AppendJSON appends b's encoding, byte for byte what codec.Marshal writes
// for it, so a commit encodes 16,000 boundaries without goccy's reflection
// (tracking.BoundaryAppender).
func (b Boundary) AppendJSON(dst []byte) ([]byte, error) {
	dst = append(dst, `{"next":`...)
	dst = codec.AppendString(dst, string(b.Next))
	dst = append(dst, `,"handles":{"resources_session_id":`...)
	dst = codec.AppendString(dst, b.Handles.ResourcesSessionID)
	dst = append(dst, `,"agent_session_id":`...)
	dst = codec.AppendString(dst, b.Handles.AgentSessionID)
	dst = append(dst, `,"resources_verify":`...)
	dst = codec.AppendString(dst, string(b.Handles.ResourcesVerify))
	if b.Handles.ResourcesCookies != "" { // omitempty
		dst = append(dst, `,"resources_cookies":`...)
		dst = codec.AppendString(dst, b.Handles.ResourcesCookies)
	}
	if b.Handles.AgentInstance != "" { // omitempty
		dst = append(dst, `,"agent_instance":`...)
		dst = codec.AppendString(dst, b.Handles.AgentInstance)
	}
	dst = append(dst, '}')
	for _, f := range [...]struct {
		key string
		raw codec.RawMessage
	}{{`,"response":`, b.Response}, {`,"observations":`, b.Observations}, {`,"result":`, b.Result}} {
		if len(f.raw) == 0 {
			continue // omitempty
		}
		var err error
		if dst, err = codec.AppendRawMessage(append(dst, f.key...), f.raw); err != nil {
			return dst, err
		}
	}
	return append(dst, '}'), nil
}

// newHandles assigns fresh session ids; verification waits until the seed
// reply says otherwise.
func newHandles() Handles {
	return Handles{
		ResourcesSessionID: "resources-session-" + randomHex(),
		AgentSessionID:     "agent-session-" + randomHex(),
		ResourcesVerify:    ModeWait,
	}
}

func randomHex() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+).
	return hex.EncodeToString(b[:])
}

// episode is one live /run. The server keeps it in its live map, keyed by
// capture key, from admission until its final cleanup has ended.
type episode struct {
	id       rollout.EpisodeID
	protocol string
	agent    AgentConfig
	// agentURL and agentName are the agent replica the episode's agent
	// calls go to (agentName is empty for an agent without replicas);
	// resourcesURL is the resources replica of its session.
	agentURL     string
	agentName    string
	resourcesURL string
	req          *RunRequest
	// digest is the task's digest, set with checkpointing on.
	digest  string
	started time.Time
	log     *slog.Logger

	mu sync.Mutex
	// boundary is the latest boundary recorded; checkpoint export reads it.
	boundary Boundary
	// agentOpened is set once the agent session open was sent: from then on
	// a session may exist even if the reply was lost.
	agentOpened bool
	// agentClosed is set once close_agent returned the observations.
	agentClosed bool
	// resourcesCookies are the resources session's cookies as soon as the
	// seed reply set them, for the final cleanup's close (which must not
	// wait for the boundary after the seed).
	resourcesCookies string

	cleanup cleanupStack

	// tracked is the episode in the checkpoint tracker; nil when
	// checkpointing is off, which makes every call on it free.
	tracked *tracking.Episode
}

// recordBoundary is called after every completed stage: the boundary is
// what a checkpoint exports for this episode, and while a checkpoint is open
// the episode parks there until admission reopens.
func (ep *episode) recordBoundary(ctx context.Context, b *Boundary) error {
	ep.mu.Lock()
	ep.boundary = *b
	ep.mu.Unlock()
	return ep.tracked.Boundary(ctx, b)
}

// latest returns the latest recorded boundary.
func (ep *episode) latest() Boundary {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.boundary
}

func (ep *episode) setAgentOpened() {
	ep.mu.Lock()
	ep.agentOpened = true
	ep.mu.Unlock()
}

func (ep *episode) setResourcesCookies(c string) {
	ep.mu.Lock()
	ep.resourcesCookies = c
	ep.mu.Unlock()
}

func (ep *episode) resourcesCookiesNow() string {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.resourcesCookies
}

func (ep *episode) setAgentClosed() {
	ep.mu.Lock()
	ep.agentClosed = true
	ep.mu.Unlock()
}

// agentNeedsClose reports whether final cleanup must close the agent session.
func (ep *episode) agentNeedsClose() bool {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.agentOpened && !ep.agentClosed
}

// cleanupStack is an episode's final cleanup: callbacks registered as the
// episode opens sessions, run last-in first-out exactly once, within one
// total timeout, whatever path the episode ends on. Callbacks must be
// idempotent on the remote side; their failures are logged, not returned,
// since the episode's reply is already decided.
type cleanupStack struct {
	mu  sync.Mutex
	fns []cleanupFunc
	ran bool
}

type cleanupFunc struct {
	name string
	fn   cleanupStep
}

// cleanupStep is one cleanup callback: it calls done, once, with its
// outcome, and need not wait for it (it may start a parked call).
type cleanupStep func(ctx context.Context, done func(error))

func (c *cleanupStack) push(name string, fn cleanupStep) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fns = append(c.fns, cleanupFunc{name: name, fn: fn})
}

// run runs every callback once, newest first, as steps of t: a callback's
// call is awaited parked. A step that got no answer is handed to late,
// which sends it again in the background; only a step late does not take
// is warned about here. done is called once the last step has ended.
func (c *cleanupStack) run(t *park.Task, ctx context.Context, log *slog.Logger, key string, late *lateCleanup, done func()) {
	c.mu.Lock()
	if c.ran {
		c.mu.Unlock()
		done()
		return
	}
	c.ran = true
	fns := c.fns
	c.fns = nil
	c.mu.Unlock()
	// The warning says when the failed step started and how long it ran:
	// one total timeout means an earlier slow step can leave a later one
	// only moments.
	runCleanupFrom(t, ctx, log, key, late, fns, len(fns)-1, time.Now(), done)
}

// runCleanupFrom runs fns[i], then the steps before it.
func runCleanupFrom(t *park.Task, ctx context.Context, log *slog.Logger, key string, late *lateCleanup, fns []cleanupFunc, i int, start time.Time, done func()) {
	if i < 0 {
		done()
		return
	}
	stepStart := time.Now()
	w := t.Hold()
	fns[i].fn(ctx, func(err error) {
		w.ResumeHere(func() {
			if err != nil {
				took := time.Since(stepStart)
				if late.add(ctx, key, fns[i].name, fns[i].fn.wait, err) {
					log.DebugContext(ctx, "final cleanup step failed; sending it again in the background", "step", fns[i].name, "err", err,
						"started_after_s", stepStart.Sub(start).Seconds(), "took_s", took.Seconds())
				} else {
					log.WarnContext(ctx, "final cleanup step failed", "step", fns[i].name, "err", err,
						"started_after_s", stepStart.Sub(start).Seconds(), "took_s", took.Seconds())
				}
			}
			runCleanupFrom(t, ctx, log, key, late, fns, i-1, start, done)
		})
	})
}

// wait runs the step and waits for its outcome: for the late cleanup,
// whose workers have goroutines of their own to wait on.
func (fn cleanupStep) wait(ctx context.Context) error {
	out := make(chan error, 1)
	fn(ctx, func(err error) { out <- err })
	return <-out
}
