package environment

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/infra/logging"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Protocols an environment server runs.
const (
	// ProtocolSingleAgentTurn runs the episode as explicit stages: seed the
	// resources session, invoke the agent once, close the agent, verify.
	ProtocolSingleAgentTurn = "single_agent_turn"
	// ProtocolLegacy relays the row to the agent's /run, which owns the
	// whole episode.
	ProtocolLegacy = "legacy"
)

// Defaults for Config.
const (
	DefaultListen         = "127.0.0.1:18040"
	DefaultName           = "env"
	DefaultEpisodeTimeout = 30 * time.Minute
	DefaultCleanupTimeout = 30 * time.Second
	// DefaultCleanupRetryWindow is how long a cleanup step that got no
	// answer is sent again in the background.
	DefaultCleanupRetryWindow = 10 * time.Minute
)

// Config configures an environment server.
type Config struct {
	// Listen is the host:port to serve on.
	Listen string `mapstructure:"listen"`
	// Name is the server's instance name (logs, metrics, checkpoint records).
	Name string `mapstructure:"name"`
	// Protocol is single_agent_turn or legacy; an agent may override it.
	Protocol string `mapstructure:"protocol"`
	// Agents are the agents a row can name in agent_ref.name.
	Agents []AgentConfig `mapstructure:"agents"`
	// DefaultAgent runs rows without agent_ref; empty means the first agent.
	DefaultAgent string `mapstructure:"default_agent"`
	// EpisodeTimeout bounds one episode's protocol, cleanup excluded.
	EpisodeTimeout time.Duration `mapstructure:"episode_timeout"`
	// CleanupTimeout bounds the final cleanup of one episode, in total.
	CleanupTimeout time.Duration `mapstructure:"cleanup_timeout"`
	// CleanupRetryWindow is how long, from its first failure, a final-cleanup
	// step that got no answer (a close that timed out, a refused connection,
	// a 5xx) is sent again in the background, each time under
	// cleanup_timeout; 0 turns the retries off.
	CleanupRetryWindow time.Duration `mapstructure:"cleanup_retry_window"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `mapstructure:"log_level"`
	// Checkpoint is the shared checkpoint block. Carried and validated; the
	// environment participant that acts on it is later work.
	Checkpoint ctlplane.Config `mapstructure:"checkpoint"`
	// Pprof serves net/http/pprof under /debug/pprof/ (off by default).
	Pprof bool `mapstructure:"pprof"`
	// HTTP is the http: section: the HTTP stack (lean or nethttp) and TLS
	// of the server's listener and of its clients to fleet peers.
	HTTP httpconf.Config `mapstructure:"http"`
	// Runtime is the runtime: section: whether the process steers the Go
	// runtime (pkg/infra/runtimetune).
	Runtime runtimetune.Config `mapstructure:"runtime"`
}

// AgentConfig names one agent server and the resources server its episodes use.
type AgentConfig struct {
	// Name is what agent_ref.name selects.
	Name string `mapstructure:"name"`
	// URL is the agent server's base URL.
	URL string `mapstructure:"url"`
	// ResourcesURL is the resources server's base URL; single_agent_turn
	// seeds, verifies and closes the session there.
	ResourcesURL string `mapstructure:"resources_url"`
	// Replicas are the agent's replicas, each by its instance name, when
	// there are several (url is then unused): a new episode goes to the
	// replica replica.Pick names for its rollout, and its boundaries record
	// that replica, so a replacement attempt after a restore goes where its
	// agent session was installed (docs/CHECKPOINTS.md, "Replicas").
	Replicas []Replica `mapstructure:"replicas"`
	// ResourcesURLs are the resources server's replicas, when there are
	// several (resources_url is then unused); an episode's resources
	// session lives on the one replica.Pick names for its rollout, as the
	// agent's tool calls do.
	ResourcesURLs []string `mapstructure:"resources_urls"`
	// Protocol overrides the server's protocol for this agent's rows.
	Protocol string `mapstructure:"protocol"`
	// Gym marks a NeMo Gym agent: its legacy /run goes without the
	// /ng-rollout prefix, which Gym's agents do not route (the row names
	// its rollout to them). Whether a peer speaks h2c or only HTTP/1.1,
	// as Gym's uvicorn servers do, is found out per host by the client.
	Gym bool `mapstructure:"gym"`
}

// Replica is one replica of an agent: its instance name and base URL.
type Replica struct {
	Name string `mapstructure:"name"`
	URL  string `mapstructure:"url"`
}

// agentURLs lists the agent's replicas: its replicas, or url alone.
func (a AgentConfig) agentReplicas() []Replica {
	if len(a.Replicas) > 0 {
		return a.Replicas
	}
	return []Replica{{URL: a.URL}}
}

// resourcesURLs lists the resources server's replicas: resources_urls, or
// resources_url alone.
func (a AgentConfig) resourcesURLs() []string {
	if len(a.ResourcesURLs) > 0 {
		return a.ResourcesURLs
	}
	return []string{a.ResourcesURL}
}

// DefaultConfig returns the defaults: single_agent_turn on 127.0.0.1:18040
// with no agents (a configuration must name at least one).
func DefaultConfig() Config {
	return Config{
		Listen:             DefaultListen,
		Name:               DefaultName,
		Protocol:           ProtocolSingleAgentTurn,
		EpisodeTimeout:     DefaultEpisodeTimeout,
		CleanupTimeout:     DefaultCleanupTimeout,
		CleanupRetryWindow: DefaultCleanupRetryWindow,
		LogLevel:           "info",
		Checkpoint:         ctlplane.DefaultConfig(),
	}
}

// Validate checks the configuration and names the first offending key.
func (c Config) Validate() error {
	var errs []error
	if strings.TrimSpace(c.Listen) == "" {
		errs = append(errs, errors.New("listen is empty"))
	}
	if !rollout.ValidID(c.Name) {
		errs = append(errs, fmt.Errorf("name %q must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", c.Name))
	}
	if err := c.Runtime.Validate(); err != nil {
		return err
	}
	if err := c.HTTP.Validate(); err != nil {
		errs = append(errs, err)
	}
	if !validProtocol(c.Protocol) {
		errs = append(errs, fmt.Errorf("protocol %q: want %s or %s", c.Protocol, ProtocolSingleAgentTurn, ProtocolLegacy))
	}
	if len(c.Agents) == 0 {
		errs = append(errs, errors.New("agents is empty: name at least one agent"))
	}
	seen := map[string]bool{}
	for i, a := range c.Agents {
		where := fmt.Sprintf("agents[%d]", i)
		if !rollout.ValidID(a.Name) {
			errs = append(errs, fmt.Errorf("%s.name %q must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", where, a.Name))
		}
		if seen[a.Name] {
			errs = append(errs, fmt.Errorf("%s.name %q is used twice", where, a.Name))
		}
		seen[a.Name] = true
		if len(a.Replicas) == 0 {
			if err := validURL(a.URL); err != nil {
				errs = append(errs, fmt.Errorf("%s.url: %w", where, err))
			}
		}
		replicaNames := map[string]bool{}
		for j, r := range a.Replicas {
			if !rollout.ValidID(r.Name) || replicaNames[r.Name] {
				errs = append(errs, fmt.Errorf("%s.replicas[%d].name %q must be a distinct instance name", where, j, r.Name))
			}
			replicaNames[r.Name] = true
			if err := validURL(r.URL); err != nil {
				errs = append(errs, fmt.Errorf("%s.replicas[%d].url: %w", where, j, err))
			}
		}
		for j, u := range a.ResourcesURLs {
			if err := validURL(u); err != nil {
				errs = append(errs, fmt.Errorf("%s.resources_urls[%d]: %w", where, j, err))
			}
		}
		if a.Protocol != "" && !validProtocol(a.Protocol) {
			errs = append(errs, fmt.Errorf("%s.protocol %q: want %s, %s or empty", where, a.Protocol, ProtocolSingleAgentTurn, ProtocolLegacy))
		}
		if c.protocolOf(a) == ProtocolSingleAgentTurn && len(a.ResourcesURLs) == 0 {
			if err := validURL(a.ResourcesURL); err != nil {
				errs = append(errs, fmt.Errorf("%s.resources_url (required by %s): %w", where, ProtocolSingleAgentTurn, err))
			}
		} else if a.ResourcesURL != "" {
			if err := validURL(a.ResourcesURL); err != nil {
				errs = append(errs, fmt.Errorf("%s.resources_url: %w", where, err))
			}
		}
	}
	if c.DefaultAgent != "" && !seen[c.DefaultAgent] {
		errs = append(errs, fmt.Errorf("default_agent %q is not one of agents", c.DefaultAgent))
	}
	if c.EpisodeTimeout <= 0 {
		errs = append(errs, fmt.Errorf("episode_timeout %v must be > 0", c.EpisodeTimeout))
	}
	if c.CleanupTimeout <= 0 {
		errs = append(errs, fmt.Errorf("cleanup_timeout %v must be > 0", c.CleanupTimeout))
	}
	if c.CleanupRetryWindow < 0 {
		errs = append(errs, fmt.Errorf("cleanup_retry_window %v must be >= 0 (0 turns the retries off)", c.CleanupRetryWindow))
	}
	if _, err := logging.ParseLevel(c.LogLevel); err != nil {
		errs = append(errs, fmt.Errorf("log_level: %w", err))
	}
	if err := c.Checkpoint.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// defaultAgent is the agent rows without agent_ref run on.
func (c Config) defaultAgent() string {
	if c.DefaultAgent != "" {
		return c.DefaultAgent
	}
	if len(c.Agents) > 0 {
		return c.Agents[0].Name
	}
	return ""
}

// protocolOf is the protocol an agent's rows run.
func (c Config) protocolOf(a AgentConfig) string {
	if a.Protocol != "" {
		return a.Protocol
	}
	return c.Protocol
}

func validProtocol(p string) bool {
	return p == ProtocolSingleAgentTurn || p == ProtocolLegacy
}

func validURL(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an absolute http(s) URL", s)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q must be a base URL without query or fragment", s)
	}
	return nil
}
