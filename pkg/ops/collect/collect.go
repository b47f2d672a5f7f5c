// Package collect runs a NeMo Gym JSONL dataset through an environment
// server's POST /run with bounded concurrency, writing each finished row to
// the output as it completes (completion order) and each failed row to a
// failures file, and summarises the run.
//
// With checkpoints on (SPEC §7, protocol §8) the collector is the
// controller of its fleet: a Collection takes checkpoints on request (the
// command maps SIGUSR1 and SIGTERM to them) or periodically, publishing
// <dir>/<checkpoint_id>/collection.json and then <dir>/LATEST; it logs every
// attempt to <dir>/dispatched.jsonl just before sending it, so a resumed
// collection after a SIGKILL restores LATEST when it is the previous run's,
// retires and restarts every other row that run sent, and writes every row
// exactly once.
package collect

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/infra/logging"
	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/replica"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// DefaultConcurrency is the number of rows in flight when Options leaves it 0.
const DefaultConcurrency = 16

// Failure row fields (NeMo Gym routes rows with _ng_failure_class to the
// failures file).
const (
	FieldFailureClass  = "_ng_failure_class"
	FieldFailureDetail = "_ng_failure_detail"
	FieldFailureStatus = "_ng_failure_status"
)

// Defaults of Options.
const (
	DefaultMaxAttempts       = 3
	DefaultCheckpointTimeout = 300 * time.Second
	DefaultKeepCheckpoints   = 2
	DefaultControlTimeout    = 30 * time.Second
	// RetireBatch bounds the attempts of one retire and the rollouts of
	// one forget.
	RetireBatch = 1024
)

// ExitPreempted is the exit status of a collection stopped by a preemption
// checkpoint (SIGTERM), Slurm's convention for "requeue me".
const ExitPreempted = 75

// ErrStopped reports a collection stopped by a checkpoint with stop (a
// preemption): rows not finished were continued by the checkpoint or start
// over when the collection is resumed.
var ErrStopped = errors.New("collection stopped by a preemption checkpoint")

// Options configure a Collector.
type Options struct {
	// EnvURL is the environment server's base URL.
	EnvURL string
	// EnvURLs, when set, are the environment's replicas (EnvURL is then
	// their first): each row goes to the replica replica.Pick names for
	// its rollout, so a replacement attempt after a restore reaches the
	// replica that restored its episode (docs/CHECKPOINTS.md, "Replicas").
	EnvURLs []string
	// Concurrency bounds the rows in flight.
	Concurrency int
	// Limit keeps the first Limit valid rows of the input (0: all).
	Limit int
	// Client sends /run; nil means h2c to our environment server and
	// HTTP/1.1 to a server that speaks only that (a NeMo Gym agent) or to
	// an https URL (httpclient.ProtocolAuto).
	// /run is never retried blindly: a /run without a reply is retried as
	// the next attempt, after the one without a reply is retired.
	Client *http.Client
	// HTTP is the http: section of the clients the collector builds (Client
	// when nil, and the fleet's control client when FleetControl.Client is
	// nil): the fleet's stack and TLS.
	HTTP httpconf.Config
	// Progress receives the progress bar; nil shows none.
	Progress io.Writer
	// PlainProgress writes plain progress lines to Progress instead of the
	// bar, which redraws with carriage returns: for a Progress that is no
	// terminal (a log file, a pipe).
	PlainProgress bool
	// Notices receives one line per checkpoint, restore and resume
	// decision; nil drops them.
	Notices io.Writer
	// Logger receives warnings (blockers, failed retires); nil discards.
	Logger *slog.Logger
	// SkipBadLines runs the valid rows of an input that has bad lines;
	// without it CollectFile and Open refuse such an input before sending
	// anything.
	SkipBadLines bool
	// MaxAttempts bounds the attempts of a row whose /run gets no reply
	// (0: DefaultMaxAttempts). The row then goes to the failures file.
	MaxAttempts int
	// Fleet lets the collector retire and forget attempts (and checkpoint);
	// nil: a /run without a reply is retried without retiring.
	Fleet *FleetControl
	// Checkpoints turns checkpointing on; it needs Fleet.
	Checkpoints *CheckpointOptions
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Tracer records a span per /run sent (the root of its rollout's trace)
	// and per checkpoint and restore (the root of each checkpoint's trace);
	// nil records none (pkg/infra/tracing).
	Tracer trace.TracerProvider
}

// FleetControl is how the collector reaches the fleet's control planes.
type FleetControl struct {
	// Endpoints are every server of the fleet; Discover finds the
	// participants among them on first use.
	Endpoints []coordination.Endpoint
	// Token is the control plane's bearer token.
	Token string
	// Client carries control calls (nil: coordination's own pool).
	Client *http.Client
	// Coordinator, when set, is used instead of discovering Endpoints.
	Coordinator *coordination.Coordinator
	// Timeout is the deadline of a retire, forget or resume (0:
	// DefaultControlTimeout).
	Timeout time.Duration
}

// CheckpointOptions configure checkpoints of a collection.
type CheckpointOptions struct {
	// Dir holds <checkpoint_id>/ directories, LATEST, dispatched.jsonl and
	// collector.pid. Participants write into it too: it must be reachable
	// by every server under the same (absolute) path. An s3:// Dir takes
	// the servers' records only, and needs StateDir.
	Dir string
	// StateDir, with an s3:// Dir, holds what the collector itself writes:
	// collector.pid, dispatched.jsonl, <checkpoint_id>/collection.json and
	// LATEST. It is local, not objects: the dispatch log is appended once
	// per row sent, before the row leaves, which an object store could do
	// only by rewriting the whole log each time. Crash and resume stay
	// sound because LATEST moves (atomicfile, in StateDir) only after every
	// server's manifest is in the store, and --resume needs the same
	// StateDir. Empty with a filesystem Dir: Dir.
	StateDir string
	// Timeout is the deadline of prepare, commit and restore (0:
	// DefaultCheckpointTimeout).
	Timeout time.Duration
	// Every takes a checkpoint periodically while rows are in flight (0:
	// never).
	Every time.Duration
	// Resume continues the previous run of Dir: rows in the output are
	// kept, LATEST is restored if it is the previous run's, and every other
	// row the previous run sent starts over.
	Resume bool
	// Keep is how many published checkpoints stay (0:
	// DefaultKeepCheckpoints).
	Keep int
}

// Collector runs datasets through one environment server.
type Collector struct {
	opts   Options
	client *http.Client
	log    *slog.Logger
	tracer tracing.Tracer
}

// New checks opts and returns a collector.
func New(opts Options) (*Collector, error) {
	for i := range opts.EnvURLs {
		opts.EnvURLs[i] = strings.TrimRight(opts.EnvURLs[i], "/")
		if !strings.HasPrefix(opts.EnvURLs[i], "http://") && !strings.HasPrefix(opts.EnvURLs[i], "https://") {
			return nil, fmt.Errorf("environment URL %q is not an http(s) URL", opts.EnvURLs[i])
		}
	}
	if len(opts.EnvURLs) > 0 {
		opts.EnvURL = opts.EnvURLs[0]
	}
	opts.EnvURL = strings.TrimRight(opts.EnvURL, "/")
	if !strings.HasPrefix(opts.EnvURL, "http://") && !strings.HasPrefix(opts.EnvURL, "https://") {
		return nil, fmt.Errorf("environment URL %q is not an http(s) URL", opts.EnvURL)
	}
	if opts.Concurrency < 0 || opts.Limit < 0 || opts.MaxAttempts < 0 {
		return nil, fmt.Errorf("concurrency %d, limit %d and max attempts %d must not be negative", opts.Concurrency, opts.Limit, opts.MaxAttempts)
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.MaxAttempts == 0 {
		opts.MaxAttempts = DefaultMaxAttempts
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if f := opts.Fleet; f != nil {
		if f.Coordinator == nil && (len(f.Endpoints) == 0 || f.Token == "") {
			return nil, errors.New("fleet control needs the fleet's endpoints and control token")
		}
		if f.Timeout <= 0 {
			f.Timeout = DefaultControlTimeout
		}
	}
	if ck := opts.Checkpoints; ck != nil {
		if opts.Fleet == nil {
			return nil, errors.New("checkpoints need the fleet's endpoints and control token (a fleet file with checkpointing on)")
		}
		if ck.Dir == "" {
			return nil, errors.New("checkpoints need a directory")
		}
		if ckptstore.IsS3(ck.StateDir) {
			return nil, fmt.Errorf("state directory %s: the collector's state (LATEST, collection.json, dispatched.jsonl) is appended to and renamed, so it must be a local directory, not s3://", ck.StateDir)
		}
		if ckptstore.IsS3(ck.Dir) && ck.StateDir == "" {
			return nil, fmt.Errorf("checkpoint directory %s is in an object store: collect then needs a local state directory (--state-dir) for its dispatch log, collection.json and LATEST, which --resume reads", ck.Dir)
		}
		if ck.Timeout < 0 || ck.Every < 0 || ck.Keep < 0 {
			return nil, fmt.Errorf("checkpoint timeout %v, period %v and keep %d must not be negative", ck.Timeout, ck.Every, ck.Keep)
		}
		if ck.Timeout == 0 {
			ck.Timeout = DefaultCheckpointTimeout
		}
		if ck.Keep == 0 {
			ck.Keep = DefaultKeepCheckpoints
		}
	}
	c := &Collector{opts: opts, client: opts.Client, log: opts.Logger, tracer: tracing.NewTracer(opts.Tracer)}
	if c.log == nil {
		c.log = logging.Discard()
	}
	if c.client == nil {
		c.client = httpclient.New(httpclient.Options{Protocol: httpclient.ProtocolAuto, HTTP: opts.HTTP})
	}
	return c, nil
}

// FailuresPath is where the failed rows of output go: <stem>_failures.jsonl.
func FailuresPath(output string) string {
	ext := filepath.Ext(output)
	return strings.TrimSuffix(output, ext) + "_failures.jsonl"
}

// BadInputError reports an input with lines that cannot run.
type BadInputError struct {
	Path   string
	Issues []LineIssue
}

func (e *BadInputError) Error() string {
	const show = 5
	parts := make([]string, 0, show)
	for i, is := range e.Issues {
		if i == show {
			parts = append(parts, fmt.Sprintf("and %d more", len(e.Issues)-show))
			break
		}
		parts = append(parts, is.String())
	}
	return fmt.Sprintf("%s: %d bad line(s), nothing was sent (--skip-bad-lines runs the other rows): %s", e.Path, len(e.Issues), strings.Join(parts, "; "))
}

// CollectFile reads input, writes every finished row to output and every
// failed row to FailuresPath(output) (created on the first failure), and
// returns the summary. Without resuming, output is truncated first.
func (c *Collector) CollectFile(ctx context.Context, input, output string) (*Summary, error) {
	coll, err := c.Open(ctx, input, output)
	if err != nil {
		return nil, err
	}
	return coll.Run(ctx)
}

// Run sends every row to /run, at most Concurrency at a time, writing each
// finished row to out and each failed one to failures, one JSON line each,
// as they complete. When ctx ends, no further row is sent and rows in flight
// are abandoned (counted as interrupted, written nowhere); Run returns the
// summary so far with ctx's error. A write error stops the run. Run keeps
// no dispatch log and takes no checkpoint.
func (c *Collector) Run(ctx context.Context, rows []Row, out, failures io.Writer) (*Summary, error) {
	coll := c.newCollection(out, failures)
	coll.ckpt = nil
	coll.queueRows(rows, nil)
	return coll.Run(ctx)
}

// outcome is what one /run came to.
type outcome int

const (
	replied         outcome = iota // any reply but the two below: the episode ended
	admissionClosed                // 409 admission_closed: resend unchanged after the checkpoint
	staleAttempt                   // 409 stale_attempt: the attempt is fenced; try the next
	noReply                        // transport error: retire the attempt, try the next
	interrupted                    // the run is stopping
)

// result is one /run's outcome.
type result struct {
	outcome  outcome
	line     []byte // the output or failures line (outcome replied)
	reply    map[string]codec.RawMessage
	err      *apierror.Error
	latency  time.Duration
	finished time.Time
}

// ReachTimeout bounds the check that the environment server answers.
const ReachTimeout = 10 * time.Second

// envURL is the environment replica a rollout's /run goes to.
func (c *Collector) envURL(rolloutID string) string {
	if len(c.opts.EnvURLs) < 2 {
		return c.opts.EnvURL
	}
	return c.opts.EnvURLs[replica.Pick(rolloutID, len(c.opts.EnvURLs))]
}

// reachable checks that the environment server answers HTTP at all (any
// status: a NeMo Gym agent may have no /healthz).
func (c *Collector) reachable(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, ReachTimeout)
	defer cancel()
	if _, err := httpclient.Do(ctx, c.client, http.MethodGet, c.opts.EnvURL+"/healthz", nil, nil); err != nil {
		return fmt.Errorf("the environment server %s does not answer, nothing was sent (is the fleet up?): %w", c.opts.EnvURL, err)
	}
	return nil
}

// send posts one attempt of a row and builds its output line.
func (c *Collector) send(ctx context.Context, t *task) result {
	start := time.Now()
	ctx, span := c.tracer.Start(ctx, tracing.SpanRollout)
	defer span.End()
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrCaptureKey.String(t.episode().CaptureKey()))
	}
	var res result
	body, err := codec.Marshal(t.body())
	if err != nil {
		res.err = apierror.New(apierror.InvalidRequest, "encoding row: %v", err)
	} else {
		rep, err := httpclient.Do(ctx, c.client, http.MethodPost, c.envURL(t.episode().RolloutID)+"/run", nil, codec.RawMessage(body))
		switch {
		case ctx.Err() != nil:
			return result{outcome: interrupted}
		case err != nil:
			return result{outcome: noReply, err: &apierror.Error{Code: apierror.UpstreamError, Detail: err.Error()}}
		case !rep.OK():
			res.err = apierror.From(rep.Err("POST /run"))
			res.err.Status = rep.Status
			switch {
			case rep.Status == http.StatusConflict && res.err.Code == apierror.AdmissionClosed:
				return result{outcome: admissionClosed, err: res.err}
			case rep.Status == http.StatusConflict && res.err.Code == apierror.StaleAttempt:
				return result{outcome: staleAttempt, err: res.err}
			}
		default:
			if err := codec.Unmarshal(rep.Body, &res.reply); err != nil || res.reply == nil {
				res.err = &apierror.Error{Code: apierror.UpstreamError, Status: rep.Status, Detail: "the /run reply is not a JSON object"}
			}
		}
	}
	res.latency = time.Since(start)
	res.finished = time.Now()
	res.line = c.line(t, res.reply, res.err)
	return res
}

// line is a row's output line (reply) or failures line (e).
func (c *Collector) line(t *task, reply map[string]codec.RawMessage, e *apierror.Error) []byte {
	var obj map[string]codec.RawMessage
	if e != nil {
		obj = failureRow(t.row, t.attempt, e)
	} else {
		obj = outputRow(t.row, t.attempt, reply)
	}
	line, err := codec.Marshal(obj)
	if err != nil {
		// Only a reply goccy cannot re-encode gets here; keep the row.
		line, _ = codec.Marshal(failureRow(t.row, t.attempt, apierror.New(apierror.Internal, "encoding the output row: %v", err)))
	}
	return append(line, '\n')
}

// outputRow is the reply plus the input's fields it lacks, stamped with the
// row's identity.
func outputRow(row *Row, attempt int, reply map[string]codec.RawMessage) map[string]codec.RawMessage {
	out := make(map[string]codec.RawMessage, len(reply)+len(row.Fields)+4)
	for k, v := range reply {
		out[k] = v
	}
	for k, v := range row.Fields {
		if _, has := out[k]; !has {
			out[k] = v
		}
	}
	stamp(out, row, attempt)
	return out
}

// failureRow is the input row, stamped, with the failure's class, detail
// and HTTP status (0 when no reply came).
func failureRow(row *Row, attempt int, e *apierror.Error) map[string]codec.RawMessage {
	out := make(map[string]codec.RawMessage, len(row.Fields)+7)
	for k, v := range row.Fields {
		out[k] = v
	}
	stamp(out, row, attempt)
	out[FieldFailureClass] = mustJSON(string(e.Code))
	out[FieldFailureDetail] = mustJSON(e.Detail)
	out[FieldFailureStatus] = mustJSON(e.Status)
	return out
}

func stamp(out map[string]codec.RawMessage, row *Row, attempt int) {
	out[rollout.FieldTaskIndex] = mustJSON(row.TaskIndex)
	out[rollout.FieldRolloutIndex] = mustJSON(row.RolloutIndex)
	out[rollout.FieldRolloutID] = mustJSON(row.Episode.RolloutID)
	out[rollout.FieldAttemptIndex] = mustJSON(attempt)
	if ref, ok := row.Fields[rollout.FieldAgentRef]; ok {
		out[rollout.FieldAgentRef] = ref
	}
}

func mustJSON(v any) codec.RawMessage {
	b, err := codec.MarshalStable(v)
	if err != nil {
		panic(fmt.Sprintf("encoding %T: %v", v, err)) // strings and integers always encode
	}
	return b
}

// lazyFile creates its file on the first write.
type lazyFile struct {
	path string
	f    *os.File
}

func (l *lazyFile) Write(b []byte) (int, error) {
	if l.f == nil {
		f, err := os.Create(l.path)
		if err != nil {
			return 0, err
		}
		l.f = f
	}
	return l.f.Write(b)
}

func (l *lazyFile) Close() error {
	if l.f == nil {
		return nil
	}
	return l.f.Close()
}
