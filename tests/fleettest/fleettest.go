// Package fleettest starts the whole fleet inside one test process: the fake
// inference server, the policy model server, the weather and counter
// resources servers, their two agents and environment servers for both
// protocols, each on 127.0.0.1:0. Tests that drive the fleet end to end
// (tests/inprocess, tests/upstream) share it.
package fleettest

import (
	"context"
	"net/http"
	"sort"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/servers/agent"
	"github.com/gymfleet/gymfleet/pkg/servers/environment"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
	"github.com/gymfleet/gymfleet/pkg/servers/resources"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

// Server is what every fleet server provides.
type Server interface {
	Listen() error
	Serve() error
	Close(ctx context.Context) error
	URL() string
}

// Serve listens and serves s until the test ends; servers close in reverse
// start order (t.Cleanup is LIFO), so callers close before callees.
func Serve(t testing.TB, name string, s Server) string {
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

// Agent names and the resources server type each one drives.
const (
	WeatherAgent = "weather_agent"
	CounterAgent = "counter_agent"
)

// Fleet is one in-process fleet.
type Fleet struct {
	FakeURL, ModelURL string
	// EnvURLs by protocol.
	EnvURLs map[string]string
	// AgentURLs by agent name.
	AgentURLs map[string]string
	// ResourcesURLs by resources server type.
	ResourcesURLs map[string]string
	// Model is the model name the fake inference server serves.
	Model string
	Ctl   *fakeinference.Control
}

// Options shape a fleet.
type Options struct {
	// Stream sets the agents' streaming.
	Stream bool
	// Client talks to the fake inference server's /_ctl routes (nil: a
	// default client).
	Client *http.Client
	// Resources replaces our resources server of a type with the server at
	// this URL (e.g. a NeMo Gym-shaped one), for its agent and environments.
	Resources map[string]string
	// HTTP is every server's http: section (the zero value: the lean
	// stack, no TLS).
	HTTP httpconf.Config
	// Tracer is every server's tracer provider (nil: none records).
	Tracer trace.TracerProvider
	// Checkpoint, when enabled, is every participant's checkpoint: block
	// (the fake inference server takes no part).
	Checkpoint ctlplane.Config
}

// Endpoints are the fleet's servers as a controller names them
// (coordination.Discover finds the participants among them).
func (f *Fleet) Endpoints() []coordination.Endpoint {
	eps := []coordination.Endpoint{{Name: "fakeinference", URL: f.FakeURL}, {Name: "policy_model", URL: f.ModelURL}}
	for _, m := range []map[string]string{f.ResourcesURLs, f.AgentURLs, f.EnvURLs} {
		names := make([]string, 0, len(m))
		for n := range m {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			eps = append(eps, coordination.Endpoint{Name: n, URL: m[n]})
		}
	}
	return eps
}

// StartModelServer starts a policy model server in front of upstream (a base
// URL ending in /v1) serving model, capturing token ids.
func StartModelServer(t testing.TB, upstream, model string, h2c bool) string {
	t.Helper()
	return startModelServer(t, upstream, model, h2c, Options{})
}

func startModelServer(t testing.TB, upstream, model string, h2c bool, opts Options) string {
	t.Helper()
	mcfg := modelproxy.DefaultConfig()
	mcfg.Listen = "127.0.0.1:0"
	mcfg.Upstream.BaseURL = upstream
	mcfg.Upstream.Model = model
	mcfg.Upstream.H2C = h2c
	mcfg.ReturnTokenIDs = true
	mcfg.Capture.Dir = t.TempDir()
	mcfg.Checkpoint = opts.Checkpoint
	mcfg.HTTP = opts.HTTP
	m, err := modelproxy.New(mcfg, modelproxy.Deps{Tracer: opts.Tracer})
	if err != nil {
		t.Fatal(err)
	}
	return Serve(t, "policy_model", m)
}

// Start starts every server.
func Start(t testing.TB, opts Options) *Fleet {
	t.Helper()
	f := &Fleet{EnvURLs: map[string]string{}, AgentURLs: map[string]string{}, ResourcesURLs: map[string]string{}}

	fcfg := fakeinference.DefaultConfig()
	fcfg.Listen = "127.0.0.1:0"
	// Fast generation: the tests are about the wiring, not pacing.
	fcfg.TokensPerSecond = 0
	fcfg.MinCallSeconds = 0
	fcfg.HTTP = opts.HTTP
	fake, err := fakeinference.New(fcfg, fakeinference.Deps{Tracer: opts.Tracer})
	if err != nil {
		t.Fatal(err)
	}
	f.FakeURL = Serve(t, "fakeinference", fake)
	f.Model = fcfg.Model
	f.Ctl = fakeinference.NewControl(f.FakeURL, opts.Client)
	f.ModelURL = startModelServer(t, f.FakeURL+"/v1", fcfg.Model, true, opts)

	for _, typ := range []string{resources.TypeWeather, resources.TypeCounter} {
		if u, ok := opts.Resources[typ]; ok {
			f.ResourcesURLs[typ] = u
			continue
		}
		rcfg := resources.DefaultConfig()
		rcfg.Name, rcfg.Type, rcfg.Listen = typ, typ, "127.0.0.1:0"
		rcfg.Checkpoint = opts.Checkpoint
		rcfg.HTTP = opts.HTTP
		rs, err := resources.New(rcfg, resources.Deps{Tracer: opts.Tracer})
		if err != nil {
			t.Fatal(err)
		}
		f.ResourcesURLs[typ] = Serve(t, typ, rs)
	}

	var agents []environment.AgentConfig
	for _, a := range []struct{ name, res string }{{WeatherAgent, resources.TypeWeather}, {CounterAgent, resources.TypeCounter}} {
		acfg := agent.DefaultConfig()
		acfg.Name, acfg.Listen = a.name, "127.0.0.1:0"
		acfg.ModelServerURL, acfg.ResourcesServerURL = f.ModelURL, f.ResourcesURLs[a.res]
		acfg.Stream = opts.Stream
		acfg.MaxSteps = 10
		acfg.Checkpoint = opts.Checkpoint
		acfg.HTTP = opts.HTTP
		as, err := agent.New(acfg, agent.Deps{Tracer: opts.Tracer})
		if err != nil {
			t.Fatal(err)
		}
		url := Serve(t, a.name, as)
		f.AgentURLs[a.name] = url
		agents = append(agents, environment.AgentConfig{Name: a.name, URL: url, ResourcesURL: f.ResourcesURLs[a.res]})
	}

	for _, protocol := range []string{environment.ProtocolSingleAgentTurn, environment.ProtocolLegacy} {
		ecfg := environment.DefaultConfig()
		ecfg.Listen, ecfg.Name, ecfg.Protocol, ecfg.Agents = "127.0.0.1:0", "env_"+protocol, protocol, agents
		ecfg.Checkpoint = opts.Checkpoint
		ecfg.HTTP = opts.HTTP
		env, err := environment.New(ecfg, environment.Deps{Tracer: opts.Tracer})
		if err != nil {
			t.Fatal(err)
		}
		f.EnvURLs[protocol] = Serve(t, "env_"+protocol, env)
	}
	return f
}
