package fleet_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

// Every generated server configuration carries the topology's pprof key at
// its top level (the process level for the agent and resources processes).
func TestGenerate_PprofReachesEveryServer(t *testing.T) {
	for _, on := range []bool{false, true} {
		dir := t.TempDir()
		topo := fleet.Standard(dir, "/bin", "tok")
		topo.Pprof = on
		cfg, err := fleet.Generate(topo)
		if err != nil {
			t.Fatal(err)
		}
		if len(cfg.Processes) != 5 {
			t.Fatalf("%d processes, want 5", len(cfg.Processes))
		}
		for _, p := range cfg.Processes {
			b, err := os.ReadFile(p.Config)
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if err := yaml.Unmarshal(b, &m); err != nil {
				t.Fatalf("%s: %v", filepath.Base(p.Config), err)
			}
			if got, ok := m["pprof"].(bool); !ok || got != on {
				t.Errorf("pprof %v: %s has pprof %v, want %v", on, filepath.Base(p.Config), m["pprof"], on)
			}
		}
	}
}

// Every server of a generated fleet listens on a port of its own.
func TestFreePorts_Distinct(t *testing.T) {
	for range 20 {
		ports, err := fleet.FreePorts(12)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[int]bool{}
		for _, p := range ports {
			if seen[p] || p == 0 {
				t.Fatalf("ports %v repeat or are zero", ports)
			}
			seen[p] = true
		}
	}
}

// The model server of a generated fleet asks its fakeinference for the model
// it serves (any other name is a 404, as from vLLM).
func TestGenerate_ModelNamesAgree(t *testing.T) {
	cfg, err := fleet.Generate(fleet.Standard(t.TempDir(), "/bin", "tok"))
	if err != nil {
		t.Fatal(err)
	}
	read := func(name string) map[string]any {
		t.Helper()
		p, ok := cfg.Process(name)
		if !ok {
			t.Fatalf("no process %s", name)
		}
		b, err := os.ReadFile(p.Config)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	served := read("fakeinference")["model"]
	asked := read("policy_model")["upstream"].(map[string]any)["model"]
	if served != fleet.ServedModel || asked != served {
		t.Errorf("fakeinference serves %v, the model server asks for %v", served, asked)
	}
}

// Every checkpointing server of a generated fleet, and the fleet file
// gymctl reads, has the topology's directory as its checkpoint root unless
// the topology names another.
func TestGenerate_CheckpointRoot(t *testing.T) {
	for _, root := range []string{"", "/somewhere/else"} {
		dir := t.TempDir()
		topo := fleet.Standard(dir, "/bin", "tok")
		topo.CheckpointRoot = root
		cfg, err := fleet.Generate(topo)
		if err != nil {
			t.Fatal(err)
		}
		want := root
		if want == "" {
			want = dir
		}
		if cfg.Checkpoint.Root != want {
			t.Errorf("fleet checkpoint.root = %q, want %q", cfg.Checkpoint.Root, want)
		}
		blocks := 0
		for _, p := range cfg.Processes {
			b, err := os.ReadFile(p.Config)
			if err != nil {
				t.Fatal(err)
			}
			var m struct {
				Checkpoint map[string]any `yaml:"checkpoint"`
			}
			if err := yaml.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			if m.Checkpoint == nil {
				continue
			}
			blocks++
			if m.Checkpoint["root"] != want {
				t.Errorf("%s: checkpoint.root = %v, want %q", filepath.Base(p.Config), m.Checkpoint["root"], want)
			}
		}
		if blocks != 4 {
			t.Errorf("%d servers have a checkpoint block, want 4 (model, resources, agents, environment)", blocks)
		}
	}
}

// A topology's HTTP stack reaches every server's file and the fleet file.
func TestGenerate_HTTPStackReachesEveryServer(t *testing.T) {
	topo := fleet.Standard(t.TempDir(), "/bin", "tok")
	topo.HTTPStack = "nethttp"
	cfg, err := fleet.Generate(topo)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HTTP.Stack != "nethttp" {
		t.Errorf("fleet http.stack %q, want nethttp", cfg.HTTP.Stack)
	}
	for _, p := range cfg.Processes {
		b, err := os.ReadFile(p.Config)
		if err != nil {
			t.Fatal(err)
		}
		var m struct {
			HTTP struct {
				Stack string `yaml:"stack"`
			} `yaml:"http"`
		}
		if err := yaml.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v", filepath.Base(p.Config), err)
		}
		if m.HTTP.Stack != "nethttp" {
			t.Errorf("%s has http.stack %q, want nethttp", filepath.Base(p.Config), m.HTTP.Stack)
		}
	}
}

// A topology's runtime tuning reaches every server's file; without one no
// file has a runtime section, and the servers keep their default.
func TestGenerate_RuntimeTuningReachesEveryServer(t *testing.T) {
	for _, mode := range []runtimetune.Mode{runtimetune.Off, runtimetune.On, ""} {
		topo := fleet.Standard(t.TempDir(), "/bin", "tok")
		topo.RuntimeTuning = mode
		cfg, err := fleet.Generate(topo)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range cfg.Processes {
			b, err := os.ReadFile(p.Config)
			if err != nil {
				t.Fatal(err)
			}
			var m struct {
				Runtime *struct {
					Tuning string `yaml:"tuning"`
				} `yaml:"runtime"`
			}
			if err := yaml.Unmarshal(b, &m); err != nil {
				t.Fatalf("%s: %v", filepath.Base(p.Config), err)
			}
			switch {
			case mode == "" && m.Runtime != nil:
				t.Errorf("%s has a runtime section %+v for a topology without tuning", filepath.Base(p.Config), *m.Runtime)
			case mode != "" && (m.Runtime == nil || m.Runtime.Tuning != string(mode)):
				t.Errorf("%s has runtime %+v, want tuning %s", filepath.Base(p.Config), m.Runtime, mode)
			}
		}
	}
}

// A topology's TLS makes every endpoint https:// and reaches every
// server's file and the fleet file.
func TestGenerate_TLSReachesEveryServer(t *testing.T) {
	topo := fleet.Standard(t.TempDir(), "/bin", "tok")
	topo.TLS = httpconf.TLS{CertFile: "/pki/cert.pem", KeyFile: "/pki/key.pem", CAFile: "/pki/ca.pem"}
	cfg, err := fleet.Generate(topo)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.HTTP.Conf(cfg.BaseDir).TLS; got != topo.TLS {
		t.Errorf("fleet http.tls %+v, want %+v", got, topo.TLS)
	}
	for _, p := range cfg.Processes {
		for _, e := range p.Endpoints {
			if !strings.HasPrefix(e.URL, "https://") {
				t.Errorf("endpoint %s: %s, want https://", e.Name, e.URL)
			}
		}
		b, err := os.ReadFile(p.Config)
		if err != nil {
			t.Fatal(err)
		}
		var m struct {
			HTTP struct {
				TLS struct {
					CertFile string `yaml:"cert_file"`
					KeyFile  string `yaml:"key_file"`
					CAFile   string `yaml:"ca_file"`
				} `yaml:"tls"`
			} `yaml:"http"`
		}
		if err := yaml.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v", filepath.Base(p.Config), err)
		}
		if got := (httpconf.TLS{CertFile: m.HTTP.TLS.CertFile, KeyFile: m.HTTP.TLS.KeyFile, CAFile: m.HTTP.TLS.CAFile}); got != topo.TLS {
			t.Errorf("%s has http.tls %+v, want %+v", filepath.Base(p.Config), got, topo.TLS)
		}
		if strings.Contains(string(b), "http://") {
			t.Errorf("%s names an http:// peer in a TLS fleet", filepath.Base(p.Config))
		}
	}
}

// Hosts puts each process's endpoints on its address: every URL in the
// fleet and every listen address in the servers' files use it, and a
// process missing from Hosts stays on loopback.
func TestGenerate_HostsPlaceEveryProcess(t *testing.T) {
	dir := t.TempDir()
	topo := fleet.Standard(dir, "/bin", "tok")
	hosts := map[string]string{"policy_model": "10.9.8.1", "resources": "10.9.8.2", "agents": "10.9.8.3", "env": "10.9.8.4"}
	topo.Hosts = hosts
	cfg, err := fleet.Generate(topo)
	if err != nil {
		t.Fatal(err)
	}
	want := func(proc string) string {
		if h, ok := hosts[proc]; ok {
			return h
		}
		return "127.0.0.1"
	}
	files := map[string][]byte{}
	for _, p := range cfg.Processes {
		b, err := os.ReadFile(p.Config)
		if err != nil {
			t.Fatal(err)
		}
		files[p.Name] = b
		for _, e := range p.Endpoints {
			if !strings.HasPrefix(e.URL, "http://"+want(p.Name)+":") {
				t.Errorf("endpoint %s of %s: url %s, want host %s", e.Name, p.Name, e.URL, want(p.Name))
			}
			// The server listens where the fleet reaches it.
			listen := "listen: " + strings.TrimPrefix(e.URL, "http://")
			if !strings.Contains(string(b), listen) {
				t.Errorf("%s's file has no %q:\n%s", p.Name, listen, b)
			}
		}
	}
	// The agents reach the model server and the resources at their hosts.
	model, _ := cfg.Endpoint("policy_model")
	weather, _ := cfg.Endpoint("weather")
	for _, u := range []string{model.URL, weather.URL} {
		if !strings.Contains(string(files["agents"]), u) {
			t.Errorf("agentserver.yaml does not name %s", u)
		}
	}
}

// A topology of two inference workers generates two fakeinference processes
// and a model server listing both in upstream.base_urls; one worker keeps
// upstream.base_url.
func TestGenerate_InferenceWorkers(t *testing.T) {
	for _, n := range []int{0, 1, 2} {
		topo := fleet.Standard(t.TempDir(), "/bin", "tok")
		topo.InferenceWorkers = n
		cfg, err := fleet.Generate(topo)
		if err != nil {
			t.Fatal(err)
		}
		var urls []any
		for _, p := range cfg.Processes {
			if p.Binary == "fakeinference" {
				urls = append(urls, p.Endpoints[0].URL+"/v1")
			}
		}
		p, _ := cfg.Process("policy_model")
		b, err := os.ReadFile(p.Config)
		if err != nil {
			t.Fatal(err)
		}
		var m struct {
			Upstream map[string]any `yaml:"upstream"`
		}
		if err := yaml.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		want := max(n, 1)
		if len(urls) != want {
			t.Fatalf("workers %d: %d fakeinference processes, want %d", n, len(urls), want)
		}
		if want == 1 {
			if m.Upstream["base_url"] != urls[0] || m.Upstream["base_urls"] != nil {
				t.Fatalf("one worker: upstream %v, want base_url %v", m.Upstream, urls[0])
			}
			continue
		}
		got, _ := m.Upstream["base_urls"].([]any)
		if _, has := m.Upstream["base_url"]; has || !reflect.DeepEqual(got, urls) {
			t.Fatalf("two workers: upstream %v, want base_urls %v", m.Upstream, urls)
		}
		if _, ok := cfg.Process("fakeinference-1"); !ok {
			t.Fatalf("no process fakeinference-1: %v", cfg.Names())
		}
	}
}

// Replicas: two of each kind are <name>-0 and <name>-1 in processes of
// their own, and every caller lists every replica of its callee.
func TestGenerate_Replicas(t *testing.T) {
	dir := t.TempDir()
	topo := fleet.Standard(dir, dir, "tok")
	topo.Replicas = fleet.Each(2)
	cfg, err := fleet.Generate(topo)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"policy_model-0", "policy_model-1", "env-0", "env-1", "resources-0", "resources-1", "agents-0", "agents-1"} {
		if _, ok := cfg.Process(name); !ok {
			t.Errorf("no process %s in %v", name, cfg.Names())
		}
	}
	for _, name := range []string{"weather_agent-0", "weather_agent-1", "weather-0", "weather-1", "policy_model-1", "env-1"} {
		if _, ok := cfg.Endpoint(name); !ok {
			t.Errorf("no endpoint %s", name)
		}
	}
	env, err := os.ReadFile(filepath.Join(dir, "envserver-1.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"name: env-1", "name: weather_agent-1", "resources_urls:"} {
		if !strings.Contains(string(env), want) {
			t.Errorf("envserver-1.yaml lacks %q:\n%s", want, env)
		}
	}
	agents, err := os.ReadFile(filepath.Join(dir, "agentserver-0.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"model_server_urls:", "resources_server_urls:"} {
		if !strings.Contains(string(agents), want) {
			t.Errorf("agentserver-0.yaml lacks %q:\n%s", want, agents)
		}
	}
}
