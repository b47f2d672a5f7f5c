// Package collect runs a NeMo Gym JSONL dataset through an environment
// server's POST /run with bounded concurrency, writing each finished row to
// the output as it completes (completion order) and each failed row to a
// failures file, and summarises the run.
package collect

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/gymfleet/gymfleet/pkg/apierror"
	"github.com/gymfleet/gymfleet/pkg/codec"
	"github.com/gymfleet/gymfleet/pkg/httpclient"
	"github.com/gymfleet/gymfleet/pkg/rollout"
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

// Options configure a Collector.
type Options struct {
	// EnvURL is the environment server's base URL.
	EnvURL string
	// Concurrency bounds the rows in flight.
	Concurrency int
	// Limit keeps the first Limit valid rows of the input (0: all).
	Limit int
	// Client sends /run; nil means an HTTP/2 (h2c) client for http URLs.
	// /run is never retried.
	Client *http.Client
	// Progress receives the progress bar; nil shows none.
	Progress io.Writer
}

// Collector runs datasets through one environment server.
type Collector struct {
	opts   Options
	client *http.Client
}

// New checks opts and returns a collector.
func New(opts Options) (*Collector, error) {
	opts.EnvURL = strings.TrimRight(opts.EnvURL, "/")
	if !strings.HasPrefix(opts.EnvURL, "http://") && !strings.HasPrefix(opts.EnvURL, "https://") {
		return nil, fmt.Errorf("environment URL %q is not an http(s) URL", opts.EnvURL)
	}
	if opts.Concurrency < 0 || opts.Limit < 0 {
		return nil, fmt.Errorf("concurrency %d and limit %d must not be negative", opts.Concurrency, opts.Limit)
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = DefaultConcurrency
	}
	c := &Collector{opts: opts, client: opts.Client}
	if c.client == nil {
		c.client = httpclient.New(httpclient.Options{H2C: strings.HasPrefix(opts.EnvURL, "http://")})
	}
	return c, nil
}

// FailuresPath is where the failed rows of output go: <stem>_failures.jsonl.
func FailuresPath(output string) string {
	ext := filepath.Ext(output)
	return strings.TrimSuffix(output, ext) + "_failures.jsonl"
}

// CollectFile reads input, writes every finished row to output (created or
// truncated) and every failed row to FailuresPath(output) (created on the
// first failure), and returns the summary.
func (c *Collector) CollectFile(ctx context.Context, input, output string) (*Summary, error) {
	in, err := os.Open(input)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	rows, issues, err := ReadRows(in, c.opts.Limit)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", input, err)
	}
	out, err := os.Create(output)
	if err != nil {
		return nil, err
	}
	failures := &lazyFile{path: FailuresPath(output)}
	sum, runErr := c.Run(ctx, rows, out, failures)
	if sum != nil {
		sum.Skipped = issues
		if failures.f != nil {
			sum.FailuresFile = failures.path
		}
	}
	if err := out.Close(); err != nil && runErr == nil {
		runErr = err
	}
	if err := failures.Close(); err != nil && runErr == nil {
		runErr = err
	}
	return sum, runErr
}

// Run sends every row to /run, at most Concurrency at a time, writing each
// finished row to out and each failed one to failures, one JSON line each,
// as they complete. When ctx ends, no further row is sent and rows in flight
// are abandoned (counted as interrupted, written nowhere); Run returns the
// summary so far with ctx's error. A write error stops the run.
func (c *Collector) Run(ctx context.Context, rows []Row, out, failures io.Writer) (*Summary, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	st := newStats(len(rows))
	var bar *progressbar.ProgressBar
	if c.opts.Progress != nil {
		bar = progressbar.NewOptions(len(rows),
			progressbar.OptionSetWriter(c.opts.Progress),
			progressbar.OptionSetWidth(30),
			progressbar.OptionShowCount(),
			progressbar.OptionSetItsString("rollouts"),
			progressbar.OptionShowIts(),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionSetDescription("collecting"),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(c.opts.Progress) }),
		)
	}
	var writeMu sync.Mutex // out, failures, st and bar
	record := func(res result) {
		writeMu.Lock()
		defer writeMu.Unlock()
		st.inFlight--
		if res.interrupted {
			st.interrupted++
			return
		}
		line, dst := res.line, out
		if res.err != nil {
			dst = failures
		}
		if _, err := dst.Write(line); err != nil {
			cancel(fmt.Errorf("writing row of line %d: %w", res.row.Line, err))
			return
		}
		st.add(res)
		if bar != nil {
			bar.Describe(fmt.Sprintf("finished %d | in flight %d | failed %d", st.succeeded+st.failed, st.inFlight, st.failed))
			_ = bar.Add(1)
		}
	}

	work := make(chan *Row)
	var wg sync.WaitGroup
	for i := 0; i < c.opts.Concurrency && i < len(rows); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for row := range work {
				writeMu.Lock()
				st.inFlight++
				writeMu.Unlock()
				record(c.runOne(ctx, row))
			}
		}()
	}
feed:
	for i := range rows {
		select {
		case work <- &rows[i]:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	sum := st.summary()
	if bar != nil && context.Cause(ctx) == nil {
		_ = bar.Finish()
	}
	if err := context.Cause(ctx); err != nil {
		return sum, err
	}
	return sum, nil
}

// result is one row's outcome.
type result struct {
	row         *Row
	line        []byte // the output or failures line
	reply       map[string]codec.RawMessage
	err         *apierror.Error
	latency     time.Duration
	finished    time.Time
	interrupted bool
}

// runOne posts one row and builds its output line.
func (c *Collector) runOne(ctx context.Context, row *Row) result {
	start := time.Now()
	res := result{row: row}
	body, err := codec.Marshal(row.Fields)
	if err != nil {
		res.err = apierror.New(apierror.InvalidRequest, "encoding row: %v", err)
	} else {
		rep, err := httpclient.Do(ctx, c.client, http.MethodPost, c.opts.EnvURL+"/run", nil, codec.RawMessage(body))
		switch {
		case ctx.Err() != nil:
			return result{row: row, interrupted: true}
		case err != nil:
			res.err = &apierror.Error{Code: apierror.UpstreamError, Detail: err.Error()}
		case !rep.OK():
			res.err = apierror.From(rep.Err("POST /run"))
			res.err.Status = rep.Status
		default:
			if err := codec.Unmarshal(rep.Body, &res.reply); err != nil || res.reply == nil {
				res.err = &apierror.Error{Code: apierror.UpstreamError, Status: rep.Status, Detail: "the /run reply is not a JSON object"}
			}
		}
	}
	res.latency = time.Since(start)
	res.finished = time.Now()
	var obj map[string]codec.RawMessage
	if res.err != nil {
		obj = failureRow(row, res.err)
	} else {
		obj = outputRow(row, res.reply)
	}
	line, err := codec.Marshal(obj)
	if err != nil {
		// Only a reply goccy cannot re-encode gets here; keep the row.
		res.err = apierror.New(apierror.Internal, "encoding the output row: %v", err)
		line, _ = codec.Marshal(failureRow(row, res.err))
	}
	res.line = append(line, '\n')
	return res
}

// outputRow is the reply plus the input's fields it lacks, stamped with the
// row's identity.
func outputRow(row *Row, reply map[string]codec.RawMessage) map[string]codec.RawMessage {
	out := make(map[string]codec.RawMessage, len(reply)+len(row.Fields)+4)
	for k, v := range reply {
		out[k] = v
	}
	for k, v := range row.Fields {
		if _, has := out[k]; !has {
			out[k] = v
		}
	}
	stamp(out, row)
	return out
}

// failureRow is the input row, stamped, with the failure's class, detail
// and HTTP status (0 when no reply came).
func failureRow(row *Row, e *apierror.Error) map[string]codec.RawMessage {
	out := make(map[string]codec.RawMessage, len(row.Fields)+7)
	for k, v := range row.Fields {
		out[k] = v
	}
	stamp(out, row)
	out[FieldFailureClass] = mustJSON(string(e.Code))
	out[FieldFailureDetail] = mustJSON(e.Detail)
	out[FieldFailureStatus] = mustJSON(e.Status)
	return out
}

func stamp(out map[string]codec.RawMessage, row *Row) {
	out[rollout.FieldTaskIndex] = mustJSON(row.TaskIndex)
	out[rollout.FieldRolloutIndex] = mustJSON(row.RolloutIndex)
	out[rollout.FieldRolloutID] = mustJSON(row.Episode.RolloutID)
	out[rollout.FieldAttemptIndex] = mustJSON(row.Episode.Attempt)
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
