package gymhead_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/ops/gymhead"
)

// standardFleet is the crash suite's topology (weather, counter and slow
// resources, an agent each, every agent routed twice by the environment).
func standardFleet(t *testing.T) *fleet.Config {
	t.Helper()
	cfg, err := fleet.Generate(fleet.Standard(t.TempDir(), "/bin", ""))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func parse(t *testing.T, doc []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal(doc, &m); err != nil {
		t.Fatalf("%s: %v", doc, err)
	}
	return m
}

// inner is get_first_server_config_dict: the first kind, the first
// implementation.
func inner(t *testing.T, m map[string]any, name string) (kind, impl string, cfg map[string]any) {
	t.Helper()
	block, ok := m[name].(map[string]any)
	if !ok || len(block) != 1 {
		t.Fatalf("instance %s = %v, want one kind", name, m[name])
	}
	for k, v := range block {
		impls := v.(map[string]any)
		if len(impls) != 1 {
			t.Fatalf("instance %s: %v, want one implementation", name, impls)
		}
		for i, c := range impls {
			return k, i, c.(map[string]any)
		}
	}
	return "", "", nil
}

func hostPort(t *testing.T, cfg *fleet.Config, endpoint string) (string, int) {
	t.Helper()
	e, ok := cfg.Endpoint(endpoint)
	if !ok {
		t.Fatalf("no endpoint %s", endpoint)
	}
	u := strings.TrimPrefix(e.URL, "http://")
	host, port, _ := strings.Cut(u, ":")
	var p int
	for _, c := range port {
		p = p*10 + int(c-'0')
	}
	return host, p
}

func TestBuild_NamesEveryServer(t *testing.T) {
	cfg := standardFleet(t)
	doc, err := gymhead.Build(cfg, "127.0.0.1:11000")
	if err != nil {
		t.Fatal(err)
	}
	m := parse(t, doc.YAML())
	if !reflect.DeepEqual(m["head_server"], map[string]any{"host": "127.0.0.1", "port": 11000}) || m["dry_run"] != false {
		t.Errorf("head_server %v, dry_run %v", m["head_server"], m["dry_run"])
	}
	if _, ok := m["fakeinference"]; ok {
		t.Error("fakeinference (vLLM's stand-in) is no Gym server")
	}
	for name, want := range map[string][2]string{
		"policy_model":  {gymhead.KindModel, gymhead.ImplModel},
		"weather":       {gymhead.KindResources, gymhead.ImplResources},
		"counter":       {gymhead.KindResources, gymhead.ImplResources},
		"weather_agent": {gymhead.KindAgent, gymhead.ImplAgent},
		"env":           {gymhead.KindEnvironment, gymhead.ImplEnvironment},
	} {
		kind, impl, c := inner(t, m, name)
		host, port := hostPort(t, cfg, name)
		if kind != want[0] || impl != want[1] || c["host"] != host || c["port"] != port {
			t.Errorf("%s: %s/%s %v, want %v at %s:%d", name, kind, impl, c, want, host, port)
		}
		if _, ok := c["entrypoint"]; ok {
			t.Errorf("%s has an entrypoint: Gym would try to start it", name)
		}
	}
	_, _, agent := inner(t, m, "counter_agent")
	if !reflect.DeepEqual(agent["resources_server"], map[string]any{"type": gymhead.KindResources, "name": "counter"}) ||
		!reflect.DeepEqual(agent["model_server"], map[string]any{"type": gymhead.KindModel, "name": "policy_model"}) {
		t.Errorf("counter_agent references: %v", agent)
	}
	// Every route of the environment is an agent it fronts, so Gym sends a
	// row naming any of them there.
	_, _, env := inner(t, m, "env")
	for _, route := range []string{"weather_agent", "weather_agent_legacy", "counter_agent_legacy", "slow_agent"} {
		if !reflect.DeepEqual(env[route], map[string]any{"type": gymhead.KindAgent, "name": route}) {
			t.Errorf("env.%s = %v", route, env[route])
		}
	}
	// A route named other than an agent is an instance at its agent.
	kind, _, legacy := inner(t, m, "weather_agent_legacy")
	host, port := hostPort(t, cfg, "weather_agent")
	if kind != gymhead.KindAgent || legacy["host"] != host || legacy["port"] != port ||
		!reflect.DeepEqual(legacy["resources_server"], map[string]any{"type": gymhead.KindResources, "name": "weather"}) ||
		legacy[gymhead.RouteOfKey] != "weather_agent" {
		t.Errorf("weather_agent_legacy = %s %v", kind, legacy)
	}
	if _, _, agent := inner(t, m, "weather_agent"); agent[gymhead.RouteOfKey] != nil {
		t.Errorf("weather_agent is a server of its own, not a route: %v", agent)
	}
	names := map[string]bool{}
	for _, in := range doc.Instances {
		names[in.Name] = true
		if in.URL() == "" || in.Process == "" {
			t.Errorf("instance %+v", in)
		}
	}
	if !names["weather_agent_legacy"] || !names["env"] || len(doc.Instances) != len(m)-2 {
		t.Errorf("instances %v, document keys %d", names, len(m))
	}
}

func TestBuild_ConfigPaths(t *testing.T) {
	cfg := standardFleet(t)
	extra := filepath.Join(t.TempDir(), "gym.yaml")
	const gymServers = `
ray_head_node_address: 127.0.0.1:6379
head_server: {host: 10.0.0.1, port: 1}
token_id_capture: {enabled: true}
counter:
  resources_servers:
    example_session_state_mgmt: {entrypoint: app.py, domain: agent, host: 127.0.0.1, port: 9}
gym_weather:
  resources_servers:
    example_single_tool_call: {entrypoint: app.py, domain: agent, host: 127.0.0.1, port: 8}
`
	if err := os.WriteFile(extra, []byte(gymServers), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Gym.ConfigPaths = []string{extra}
	doc, err := gymhead.Build(cfg, "127.0.0.1:11000")
	if err != nil {
		t.Fatal(err)
	}
	m := parse(t, doc.YAML())
	if m["ray_head_node_address"] != "127.0.0.1:6379" || !reflect.DeepEqual(m["token_id_capture"], map[string]any{"enabled": true}) {
		t.Errorf("run-level keys not merged: %v", m)
	}
	if !reflect.DeepEqual(m["head_server"], map[string]any{"host": "127.0.0.1", "port": 11000}) {
		t.Errorf("head_server = %v: a file must not move it", m["head_server"])
	}
	if _, impl, c := inner(t, m, "counter"); impl != "example_session_state_mgmt" || c["port"] != 9 {
		t.Errorf("counter = %s %v, want the file's instance", impl, c)
	}
	if _, impl, _ := inner(t, m, "gym_weather"); impl != "example_single_tool_call" {
		t.Errorf("gym_weather = %s", impl)
	}
	for _, in := range doc.Instances {
		if in.Name == "counter" || in.Name == "gym_weather" {
			t.Errorf("instance %s is the file's, not ours", in.Name)
		}
	}
}

func TestBuild_Refuses(t *testing.T) {
	cfg := standardFleet(t)
	if _, err := gymhead.Build(cfg, "nohost"); err == nil {
		t.Error("a head_server without a port was taken")
	}
	tls := standardFleet(t)
	tls.Processes[1].Endpoints[0].URL = strings.Replace(tls.Processes[1].Endpoints[0].URL, "http://", "https://", 1)
	if _, err := gymhead.Build(tls, "127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "http://") {
		t.Errorf("an https endpoint: %v (Gym reaches servers over http:// only)", err)
	}
}

func TestServer_Routes(t *testing.T) {
	cfg := standardFleet(t)
	start := time.Unix(1700000000, 500000000)
	srv, err := gymhead.New(cfg, gymhead.Options{
		Listen: "127.0.0.1:0",
		PID: func(p string) int {
			if p == "env" {
				return 4242
			}
			return 0
		},
		Now: func() time.Time { return start },
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Error(err)
		}
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	get := func(path string) (int, []byte) {
		t.Helper()
		resp, err := http.Get(srv.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	for _, p := range []string{"/", "/livez", "/readyz", "/healthz", "/health"} {
		if code, body := get(p); code != 200 || strings.TrimSpace(string(body)) != `{"status":"ok"}` {
			t.Errorf("GET %s = %d %s", p, code, body)
		}
	}
	// A JSON string whose text is the YAML (ServerClient: json.loads, then
	// OmegaConf.create), naming the address the server listens on.
	code, body := get("/global_config_dict_yaml")
	var text string
	if err := json.Unmarshal(body, &text); code != 200 || err != nil {
		t.Fatalf("GET /global_config_dict_yaml = %d %s: %v", code, body, err)
	}
	m := parse(t, []byte(text))
	head := m["head_server"].(map[string]any)
	if got := net.JoinHostPort(head["host"].(string), strconv.Itoa(head["port"].(int))); "http://"+got != srv.URL() {
		t.Errorf("head_server %v, server at %s", head, srv.URL())
	}
	code, body = get("/server_instances")
	var instances []map[string]any
	if err := json.Unmarshal(body, &instances); code != 200 || err != nil {
		t.Fatalf("GET /server_instances = %d %s: %v", code, body, err)
	}
	servers := 0
	for _, in := range srv.Document().Instances {
		if in.RouteOf == "" {
			servers++
		}
	}
	if len(instances) != servers {
		t.Fatalf("%d instances, want the %d servers (routes are none)", len(instances), servers)
	}
	keys := []string{"config_path", "dir_path", "entrypoint", "host", "name", "pid", "port", "process_name", "server_type", "start_time", "status", "uptime_seconds", "url"}
	for _, in := range instances {
		for _, k := range keys {
			if _, ok := in[k]; !ok {
				t.Errorf("instance %v lacks %s (ServerInstanceDisplayConfig serializes every field)", in, k)
			}
		}
		if in["start_time"] != 1700000000.5 {
			t.Errorf("start_time = %v", in["start_time"])
		}
		if in["process_name"] == "env" {
			if in["pid"] != 4242.0 || in["server_type"] != gymhead.KindEnvironment || in["name"] != gymhead.ImplEnvironment || in["config_path"] != "env" {
				t.Errorf("env instance = %v", in)
			}
		} else if in["pid"] != nil {
			t.Errorf("%v: a pid nobody knows", in)
		}
	}
}
