package e2e

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf/tlstest"
)

// TestTLS_FleetRunsCheckpointsAndRestores runs a fleet spread as over
// hosts: every listener serves TLS only and every client (the servers'
// own, the launcher's probes, the test's) verifies the fleet's CA. Rollouts
// of both protocols run, a rollout held at its second model call is
// checkpointed, the fleet is killed and restored, and the rollout
// continues without repeating its delivered call; on the pass's HTTP stack
// (GYMFLEET_E2E_STACK: make test-e2e runs both).
func TestTLS_FleetRunsCheckpointsAndRestores(t *testing.T) {
	files := tlstest.New(t)
	f := startFleet(t, func(tp *fleet.Topology) { tp.TLS = files.Server() })
	for _, e := range f.Cfg.Endpoints("") {
		if !strings.HasPrefix(e.URL, "https://") {
			t.Fatalf("endpoint %s is %s, want https://", e.Name, e.URL)
		}
	}

	// Nothing is served in the clear, nor to a client that does not know
	// the CA.
	plain := strings.Replace(f.EnvURL, "https://", "http://", 1) + "/readyz"
	resp, err := http.Get(plain)
	if err != nil {
		t.Fatalf("GET %s: %v", plain, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "HTTPS") {
		t.Errorf("plain HTTP/1 to a TLS listener: %d %q, want 400 naming HTTPS", resp.StatusCode, body)
	}
	stranger := httpclient.New(httpclient.Options{H2C: true, HTTP: httpconf.Config{Stack: stack, TLS: tlstest.New(t).Client()}})
	defer stranger.CloseIdleConnections()
	if _, err := httpclient.Do(context.Background(), stranger, http.MethodGet, f.EnvURL+"/readyz", nil, nil); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("a client verifying another CA: %v, want the certificate refused", err)
	}

	// Rollouts of both protocols, through every server.
	for _, row := range []map[string]any{
		weatherRow("tls-w1", "weather_agent", "Paris"),
		counterRow("tls-c1", "counter_agent_legacy", 3, 1, 2),
	} {
		if rep := f.RunOK(row); rep.Reward() != 1.0 {
			t.Errorf("%v: reward %v, want 1.0: %v", row["_ng_rollout_id"], rep.Reward(), rep.Body)
		}
	}

	// Checkpoint a rollout in flight, kill the fleet, restore, continue.
	f.HoldSecondCalls()
	row := weatherRow("tls-native", "weather_agent", "Oslo")
	first := f.Start(row)
	f.WaitHeld("tls-native", 2)
	f.Checkpoint(f.Coord(), "c1", ep("tls-native", 0))
	f.CrashAndRestore("c1", ep("tls-native", 0))
	if rep := first.Wait(t, 30*time.Second); rep.Status == http.StatusOK {
		t.Fatalf("the first attempt replied across a crash: %v", rep.Body)
	}
	f.Release()
	assertReward(t, f.RunOK(withAttempt(row, 1)), 1.0)
	if got, want := f.MessageCounts("tls-native"), []int{2, 4, 4}; !slices.Equal(got, want) {
		t.Fatalf("model calls (messages each) %v, want %v: the delivered call 0 is never repeated, the undelivered call 1 is re-issued once", got, want)
	}
}

// TestTLS_GymctlCollectsAndCheckpoints runs gymctl collect against a fleet
// on TLS: gymctl verifies the servers with the fleet file's
// http.tls.ca_file, checkpoints on SIGUSR1 and finishes every row once.
func TestTLS_GymctlCollectsAndCheckpoints(t *testing.T) {
	files := tlstest.New(t)
	f := startFleet(t, func(tp *fleet.Topology) { tp.TLS = files.Server() })
	f.HoldSecondCalls()
	ws := newWorkspace(t, weatherRow("tls-usr-1", "weather_agent", "Lima"), weatherRow("tls-usr-2", "weather_agent_legacy", "Rome"))
	c := f.collect(ws)
	f.WaitHeld("tls-usr-1", 2)
	f.WaitHeld("tls-usr-2", 2)
	c.signal(syscall.SIGUSR1)
	f.WaitFor("LATEST", 30*time.Second, func() bool { _, ok := ws.latest(); return ok })
	f.Release()
	c.requireExit(time.Minute, 0)
	m, _ := ws.latest()
	if got := continuedKeys(m); !slices.Equal(got, []string{"tls-usr-1", "tls-usr-2"}) {
		t.Fatalf("the manifest continues %v, want [tls-usr-1 tls-usr-2]", got)
	}
	ws.exactlyOnce("tls-usr-1", "tls-usr-2")
}
