package environment_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gymfleet/gymfleet/pkg/servers/environment"
)

// retryFixture is an environment server with a short cleanup_timeout, the
// late cleanup on, its logs and metrics at hand, in front of the default
// stand-ins with /close_session answered by closeSession.
type retryFixture struct {
	rec  *recorder
	env  *environment.Server
	url  string
	logs *environment.LogBuffer
	reg  *prometheus.Registry
}

func newRetryFixture(t *testing.T, closeSession route) *retryFixture {
	t.Helper()
	f := &retryFixture{rec: newRecorder(), logs: &environment.LogBuffer{}, reg: prometheus.NewRegistry()}
	resRoutes := defaultResourcesRoutes()
	resRoutes["/close_session"] = closeSession
	agent := newStandIn(t, "agent", f.rec, defaultAgentRoutes())
	res := newStandIn(t, "resources", f.rec, resRoutes)
	cfg := environment.DefaultConfig()
	cfg.Protocol = environment.ProtocolSingleAgentTurn
	cfg.CleanupTimeout = 200 * time.Millisecond
	cfg.CleanupRetryWindow = time.Minute
	cfg.Agents = []environment.AgentConfig{{Name: "weather_agent", URL: agent.URL, ResourcesURL: res.URL}}
	log := slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f.env, f.url = startEnvWith(t, cfg, environment.Deps{Logger: log, Registry: f.reg})
	return f
}

func (f *retryFixture) closeEnv(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.env.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// failedStepWarnings are the warnings of a final cleanup step given up at
// once (the debug line of a step handed to the late cleanup starts alike,
// hence the closing quote).
func (f *retryFixture) failedStepWarnings() []string {
	return f.logs.Lines("level=WARN", `msg="final cleanup step failed"`)
}

// hangUntilCancelled holds a request until its caller gives up on it, or
// the test ends.
func hangUntilCancelled(t *testing.T) func(r *http.Request) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	return func(r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}
}

// TestRun_UnansweredCloseIsSentAgain: the resources close gets no answer
// within cleanup_timeout; /run replies as usual, and the close is sent again
// in the background and answered, with no warning.
func TestRun_UnansweredCloseIsSentAgain(t *testing.T) {
	var closes atomic.Int32
	hang := hangUntilCancelled(t)
	f := newRetryFixture(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if closes.Add(1) == 1 {
			hang(r)
			return
		}
		jsonReply(200, `{"closed":true}`)(w, r, body)
	})
	status, body, err := postRun(t.Context(), t, f.url, row)
	if err != nil || status != 200 {
		t.Fatalf("/run = %d %s, %v", status, body, err)
	}
	assertJSON(t, "reply", body, `{"responses_create_params":{"input":"What is the weather in Paris?","tools":[]},"response":{"id":"resp_1"},"reward":1.0,"city":"Paris","episode_id":{"rollout_id":"7-0","attempt":0},"observations":{"model_calls":2,"tool_calls":1}}`)
	if n := closes.Load(); n < 1 {
		t.Fatalf("/run replied before its final cleanup sent the close (%d closes)", n)
	}

	// The retry comes about 1 s later (a 2 s backoff more if it gets no
	// answer either on a loaded machine).
	waitUntilWithin(t, 30*time.Second, "the close is sent again and answered", func() bool {
		return closes.Load() >= 2 && environment.LateCleanupPending(f.env) == 0
	})
	if got := environment.GatheredValue(t, f.reg, "gymfleet_env_cleanup_retries_total", "done"); got != 1 {
		t.Errorf("retries done = %v, want 1", got)
	}
	if got := environment.GatheredValue(t, f.reg, "gymfleet_env_cleanup_retries_total", "abandoned"); got != 0 {
		t.Errorf("retries abandoned = %v, want 0", got)
	}
	if got := environment.GatheredValue(t, f.reg, "gymfleet_env_cleanup_retries_pending", ""); got != 0 {
		t.Errorf("retries pending = %v, want 0", got)
	}
	// Every close is the same one: the episode's path and session.
	var sessions []string
	for _, c := range f.rec.snapshot() {
		if c.Server == "resources" && strings.HasSuffix(c.Path, "/close_session") {
			if c.Path != "/ng-rollout/7-0/close_session" {
				t.Errorf("close sent to %s", c.Path)
			}
			sessions = append(sessions, c.Headers[environment.HeaderSessionID])
		}
	}
	if len(sessions) < 2 || !resourcesSession.MatchString(sessions[0]) {
		t.Fatalf("closes carried sessions %q", sessions)
	}
	for _, s := range sessions[1:] {
		if s != sessions[0] {
			t.Errorf("a retry closed session %q, the episode's is %q", s, sessions[0])
		}
	}
	if w := f.failedStepWarnings(); len(w) != 0 {
		t.Errorf("the close sent again was warned about as failed: %q", w)
	}
	if l := f.logs.Lines("level=DEBUG", "sending it again in the background", `step="close resources session"`); len(l) != 1 {
		t.Errorf("want one debug line handing the close to the late cleanup; logs:\n%s", f.logs.String())
	}

	f.closeEnv(t)
	if w := f.logs.Lines("level=WARN"); len(w) != 0 {
		t.Errorf("warnings: %q", w)
	}
}

// TestRun_RefusedCloseIsNotSentAgain: a close the resources server refuses
// (4xx) is final: warned about at once, not kept.
func TestRun_RefusedCloseIsNotSentAgain(t *testing.T) {
	var closes atomic.Int32
	f := newRetryFixture(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		closes.Add(1)
		jsonReply(409, `{"error":{"code":"stale_attempt","detail":"not yours"}}`)(w, r, body)
	})
	status, body, err := postRun(t.Context(), t, f.url, row)
	if err != nil || status != 200 {
		t.Fatalf("/run = %d %s, %v", status, body, err)
	}
	// The late cleanup refused the step before /run replied.
	if n := environment.LateCleanupPending(f.env); n != 0 {
		t.Errorf("%d cleanup steps pending after a refused close, want 0", n)
	}
	if w := f.failedStepWarnings(); len(w) != 1 || !strings.Contains(w[0], "409") {
		t.Errorf("want one warning naming the refusal; logs:\n%s", f.logs.String())
	}
	// Once closed, the late cleanup sends nothing more.
	f.closeEnv(t)
	if n := closes.Load(); n != 1 {
		t.Errorf("%d closes, want the refused one only", n)
	}
	if got := environment.GatheredValue(t, f.reg, "gymfleet_env_cleanup_retries_total", "abandoned"); got != 0 {
		t.Errorf("retries abandoned = %v, want 0: the step was never kept", got)
	}
}

// TestClose_AbandonsPendingCleanup: a close that never gets an answer is
// still pending when the server closes; Close cancels it and returns, and
// counts it abandoned with a warning.
func TestClose_AbandonsPendingCleanup(t *testing.T) {
	var closes atomic.Int32
	hang := hangUntilCancelled(t)
	f := newRetryFixture(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		closes.Add(1)
		hang(r)
	})
	status, body, err := postRun(t.Context(), t, f.url, row)
	if err != nil || status != 200 {
		t.Fatalf("/run = %d %s, %v", status, body, err)
	}
	// Waiting or in flight, the step is pending until its window of a
	// minute has passed.
	if n := environment.LateCleanupPending(f.env); n != 1 {
		t.Fatalf("%d cleanup steps pending, want the unanswered close", n)
	}
	f.closeEnv(t)
	if n := environment.LateCleanupPending(f.env); n != 0 {
		t.Errorf("%d cleanup steps pending after Close", n)
	}
	if got := environment.GatheredValue(t, f.reg, "gymfleet_env_cleanup_retries_total", "abandoned"); got != 1 {
		t.Errorf("retries abandoned = %v, want 1", got)
	}
	if got := environment.GatheredValue(t, f.reg, "gymfleet_env_cleanup_retries_pending", ""); got != 0 {
		t.Errorf("retries pending = %v, want 0", got)
	}
	if w := f.logs.Lines("level=WARN", "abandoned", "the server is closing"); len(w) != 1 {
		t.Errorf("want one warning abandoning the close; logs:\n%s", f.logs.String())
	}
}

// waitUntilWithin polls cond until it holds or d has passed.
func waitUntilWithin(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		<-tick.C
	}
}
