package fleet

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"gopkg.in/yaml.v3"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

// ServedModel is the model name a generated fleet's fakeinference serves
// and its model server asks for.
const ServedModel = "fake-model"

// Topology describes a local fleet to generate: which resources servers,
// agents and environment routes it has. Generate writes one config file per
// process with free loopback ports, the way configs/ holds them for the
// fixed-port local fleet. The crash suite, the demo and the scale bench run
// fleets generated from a Topology.
type Topology struct {
	// Dir receives the config files and the run directory.
	Dir string
	// BinDir holds the server binaries.
	BinDir string
	// Token enables checkpointing on every server when set.
	Token string
	// CheckpointRoot is every server's checkpoint.root (default: Dir); an
	// s3://bucket/prefix root puts checkpoints in an object store.
	CheckpointRoot string
	// S3Endpoint and S3PathStyle are every server's checkpoint.s3_endpoint
	// and checkpoint.s3_path_style (for an s3:// root).
	S3Endpoint  string
	S3PathStyle bool
	// EpochFile is every server's checkpoint.epoch_file (default: EPOCH
	// in Dir): the fleet's own, even where fleets share a checkpoint root.
	EpochFile string
	// LeaseGraceSeconds overrides the lease grace (0: the default).
	LeaseGraceSeconds float64
	// InferenceWorkers is how many fakeinference processes the model
	// server balances over (0 means 1): the first is named fakeinference,
	// the others fakeinference-1, fakeinference-2, ...
	InferenceWorkers int
	// TokensPerSecond and MinCallSeconds pace fakeinference.
	TokensPerSecond float64
	MinCallSeconds  float64
	// GenerationCuts lets the model server cut in-flight generations.
	GenerationCuts bool
	Resources      []ResourcesSpec
	Agents         []AgentSpec
	// Routes are the environment server's agent entries; rows pick one by
	// agent_ref.name.
	Routes []RouteSpec
	// LogLevel of every server (default info).
	LogLevel string
	// Pprof serves net/http/pprof under /debug/pprof/ on every server.
	Pprof bool
	// HTTPStack is every server's http.stack (empty: the default, lean),
	// also the fleet file's http.stack.
	HTTPStack httpconf.Stack
	// TLS is every server's http.tls (absolute paths). With a certificate
	// every listener serves TLS and every URL is https://; the CA is what
	// every client, the launcher's probes included, verifies them by.
	TLS httpconf.TLS
	// RuntimeTuning is every server's runtime.tuning (empty: the servers'
	// default, runtimetune.DefaultMode), so the scale bench can compare a
	// fleet steering the Go runtime with one on Go's own behaviour.
	RuntimeTuning runtimetune.Mode
	// Ports chooses the servers' ports (nil: FreePorts, the kernel's).
	Ports PortSource
	// Hosts is the address each process (fakeinference, policy_model,
	// resources, agents, env) listens on and is reached by; a process
	// missing from it listens on 127.0.0.1. The multi-host test puts each
	// process on its own network namespace's address this way.
	Hosts map[string]string
}

// PortSource hands out n distinct loopback ports that are free now.
type PortSource interface {
	Take(n int) ([]int, error)
}

// ResourcesSpec is one resources server.
type ResourcesSpec struct {
	Name, Type, CheckpointMode, VerifyMode string
}

// AgentSpec is one agent, bound to a resources server.
type AgentSpec struct {
	Name, Resources string
	MaxSteps        int
	Stream          bool
}

// RouteSpec is one environment route: a name rows use as agent_ref.name,
// the agent behind it and the protocol.
type RouteSpec struct {
	Name, Agent, Protocol string
}

// Standard is the topology of the crash suite and the demo: weather,
// counter and slow_verify resources with an agent each, each reachable
// through single_agent_turn (route named like the agent) and legacy (route
// "<agent>_legacy").
func Standard(dir, binDir, token string) Topology {
	t := Topology{
		Dir: dir, BinDir: binDir, Token: token, GenerationCuts: true,
		TokensPerSecond: 2000, MinCallSeconds: 0.002,
		Resources: []ResourcesSpec{
			{Name: "weather", Type: "weather"},
			{Name: "counter", Type: "counter"},
			{Name: "slow", Type: "slow_verify"},
		},
	}
	for _, r := range t.Resources {
		a := r.Name + "_agent"
		t.Agents = append(t.Agents, AgentSpec{Name: a, Resources: r.Name, MaxSteps: 10})
		t.Routes = append(t.Routes, RouteSpec{Name: a, Agent: a, Protocol: "single_agent_turn"}, RouteSpec{Name: a + "_legacy", Agent: a, Protocol: "legacy"})
	}
	return t
}

// FreePorts asks the kernel for n distinct free loopback ports. Every
// listener stays open until all n are chosen, so the kernel cannot hand the
// same port out twice (closing each before asking for the next did, and two
// servers of one fleet got the same port). The ports are released before
// use, so another process could take one first; the launcher then fails
// that start loudly rather than silently.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var held []net.Listener
	defer func() {
		for _, ln := range held {
			_ = ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		held = append(held, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Generate writes the topology's config files and returns its fleet.
func Generate(t Topology) (*Config, error) {
	if t.LogLevel == "" {
		t.LogLevel = "info"
	}
	if err := os.MkdirAll(t.Dir, 0o755); err != nil {
		return nil, err
	}
	urls := map[string]string{}
	listen := map[string]string{}
	names := t.names()
	take := FreePorts
	if t.Ports != nil {
		take = t.Ports.Take
	}
	ports, err := take(len(names))
	if err != nil {
		return nil, err
	}
	for i, name := range names {
		listen[name] = net.JoinHostPort(t.hostOf(name), strconv.Itoa(ports[i]))
		urls[name] = "http://" + listen[name]
		if t.TLS.Serving() {
			urls[name] = "https://" + listen[name]
		}
	}
	if t.CheckpointRoot == "" {
		t.CheckpointRoot = t.Dir
	}
	// Absolute: the servers run in the topology's directory.
	if !ckptstore.IsS3(t.CheckpointRoot) {
		if t.CheckpointRoot, err = filepath.Abs(t.CheckpointRoot); err != nil {
			return nil, err
		}
	}
	if t.EpochFile == "" {
		t.EpochFile = filepath.Join(t.Dir, "EPOCH")
	}
	if t.EpochFile, err = filepath.Abs(t.EpochFile); err != nil {
		return nil, err
	}
	checkpoint := map[string]any{"enabled": t.Token != "", "control_auth_token": t.Token, "root": t.CheckpointRoot, "epoch_file": t.EpochFile}
	if t.S3Endpoint != "" || t.S3PathStyle {
		checkpoint["s3_endpoint"] = t.S3Endpoint
		checkpoint["s3_path_style"] = t.S3PathStyle
	}
	if t.LeaseGraceSeconds > 0 {
		checkpoint["lease_grace_seconds"] = t.LeaseGraceSeconds
	}
	upstream := map[string]any{"h2c": true}
	workers := t.workerNames()
	if len(workers) == 1 {
		upstream["base_url"] = urls[workers[0]] + "/v1"
	} else {
		var bases []string
		for _, w := range workers {
			bases = append(bases, urls[w]+"/v1")
		}
		upstream["base_urls"] = bases
	}
	files := map[string]any{
		"modelserver.yaml": map[string]any{
			"listen": listen["policy_model"], "name": "policy_model", "log_level": t.LogLevel, "pprof": t.Pprof,
			"upstream":   upstream,
			"capture":    map[string]any{"dir": filepath.Join(t.Dir, "run", "capture")},
			"checkpoint": checkpoint,
		},
	}
	for _, w := range workers {
		files[w+".yaml"] = map[string]any{
			"listen": listen[w], "log_level": t.LogLevel,
			"tokens_per_second": t.TokensPerSecond, "min_call_seconds": t.MinCallSeconds,
			"control_auth_token": t.Token, "pprof": t.Pprof,
			"model": ServedModel,
		}
	}
	// The stand-in answers 404 to a model it does not serve, as vLLM does.
	files["modelserver.yaml"].(map[string]any)["upstream"].(map[string]any)["model"] = ServedModel
	if t.GenerationCuts && t.Token != "" {
		files["modelserver.yaml"].(map[string]any)["generation_cuts"] = map[string]any{"enabled": true, "control_auth_token": t.Token}
	}
	var servers []map[string]any
	for _, r := range t.Resources {
		s := map[string]any{"name": r.Name, "type": r.Type, "listen": listen[r.Name]}
		if r.CheckpointMode != "" {
			s["checkpoint_mode"] = r.CheckpointMode
		}
		if r.VerifyMode != "" {
			s["verify_mode"] = r.VerifyMode
		}
		servers = append(servers, s)
	}
	files["resourceserver.yaml"] = map[string]any{"log_level": t.LogLevel, "pprof": t.Pprof, "checkpoint": checkpoint, "servers": servers}
	var agents []map[string]any
	resourcesOf := map[string]string{}
	for _, a := range t.Agents {
		resourcesOf[a.Name] = urls[a.Resources]
		agents = append(agents, map[string]any{
			"name": a.Name, "listen": listen[a.Name], "model_server_url": urls["policy_model"],
			"resources_server_url": urls[a.Resources], "max_steps": a.MaxSteps, "stream": a.Stream,
		})
	}
	files["agentserver.yaml"] = map[string]any{"log_level": t.LogLevel, "pprof": t.Pprof, "checkpoint": checkpoint, "agents": agents}
	var routes []map[string]any
	for _, r := range t.Routes {
		routes = append(routes, map[string]any{"name": r.Name, "url": urls[r.Agent], "resources_url": resourcesOf[r.Agent], "protocol": r.Protocol})
	}
	env := map[string]any{"listen": listen["env"], "name": "env", "log_level": t.LogLevel, "pprof": t.Pprof, "agents": routes, "checkpoint": checkpoint}
	if len(routes) > 0 {
		env["default_agent"] = t.Routes[0].Name
	}
	files["envserver.yaml"] = env
	if t.HTTPStack != "" || t.TLS != (httpconf.TLS{}) {
		for _, v := range files {
			v.(map[string]any)["http"] = map[string]any{"stack": string(t.HTTPStack), "tls": map[string]any{
				"cert_file": t.TLS.CertFile, "key_file": t.TLS.KeyFile, "ca_file": t.TLS.CAFile,
			}}
		}
	}
	if t.RuntimeTuning != "" {
		for _, v := range files {
			v.(map[string]any)["runtime"] = map[string]any{"tuning": string(t.RuntimeTuning)}
		}
	}
	for name, v := range files {
		b, err := yaml.Marshal(v)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(t.Dir, name), b, 0o644); err != nil {
			return nil, err
		}
	}

	cfg := &Config{
		RunDir: filepath.Join(t.Dir, "run"), BinDir: t.BinDir, BaseDir: t.Dir,
		Checkpoint: Checkpoint{Enabled: t.Token != "", ControlAuthToken: t.Token, Root: t.CheckpointRoot, S3Endpoint: t.S3Endpoint, S3PathStyle: t.S3PathStyle},
		HTTP:       HTTP{Stack: t.HTTPStack, TLS: TLS{CertFile: t.TLS.CertFile, KeyFile: t.TLS.KeyFile, CAFile: t.TLS.CAFile}},
	}
	proc := func(name, binary, config string, eps ...Endpoint) {
		cfg.Processes = append(cfg.Processes, Process{Name: name, Binary: binary, Config: filepath.Join(t.Dir, config), Endpoints: eps})
	}
	for _, w := range workers {
		proc(w, "fakeinference", w+".yaml", Endpoint{Name: w, Kind: KindFakeInference, URL: urls[w]})
	}
	proc("policy_model", "modelserver", "modelserver.yaml", Endpoint{Name: "policy_model", Kind: KindModel, URL: urls["policy_model"]})
	var resEps, agentEps []Endpoint
	for _, r := range t.Resources {
		resEps = append(resEps, Endpoint{Name: r.Name, Kind: KindResources, URL: urls[r.Name]})
	}
	for _, a := range t.Agents {
		agentEps = append(agentEps, Endpoint{Name: a.Name, Kind: KindAgent, URL: urls[a.Name]})
	}
	if len(resEps) > 0 {
		proc("resources", "resourceserver", "resourceserver.yaml", resEps...)
	}
	if len(agentEps) > 0 {
		proc("agents", "agentserver", "agentserver.yaml", agentEps...)
	}
	proc("env", "envserver", "envserver.yaml", Endpoint{Name: "env", Kind: KindEnvironment, URL: urls["env"]})
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// workerNames are the fakeinference processes' names.
func (t Topology) workerNames() []string {
	names := []string{"fakeinference"}
	for i := 1; i < t.InferenceWorkers; i++ {
		names = append(names, fmt.Sprintf("fakeinference-%d", i))
	}
	return names
}

func (t Topology) names() []string {
	names := append(t.workerNames(), "policy_model", "env")
	for _, r := range t.Resources {
		names = append(names, r.Name)
	}
	for _, a := range t.Agents {
		names = append(names, a.Name)
	}
	return names
}

// hostOf is the listen address of an endpoint name: its process's entry in
// Hosts, else 127.0.0.1.
func (t Topology) hostOf(endpoint string) string {
	proc := endpoint
	for _, r := range t.Resources {
		if r.Name == endpoint {
			proc = "resources"
		}
	}
	for _, a := range t.Agents {
		if a.Name == endpoint {
			proc = "agents"
		}
	}
	if h := t.Hosts[proc]; h != "" {
		return h
	}
	return "127.0.0.1"
}
