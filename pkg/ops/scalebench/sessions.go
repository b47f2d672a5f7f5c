package scalebench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Sessions is what the fresh fleet still held once every replacement had
// replied: the contract wants every session closed, the ones whose close
// the environment had to send again included.
type Sessions struct {
	// Seconds is from the last replacement's reply until nothing was left
	// open and no close was waiting to be sent again (or the deadline).
	Seconds float64 `json:"seconds"`
	// ResourcesOpen and AgentOpen are the sessions left open at the end.
	ResourcesOpen int `json:"resources_open"`
	AgentOpen     int `json:"agent_open"`
	// RetriesPending are cleanup steps the environment still meant to send
	// again; RetriesDone and RetriesAbandoned those it sent again and that
	// were answered, or that it gave up on.
	RetriesPending   int `json:"retries_pending"`
	RetriesDone      int `json:"retries_done"`
	RetriesAbandoned int `json:"retries_abandoned"`
}

// sessionsTimeout bounds the wait for the last sessions to close: longer
// than the environment's backoff between retries (30 s at most), far
// shorter than its retry window (10 min), so a close that keeps failing
// shows as a violation instead of a long wait.
const sessionsTimeout = 3 * time.Minute

// awaitSessionsClosed waits until the fresh fleet holds no session and the
// environment has no cleanup step left to send again, and records what was
// left when it did not.
func (b *bench) awaitSessionsClosed(ctx context.Context) error {
	start := time.Now()
	deadline := start.Add(sessionsTimeout)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var s Sessions
	for {
		var err error
		if s, err = b.sessions(ctx); err != nil {
			return err
		}
		s.Seconds = seconds(time.Since(start))
		if s.ResourcesOpen == 0 && s.AgentOpen == 0 && s.RetriesPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			b.violate("%d resources and %d agent sessions still open %v after the last replacement replied (%d cleanup steps waiting to be sent again)",
				s.ResourcesOpen, s.AgentOpen, sessionsTimeout, s.RetriesPending)
			break
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-tick.C:
		}
	}
	if s.RetriesAbandoned > 0 {
		b.violate("the environment gave up on %d cleanup steps", s.RetriesAbandoned)
	}
	b.res.Sessions = s
	return nil
}

// sessions reads the gauges of the fresh fleet's resources, agent and
// environment servers, every replica's /metrics once, and sums them.
func (b *bench) sessions(ctx context.Context) (Sessions, error) {
	var s Sessions
	pages := map[string][]byte{}
	for _, q := range []struct {
		base, metric string
		into         *int
	}{
		{resourceName, "gymfleet_resources_sessions", &s.ResourcesOpen},
		{agentName, "gymfleet_agent_sessions", &s.AgentOpen},
		{envName, "gymfleet_env_cleanup_retries_pending", &s.RetriesPending},
		{envName, `gymfleet_env_cleanup_retries_total{outcome="done"}`, &s.RetriesDone},
		{envName, `gymfleet_env_cleanup_retries_total{outcome="abandoned"}`, &s.RetriesAbandoned},
	} {
		for _, endpoint := range b.replicaNames(q.base) {
			page, ok := pages[endpoint]
			if !ok {
				var err error
				if page, err = b.metricsPage(ctx, b.url(endpoint)); err != nil {
					return s, err
				}
				pages[endpoint] = page
			}
			v, err := sampleValue(bytes.NewReader(page), q.metric)
			if err != nil {
				return s, err
			}
			*q.into += int(v)
		}
	}
	return s, nil
}

// metricsPage reads a server's /metrics.
func (b *bench) metricsPage(ctx context.Context, base string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := b.ctl.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading %s/metrics: %w", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s/metrics answered %s", base, resp.Status)
	}
	page, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("reading %s/metrics: %w", base, err)
	}
	return page, nil
}

// sampleValue finds one sample, named as the text exposition format writes
// it (name, then labels in braces), and returns its value; a counter never
// incremented for a label is absent and reads 0.
func sampleValue(r io.Reader, sample string) (float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, sample)
		if !ok || !strings.HasPrefix(rest, " ") {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q is not a number", sample, rest)
		}
		return v, nil
	}
	return 0, sc.Err()
}
