// Package gymhead tells NeMo Gym's tools where a fleet's servers are, as
// Gym's own head server does: GET /global_config_dict_yaml answers Gym's
// global config (each server an instance named the way rows and configs name
// it: instance name → server kind → implementation → host, port, references)
// and GET /server_instances the list `gym env status` reads. Gym's
// ServerClient resolves a server name through that config
// (get_first_server_config_dict: the first kind, the first implementation,
// then http://{host}:{port}), so Gym's rollout collection, NeMo RL's call of
// it and Gym's own servers find ours by name without a hand-written config.
//
// The shapes are nemo-gym 0.7.0's (nemo_gym/server_utils.py HeadServer and
// ServerInstanceDisplayConfig; nemo_gym/global_config.py for the instance
// blocks and environment_server_agent_refs).
package gymhead

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
)

// Gym's server kinds (the second level of an instance block).
const (
	KindModel       = "responses_api_models"
	KindResources   = "resources_servers"
	KindAgent       = "responses_api_agents"
	KindEnvironment = "environment_servers"
)

// Implementation names of our servers (the third level). They name no Gym
// implementation directory, and our instances have no entrypoint, so Gym
// never tries to start them.
const (
	ImplModel       = "gymfleet_modelserver"
	ImplResources   = "gymfleet_resourceserver"
	ImplAgent       = "gymfleet_agentserver"
	ImplEnvironment = "gymfleet_envserver"
)

// DefaultPort is Gym's head server port (DEFAULT_HEAD_SERVER_PORT), which
// Gym's tools ask when told nothing else.
const DefaultPort = 11000

// Instance is one server instance of the document that one of our
// endpoints serves.
type Instance struct {
	// Name is the instance name (the top-level key), what rows and Gym's
	// configs name the server by.
	Name string
	// Kind and Impl are the second and third levels of its block.
	Kind, Impl string
	Host       string
	Port       int
	// Process is the fleet process serving it.
	Process string
	// RouteOf is set on an instance that only names an environment route:
	// the agent instance at the same address ("-" for an agent outside the
	// fleet). Such an instance is no server of its own: a discoverer of
	// participants (a checkpoint coordinator) skips it, as the document
	// says with RouteOfKey.
	RouteOf string
}

// RouteOfKey marks, in the document, an agent instance that names an
// environment route to the agent it holds (our field; Gym ignores fields
// it does not know).
const RouteOfKey = "gymfleet_route_of"

// URL is http://host:port, as Gym's ServerClient builds it.
func (i Instance) URL() string { return "http://" + net.JoinHostPort(i.Host, strconv.Itoa(i.Port)) }

// Document is a fleet's NeMo Gym global config.
type Document struct {
	// Head is the head_server the document names, host:port.
	Head string
	// Instances are ours, in document order.
	Instances []Instance
	yaml      []byte
}

// YAML is the document as Gym's head server serves it (the text its
// ServerClient parses with OmegaConf).
func (d *Document) YAML() []byte { return d.yaml }

// Build makes the document of a fleet whose head server listens on head
// (host:port; what the document's head_server says): an instance per model,
// resources, agent and environment endpoint (fakeinference stands for vLLM
// and is no Gym server), then the files of the fleet's gym.config_paths
// merged in order.
//
// Agents reference their model and resources servers, and environment
// servers their agents, as each process's configuration file names them
// by URL. Every route of an environment server becomes an agent
// reference, since Gym routes a row to the environment server that
// fronts its agent_ref.name: a route whose name is no agent endpoint
// (e.g. weather_agent_legacy, the legacy protocol to weather_agent) gets an
// instance of its own at its agent's address. An instance that a
// config_paths file defines replaces ours whole; its other top-level keys
// (run-level settings such as ray_head_node_address) are merged over ours.
func Build(cfg *fleet.Config, head string) (*Document, error) {
	hh, hp, err := splitHostPort(head)
	if err != nil {
		return nil, fmt.Errorf("gym.head_server %q: %w", head, err)
	}
	b := builder{cfg: cfg, byURL: map[string]string{}, blocks: map[string]*yaml.Node{}}
	if err := b.ours(); err != nil {
		return nil, err
	}
	root := mapping()
	put(root, "head_server", mapping(kv("host", str(hh)), kv("port", integer(hp))))
	// Gym's parser always sets dry_run, and a Gym server started with
	// this document as its NEMO_GYM_CONFIG_DICT reads it.
	put(root, "dry_run", boolean(false))
	for _, name := range b.order {
		put(root, name, b.blocks[name])
	}
	for _, p := range cfg.Gym.ConfigPaths {
		if err := mergeFile(root, cfg.Path(p)); err != nil {
			return nil, err
		}
	}
	// head_server is where this document is served: a file cannot move it.
	put(root, "head_server", mapping(kv("host", str(hh)), kv("port", integer(hp))))
	var instances []Instance
	for _, in := range b.instances {
		if get(root, in.Name) == b.blocks[in.Name] {
			instances = append(instances, in)
		}
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return &Document{Head: net.JoinHostPort(hh, strconv.Itoa(hp)), Instances: instances, yaml: buf.Bytes()}, nil
}

type builder struct {
	cfg *fleet.Config
	// byURL maps a normalized endpoint URL to its endpoint name.
	byURL     map[string]string
	order     []string
	blocks    map[string]*yaml.Node
	instances []Instance
}

func (b *builder) add(in Instance, fields ...[2]*yaml.Node) error {
	if _, dup := b.blocks[in.Name]; dup {
		return fmt.Errorf("gym config: instance %q is defined twice (an endpoint and an environment route share the name)", in.Name)
	}
	inner := mapping(kv("host", str(in.Host)), kv("port", integer(in.Port)))
	for _, f := range fields {
		inner.Content = append(inner.Content, f[0], f[1])
	}
	b.blocks[in.Name] = mapping(kv(in.Kind, mapping(kv(in.Impl, inner))))
	b.order = append(b.order, in.Name)
	b.instances = append(b.instances, in)
	return nil
}

func (b *builder) ours() error {
	kinds := map[string][2]string{
		fleet.KindModel:       {KindModel, ImplModel},
		fleet.KindResources:   {KindResources, ImplResources},
		fleet.KindAgent:       {KindAgent, ImplAgent},
		fleet.KindEnvironment: {KindEnvironment, ImplEnvironment},
	}
	type ep struct {
		fleet.Endpoint
		process fleet.Process
	}
	var eps []ep
	for _, p := range b.cfg.Processes {
		for _, e := range p.Endpoints {
			b.byURL[normURL(e.URL)] = e.Name
			if _, ok := kinds[e.Kind]; ok {
				eps = append(eps, ep{e, p})
			}
		}
	}
	// Models and resources first: agents reference them, and environments
	// agents, so a reader meets each name before its references.
	rank := map[string]int{fleet.KindModel: 0, fleet.KindResources: 1, fleet.KindAgent: 2, fleet.KindEnvironment: 3}
	sort.SliceStable(eps, func(i, j int) bool { return rank[eps[i].Kind] < rank[eps[j].Kind] })

	agentRefs := map[string][][2]*yaml.Node{}
	agentAddr := map[string]Instance{}
	var routes []envRoutes
	for _, p := range b.cfg.Processes {
		switch {
		case hasKind(p, fleet.KindAgent):
			refs, err := b.agentRefs(p)
			if err != nil {
				return err
			}
			for k, v := range refs {
				agentRefs[k] = v
			}
		case hasKind(p, fleet.KindEnvironment):
			r, err := b.envRoutes(p)
			if err != nil {
				return err
			}
			routes = append(routes, r...)
		}
	}
	for _, e := range eps {
		host, port, err := urlHostPort(e.URL)
		if err != nil {
			return fmt.Errorf("endpoint %s: %w", e.Name, err)
		}
		k := kinds[e.Kind]
		in := Instance{Name: e.Name, Kind: k[0], Impl: k[1], Host: host, Port: port, Process: e.process.Name}
		switch e.Kind {
		case fleet.KindAgent:
			agentAddr[e.Name] = in
			if err := b.add(in, agentRefs[e.Name]...); err != nil {
				return err
			}
		case fleet.KindEnvironment:
			var fields [][2]*yaml.Node
			for _, r := range routes {
				if r.env != e.Name {
					continue
				}
				for _, rt := range r.routes {
					switch rt.name {
					case "host", "port", "entrypoint":
						return fmt.Errorf("environment %s: a route named %q would shadow the instance's own field", e.Name, rt.name)
					}
					fields = append(fields, kv(rt.name, ref(KindAgent, rt.name)))
				}
			}
			if err := b.add(in, fields...); err != nil {
				return err
			}
		default:
			if err := b.add(in); err != nil {
				return err
			}
		}
	}
	// Routes named other than an agent endpoint: an instance of their own.
	for _, r := range routes {
		for _, rt := range r.routes {
			if _, ok := b.blocks[rt.name]; ok {
				continue
			}
			in := Instance{Name: rt.name, Kind: KindAgent, Impl: ImplAgent, Process: r.process, RouteOf: "-"}
			var fields [][2]*yaml.Node
			if target, ok := agentAddr[b.byURL[normURL(rt.url)]]; ok {
				in.Host, in.Port, in.Process, in.RouteOf = target.Host, target.Port, target.Process, target.Name
				fields = append(slices.Clone(agentRefs[target.Name]), kv(RouteOfKey, str(target.Name)))
			} else {
				host, port, err := urlHostPort(rt.url)
				if err != nil {
					return fmt.Errorf("environment %s route %s: %w", r.env, rt.name, err)
				}
				in.Host, in.Port = host, port
			}
			if err := b.add(in, fields...); err != nil {
				return err
			}
		}
	}
	return nil
}

func hasKind(p fleet.Process, kind string) bool {
	for _, e := range p.Endpoints {
		if e.Kind == kind {
			return true
		}
	}
	return false
}

// agentFile is what an agentserver configuration says about its agents'
// peers (pkg/servers/agent ProcessConfig).
type agentFile struct {
	Agents []struct {
		Name                string   `yaml:"name"`
		ModelServerURL      string   `yaml:"model_server_url"`
		ModelServerURLs     []string `yaml:"model_server_urls"`
		ResourcesServerURL  string   `yaml:"resources_server_url"`
		ResourcesServerURLs []string `yaml:"resources_server_urls"`
	} `yaml:"agents"`
}

func (b *builder) agentRefs(p fleet.Process) (map[string][][2]*yaml.Node, error) {
	var f agentFile
	if err := readConfig(b.cfg.Path(p.Config), &f); err != nil {
		return nil, fmt.Errorf("process %s: %w", p.Name, err)
	}
	out := map[string][][2]*yaml.Node{}
	for _, a := range f.Agents {
		var fields [][2]*yaml.Node
		if name := b.byURL[normURL(first(a.ResourcesServerURL, a.ResourcesServerURLs))]; name != "" {
			fields = append(fields, kv("resources_server", ref(KindResources, name)))
		}
		if name := b.byURL[normURL(first(a.ModelServerURL, a.ModelServerURLs))]; name != "" {
			fields = append(fields, kv("model_server", ref(KindModel, name)))
		}
		out[a.Name] = fields
	}
	return out, nil
}

// envFile is what an envserver configuration says about its routes
// (pkg/servers/environment Config).
type envFile struct {
	Name   string `yaml:"name"`
	Agents []struct {
		Name     string `yaml:"name"`
		URL      string `yaml:"url"`
		Replicas []struct {
			URL string `yaml:"url"`
		} `yaml:"replicas"`
	} `yaml:"agents"`
}

type route struct{ name, url string }

type envRoutes struct {
	env, process string
	routes       []route
}

func (b *builder) envRoutes(p fleet.Process) ([]envRoutes, error) {
	var f envFile
	if err := readConfig(b.cfg.Path(p.Config), &f); err != nil {
		return nil, fmt.Errorf("process %s: %w", p.Name, err)
	}
	var rs []route
	for _, a := range f.Agents {
		u := a.URL
		if len(a.Replicas) > 0 {
			u = a.Replicas[0].URL
		}
		rs = append(rs, route{name: a.Name, url: u})
	}
	var out []envRoutes
	for _, e := range p.Endpoints {
		if e.Kind == fleet.KindEnvironment {
			out = append(out, envRoutes{env: e.Name, process: p.Name, routes: rs})
		}
	}
	return out, nil
}

func readConfig(path string, v any) error {
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// mergeFile merges a Gym config file into root: its instance blocks
// replace ours of the same name, its other keys merge over ours.
func mergeFile(root *yaml.Node, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("gym.config_paths: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("gym.config_paths %s: %w", path, err)
	}
	if len(doc.Content) == 0 {
		return nil
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return fmt.Errorf("gym.config_paths %s: not a mapping of Gym config keys", path)
	}
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i].Value, top.Content[i+1]
		if isInstance(v) {
			put(root, k, v)
			continue
		}
		mergeInto(root, k, v)
	}
	return nil
}

func isInstance(v *yaml.Node) bool {
	if v.Kind != yaml.MappingNode {
		return false
	}
	for i := 0; i+1 < len(v.Content); i += 2 {
		switch v.Content[i].Value {
		case KindModel, KindResources, KindAgent, KindEnvironment:
			return true
		}
	}
	return false
}

// mergeInto sets key in m to v, merging mappings key by key.
func mergeInto(m *yaml.Node, key string, v *yaml.Node) {
	have := get(m, key)
	if have == nil || have.Kind != yaml.MappingNode || v.Kind != yaml.MappingNode {
		put(m, key, v)
		return
	}
	for i := 0; i+1 < len(v.Content); i += 2 {
		mergeInto(have, v.Content[i].Value, v.Content[i+1])
	}
}

// YAML node helpers.

func mapping(pairs ...[2]*yaml.Node) *yaml.Node {
	n := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	for _, p := range pairs {
		n.Content = append(n.Content, p[0], p[1])
	}
	return n
}

func kv(k string, v *yaml.Node) [2]*yaml.Node { return [2]*yaml.Node{str(k), v} }

func str(s string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
}

func integer(i int) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(i)}
}

func boolean(b bool) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(b)}
}

// ref is a Gym server reference {type, name}.
func ref(kind, name string) *yaml.Node { return mapping(kv("type", str(kind)), kv("name", str(name))) }

func get(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

func put(m *yaml.Node, key string, v *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content[i+1] = v
			return
		}
	}
	m.Content = append(m.Content, str(key), v)
}

func first(one string, many []string) string {
	if one != "" || len(many) == 0 {
		return one
	}
	return many[0]
}

// normURL is scheme://host:port of a base URL, for matching the URLs
// configurations name peers by against the fleet's endpoints.
func normURL(raw string) string {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.Host == "" {
		return ""
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = map[string]string{"https": "443"}[u.Scheme]
		if port == "" {
			port = "80"
		}
	}
	return u.Scheme + "://" + net.JoinHostPort(host, port)
}

func urlHostPort(raw string) (string, int, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "", 0, fmt.Errorf("url %q is not an absolute URL", raw)
	}
	if u.Scheme != "http" {
		// Gym's ServerClient reaches every server as http://host:port.
		return "", 0, fmt.Errorf("url %q: NeMo Gym reaches servers over http:// only", raw)
	}
	return splitHostPort(u.Host)
}

func splitHostPort(hp string) (string, int, error) {
	host, p, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port <= 0 || port > 65535 {
		return "", 0, errors.New("the port must be a number from 1 to 65535")
	}
	return host, port, nil
}
