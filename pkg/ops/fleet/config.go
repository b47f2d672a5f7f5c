// Package fleet reads the fleet file (which processes make up a gymfleet
// deployment, the binaries and configurations they run, and the endpoints
// they serve) and launches a fleet's processes on this host.
package fleet

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Endpoint kinds.
const (
	KindFakeInference = "fakeinference"
	KindModel         = "model"
	KindAgent         = "agent"
	KindResources     = "resources"
	KindEnvironment   = "environment"
)

// Kinds lists the endpoint kinds a fleet file may use.
func Kinds() []string {
	return []string{KindFakeInference, KindModel, KindAgent, KindResources, KindEnvironment}
}

// Defaults for Config.
const (
	DefaultRunDir = ".gymfleet"
	DefaultBinDir = "bin"
)

// Config is a fleet file.
type Config struct {
	// RunDir holds logs/<process>.log, addr/<process>.addr and capture and
	// checkpoint directories.
	RunDir string `yaml:"run_dir"`
	// BinDir is where the server binaries are.
	BinDir string `yaml:"bin_dir"`
	// Checkpoint is the checkpoint settings every server shares.
	Checkpoint Checkpoint `yaml:"checkpoint"`
	// HTTP is the fleet-wide http: section.
	HTTP HTTP `yaml:"http"`
	// Processes start in file order and stop in reverse.
	Processes []Process `yaml:"processes"`
	// Gym is what NeMo Gym's tools are told about the fleet.
	Gym Gym `yaml:"gym"`

	// BaseDir resolves the file's relative paths (run_dir, bin_dir, each
	// process's config). Load sets it to the working directory.
	BaseDir string `yaml:"-"`
}

// Checkpoint is the fleet-wide checkpoint block. When Enabled, the launcher
// hands it to every process as GYMFLEET_CHECKPOINT_* environment variables.
type Checkpoint struct {
	Enabled          bool   `yaml:"enabled"`
	ControlAuthToken string `yaml:"control_auth_token"`
	// Root is the directory every checkpoint directory lies beneath (each
	// server's checkpoint.root; relative to the file's base directory).
	// gymctl refuses a --dir or --checkpoint-dir outside it before any
	// server is called. It may instead be s3://bucket/prefix: checkpoints
	// then go to an object store (see S3Endpoint).
	Root string `yaml:"root"`
	// S3Endpoint and S3PathStyle say how every server (and gymctl ckpt
	// verify) reaches the object store of an s3:// root: the base URL of a
	// server other than AWS, and path-style bucket addressing. Credentials
	// come from the standard AWS environment and files.
	S3Endpoint  string `yaml:"s3_endpoint"`
	S3PathStyle bool   `yaml:"s3_path_style"`
	// SigningKeyFile names the file holding the key every server signs
	// its manifests with and verifies them by (each server's
	// checkpoint.signing_key_file; relative to the file's base directory).
	// Empty: manifests are not signed. gymctl ckpt verify checks
	// signatures with it.
	SigningKeyFile string `yaml:"signing_key_file"`
}

// HTTP is the fleet-wide http: section. The launcher hands its stack to
// every process as GYMFLEET_HTTP_STACK (a process's own env entries still
// win), and gymctl's clients to the fleet speak the same stack.
type HTTP struct {
	// Stack is lean (the default) or nethttp (see pkg/transport/httpconf); empty
	// leaves each process to its own configuration.
	Stack httpconf.Stack `yaml:"stack"`
	// TLS is every process's http.tls, handed to it as
	// GYMFLEET_HTTP_TLS_CERT_FILE, _KEY_FILE and _CA_FILE (paths relative
	// to the file's base directory); the launcher's probes and gymctl's
	// clients verify the fleet's https:// endpoints against its ca_file.
	TLS TLS `yaml:"tls"`
}

// TLS is the fleet-wide http.tls section (see pkg/transport/httpconf.TLS).
type TLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	CAFile   string `yaml:"ca_file"`
}

// Conf is the section as a process's httpconf.Config, its paths resolved
// against base.
func (h HTTP) Conf(base string) httpconf.Config {
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(base, p)
	}
	return httpconf.Config{Stack: h.Stack, TLS: httpconf.TLS{CertFile: abs(h.TLS.CertFile), KeyFile: abs(h.TLS.KeyFile), CAFile: abs(h.TLS.CAFile)}}
}

// Gym is the fleet file's gym: section (pkg/ops/gymhead): NeMo Gym's tools
// find the fleet's servers by name through a head server, as they find
// Gym's own.
type Gym struct {
	// HeadServer is the host:port where `gymctl up` serves NeMo Gym's
	// head-server routes (/global_config_dict_yaml, /server_instances) for
	// the fleet's servers; empty serves none. Gym's tools ask
	// 127.0.0.1:11000 unless told otherwise (+head_server.port=...).
	HeadServer string `yaml:"head_server"`
	// ConfigPaths are NeMo Gym config files merged into the served config
	// in order (relative to the file's base directory): Gym servers running
	// beside the fleet, and run-level keys such as ray_head_node_address.
	// An instance a file defines replaces the fleet's of that name.
	ConfigPaths []string `yaml:"config_paths"`
}

// Process is one server process of the fleet.
type Process struct {
	// Name names the process (its log file, Launcher calls).
	Name string `yaml:"name"`
	// Binary is the executable's name in bin_dir, or an absolute path.
	Binary string `yaml:"binary"`
	// Config is the server's YAML configuration, passed as --config.
	Config string `yaml:"config"`
	// Args are extra command-line arguments after --config and --addr-file.
	Args []string `yaml:"args"`
	// Env are extra environment variables, e.g. GYMFLEET_* overrides.
	Env []EnvVar `yaml:"env"`
	// Host is where the process runs in a multi-host fleet; empty or
	// "localhost" means this host. The local launcher starts only local
	// processes.
	Host string `yaml:"host"`
	// Endpoints are the servers the process serves.
	Endpoints []Endpoint `yaml:"endpoints"`
}

// EnvVar is one environment variable of a process.
type EnvVar struct {
	Name  string `yaml:"name"`
	Value string `yaml:"value"`
}

// Endpoint is one server a process serves.
type Endpoint struct {
	Name string `yaml:"name"`
	Kind string `yaml:"kind"`
	URL  string `yaml:"url"`
}

// Load reads and validates a fleet file. Relative paths in it resolve
// against the working directory.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("fleet file: %w", err)
	}
	cfg, err := Decode(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("fleet file %s: %w", path, err)
	}
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	cfg.BaseDir = wd
	return cfg, nil
}

// Decode reads a fleet file from r, refusing unknown keys (named with their
// line), applies the defaults and validates it. BaseDir is left empty.
func Decode(r io.Reader) (*Config, error) {
	dec := yaml.NewDecoder(r)
	dec.KnownFields(true)
	var cfg Config
	if err := dec.Decode(&cfg); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the file is empty")
		}
		return nil, err
	}
	if cfg.RunDir == "" {
		cfg.RunDir = DefaultRunDir
	}
	if cfg.BinDir == "" {
		cfg.BinDir = DefaultBinDir
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Validate checks names, kinds and URLs, and that names are unique.
func (c *Config) Validate() error {
	var errs []error
	if len(c.Processes) == 0 {
		errs = append(errs, errors.New("processes is empty"))
	}
	if c.Checkpoint.Enabled && c.Checkpoint.ControlAuthToken == "" {
		errs = append(errs, errors.New("checkpoint.enabled is true but checkpoint.control_auth_token is empty"))
	}
	if c.Checkpoint.Enabled && c.Checkpoint.Root == "" {
		errs = append(errs, errors.New("checkpoint.enabled is true but checkpoint.root is empty: name the directory every checkpoint directory lies beneath"))
	}
	if c.HTTP.Stack != "" {
		if err := (httpconf.Config{Stack: c.HTTP.Stack}).Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if (c.HTTP.TLS.CertFile == "") != (c.HTTP.TLS.KeyFile == "") {
		errs = append(errs, errors.New("http.tls: cert_file and key_file are set together or not at all"))
	}
	if h := c.Gym.HeadServer; h != "" {
		if _, port, err := net.SplitHostPort(h); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("gym.head_server %q: want host:port", h))
		}
	}
	procs := map[string]bool{}
	endpoints := map[string]bool{}
	for i, p := range c.Processes {
		where := fmt.Sprintf("processes[%d]", i)
		if p.Name != "" {
			where = fmt.Sprintf("process %q", p.Name)
		}
		if !rollout.ValidID(p.Name) {
			errs = append(errs, fmt.Errorf("%s: name %q must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", where, p.Name))
		}
		if procs[p.Name] {
			errs = append(errs, fmt.Errorf("%s: name is used twice", where))
		}
		procs[p.Name] = true
		if p.Binary == "" {
			errs = append(errs, fmt.Errorf("%s: binary is empty", where))
		} else if !filepath.IsAbs(p.Binary) && strings.ContainsRune(p.Binary, filepath.Separator) {
			errs = append(errs, fmt.Errorf("%s: binary %q must be a name in bin_dir or an absolute path", where, p.Binary))
		}
		for _, e := range p.Env {
			if !envName.MatchString(e.Name) {
				errs = append(errs, fmt.Errorf("%s: env name %q is not a valid variable name", where, e.Name))
			}
		}
		if len(p.Endpoints) == 0 {
			errs = append(errs, fmt.Errorf("%s: endpoints is empty", where))
		}
		for j, e := range p.Endpoints {
			ew := fmt.Sprintf("%s endpoints[%d]", where, j)
			if !rollout.ValidID(e.Name) {
				errs = append(errs, fmt.Errorf("%s: name %q must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", ew, e.Name))
			}
			if endpoints[e.Name] {
				errs = append(errs, fmt.Errorf("%s: endpoint name %q is used twice in the fleet", ew, e.Name))
			}
			endpoints[e.Name] = true
			if !validKind(e.Kind) {
				errs = append(errs, fmt.Errorf("%s: kind %q: want one of %s", ew, e.Kind, strings.Join(Kinds(), ", ")))
			}
			if u, err := url.Parse(e.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				errs = append(errs, fmt.Errorf("%s: url %q is not an absolute http(s) URL", ew, e.URL))
			}
		}
	}
	return errors.Join(errs...)
}

func validKind(k string) bool {
	for _, v := range Kinds() {
		if k == v {
			return true
		}
	}
	return false
}

// Process returns the process named name.
func (c *Config) Process(name string) (Process, bool) {
	for _, p := range c.Processes {
		if p.Name == name {
			return p, true
		}
	}
	return Process{}, false
}

// Endpoints lists the fleet's endpoints of one kind (all kinds when kind is
// empty), in file order.
func (c *Config) Endpoints(kind string) []Endpoint {
	var out []Endpoint
	for _, p := range c.Processes {
		for _, e := range p.Endpoints {
			if kind == "" || e.Kind == kind {
				out = append(out, e)
			}
		}
	}
	return out
}

// Endpoint returns the endpoint named name.
func (c *Config) Endpoint(name string) (Endpoint, bool) {
	for _, e := range c.Endpoints("") {
		if e.Name == name {
			return e, true
		}
	}
	return Endpoint{}, false
}

// Names lists the process names in start order.
func (c *Config) Names() []string {
	out := make([]string, len(c.Processes))
	for i, p := range c.Processes {
		out[i] = p.Name
	}
	return out
}

// Local reports whether the process runs on this host.
func (p Process) Local() bool {
	return p.Host == "" || p.Host == "localhost" || p.Host == "127.0.0.1"
}

// Path resolves a path of the file against BaseDir.
func (c *Config) Path(p string) string {
	if p == "" || filepath.IsAbs(p) || c.BaseDir == "" || ckptstore.IsS3(p) {
		return p
	}
	return filepath.Join(c.BaseDir, p)
}

// LogPath is where a process's output goes.
func (c *Config) LogPath(process string) string {
	return filepath.Join(c.Path(c.RunDir), "logs", process+".log")
}

// AddrPath is the --addr-file of a process.
func (c *Config) AddrPath(process string) string {
	return filepath.Join(c.Path(c.RunDir), "addr", process+".addr")
}

// BinaryPath is the executable a process runs.
func (c *Config) BinaryPath(p Process) string {
	if filepath.IsAbs(p.Binary) {
		return p.Binary
	}
	return filepath.Join(c.Path(c.BinDir), p.Binary)
}
