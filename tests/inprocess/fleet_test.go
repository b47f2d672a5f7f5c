// Package inprocess_test runs the whole fleet inside one test process: the
// fake inference server, the policy model server, the weather and counter
// resources servers, their two agents and environment servers for both
// protocols, each on 127.0.0.1:0, and drives rollouts end to end through
// POST /run.
package inprocess_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/tests/fleettest"
)

// testFleet is one in-process fleet.
type testFleet struct {
	fakeURL, modelURL string
	// envURLs by protocol.
	envURLs map[string]string
	// agentURLs by agent name.
	agentURLs map[string]string
	ctl       *fakeinference.Control
	client    *http.Client
}

// startFleet starts every server; stream sets the agents' streaming.
func startFleet(t *testing.T, stream bool) *testFleet {
	t.Helper()
	client := httpclient.New(httpclient.Options{H2C: true})
	t.Cleanup(client.CloseIdleConnections)
	fl := fleettest.Start(t, fleettest.Options{Stream: stream, Client: client})
	return &testFleet{fakeURL: fl.FakeURL, modelURL: fl.ModelURL, envURLs: fl.EnvURLs, agentURLs: fl.AgentURLs, ctl: fl.Ctl, client: client}
}

// get GETs url and returns the body of a 200.
func (f *testFleet) get(ctx context.Context, t *testing.T, url string) []byte {
	t.Helper()
	rep, err := httpclient.Do(ctx, f.client, http.MethodGet, url, nil, nil)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	if err := rep.Err("GET " + url); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return rep.Body
}

// postRun posts a row to an environment's /run.
func (f *testFleet) postRun(ctx context.Context, t *testing.T, protocol string, row []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.envURLs[protocol]+"/run", strings.NewReader(string(row)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatalf("POST /run: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}
