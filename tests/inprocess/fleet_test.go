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
	"time"

	"github.com/gymfleet/gymfleet/pkg/agent"
	"github.com/gymfleet/gymfleet/pkg/environment"
	"github.com/gymfleet/gymfleet/pkg/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/httpclient"
	"github.com/gymfleet/gymfleet/pkg/modelproxy"
	"github.com/gymfleet/gymfleet/pkg/resources"
)

// server is what every fleet server provides.
type server interface {
	Listen() error
	Serve() error
	Close(ctx context.Context) error
	URL() string
}

// serve listens and serves s until the test ends; servers close in reverse
// start order (t.Cleanup is LIFO), so callers close before callees.
func serve(t *testing.T, name string, s server) string {
	t.Helper()
	if err := s.Listen(); err != nil {
		t.Fatalf("%s: listen: %v", name, err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("%s: close: %v", name, err)
		}
		if err := <-done; err != nil {
			t.Errorf("%s: serve: %v", name, err)
		}
	})
	return s.URL()
}

// testFleet is one in-process fleet.
type testFleet struct {
	fakeURL, modelURL string
	// envURLs by protocol.
	envURLs map[string]string
	ctl     *fakeinference.Control
	client  *http.Client
}

// startFleet starts every server; stream sets the agents' streaming.
func startFleet(t *testing.T, stream bool) *testFleet {
	t.Helper()
	f := &testFleet{envURLs: map[string]string{}, client: httpclient.New(httpclient.Options{H2C: true})}
	t.Cleanup(f.client.CloseIdleConnections)

	fcfg := fakeinference.DefaultConfig()
	fcfg.Listen = "127.0.0.1:0"
	// Fast generation: the test is about the wiring, not pacing.
	fcfg.TokensPerSecond = 0
	fcfg.MinCallSeconds = 0
	fake, err := fakeinference.New(fcfg, fakeinference.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	f.fakeURL = serve(t, "fakeinference", fake)
	f.ctl = fakeinference.NewControl(f.fakeURL, f.client)

	mcfg := modelproxy.DefaultConfig()
	mcfg.Listen = "127.0.0.1:0"
	mcfg.Upstream.BaseURL = f.fakeURL + "/v1"
	mcfg.Upstream.Model = fcfg.Model
	mcfg.Upstream.H2C = true
	mcfg.ReturnTokenIDs = true
	mcfg.Capture.Dir = t.TempDir()
	model, err := modelproxy.New(mcfg, modelproxy.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	f.modelURL = serve(t, "policy_model", model)

	resURLs := map[string]string{}
	for _, typ := range []string{resources.TypeWeather, resources.TypeCounter} {
		rcfg := resources.DefaultConfig()
		rcfg.Name, rcfg.Type, rcfg.Listen = typ, typ, "127.0.0.1:0"
		rs, err := resources.New(rcfg, resources.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		resURLs[typ] = serve(t, typ, rs)
	}

	var agents []environment.AgentConfig
	for _, a := range []struct{ name, res string }{{"weather_agent", resources.TypeWeather}, {"counter_agent", resources.TypeCounter}} {
		acfg := agent.DefaultConfig()
		acfg.Name, acfg.Listen = a.name, "127.0.0.1:0"
		acfg.ModelServerURL, acfg.ResourcesServerURL = f.modelURL, resURLs[a.res]
		acfg.Stream = stream
		acfg.MaxSteps = 10
		as, err := agent.New(acfg, agent.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		url := serve(t, a.name, as)
		agents = append(agents, environment.AgentConfig{Name: a.name, URL: url, ResourcesURL: resURLs[a.res]})
	}

	for _, protocol := range []string{environment.ProtocolSingleAgentTurn, environment.ProtocolLegacy} {
		ecfg := environment.DefaultConfig()
		ecfg.Listen, ecfg.Name, ecfg.Protocol, ecfg.Agents = "127.0.0.1:0", "env_"+protocol, protocol, agents
		env, err := environment.New(ecfg, environment.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		f.envURLs[protocol] = serve(t, "env_"+protocol, env)
	}
	return f
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
