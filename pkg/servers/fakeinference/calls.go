package fakeinference

import (
	"container/list"
	"context"
	"strconv"
	"time"

	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Call statuses in the call log.
const (
	StatusHeld       = "held"
	StatusGenerating = "generating"
	StatusReturned   = "returned"
	StatusFailed     = "failed"
	StatusCut        = "cut"
)

// call is one admitted chat call. Fields below the line are guarded by
// Server.mu once the call is admitted.
type call struct {
	seq           int
	id            string
	episode       *rollout.EpisodeID
	stream        bool
	nMessages     int
	promptTokens  int
	promptIDs     []int // dropped (with tokens) once the reply is written
	promptDigest  string
	tokens        []genToken // everything the call returns unless cut
	truncated     bool       // tokens were cut short by max_tokens
	reused        int        // leading tokens continued from a staged prefix
	continuedFrom string
	sched         schedule // paces tokens[reused:]
	script        *Script  // the script the call was planned with, if any
	request       CallRequest
	// failure, when set, is the error the call ends with after its tokens
	// (a scripted stream_error).
	failure *RequestError
	// cutShort ends a stream after its tokens without a finish_reason (a
	// scripted truncate_stream).
	cutShort bool
	// namedToolChoice: the request named its tool (finish_reason "stop").
	namedToolChoice bool

	// ----
	index            int
	status           string
	everHeld         bool
	receivedAt       time.Time
	finishedAt       time.Time
	finishReason     string
	completionTokens int
	waiter           *list.Element
	released         chan struct{} // non-nil when the call was held; closed on release
	genStart         time.Time
	cutCh            chan struct{} // closed when a generation cut stops the call
	cut              *cutResult
}

type cutResult struct {
	key    string
	tokens []genToken
}

func (c *call) captureKey() string {
	if c.episode == nil {
		return ""
	}
	return c.episode.CaptureKey()
}

// produced is how many tokens the call has at now (reused ones included).
func (c *call) produced(now time.Time) int {
	switch c.status {
	case StatusGenerating:
		return min(len(c.tokens), c.reused+c.sched.due(now.Sub(c.genStart)))
	case StatusHeld:
		return 0
	}
	return c.completionTokens
}

// admit logs the call and either holds it or starts its generation.
func (s *Server) admit(c *call) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	c.seq = s.seq
	if c.id == "" {
		c.id = "call-" + strconv.Itoa(s.seq)
	}
	c.index = s.counts.Received
	c.receivedAt = time.Now()
	s.counts.Received++
	if c.episode != nil {
		s.perRollout[c.episode.RolloutID]++
	}
	s.calls = append(s.calls, c)
	s.byID[c.id] = c
	s.metrics.tokens.WithLabelValues("prompt").Add(float64(c.promptTokens))
	if s.shouldHoldLocked(c) {
		c.status = StatusHeld
		c.everHeld = true
		c.released = make(chan struct{})
		c.waiter = s.waiters.PushBack(c)
		s.counts.Held++
		s.metrics.held.Set(float64(s.counts.Held))
		return
	}
	s.startLocked(c)
}

func (s *Server) shouldHoldLocked(c *call) bool {
	switch {
	case s.hold == nil:
		return false
	case s.hold.AfterCalls != nil:
		return c.index >= *s.hold.AfterCalls
	case c.episode == nil:
		// A per-rollout hold cannot place a call that names no rollout.
		return false
	}
	return s.perRollout[c.episode.RolloutID] > *s.hold.AfterCallsPerRollout
}

// startLocked starts a call's generation (at admission or at release).
func (s *Server) startLocked(c *call) {
	if c.status == StatusHeld {
		s.counts.Held--
		s.metrics.held.Set(float64(s.counts.Held))
	}
	c.status = StatusGenerating
	c.genStart = time.Now()
	c.cutCh = make(chan struct{})
	s.counts.InFlight++
	s.active[c.id] = c
}

// finishLocked records how a call ended.
func (s *Server) finishLocked(c *call, status, finish string, completion int) {
	switch c.status {
	case StatusHeld:
		if c.waiter != nil {
			s.waiters.Remove(c.waiter)
			c.waiter = nil
		}
		s.counts.Held--
		s.metrics.held.Set(float64(s.counts.Held))
	case StatusGenerating:
		s.counts.InFlight--
		if s.active[c.id] == c {
			delete(s.active, c.id)
		}
	default:
		return // already ended
	}
	c.status = status
	c.finishReason = finish
	c.completionTokens = completion
	c.finishedAt = time.Now()
	switch status {
	case StatusReturned:
		s.counts.Returned++
	case StatusFailed:
		s.counts.Failed++
	case StatusCut:
		s.counts.Cut++
	}
	s.metrics.calls.WithLabelValues(status).Inc()
	if gen := completion - c.reused; gen > 0 {
		s.metrics.tokens.WithLabelValues("generation").Add(float64(gen))
	}
}

// dropPayload forgets a finished call's prompt and tokens: the call log
// keeps only counts, so thousands of calls stay cheap to remember.
func (s *Server) dropPayload(c *call) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c.promptIDs, c.tokens = nil, nil
}

// awaitRelease waits while the call is held. A call the client abandons (or
// the server's close ends) leaves the gate and counts as failed.
func (s *Server) awaitRelease(ctx context.Context, c *call) error {
	if c.released == nil {
		return nil
	}
	var why error
	select {
	case <-c.released:
		return nil
	case <-ctx.Done():
		why = context.Cause(ctx)
	case <-s.closing:
		why = errClosing
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.status != StatusHeld {
		// Released at the same moment; the generation notices the
		// cancellation itself.
		return nil
	}
	s.finishLocked(c, StatusFailed, "", 0)
	return why
}

// releaseLocked releases the k oldest held calls (every one when k <= 0).
func (s *Server) releaseLocked(k int) int {
	n := 0
	for e := s.waiters.Front(); e != nil && (k <= 0 || n < k); {
		next := e.Next()
		c := e.Value.(*call)
		s.waiters.Remove(e)
		c.waiter = nil
		s.startLocked(c)
		close(c.released)
		n++
		e = next
	}
	return n
}

func (s *Server) currentScript() *Script {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.script != nil {
		return s.script
	}
	return s.baseScript
}

// resetLocked clears everything a test may have left: calls, counters, the
// hold, the script, cuts and staged prefixes.
func (s *Server) resetLocked() {
	s.calls = nil
	s.byID = make(map[string]*call)
	s.active = make(map[string]*call)
	s.perRollout = make(map[string]int)
	s.hold = nil
	s.waiters.Init()
	s.script = nil
	s.cuts = nil
	s.staged = make(map[string]*stagedPrefix)
	s.counts = CallCount{}
	s.metrics.held.Set(0)
}

// info is the call's call-log entry.
func (c *call) info(now time.Time) CallInfo {
	ci := CallInfo{
		Index:              c.index,
		CallID:             c.id,
		NMessages:          c.nMessages,
		Stream:             c.stream,
		PromptTokens:       c.promptTokens,
		CompletionTokens:   c.produced(now),
		Status:             c.status,
		Held:               c.everHeld,
		ReusedPrefixTokens: c.reused,
		ReceivedAt:         c.receivedAt,
		Request:            c.request,
	}
	if c.episode != nil {
		key, rid, attempt := c.episode.CaptureKey(), c.episode.RolloutID, c.episode.Attempt
		ci.CaptureKey, ci.RolloutID, ci.Attempt = &key, &rid, &attempt
	}
	if c.finishReason != "" {
		fr := c.finishReason
		ci.FinishReason = &fr
	}
	if c.continuedFrom != "" {
		cf := c.continuedFrom
		ci.ContinuedFrom = &cf
	}
	if !c.finishedAt.IsZero() {
		t := c.finishedAt
		ci.FinishedAt = &t
	}
	return ci
}
