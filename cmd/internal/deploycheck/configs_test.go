package deploycheck

import (
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gymfleet/gymfleet/cmd/internal/configload"
	"github.com/gymfleet/gymfleet/cmd/internal/lifecycle"
	"github.com/gymfleet/gymfleet/pkg/ops/collect"
	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/servers/agent"
	"github.com/gymfleet/gymfleet/pkg/servers/environment"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
	"github.com/gymfleet/gymfleet/pkg/servers/resources"
)

// serverConfig is what a loaded configuration says about its peers.
type serverConfig struct {
	// listens are the addresses the process listens on.
	listens []string
	// peers are the URLs it calls.
	peers []string
}

// server is one server binary's loader, the one its command runs
// (lifecycle.LoadConfig: defaults, file, environment, unknown keys
// refused, then Validate), and the names of the variables it reads.
type server struct {
	load func(path string, getenv func(string) string) (serverConfig, error)
	env  []string
}

func servers() map[string]server {
	return map[string]server{
		"modelserver": {
			load: func(path string, getenv func(string) string) (serverConfig, error) {
				cfg, err := lifecycle.LoadConfig(configload.Flags{Config: path}, getenv, modelproxy.DefaultConfig(), nil)
				return serverConfig{listens: []string{cfg.Listen}, peers: cfg.Upstream.Workers()}, err
			},
			env: configload.EnvNames(new(modelproxy.Config)),
		},
		"agentserver": {
			load: func(path string, getenv func(string) string) (serverConfig, error) {
				cfg, err := lifecycle.LoadConfig(configload.Flags{Config: path}, getenv, agent.DefaultProcessConfig(), nil)
				var sc serverConfig
				for _, a := range cfg.Agents {
					sc.listens = append(sc.listens, a.Listen)
					sc.peers = append(sc.peers, a.ModelServerURL, a.ResourcesServerURL)
				}
				return sc, err
			},
			env: configload.EnvNames(new(agent.ProcessConfig)),
		},
		"resourceserver": {
			load: func(path string, getenv func(string) string) (serverConfig, error) {
				cfg, err := lifecycle.LoadConfig(configload.Flags{Config: path}, getenv, resources.DefaultProcessConfig(), nil)
				var sc serverConfig
				for _, s := range cfg.Servers {
					sc.listens = append(sc.listens, s.Listen)
				}
				return sc, err
			},
			env: configload.EnvNames(new(resources.ProcessConfig)),
		},
		"envserver": {
			load: func(path string, getenv func(string) string) (serverConfig, error) {
				cfg, err := lifecycle.LoadConfig(configload.Flags{Config: path}, getenv, environment.DefaultConfig(), nil)
				sc := serverConfig{listens: []string{cfg.Listen}}
				for _, a := range cfg.Agents {
					sc.peers = append(sc.peers, a.URL, a.ResourcesURL)
				}
				return sc, err
			},
			env: configload.EnvNames(new(environment.Config)),
		},
		"fakeinference": {
			load: func(path string, getenv func(string) string) (serverConfig, error) {
				cfg, err := lifecycle.LoadConfig(configload.Flags{Config: path}, getenv, fakeinference.DefaultConfig(), nil)
				return serverConfig{listens: []string{cfg.Listen}}, err
			},
			env: configload.EnvNames(new(fakeinference.Config)),
		},
	}
}

// flagValue is the value of --name in args ("--name v" or "--name=v").
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// TestManifests_ServerConfigsLoad loads every server container's --config,
// as mounted from its ConfigMap, with the container's environment, through
// the server's own loader; every GYMFLEET_ variable must be one the
// loader reads, every listen port a port of the container, and every peer
// URL a Service port of the same rendering.
func TestManifests_ServerConfigsLoad(t *testing.T) {
	srv := servers()
	eachRendering(t, func(t *testing.T, dir string, o *objects) {
		loaded := map[string]bool{}
		for _, p := range o.pods() {
			for _, c := range p.spec.Containers {
				if len(c.Command) == 0 {
					continue
				}
				s, ok := srv[c.Command[0]]
				if !ok {
					continue
				}
				where := p.where + " container " + c.Name
				path, ok := flagValue(c.Args, "config")
				if !ok {
					t.Errorf("%s: no --config", where)
					continue
				}
				content, ok := mountedFile(t, o, p, c, path)
				if !ok {
					t.Errorf("%s: --config %s is in no mounted ConfigMap", where, path)
					continue
				}
				env := containerEnv(t, o, p, c)
				for name := range env {
					if strings.HasPrefix(name, configload.EnvPrefix+"_") && !slices.Contains(s.env, name) {
						t.Errorf("%s: env %s is no key of %s: it would be ignored", where, name, c.Command[0])
					}
				}
				sc, err := s.load(writeTemp(t, "config.yaml", content), func(k string) string { return env[k] })
				if err != nil {
					t.Errorf("%s: %s does not load: %v", where, path, err)
					continue
				}
				loaded[c.Command[0]] = true
				for _, l := range sc.listens {
					checkListen(t, where, l, c)
				}
				for _, u := range sc.peers {
					checkURL(t, o, where, u)
				}
			}
		}
		for _, name := range []string{"modelserver", "agentserver", "resourceserver", "envserver"} {
			if !loaded[name] {
				t.Errorf("no %s container's configuration was loaded", name)
			}
		}
	})
}

// TestManifests_LoaderRefusesUnknownKeys shows the check above has teeth:
// a key the server does not know, added to a ConfigMap's file, fails it.
func TestManifests_LoaderRefusesUnknownKeys(t *testing.T) {
	o := render(t, "base")
	var content string
	for name, cm := range o.configMaps {
		// The generator appends a hash of the content to the name.
		if strings.HasPrefix(name, "gymfleet-config-") {
			content = cm.Data["envserver.yaml"]
		}
	}
	if content == "" {
		t.Fatal("gymfleet-config has no envserver.yaml")
	}
	_, err := servers()["envserver"].load(writeTemp(t, "envserver.yaml", content+"episode_timeuot: 5m\n"), func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "episode_timeuot") {
		t.Fatalf("a misspelt key: %v, want an error naming it", err)
	}
}

// TestManifests_CollectorFleetFile decodes the collector's fleet file as
// gymctl does, and checks that its token is the servers' and that each
// endpoint is a pod's stable DNS name and port.
func TestManifests_CollectorFleetFile(t *testing.T) {
	eachRendering(t, func(t *testing.T, dir string, o *objects) {
		job := o.jobs["collect"]
		if job == nil {
			t.Fatal("no collect Job")
		}
		p := pod{where: "Job collect", spec: job.Spec.Template.Spec}
		c := p.spec.Containers[0]
		script := strings.Join(append(append([]string{}, c.Command...), c.Args...), " ")
		path, ok := flagValue(strings.Fields(script), "config")
		if !ok || !strings.Contains(script, "gymctl collect") {
			t.Fatalf("the Job runs %q: want gymctl collect --config", script)
		}
		content, ok := mountedFile(t, o, p, c, path)
		if !ok {
			t.Fatalf("--config %s is in no mounted volume", path)
		}
		cfg, err := fleet.Decode(strings.NewReader(content))
		if err != nil {
			t.Fatalf("fleet file: %v", err)
		}
		if tok := o.secrets["gymfleet-control"].StringData["token"]; cfg.Checkpoint.ControlAuthToken != tok {
			t.Errorf("fleet file token %q, servers' token %q: the collector's control calls would be refused", cfg.Checkpoint.ControlAuthToken, tok)
		}
		ckdir, _ := flagValue(strings.Fields(script), "checkpoint-dir")
		if !strings.HasPrefix(ckdir, cfg.Checkpoint.Root+"/") {
			t.Errorf("--checkpoint-dir %s is not beneath the fleet's checkpoint root %s", ckdir, cfg.Checkpoint.Root)
		}
		kinds := map[string]int{}
		for _, e := range cfg.Endpoints("") {
			kinds[e.Kind]++
			checkURL(t, o, "fleet endpoint "+e.Name, e.URL)
		}
		for _, k := range []string{fleet.KindModel, fleet.KindAgent, fleet.KindResources, fleet.KindEnvironment} {
			if kinds[k] == 0 {
				t.Errorf("the fleet file has no %s endpoint: checkpoints would leave it out", k)
			}
		}
		// The init container waits for every endpoint of the file, by
		// URLs that name Services of the rendering.
		var waited []string
		for _, ic := range p.spec.InitContainers {
			for _, w := range strings.Fields(strings.Join(ic.Args, " ")) {
				if strings.HasPrefix(w, "http://") {
					checkURL(t, o, "init container "+ic.Name, w)
					waited = append(waited, w)
				}
			}
		}
		for _, e := range cfg.Endpoints("") {
			if !slices.Contains(waited, e.URL) {
				t.Errorf("the Job does not wait for %s (%s) before collecting", e.Name, e.URL)
			}
		}
		// Every participant listener of the rendering is in the file.
		if want := listenerCount(t, o); len(cfg.Endpoints("")) != want {
			t.Errorf("the fleet file has %d endpoints, the StatefulSets' pods %d listeners", len(cfg.Endpoints("")), want)
		}
	})
}

// listenerCount counts the container ports of every StatefulSet pod.
func listenerCount(t *testing.T, o *objects) int {
	t.Helper()
	n := 0
	for _, s := range o.statefulSets {
		replicas := int32(1)
		if s.Spec.Replicas != nil {
			replicas = *s.Spec.Replicas
		}
		for _, c := range s.Spec.Template.Spec.Containers {
			n += int(replicas) * len(c.Ports)
		}
	}
	return n
}

func checkListen(t *testing.T, where, addr string, c corev1.Container) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("%s: listen %q: %v", where, addr, err)
		return
	}
	if host != "0.0.0.0" && host != "" && host != "::" {
		t.Errorf("%s: listen %s: a pod's server listens on every address, or its Service cannot reach it", where, addr)
	}
	for _, p := range c.Ports {
		if strconv.Itoa(int(p.ContainerPort)) == port {
			return
		}
	}
	t.Errorf("%s: listen %s is on no port the container declares", where, addr)
}

// checkURL checks that u names a Service of the rendering (service or
// <pod>.<service>, the pod one of its StatefulSet's) on one of its ports.
func checkURL(t *testing.T, o *objects, where, raw string) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Errorf("%s: %q: %v", where, raw, err)
		return
	}
	labels := strings.Split(u.Hostname(), ".")
	svcName := labels[len(labels)-1]
	svc := o.services[svcName]
	if svc == nil || len(labels) > 2 {
		t.Errorf("%s: %s names no Service of the rendering", where, raw)
		return
	}
	if len(labels) == 2 {
		podName := labels[0]
		var found bool
		for n, s := range o.statefulSets {
			ord, ok := strings.CutPrefix(podName, n+"-")
			i, err := strconv.Atoi(ord)
			replicas := int32(1)
			if s.Spec.Replicas != nil {
				replicas = *s.Spec.Replicas
			}
			if ok && err == nil && s.Spec.ServiceName == svcName && i >= 0 && int32(i) < replicas {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: %s names no pod of a StatefulSet behind Service %s", where, raw, svcName)
		}
	}
	for _, p := range svc.Spec.Ports {
		if strconv.Itoa(int(p.Port)) == u.Port() {
			return
		}
	}
	t.Errorf("%s: %s: Service %s has no port %s", where, raw, svcName, u.Port())
}

// TestManifests_SampleRowsRunOnTheFleet reads the fake-inference overlay's
// rows as gymctl collect does: every line is a row, and each names an
// agent the environment server knows.
func TestManifests_SampleRowsRunOnTheFleet(t *testing.T) {
	o := render(t, "overlays/fake-inference")
	var rowsText, envText string
	for name, cm := range o.configMaps {
		switch {
		case strings.HasPrefix(name, "gymfleet-input-"):
			rowsText = cm.Data["rows.jsonl"]
		case strings.HasPrefix(name, "gymfleet-config-"):
			envText = cm.Data["envserver.yaml"]
		}
	}
	rows, issues, err := collect.ReadRows(strings.NewReader(rowsText), 0)
	if err != nil || len(issues) > 0 || len(rows) == 0 {
		t.Fatalf("rows.jsonl: %d rows, issues %v, %v", len(rows), issues, err)
	}
	cfg, err := lifecycle.LoadConfig(configload.Flags{Config: writeTemp(t, "envserver.yaml", envText)}, func(k string) string {
		if k == "GYMFLEET_CHECKPOINT_CONTROL_AUTH_TOKEN" {
			return "t"
		}
		return ""
	}, environment.DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	agents := map[string]bool{}
	for _, a := range cfg.Agents {
		agents[a.Name] = true
	}
	for _, r := range rows {
		if r.Agent != "" && !agents[r.Agent] {
			t.Errorf("row %s names agent %q, which the environment server does not know", r.Episode.RolloutID, r.Agent)
		}
	}
}
