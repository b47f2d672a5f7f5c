package gym

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// discovered is what py/discovery.py prints: each instance of a head's
// document as Gym's ServerClient resolves it.
type discovered struct {
	HeadServer map[string]any `json:"head_server"`
	Instances  map[string]struct {
		Kind string `json:"kind"`
		URL  string `json:"url"`
	} `json:"instances"`
}

func discover(t *testing.T, dir string, port int) discovered {
	t.Helper()
	var d discovered
	out := runPy(t, dir, "discovery.py", "127.0.0.1", strconv.Itoa(port))
	if err := json.Unmarshal(out, &d); err != nil {
		t.Fatalf("discovery.py: %s: %v", out, err)
	}
	return d
}

// standardSpec is our fleet on its own: weather and counter resources, an
// agent each, the environment routing both by single_agent_turn and the
// counter also by the legacy protocol under another name.
func standardSpec() fleetSpec {
	return fleetSpec{
		ourResources: true,
		agents: []agentSpec{
			{name: "weather_agent", resources: ours("weather"), maxSteps: 6},
			{name: "counter_agent", resources: ours("counter"), maxSteps: 8},
		},
		routes: []routeSpec{
			{name: "weather_agent", agent: ourAgent("weather_agent"), resources: ours("weather")},
			{name: "counter_agent", agent: ourAgent("counter_agent"), resources: ours("counter")},
			{name: "counter_agent_legacy", agent: ourAgent("counter_agent"), resources: ours("counter"), protocol: "legacy"},
		},
	}
}

// TestDiscovery: `gymctl up` serves Gym's head-server routes for the fleet
// it runs, and Gym's own client resolves every server of ours by name to
// its address: the model, the resources servers, the agents, the
// environment, and a route named other than its agent (to that agent's
// address). `gym env status` lists the servers, all healthy. `gymctl gym-config`
// prints the document the head serves, and `gymctl gym-head` serves the
// same for the fleet as one started elsewhere.
func TestDiscovery(t *testing.T) {
	spec := standardSpec()
	spec.head = true
	f := startFleet(t, spec)
	want := map[string][2]string{
		"policy_model":         {"responses_api_models", f.model},
		"weather":              {"resources_servers", f.resources["weather"]},
		"counter":              {"resources_servers", f.resources["counter"]},
		"weather_agent":        {"responses_api_agents", f.agents["weather_agent"]},
		"counter_agent":        {"responses_api_agents", f.agents["counter_agent"]},
		"counter_agent_legacy": {"responses_api_agents", f.agents["counter_agent"]},
		"env":                  {"environment_servers", f.env},
	}
	check := func(t *testing.T, head int) {
		d := discover(t, f.dir, head)
		if d.HeadServer["port"] != float64(head) {
			t.Errorf("head_server %v, served on %d", d.HeadServer, head)
		}
		for name, w := range want {
			got, ok := d.Instances[name]
			if !ok || got.Kind != w[0] || got.URL != w[1] {
				t.Errorf("Gym resolves %s to %+v, want %s at %s", name, got, w[0], w[1])
			}
		}
		if len(d.Instances) != len(want) {
			t.Errorf("Gym sees instances %v, want exactly %d", d.Instances, len(want))
		}
		// counter_agent_legacy names a route, not a server: gym env
		// status lists the six servers.
		checkStatus(t, f.dir, head, len(want)-1)
	}
	t.Run("gymctl up", func(t *testing.T) { check(t, f.head) })

	printed := runCmd(t, t.Context(), f.dir, filepath.Join(binDir, "gymctl"), "gym-config", "--config", f.fleetFile)
	if served := f.headDocument(t); !bytes.Equal(printed, served) {
		t.Errorf("gymctl gym-config printed\n%s\nthe head serves\n%s", printed, served)
	}

	t.Run("gymctl gym-head", func(t *testing.T) {
		port := takePorts(t, 1)[0]
		head := startProcess(t, "gymctl-gym-head", f.dir, nil, filepath.Join(binDir, "gymctl"), "gym-head", "--config", f.fleetFile, "--listen", addr(port))
		if err := head.WaitFor("serving until Ctrl-C", 30*time.Second); err != nil {
			t.Fatalf("gymctl gym-head: %v\n%s", err, head.Tail())
		}
		check(t, port)
		var instances []map[string]any
		if err := json.Unmarshal(httpGet(t, url(port)+"/server_instances"), &instances); err != nil {
			t.Fatal(err)
		}
		for _, in := range instances {
			if in["pid"] != nil {
				t.Errorf("%v: a static fleet's pid is unknown, want null", in)
			}
		}
	})
}

var statusLine = regexp.MustCompile(`(\d+) servers found \((\d+) healthy, (\d+) unhealthy\)`)

// checkStatus runs `gym env status` against a head: it lists the head's
// /server_instances and GETs each url.
func checkStatus(t *testing.T, dir string, head int, want int) {
	t.Helper()
	out := runGym(t, dir, "env", "status", "++head_server.host=127.0.0.1", "++head_server.port="+strconv.Itoa(head))
	m := statusLine.FindSubmatch(out)
	if m == nil || string(m[1]) != strconv.Itoa(want) || string(m[2]) != strconv.Itoa(want) {
		t.Errorf("gym env status: want %d servers, all healthy:\n%s", want, lastBytes(string(out), 3000))
	}
}
