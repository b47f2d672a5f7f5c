// Package coordination is the controller's side of checkpoints (SPEC §4):
// it discovers the participants of a fleet and drives prepare, commit,
// resume, restore, retire and forget across them in the fleet's mandatory
// orders. It is stateless between calls: every call is safe to repeat with
// the same checkpoint id, and nothing is retried blindly.
package coordination

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/infra/logging"
	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/control"
	"github.com/gymfleet/gymfleet/pkg/wire/replica"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// PrepareOrder is the stage order of prepare: environments park their
// episodes first, then the policy model holds undelivered responses (pinning
// agents at a boundary), then agents report ready, and resources last,
// because agents and environments call them until they park.
var PrepareOrder = []string{control.KindEnvironment, control.KindModel, control.KindAgent, control.KindResources}

// RetireOrder is the stage order of retire and forget: callers before callees.
var RetireOrder = [][]string{{control.KindEnvironment}, {control.KindAgent}, {control.KindModel, control.KindResources}}

// ReplyGrace is added to a call's deadline for the reply already on the wire.
const ReplyGrace = 5 * time.Second

// RestoreCleanupGrace is the least time a failed restore's cleanup gets.
const RestoreCleanupGrace = 30 * time.Second

// Endpoint is one server of a fleet, as its configuration names it.
type Endpoint struct {
	Name string
	URL  string
}

// Member is a discovered participant.
type Member struct {
	Name     string `json:"name"`
	URL      string `json:"url"`
	Kind     string `json:"kind"`
	Instance string `json:"instance"`
}

// Options configure a Coordinator.
type Options struct {
	// Token is the control plane's bearer token.
	Token string
	// Client carries control calls. It must be a pool of its own, so control
	// calls never queue behind data traffic; nil builds one.
	Client *http.Client
	// HTTP is the http: section the client built when Client is nil
	// speaks (the fleet's stack and TLS).
	HTTP   httpconf.Config
	Logger *slog.Logger
	// OnCall, if set, is called before every control request (tests record
	// the order of calls with it).
	OnCall func(op string, m Member)
	// AllowNoModel permits a fleet without a policy model participant.
	AllowNoModel bool
	// Store is how Restore reads a checkpoint's manifests to learn its
	// instances (the signing key, an object store's endpoint), for a
	// restore into a different set of replicas.
	Store ckptstore.Options
	// Tracer records a gym.checkpoint.coordinate.<op> span per operation
	// (pkg/infra/tracing); control calls carry it to the participants, so one
	// checkpoint is one trace. nil records none.
	Tracer trace.TracerProvider
}

// Coordinator drives a fixed set of participants.
type Coordinator struct {
	members []Member
	opts    Options
	client  *http.Client
	log     *slog.Logger
	tracer  tracing.Tracer
	// lastID is the last checkpoint id this coordinator drove (a string),
	// which retire and forget name when their caller names none.
	lastID atomic.Value
}

// Error is a coordination failure: the operation and each failing server's
// error.
type Error struct {
	Op       string
	Failures map[string]error
}

func (e *Error) Error() string {
	names := make([]string, 0, len(e.Failures))
	for n := range e.Failures {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + ": " + e.Failures[n].Error()
	}
	return fmt.Sprintf("coordination %s failed on %d server(s): %s", e.Op, len(names), strings.Join(parts, "; "))
}

// Code returns the code of the failures when they all share one.
func (e *Error) Code() apierror.Code {
	var code apierror.Code
	for _, err := range e.Failures {
		c := apierror.CodeOf(err)
		if code != "" && c != code {
			return ""
		}
		code = c
	}
	return code
}

// newClient is the control client: h2c to our servers, HTTP/1.1 to a
// server that speaks only that (NeMo Gym's, under uvicorn), found out per
// host.
func newClient(hc httpconf.Config) *http.Client {
	return httpclient.New(httpclient.Options{Protocol: httpclient.ProtocolAuto, MaxConnsPerHost: 4, HTTP: hc})
}

// New returns a coordinator of already discovered members.
func New(members []Member, opts Options) *Coordinator {
	if opts.Logger == nil {
		opts.Logger = logging.Discard()
	}
	c := &Coordinator{opts: opts, client: opts.Client, log: opts.Logger, tracer: tracing.NewTracer(opts.Tracer)}
	if c.client == nil {
		c.client = newClient(opts.HTTP)
	}
	c.members = append([]Member(nil), members...)
	sort.SliceStable(c.members, func(i, j int) bool {
		a, b := stageIndex(c.members[i].Kind), stageIndex(c.members[j].Kind)
		if a != b {
			return a < b
		}
		return c.members[i].Name < c.members[j].Name
	})
	return c
}

func stageIndex(kind string) int {
	for i, k := range PrepareOrder {
		if k == kind {
			return i
		}
	}
	return len(PrepareOrder)
}

// Discover asks every endpoint for GET /ng-control/v1/checkpoint/status
// (NeMo Gym's discover does the same). 404 means the server
// is not a participant (e.g. fakeinference, or a server with checkpointing
// off); any other failure fails discovery.
func Discover(ctx context.Context, endpoints []Endpoint, opts Options) (*Coordinator, error) {
	client := opts.Client
	if client == nil {
		client = newClient(opts.HTTP)
		opts.Client = client
	}
	getter := httpclient.NewIdempotentClient(client, 3)
	var (
		mu       sync.Mutex
		members  []Member
		failures = map[string]error{}
		wg       sync.WaitGroup
	)
	for _, ep := range endpoints {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var st struct {
				Kind     string `json:"kind"`
				Instance string `json:"instance"`
			}
			h := http.Header{"Authorization": {"Bearer " + opts.Token}}
			rep, err := httpclient.GetJSON(ctx, getter, strings.TrimRight(ep.URL, "/")+control.CheckpointRoutePrefix+"/status", h, &st)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case rep != nil && rep.Status == http.StatusNotFound:
				return
			case err != nil:
				failures[ep.Name] = err
			case stageIndex(st.Kind) == len(PrepareOrder):
				failures[ep.Name] = fmt.Errorf("unknown participant kind %q", st.Kind)
			default:
				members = append(members, Member{Name: ep.Name, URL: strings.TrimRight(ep.URL, "/"), Kind: st.Kind, Instance: st.Instance})
			}
		}()
	}
	wg.Wait()
	if len(failures) > 0 {
		return nil, &Error{Op: "discover", Failures: failures}
	}
	if len(members) == 0 {
		return nil, errors.New("coordination discover: no server of the fleet takes part in checkpoints (is checkpoint.enabled set?)")
	}
	c := New(members, opts)
	if !opts.AllowNoModel && len(c.ofKinds(control.KindModel)) == 0 {
		return nil, errors.New("coordination discover: no policy model takes part in checkpoints")
	}
	return c, nil
}

// Members lists the participants in prepare order.
func (c *Coordinator) Members() []Member { return append([]Member(nil), c.members...) }

func (c *Coordinator) ofKinds(kinds ...string) []Member {
	var out []Member
	for _, m := range c.members {
		for _, k := range kinds {
			if m.Kind == k {
				out = append(out, m)
			}
		}
	}
	return out
}

// call sends one control request: bearer, absolute deadline plus the reply
// grace, never retried.
func (c *Coordinator) call(ctx context.Context, m Member, op string, deadline time.Time, body, out any) error {
	if c.opts.OnCall != nil {
		c.opts.OnCall(op, m)
	}
	ctx, cancel := context.WithDeadline(ctx, deadline.Add(ReplyGrace))
	defer cancel()
	h := http.Header{"Authorization": {"Bearer " + c.opts.Token}}
	method, url := http.MethodPost, m.URL+control.CheckpointRoutePrefix+"/"+op
	if op == "status" {
		method = http.MethodGet
		body = nil
	}
	rep, err := httpclient.Do(ctx, c.client, method, url, h, body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, m.Name, err)
	}
	if err := rep.Err(m.Name + " " + op); err != nil {
		return err
	}
	if out != nil {
		if err := codec.Unmarshal(rep.Body, out); err != nil {
			return fmt.Errorf("%s %s: decoding reply: %w", op, m.Name, err)
		}
	}
	return nil
}

// encodeOnce encodes a request sent to every member, so that a body naming
// 100,000 episodes is encoded once rather than once per member, on the
// cores the participants are committing on.
func encodeOnce(body any) ([]byte, error) {
	b, err := codec.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encoding the request: %w", err)
	}
	return b, nil
}

// fanOut runs fn for every member at once and collects failures by name.
func fanOut(members []Member, fn func(m Member) error) map[string]error {
	var mu sync.Mutex
	failures := map[string]error{}
	var wg sync.WaitGroup
	for _, m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(m); err != nil {
				mu.Lock()
				failures[m.Name] = err
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return failures
}

func unix(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// span starts the controller's span of op (protocol.md §9: kind
// controller, instance coordination); end it with endSpan.
func (c *Coordinator) span(ctx context.Context, op, checkpointID string, participants int) (context.Context, trace.Span) {
	return c.tracer.Start(ctx, tracing.SpanCoordinatePrefix+op, trace.WithAttributes(
		tracing.AttrCheckpointID.String(checkpointID),
		tracing.AttrParticipantKind.String("controller"),
		tracing.AttrInstance.String("coordination"),
		tracing.AttrParticipants.Int(participants)))
}

// endSpan ends span, failed with *errp when set.
func endSpan(span trace.Span, errp *error) {
	tracing.Fail(span, *errp)
	span.End()
}

// Status reads every participant's status.
func (c *Coordinator) Status(ctx context.Context) (map[string]map[string]any, error) {
	var mu sync.Mutex
	out := map[string]map[string]any{}
	failures := fanOut(c.members, func(m Member) error {
		var st map[string]any
		if err := c.call(ctx, m, "status", time.Now().Add(30*time.Second), nil, &st); err != nil {
			return err
		}
		mu.Lock()
		out[m.Name] = st
		mu.Unlock()
		return nil
	})
	if len(failures) > 0 {
		return out, &Error{Op: "status", Failures: failures}
	}
	return out, nil
}

// nextEpoch mints the epoch of a restore: one past the highest any
// participant reports (each reads the fleet's epoch file as it starts).
func (c *Coordinator) nextEpoch(ctx context.Context) (uint64, error) {
	var mu sync.Mutex
	var top uint64
	unannounced := 0
	failures := fanOut(c.members, func(m Member) error {
		var st struct {
			Epoch *uint64 `json:"epoch"`
		}
		if err := c.call(ctx, m, "status", time.Now().Add(30*time.Second), nil, &st); err != nil {
			return err
		}
		mu.Lock()
		if st.Epoch == nil {
			unannounced++
		} else {
			top = max(top, *st.Epoch)
		}
		mu.Unlock()
		return nil
	})
	if len(failures) > 0 {
		return 0, &Error{Op: "restore", Failures: failures}
	}
	if unannounced > 0 {
		// A participant that announces no epoch (NeMo Gym's: its
		// RestoreRequest forbids unknown fields, control.py) gets
		// upstream's restore body, and so does every other: an epoch
		// only some processes adopt would fence nothing.
		return 0, nil
	}
	return top + 1, nil
}

// StageResult is one prepare stage: every server's reply and how long the
// stage took.
type StageResult struct {
	Kind     string                          `json:"kind"`
	Replies  map[string]control.PrepareReply `json:"replies"`
	Duration time.Duration                   `json:"duration"`
}

// PrepareResult keeps every stage's replies.
type PrepareResult struct {
	Prepared bool          `json:"prepared"`
	Stages   []StageResult `json:"stages"`
}

// Blockers maps each server that was not prepared to its listed blockers.
func (r *PrepareResult) Blockers() map[string][]string {
	out := map[string][]string{}
	for _, s := range r.Stages {
		for name, rep := range s.Replies {
			if rep.Phase != control.PhasePrepared {
				out[name] = rep.Report.Blockers
			}
		}
	}
	return out
}

// Restarts is the union of every reported restart (capture keys).
func (r *PrepareResult) Restarts() []string {
	set := map[string]bool{}
	for _, s := range r.Stages {
		for _, rep := range s.Replies {
			for _, k := range rep.Report.Restarts {
				set[k] = true
			}
		}
	}
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Continued is the commit scope for the given in-flight episodes: those
// minus the reported restarts.
func (r *PrepareResult) Continued(inFlight []rollout.EpisodeID) []rollout.EpisodeID {
	restarts := map[string]bool{}
	for _, k := range r.Restarts() {
		restarts[k] = true
	}
	out := make([]rollout.EpisodeID, 0, len(inFlight))
	for _, id := range inFlight {
		if !restarts[id.CaptureKey()] {
			out = append(out, id)
		}
	}
	return out
}

// Prepare prepares stage by stage, all servers of a stage in parallel, and
// stops at the first stage not prepared. The result keeps every stage's
// replies, prepared or not.
func (c *Coordinator) Prepare(ctx context.Context, id string, deadline time.Time) (_ *PrepareResult, err error) {
	c.lastID.Store(id)
	ctx, span := c.span(ctx, "prepare", id, len(c.members))
	defer endSpan(span, &err)
	res := &PrepareResult{}
	defer func() { span.SetAttributes(attribute.Bool("nemo.gym.checkpoint.prepared", res.Prepared)) }()
	for _, kind := range PrepareOrder {
		members := c.ofKinds(kind)
		if len(members) == 0 {
			continue
		}
		start := time.Now()
		sctx, stageSpan := c.tracer.Start(ctx, tracing.SpanCoordinatePrefix+"prepare."+kind, trace.WithAttributes(
			tracing.AttrCheckpointID.String(id), tracing.AttrParticipants.Int(len(members))))
		stage := StageResult{Kind: kind, Replies: map[string]control.PrepareReply{}}
		var mu sync.Mutex
		failures := fanOut(members, func(m Member) error {
			var rep control.PrepareReply
			if err := c.call(sctx, m, "prepare", deadline, control.CheckpointRequest{CheckpointID: id, DeadlineTS: unix(deadline)}, &rep); err != nil {
				return err
			}
			mu.Lock()
			stage.Replies[m.Name] = rep
			mu.Unlock()
			return nil
		})
		stage.Duration = time.Since(start)
		res.Stages = append(res.Stages, stage)
		blockers := 0
		for _, rep := range stage.Replies {
			blockers += rep.Report.BlockerCount
		}
		stageSpan.SetAttributes(tracing.AttrBlockers.Int(blockers))
		if len(failures) > 0 {
			err := &Error{Op: "prepare", Failures: failures}
			tracing.Fail(stageSpan, err)
			stageSpan.End()
			return res, err
		}
		stageSpan.End()
		for _, rep := range stage.Replies {
			if rep.Phase != control.PhasePrepared {
				return res, nil
			}
		}
	}
	res.Prepared = true
	return res, nil
}

// CommitResult keeps every participant's commit reply.
type CommitResult struct {
	Replies map[string]map[string]any `json:"replies"`
}

// Exported is the set of capture keys some participant exported.
func (r *CommitResult) Exported() []string {
	set := map[string]bool{}
	for _, rep := range r.Replies {
		if ids, ok := rep["episode_ids"].([]any); ok {
			for _, v := range ids {
				if s, ok := v.(string); ok {
					set[s] = true
				}
			}
		}
	}
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// ExportedBy lists the capture keys one participant exported.
func (r *CommitResult) ExportedBy(name string) []string {
	var out []string
	if ids, ok := r.Replies[name]["episode_ids"].([]any); ok {
		for _, v := range ids {
			if s, ok := v.(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

// Commit commits every participant at once with the scope: every episode
// the controller continues (in flight, plus restored episodes whose
// replacement has not started, named by the replacement attempt, minus
// restarts). The controller publishes its own checkpoint only if this
// succeeds everywhere.
func (c *Coordinator) Commit(ctx context.Context, id, dir string, scope []rollout.EpisodeID, deadline time.Time, stop bool) (_ *CommitResult, err error) {
	c.lastID.Store(id)
	ctx, span := c.span(ctx, "commit", id, len(c.members))
	span.SetAttributes(tracing.AttrEpisodes.Int(len(scope)), tracing.AttrStop.Bool(stop))
	defer endSpan(span, &err)
	if scope == nil {
		scope = []rollout.EpisodeID{}
	}
	res := &CommitResult{Replies: map[string]map[string]any{}}
	var mu sync.Mutex
	body, err := encodeOnce(control.CommitRequest{CheckpointID: id, DeadlineTS: unix(deadline), CheckpointDir: dir, EpisodeIDs: scope, Stop: stop})
	if err != nil {
		return nil, err
	}
	failures := fanOut(c.members, func(m Member) error {
		var rep map[string]any
		if err := c.call(ctx, m, "commit", deadline, body, &rep); err != nil {
			return err
		}
		mu.Lock()
		res.Replies[m.Name] = rep
		mu.Unlock()
		return nil
	})
	if len(failures) > 0 {
		return res, &Error{Op: "commit", Failures: failures}
	}
	return res, nil
}

// Resume reopens every participant in reverse prepare order (no server
// reopens before the servers it calls), continuing past failures; an
// unreachable participant reopens when its lease expires.
func (c *Coordinator) Resume(ctx context.Context, id string, deadline time.Time) (err error) {
	c.lastID.Store(id)
	ctx, span := c.span(ctx, "resume", id, len(c.members))
	defer endSpan(span, &err)
	failures := map[string]error{}
	for i := len(PrepareOrder) - 1; i >= 0; i-- {
		members := c.ofKinds(PrepareOrder[i])
		for n, err := range fanOut(members, func(m Member) error {
			return c.call(ctx, m, "resume", deadline, control.CheckpointRequest{CheckpointID: id, DeadlineTS: unix(deadline)}, nil)
		}) {
			failures[n] = err
		}
	}
	if len(failures) > 0 {
		return &Error{Op: "resume", Failures: failures}
	}
	return nil
}

// RestoreResult keeps every participant's restore reply.
type RestoreResult struct {
	Replies map[string]control.RestoreReply `json:"replies"`
	// Epoch is the epoch the restored fleet runs in: one past every
	// participant's, so every earlier incarnation is fenced.
	Epoch uint64 `json:"epoch"`
	// Seconds is each participant's call, from sending the request to its
	// reply decoded: beyond the reply's read and install, it holds the
	// request's transfer and decoding and the reply's.
	Seconds map[string]float64 `json:"seconds"`
}

// Restore restores every participant at once; each episode of the scope
// continues as its next attempt. All or nothing: if any participant fails,
// the next attempts are retired everywhere (freeing whatever was
// installed), every participant is resumed, and the error is returned. The
// participants stay closed on success until Resume.
func (c *Coordinator) Restore(ctx context.Context, id, dir string, scope []rollout.EpisodeID, deadline time.Time) (_ *RestoreResult, err error) {
	c.lastID.Store(id)
	ctx, span := c.span(ctx, "restore", id, len(c.members))
	span.SetAttributes(tracing.AttrEpisodes.Int(len(scope)))
	defer endSpan(span, &err)
	if scope == nil {
		scope = []rollout.EpisodeID{}
	}
	epoch, err := c.nextEpoch(ctx)
	if err != nil {
		return nil, err
	}
	plans, err := c.PlanReplicas(ctx, dir)
	if err != nil {
		return nil, err
	}
	res := &RestoreResult{Replies: map[string]control.RestoreReply{}, Seconds: map[string]float64{}, Epoch: epoch}
	var mu sync.Mutex
	req := control.RestoreRequest{CheckpointID: id, DeadlineTS: unix(deadline), CheckpointDir: dir, EpisodeIDs: scope, Epoch: epoch}
	body, err := encodeOnce(req)
	if err != nil {
		return nil, err
	}
	failures := fanOut(c.members, func(m Member) error {
		var rep control.RestoreReply
		start := time.Now()
		b := any(body)
		if plan := plans[m.Name]; plan != nil {
			// Each participant's plan differs; the scope is encoded again
			// per participant only in a restore across replicas.
			r := req
			r.Replicas = plan
			b = r
		}
		if err := c.call(ctx, m, "restore", deadline, b, &rep); err != nil {
			return err
		}
		took := time.Since(start).Seconds()
		mu.Lock()
		res.Replies[m.Name] = rep
		res.Seconds[m.Name] = took
		mu.Unlock()
		return nil
	})
	if len(failures) == 0 {
		return res, nil
	}
	restoreErr := &Error{Op: "restore", Failures: failures}
	cleanup := deadline
	if min := time.Now().Add(RestoreCleanupGrace); cleanup.Before(min) {
		cleanup = min
	}
	next := make([]rollout.EpisodeID, len(scope))
	for i, e := range scope {
		next[i] = e.Next()
	}
	// The restored participants are in phase restored (retire is allowed
	// there); the failed ones are idle. Retiring the next attempts frees
	// what was installed and fences them; the controller starts those
	// rollouts over as later attempts.
	if len(next) > 0 {
		if err := c.Retire(ctx, id, next, cleanup); err != nil {
			c.log.Error("retiring the next attempts after a failed restore", "checkpoint_id", id, "err", err)
		}
	}
	if err := c.Resume(ctx, id, cleanup); err != nil {
		c.log.Error("resuming after a failed restore", "checkpoint_id", id, "err", err)
	}
	return res, restoreErr
}

// OwnerRoutedKinds are the kinds whose callers record the replica that
// owns each rollout (the environment records agent_instance) and follow a
// restore's aliases: a restore moves each former replica whole (all its
// sessions together, replica.Place) as the reference places sessions over
// worker counts.
var OwnerRoutedKinds = []string{control.KindAgent}

// RolloutRoutedKinds are the kinds whose callers reach them by a hash of
// the rollout id over the live replicas (replica.Pick): the client reaches
// environments that way, environments and agents the resources servers,
// agents the model servers. No handle names a replica there, so a restore
// into another count places each rollout's records on the replica Pick now
// names for it (replica.Spread): every caller finds them with no routing of
// its own changed.
var RolloutRoutedKinds = []string{control.KindEnvironment, control.KindResources, control.KindModel}

// ReplicaCountChangeKinds are the kinds whose number of replicas a restore
// may change: every kind, each by how its callers route to it.
var ReplicaCountChangeKinds = append(slices.Clone(OwnerRoutedKinds), RolloutRoutedKinds...)

// PlanReplicas compares the instances a checkpoint holds with the live
// members, family by family (replica.Family within a kind). When they are
// the same it returns nil: every participant restores its own instance.
// Otherwise it places every former instance of a changed family on its live
// replicas (replica.Place for OwnerRoutedKinds, replica.Spread for
// RolloutRoutedKinds) and returns each member's part, every member getting
// the whole alias table; a family it cannot place (no live replica though
// the kind has members, or live replicas not named as callers index them)
// is refused with replicas_unsupported before any participant is called. A
// kind with no member is left alone: a coordinator may drive part of a
// fleet. A checkpoint whose manifests cannot be listed is left to the
// participants (nil).
func (c *Coordinator) PlanReplicas(ctx context.Context, dir string) (map[string]*control.ReplicaPlan, error) {
	store, err := ckptstore.OpenWith(dir, c.opts.Store)
	if err != nil {
		return nil, nil
	}
	defer store.Close()
	mans, err := store.Manifests(ctx, dir)
	if err != nil {
		c.log.Warn("listing the checkpoint's participants; each restores its own", "checkpoint_dir", dir, "err", err)
		return nil, nil
	}
	type family struct{ kind, name string }
	former := map[family][]replica.Former{}
	legacyRuns := map[family]int{}
	live := map[family][]string{}
	for _, m := range mans {
		f := family{m.Kind, replica.Family(m.Instance)}
		former[f] = append(former[f], replica.Former{Instance: m.Instance, Records: m.RecordCount})
		legacyRuns[f] += manifestCount(m.Extras[control.ManifestLegacyRuns])
	}
	kinds := map[string]bool{}
	for _, m := range c.members {
		f := family{m.Kind, replica.Family(m.Instance)}
		live[f] = append(live[f], m.Instance)
		kinds[m.Kind] = true
	}
	sources := map[string][]string{} // live instance -> former instances
	aliases := map[string]string{}
	partitions := map[string]replica.Partition{}
	changed := false
	fams := make([]family, 0, len(former))
	for f := range former {
		fams = append(fams, f)
	}
	sort.Slice(fams, func(i, j int) bool { return fams[i].kind+"/"+fams[i].name < fams[j].kind+"/"+fams[j].name })
	for _, f := range fams {
		was := make([]string, 0, len(former[f]))
		for _, fo := range former[f] {
			was = append(was, fo.Instance)
		}
		sort.Strings(was)
		now := append([]string(nil), live[f]...)
		sort.Strings(now)
		if slices.Equal(was, now) || !kinds[f.kind] {
			// A kind with no member here is another coordinator's to
			// restore: this one drives part of the fleet.
			continue
		}
		changed = true
		if len(now) == 0 {
			return nil, apierror.New(apierror.ReplicasUnsupported, "the checkpoint holds %s %s, and the fleet has no replica of %s to restore them into",
				f.kind, strings.Join(was, ", "), f.name)
		}
		if n := legacyRuns[f]; n > 0 {
			return nil, apierror.New(apierror.ReplicasUnsupported,
				"the checkpoint holds %d legacy /run episodes on %s replicas %s, the fleet has %s: a legacy /run reaches its agent by rollout id, so they restore only into the same replicas",
				n, f.kind, strings.Join(was, ", "), strings.Join(now, ", "))
		}
		var plan replica.Plan
		switch {
		case slices.Contains(OwnerRoutedKinds, f.kind):
			plan, err = replica.Place(former[f], now)
		case slices.Contains(RolloutRoutedKinds, f.kind):
			plan, err = replica.Spread(f.name, former[f], now)
		default:
			err = fmt.Errorf("the replicas of %s may not differ (only those of %s)", f.kind, strings.Join(ReplicaCountChangeKinds, ", "))
		}
		if err != nil {
			return nil, apierror.New(apierror.ReplicasUnsupported, "the checkpoint holds %s replicas %s, the fleet has %s: %v",
				f.kind, strings.Join(was, ", "), strings.Join(now, ", "), err)
		}
		for inst, src := range plan.Sources {
			sources[inst] = src
		}
		for inst, part := range plan.Partitions {
			partitions[inst] = part
		}
		for from, to := range plan.Aliases {
			aliases[from] = to
		}
	}
	if !changed {
		return nil, nil
	}
	out := map[string]*control.ReplicaPlan{}
	for _, m := range c.members {
		src, ok := sources[m.Instance]
		if !ok {
			src = []string{m.Instance}
		}
		rp := &control.ReplicaPlan{Sources: src, Aliases: aliases}
		if part, ok := partitions[m.Instance]; ok {
			rp.Partition = &part
		}
		out[m.Name] = rp
	}
	c.log.Info("restoring into a different set of replicas", "checkpoint_dir", dir, "aliases", aliases, "partitioned", len(partitions))
	return out, nil
}

// manifestCount reads a count a participant wrote into its manifest's
// extras, which come back from JSON as float64; anything else counts 0.
func manifestCount(v any) int {
	n, _ := v.(float64)
	return int(n)
}

// Retire retires attempts everywhere: environments, then agents, then
// models and resources. Refused while a checkpoint is open (resume first).
// checkpointID names the restored checkpoint when retiring inside a
// restore; empty, the last checkpoint this coordinator drove is named
// (the body requires one: NeMo Gym's RetireRequest, control.py).
func (c *Coordinator) Retire(ctx context.Context, checkpointID string, ids []rollout.EpisodeID, deadline time.Time) (err error) {
	checkpointID = c.checkpointIDOr(checkpointID)
	ctx, span := c.span(ctx, "retire", checkpointID, len(c.members))
	span.SetAttributes(tracing.AttrEpisodes.Int(len(ids)))
	defer endSpan(span, &err)
	body, err := encodeOnce(control.RetireRequest{CheckpointID: checkpointID, DeadlineTS: unix(deadline), EpisodeIDs: ids})
	if err != nil {
		return err
	}
	for _, kinds := range RetireOrder {
		failures := fanOut(c.ofKinds(kinds...), func(m Member) error {
			return c.call(ctx, m, "retire", deadline, body, nil)
		})
		if len(failures) > 0 {
			return &Error{Op: "retire", Failures: failures}
		}
	}
	return nil
}

// Forget drops the retired marks of rollouts done for good, in retire
// order. The body names the last checkpoint this coordinator drove and
// lists the rollouts sorted, once each, as NeMo Gym's coordination.py
// sends it.
func (c *Coordinator) Forget(ctx context.Context, rolloutIDs []string, deadline time.Time) (err error) {
	checkpointID := c.checkpointIDOr("")
	ctx, span := c.span(ctx, "forget", checkpointID, len(c.members))
	span.SetAttributes(tracing.AttrRollouts.Int(len(rolloutIDs)))
	defer endSpan(span, &err)
	rolloutIDs = slices.Compact(slices.Sorted(slices.Values(rolloutIDs)))
	body, err := encodeOnce(control.ForgetRequest{CheckpointID: checkpointID, DeadlineTS: unix(deadline), RolloutIDs: rolloutIDs})
	if err != nil {
		return err
	}
	for _, kinds := range RetireOrder {
		failures := fanOut(c.ofKinds(kinds...), func(m Member) error {
			return c.call(ctx, m, "forget", deadline, body, nil)
		})
		if len(failures) > 0 {
			return &Error{Op: "forget", Failures: failures}
		}
	}
	return nil
}

// Verify checks that every participant's part of a committed checkpoint
// verifies (digest, count, manifest). With a signing key (the servers'
// checkpoint.signing_key_file) every manifest's signature is checked too,
// and an unsigned one fails; without one, signatures are not checked (a
// manifest's HMAC field says whether it carries one).
func (c *Coordinator) Verify(ctx context.Context, dir, id string, signingKey []byte) ([]ckptstore.Manifest, error) {
	return c.VerifyWith(ctx, dir, id, ckptstore.Options{SigningKey: signingKey})
}

// VerifyWith is Verify with the store's options: its signing key, and how
// to reach the object store of an s3:// dir.
func (c *Coordinator) VerifyWith(ctx context.Context, dir, id string, o ckptstore.Options) ([]ckptstore.Manifest, error) {
	// The directory is its own root: nothing beneath it is followed
	// through a symbolic link.
	store, err := ckptstore.OpenWith(dir, o)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	var out []ckptstore.Manifest
	for _, m := range c.members {
		man, _, _, err := store.Read(ctx, ckptstore.Target{Dir: dir, Kind: m.Kind, Instance: m.Instance, CheckpointID: id}, func(rollout.EpisodeID) bool { return false })
		if err != nil {
			return out, fmt.Errorf("%s: %w", m.Name, err)
		}
		out = append(out, man)
	}
	return out, nil
}

// DefaultCheckpointID names retires and forgets of a coordinator that has
// driven no checkpoint yet: their bodies require an id (NeMo Gym's
// control.py), which a participant outside a checkpoint only checks for
// form.
const DefaultCheckpointID = "gymfleet-controller"

// checkpointIDOr is id, else the last checkpoint this coordinator drove,
// else DefaultCheckpointID.
func (c *Coordinator) checkpointIDOr(id string) string {
	if id != "" {
		return id
	}
	if last, ok := c.lastID.Load().(string); ok && last != "" {
		return last
	}
	return DefaultCheckpointID
}
