package scalebench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/replica"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// row is one weather rollout of the bench.
type row struct {
	id, city string
}

// weatherRows returns n one-tool-round weather rows: each rollout's first
// model call asks for get_weather, its second gives the final answer.
func weatherRows(n int) []row {
	out := make([]row, n)
	width := len(fmt.Sprint(n - 1))
	for i := range out {
		out[i] = row{id: fmt.Sprintf("w%0*d", width, i), city: fmt.Sprintf("City%d", i)}
	}
	return out
}

var weatherTool = map[string]any{
	"type": "function", "name": "get_weather", "description": "Get the current weather of a city.", "strict": true,
	"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}},
}

// body is the /run body of the row's attempt: a NeMo Gym dataset row on
// the single_agent_turn route.
func (r row) body(attempt int) ([]byte, error) {
	m := map[string]any{
		"responses_create_params": map[string]any{
			"input": []any{
				map[string]any{"role": "developer", "content": "You are a weather assistant."},
				map[string]any{"role": "user", "content": fmt.Sprintf(`What is the weather in %s? Call get_weather with {"city": %q}.`, r.city, r.city)},
			},
			"tools": []any{weatherTool},
		},
		"city":                 r.city,
		rollout.FieldRolloutID: r.id,
		rollout.FieldAgentRef:  map[string]any{"type": "responses_api_agents", "name": agentName},
	}
	if attempt > 0 {
		m[rollout.FieldAttemptIndex] = attempt
	}
	return codec.Marshal(m)
}

// outcome is how one /run ended. status 0 means no HTTP reply (err says why).
type outcome struct {
	status int
	reward float64
	err    string
}

// batch is N /run calls in flight at once, each sent once and never
// retried: a /run cut off by a crash is never sent again as a second
// execution of the same attempt.
type batch struct {
	rows    []row
	attempt int
	start   time.Time
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	sent     atomic.Int64
	sentOnce sync.Once
	sentCh   chan struct{}
	sentAt   time.Time // set before sentCh closes

	done       atomic.Int64
	httpReplys atomic.Int64
	finished   chan struct{}
	out        []outcome // out[i] is written only by row i's goroutine

	mu    sync.Mutex
	first string // the first notable outcome, for error messages
}

// router is the /run URL of a rollout.
type router func(rolloutID string) string

// runRouter sends a rollout's /run to the environment replica
// replica.Pick chooses for its id, as gymctl collect does: every attempt
// of a rollout reaches the same replica while the count is unchanged.
func runRouter(envURLs []string) router {
	return func(rolloutID string) string {
		return envURLs[replica.Pick(rolloutID, len(envURLs))] + "/run"
	}
}

// dispatch sends every row's /run as attempt, one goroutine each, through
// one client, each to the URL route gives for its rollout. The env server's MaxConcurrentStreams decides how many h2c
// connections they share (pkg/transport/httpclient bounds them).
func dispatch(ctx context.Context, client *http.Client, route router, rows []row, attempt int) *batch {
	ctx, cancel := context.WithCancel(ctx)
	b := &batch{
		rows: rows, attempt: attempt, start: time.Now(), cancel: cancel,
		sentCh: make(chan struct{}), finished: make(chan struct{}),
		out: make([]outcome, len(rows)),
	}
	trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) {
		if b.sent.Add(1) == int64(len(rows)) {
			b.sentOnce.Do(func() {
				b.sentAt = time.Now()
				close(b.sentCh)
			})
		}
	}}
	tctx := httptrace.WithClientTrace(ctx, trace)
	b.wg.Add(len(rows))
	for i, r := range rows {
		go func() {
			defer b.wg.Done()
			o := send(tctx, client, route(r.id), r, attempt)
			b.out[i] = o
			if o.status != 0 {
				b.httpReplys.Add(1)
			}
			b.note(r, o)
			if b.done.Add(1) == int64(len(rows)) {
				close(b.finished)
			}
		}()
	}
	if len(rows) == 0 {
		close(b.finished)
		b.sentOnce.Do(func() { b.sentAt = time.Now(); close(b.sentCh) })
	}
	return b
}

func send(ctx context.Context, client *http.Client, url string, r row, attempt int) outcome {
	body, err := r.body(attempt)
	if err != nil {
		return outcome{err: err.Error()}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return outcome{err: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return outcome{err: err.Error()}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return outcome{status: resp.StatusCode, reward: math.NaN(), err: "reading the reply: " + err.Error()}
	}
	o := outcome{status: resp.StatusCode, reward: math.NaN()}
	if resp.StatusCode != http.StatusOK {
		o.err = truncate(string(bytes.TrimSpace(b)), 300)
		return o
	}
	var rep struct {
		Reward *float64 `json:"reward"`
	}
	if err := codec.Unmarshal(b, &rep); err != nil || rep.Reward == nil {
		o.err = "a 200 reply without a reward: " + truncate(string(b), 300)
		return o
	}
	o.reward = *rep.Reward
	return o
}

// note keeps the first outcome worth naming in an error: for the originals
// any HTTP reply (each was exported, so none may reply), for replacements
// any that is not a 200 with reward 1.0.
func (b *batch) note(r row, o outcome) {
	notable := o.status != 0
	if b.attempt > 0 {
		notable = !o.ok()
	}
	if !notable {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.first == "" {
		b.first = fmt.Sprintf("/run of %s attempt %d: status %d reward %v %s", r.id, b.attempt, o.status, o.reward, o.err)
	}
}

func (o outcome) ok() bool { return o.status == http.StatusOK && o.reward == 1.0 && o.err == "" }

// example is the first notable outcome, or "" if none.
func (b *batch) example() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.first
}

// replied counts the calls that got an HTTP reply so far.
func (b *batch) replied() int { return int(b.httpReplys.Load()) }

// allSent reports whether every request was written.
func (b *batch) allSent() bool {
	select {
	case <-b.sentCh:
		return true
	default:
		return false
	}
}

// wait waits until every call ended, ctx ends or timeout passes.
func (b *batch) wait(ctx context.Context, timeout time.Duration) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-b.finished:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-timer.C:
		return fmt.Errorf("%d of %d /run calls still open after %v", len(b.rows)-int(b.done.Load()), len(b.rows), timeout)
	}
}

// close cancels every call still open and waits for its goroutine.
func (b *batch) close() {
	b.cancel()
	b.wg.Wait()
}

type batchSummary struct {
	replied, transportErrors, ok, non200, rewardNotOne int
}

func (s batchSummary) failed() int { return s.transportErrors + s.non200 }

// summary classifies the outcomes; call it after wait returned nil.
func (b *batch) summary() batchSummary {
	var s batchSummary
	for _, o := range b.out {
		switch {
		case o.status == 0:
			s.transportErrors++
		case o.status != http.StatusOK || o.err != "":
			s.replied++
			s.non200++
		case o.reward != 1.0:
			s.replied++
			s.rewardNotOne++
		default:
			s.replied++
			s.ok++
		}
	}
	return s
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
