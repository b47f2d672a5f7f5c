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
	"github.com/gymfleet/gymfleet/pkg/wire/replica"
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
	// Replicas is how many processes of each participant kind the fleet
	// runs (0 means 1). With several, replica i of a server named x is
	// instance x-i (replica.Name), in process <process>-i with config
	// <binary>-i.yaml; with one, names are unchanged.
	Replicas Replicas
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

// Replicas counts the replicas of each participant kind (0 means 1).
type Replicas struct {
	Environment, Agent, Resources, Model int
}

// Each returns n replicas of every kind.
func Each(n int) Replicas { return Replicas{Environment: n, Agent: n, Resources: n, Model: n} }

func count(n int) int { return max(n, 1) }

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
	// The stand-in answers 404 to a model it does not serve, as vLLM does.
	upstream["model"] = ServedModel
	files := map[string]any{}
	nModel := count(t.Replicas.Model)
	models := replica.Names("policy_model", nModel)
	var modelURLs []string
	for i, m := range models {
		modelURLs = append(modelURLs, urls[m])
		capture := filepath.Join(t.Dir, "run", "capture")
		if nModel > 1 {
			capture = filepath.Join(capture, m)
		}
		ms := map[string]any{
			"listen": listen[m], "name": m, "log_level": t.LogLevel, "pprof": t.Pprof,
			"upstream":   upstream,
			"capture":    map[string]any{"dir": capture},
			"checkpoint": checkpoint,
		}
		if t.GenerationCuts && t.Token != "" {
			ms["generation_cuts"] = map[string]any{"enabled": true, "control_auth_token": t.Token}
		}
		files[replicaFile("modelserver", i, nModel)] = ms
	}
	for _, w := range workers {
		files[w+".yaml"] = map[string]any{
			"listen": listen[w], "log_level": t.LogLevel,
			"tokens_per_second": t.TokensPerSecond, "min_call_seconds": t.MinCallSeconds,
			"control_auth_token": t.Token, "pprof": t.Pprof,
			"model": ServedModel,
		}
	}
	nRes := count(t.Replicas.Resources)
	for i := range nRes {
		var servers []map[string]any
		for _, r := range t.Resources {
			name := replica.Name(r.Name, i, nRes)
			s := map[string]any{"name": name, "type": r.Type, "listen": listen[name]}
			if r.CheckpointMode != "" {
				s["checkpoint_mode"] = r.CheckpointMode
			}
			if r.VerifyMode != "" {
				s["verify_mode"] = r.VerifyMode
			}
			servers = append(servers, s)
		}
		files[replicaFile("resourceserver", i, nRes)] = map[string]any{"log_level": t.LogLevel, "pprof": t.Pprof, "checkpoint": checkpoint, "servers": servers}
	}
	resourcesURLs := map[string][]string{} // by resources server name
	for _, r := range t.Resources {
		for _, n := range replica.Names(r.Name, nRes) {
			resourcesURLs[r.Name] = append(resourcesURLs[r.Name], urls[n])
		}
	}
	nAgent := count(t.Replicas.Agent)
	for i := range nAgent {
		var agents []map[string]any
		for _, a := range t.Agents {
			name := replica.Name(a.Name, i, nAgent)
			ac := map[string]any{
				"name": name, "listen": listen[name], "max_steps": a.MaxSteps, "stream": a.Stream,
			}
			if nModel == 1 {
				ac["model_server_url"] = modelURLs[0]
			} else {
				ac["model_server_urls"] = modelURLs
			}
			if nRes == 1 {
				ac["resources_server_url"] = resourcesURLs[a.Resources][0]
			} else {
				ac["resources_server_urls"] = resourcesURLs[a.Resources]
			}
			agents = append(agents, ac)
		}
		files[replicaFile("agentserver", i, nAgent)] = map[string]any{"log_level": t.LogLevel, "pprof": t.Pprof, "checkpoint": checkpoint, "agents": agents}
	}
	agentOf := map[string]AgentSpec{}
	for _, a := range t.Agents {
		agentOf[a.Name] = a
	}
	var routes []map[string]any
	for _, r := range t.Routes {
		route := map[string]any{"name": r.Name, "protocol": r.Protocol}
		if nAgent == 1 {
			route["url"] = urls[r.Agent]
		} else {
			var reps []map[string]any
			for _, n := range replica.Names(r.Agent, nAgent) {
				reps = append(reps, map[string]any{"name": n, "url": urls[n]})
			}
			route["replicas"] = reps
		}
		if res := resourcesURLs[agentOf[r.Agent].Resources]; len(res) == 1 {
			route["resources_url"] = res[0]
		} else if len(res) > 1 {
			route["resources_urls"] = res
		}
		routes = append(routes, route)
	}
	nEnv := count(t.Replicas.Environment)
	envs := replica.Names("env", nEnv)
	for i, e := range envs {
		env := map[string]any{"listen": listen[e], "name": e, "log_level": t.LogLevel, "pprof": t.Pprof, "agents": routes, "checkpoint": checkpoint}
		if len(routes) > 0 {
			env["default_agent"] = t.Routes[0].Name
		}
		files[replicaFile("envserver", i, nEnv)] = env
	}
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
	for i, m := range models {
		proc(m, "modelserver", replicaFile("modelserver", i, nModel), Endpoint{Name: m, Kind: KindModel, URL: urls[m]})
	}
	for i := range nRes {
		var eps []Endpoint
		for _, r := range t.Resources {
			n := replica.Name(r.Name, i, nRes)
			eps = append(eps, Endpoint{Name: n, Kind: KindResources, URL: urls[n]})
		}
		if len(eps) > 0 {
			proc(replica.Name("resources", i, nRes), "resourceserver", replicaFile("resourceserver", i, nRes), eps...)
		}
	}
	for i := range nAgent {
		var eps []Endpoint
		for _, a := range t.Agents {
			n := replica.Name(a.Name, i, nAgent)
			eps = append(eps, Endpoint{Name: n, Kind: KindAgent, URL: urls[n]})
		}
		if len(eps) > 0 {
			proc(replica.Name("agents", i, nAgent), "agentserver", replicaFile("agentserver", i, nAgent), eps...)
		}
	}
	for i, e := range envs {
		proc(e, "envserver", replicaFile("envserver", i, nEnv), Endpoint{Name: e, Kind: KindEnvironment, URL: urls[e]})
	}
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
	names := append(t.workerNames(), replica.Names("policy_model", count(t.Replicas.Model))...)
	names = append(names, replica.Names("env", count(t.Replicas.Environment))...)
	for _, r := range t.Resources {
		names = append(names, replica.Names(r.Name, count(t.Replicas.Resources))...)
	}
	for _, a := range t.Agents {
		names = append(names, replica.Names(a.Name, count(t.Replicas.Agent))...)
	}
	return names
}

// replicaFile is the config file of replica i of n of a binary.
func replicaFile(binary string, i, n int) string {
	return replica.Name(binary, i, n) + ".yaml"
}

// hostOf is the listen address of an endpoint (instance) name: its
// process's entry in Hosts (the replica's process, else the kind's
// process name), else 127.0.0.1.
func (t Topology) hostOf(endpoint string) string {
	base := replica.Family(endpoint)
	proc, n := endpoint, 0
	switch {
	case base == "policy_model":
		proc, n = "policy_model", count(t.Replicas.Model)
	case base == "env":
		proc, n = "env", count(t.Replicas.Environment)
	}
	for _, r := range t.Resources {
		if r.Name == endpoint || r.Name == base {
			proc, n = "resources", count(t.Replicas.Resources)
		}
	}
	for _, a := range t.Agents {
		if a.Name == endpoint || a.Name == base {
			proc, n = "agents", count(t.Replicas.Agent)
		}
	}
	if n > 1 && base != endpoint {
		if h := t.Hosts[proc+endpoint[len(base):]]; h != "" {
			return h
		}
	}
	if h := t.Hosts[proc]; h != "" {
		return h
	}
	return "127.0.0.1"
}
