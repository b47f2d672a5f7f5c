package agent

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/wire/replica"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Config configures one named Simple Agent.
type Config struct {
	// Name is the instance name.
	Name string `mapstructure:"name"`
	// Listen is host:port; port 0 picks a free one.
	Listen string `mapstructure:"listen"`
	// ModelServerURL is the policy model server's base URL (http://host:port).
	ModelServerURL string `mapstructure:"model_server_url"`
	// ResourcesServerURL is the resources server's base URL.
	ResourcesServerURL string `mapstructure:"resources_server_url"`
	// ModelServerURLs and ResourcesServerURLs list the replicas of the
	// policy model server and of the resources server when there are
	// several (the single URL is then unused). A rollout's calls all go to
	// the replica replica.Pick names for its rollout id, as the
	// environment's do, so its capture ledger, held responses and resources
	// session stay on one replica (docs/CHECKPOINTS.md, "Replicas").
	ModelServerURLs     []string `mapstructure:"model_server_urls"`
	ResourcesServerURLs []string `mapstructure:"resources_server_urls"`
	// MaxSteps bounds model calls per activation; 0 means unlimited.
	MaxSteps int `mapstructure:"max_steps"`
	// Stream calls the model server with stream: true and reads Responses SSE.
	Stream bool `mapstructure:"stream"`
	// Checkpoint is the process's checkpoint: block, copied into each agent
	// by the command (it is not a per-agent key in the file).
	Checkpoint ctlplane.Config `mapstructure:"-"`
	// Pprof is the process's pprof key, copied into each agent like
	// Checkpoint: every listener of the process then serves /debug/pprof/
	// (the profiles are the whole process's).
	Pprof bool `mapstructure:"-"`
	// ClosedSessionTTL is the process's closed_session_ttl, copied into
	// each agent like Checkpoint: how long a closed session is remembered
	// (to answer a close sent again and refuse late activations); 0 keeps
	// every closed session for the life of the process.
	ClosedSessionTTL time.Duration `mapstructure:"-"`
	// HTTP is the process's http: section, copied into each agent like
	// Checkpoint: its listener's and its clients' stack and TLS.
	HTTP httpconf.Config `mapstructure:"-"`
}

// DefaultConfig is an agent on a free loopback port against the default
// local model and weather resources servers.
func DefaultConfig() Config {
	return Config{
		Name:               "simple_agent",
		Listen:             "127.0.0.1:0",
		ModelServerURL:     "http://127.0.0.1:18010",
		ResourcesServerURL: "http://127.0.0.1:18020",
		Checkpoint:         ctlplane.DefaultConfig(),
		ClosedSessionTTL:   DefaultClosedSessionTTL,
	}
}

// DefaultClosedSessionTTL is how long a closed session is remembered: well
// past the environment's default cleanup_retry_window (10 minutes), within
// which a close whose reply was lost is sent again.
const DefaultClosedSessionTTL = time.Hour

// Validate checks the name, address, URLs and step bound.
func (c Config) Validate() error {
	if !rollout.ValidID(c.Name) {
		return fmt.Errorf("agent name %q must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", c.Name)
	}
	if c.Listen == "" {
		return fmt.Errorf("agent %s: listen is empty", c.Name)
	}
	if len(c.ModelServerURLs) == 0 {
		if err := checkBaseURL(c.ModelServerURL); err != nil {
			return fmt.Errorf("agent %s: model_server_url: %w", c.Name, err)
		}
	}
	for i, u := range c.ModelServerURLs {
		if err := checkBaseURL(u); err != nil {
			return fmt.Errorf("agent %s: model_server_urls[%d]: %w", c.Name, i, err)
		}
	}
	if len(c.ResourcesServerURLs) == 0 {
		if err := checkBaseURL(c.ResourcesServerURL); err != nil {
			return fmt.Errorf("agent %s: resources_server_url: %w", c.Name, err)
		}
	}
	for i, u := range c.ResourcesServerURLs {
		if err := checkBaseURL(u); err != nil {
			return fmt.Errorf("agent %s: resources_server_urls[%d]: %w", c.Name, i, err)
		}
	}
	if c.MaxSteps < 0 {
		return fmt.Errorf("agent %s: max_steps %d is negative (0 means unlimited)", c.Name, c.MaxSteps)
	}
	if c.ClosedSessionTTL < 0 {
		return fmt.Errorf("agent %s: closed_session_ttl %v is negative (0 keeps closed sessions for the life of the process)", c.Name, c.ClosedSessionTTL)
	}
	if err := c.Checkpoint.Validate(); err != nil {
		return fmt.Errorf("agent %s: %w", c.Name, err)
	}
	if err := c.HTTP.Validate(); err != nil {
		return fmt.Errorf("agent %s: %w", c.Name, err)
	}
	return nil
}

func checkBaseURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http:// or https:// base URL", s)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q must not carry a query or fragment", s)
	}
	return nil
}

// baseURL is a configured URL without its trailing slash, ready for a path.
func baseURL(s string) string { return strings.TrimRight(s, "/") }

// ProcessConfig is the configuration file of cmd/agentserver: one process
// running one or more agents.
type ProcessConfig struct {
	LogLevel   string          `mapstructure:"log_level"`
	Checkpoint ctlplane.Config `mapstructure:"checkpoint"`
	// Pprof serves net/http/pprof under /debug/pprof/ on every agent of
	// the process (off by default).
	Pprof bool `mapstructure:"pprof"`
	// ClosedSessionTTL is how long every agent of the process remembers a
	// closed session (see Config.ClosedSessionTTL).
	ClosedSessionTTL time.Duration `mapstructure:"closed_session_ttl"`
	// HTTP is the http: section every agent of the process shares: the
	// HTTP stack (lean or nethttp) and TLS of its listeners and clients.
	HTTP httpconf.Config `mapstructure:"http"`
	// Runtime is the runtime: section: whether every server of the process steers the Go
	// runtime (pkg/infra/runtimetune).
	Runtime runtimetune.Config `mapstructure:"runtime"`
	// Agents is a list, not a map: viper lower-cases map keys.
	Agents []Config `mapstructure:"agents"`
}

// DefaultProcessConfig is info logging, checkpointing off and no agents.
func DefaultProcessConfig() ProcessConfig {
	return ProcessConfig{LogLevel: "info", Checkpoint: ctlplane.DefaultConfig(), ClosedSessionTTL: DefaultClosedSessionTTL}
}

// AgentConfigs returns the agents with the process's checkpoint block,
// pprof, closed_session_ttl and http keys copied into each.
func (p ProcessConfig) AgentConfigs() []Config {
	out := slices.Clone(p.Agents)
	for i := range out {
		out[i].Checkpoint = p.Checkpoint
		out[i].Pprof = p.Pprof
		out[i].ClosedSessionTTL = p.ClosedSessionTTL
		out[i].HTTP = p.HTTP
	}
	return out
}

// Validate checks every agent, and that names and listen addresses are unique.
func (p ProcessConfig) Validate() error {
	if err := p.Checkpoint.Validate(); err != nil {
		return err
	}
	if err := p.Runtime.Validate(); err != nil {
		return err
	}
	if err := p.HTTP.Validate(); err != nil {
		return err
	}
	if len(p.Agents) == 0 {
		return errors.New("agents is empty: configure at least one agent")
	}
	names := map[string]bool{}
	addrs := map[string]string{}
	for _, c := range p.AgentConfigs() {
		if err := c.Validate(); err != nil {
			return err
		}
		if names[c.Name] {
			return fmt.Errorf("agent name %q appears twice", c.Name)
		}
		names[c.Name] = true
		if !strings.HasSuffix(c.Listen, ":0") {
			if other, dup := addrs[c.Listen]; dup {
				return fmt.Errorf("agents %s and %s both listen on %s", other, c.Name, c.Listen)
			}
			addrs[c.Listen] = c.Name
		}
	}
	return nil
}

// modelURL is the base URL of the model server replica a rollout's model
// calls go to.
func (c Config) modelURL(rolloutID string) string {
	if len(c.ModelServerURLs) == 0 {
		return c.ModelServerURL
	}
	return c.ModelServerURLs[replica.Pick(rolloutID, len(c.ModelServerURLs))]
}

// resourcesURL is the base URL of the resources server replica holding a
// rollout's resources session.
func (c Config) resourcesURL(rolloutID string) string {
	if len(c.ResourcesServerURLs) == 0 {
		return c.ResourcesServerURL
	}
	return c.ResourcesServerURLs[replica.Pick(rolloutID, len(c.ResourcesServerURLs))]
}
