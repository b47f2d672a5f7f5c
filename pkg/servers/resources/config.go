package resources

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Types of resources server.
const (
	TypeWeather    = "weather"
	TypeCounter    = "counter"
	TypeSlowVerify = "slow_verify"
)

// Checkpoint modes (SPEC §6): how a server's sessions take part in a checkpoint.
const (
	// ModeSaved exports and restores session state.
	ModeSaved = "saved"
	// ModeStateless records sessions with null state, so routing survives.
	ModeStateless = "stateless"
	// ModeRestartOnly never blocks a checkpoint; its sessions start over.
	ModeRestartOnly = "restart_only"
)

// Verify modes, announced on seed replies when checkpointing is on.
const (
	// VerifyWait means a checkpoint waits for a /verify in flight.
	VerifyWait = "wait"
	// VerifyReplay means /verify may run again after a crash.
	VerifyReplay = "replay"
)

// Config configures one named resources server.
type Config struct {
	// Name is the instance name (the participant instance once checkpoints exist).
	Name string `mapstructure:"name"`
	// Type is weather, counter or slow_verify.
	Type string `mapstructure:"type"`
	// Listen is host:port; port 0 picks a free one.
	Listen string `mapstructure:"listen"`
	// CheckpointMode is saved, stateless or restart_only; "" is the type's default.
	CheckpointMode string `mapstructure:"checkpoint_mode"`
	// VerifyMode is wait or replay; "" is the type's default.
	VerifyMode string `mapstructure:"verify_mode"`
	// Checkpoint is the process's checkpoint: block, copied into each server
	// by the command (it is not a per-server key in the file).
	Checkpoint ctlplane.Config `mapstructure:"-"`
	// Pprof is the process's pprof key, copied into each server like
	// Checkpoint: every listener of the process then serves /debug/pprof/
	// (the profiles are the whole process's).
	Pprof bool `mapstructure:"-"`
	// HTTP is the process's http: section, copied into each server like
	// Checkpoint: its listener's stack and TLS.
	HTTP httpconf.Config `mapstructure:"-"`
}

// DefaultConfig is a weather server on a free loopback port.
func DefaultConfig() Config {
	return Config{Name: TypeWeather, Type: TypeWeather, Listen: "127.0.0.1:0", Checkpoint: ctlplane.DefaultConfig()}
}

// typeModes returns a type's default checkpoint and verify modes.
func typeModes(typ string) (checkpoint, verify string, ok bool) {
	switch typ {
	case TypeWeather:
		return ModeStateless, VerifyReplay, true
	case TypeCounter:
		return ModeSaved, VerifyReplay, true
	case TypeSlowVerify:
		return ModeStateless, VerifyWait, true
	}
	return "", "", false
}

// Types lists the known server types.
func Types() []string { return []string{TypeWeather, TypeCounter, TypeSlowVerify} }

// EffectiveCheckpointMode is CheckpointMode, or the type's default when empty.
func (c Config) EffectiveCheckpointMode() string {
	if c.CheckpointMode != "" {
		return c.CheckpointMode
	}
	m, _, _ := typeModes(c.Type)
	return m
}

// EffectiveVerifyMode is VerifyMode, or the type's default when empty.
func (c Config) EffectiveVerifyMode() string {
	if c.VerifyMode != "" {
		return c.VerifyMode
	}
	_, m, _ := typeModes(c.Type)
	return m
}

// Validate checks the name, type, listen address and modes.
func (c Config) Validate() error {
	if !rollout.ValidID(c.Name) {
		return fmt.Errorf("resources server name %q must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", c.Name)
	}
	if _, _, ok := typeModes(c.Type); !ok {
		return fmt.Errorf("resources server %s: type %q is not one of %s", c.Name, c.Type, strings.Join(Types(), ", "))
	}
	if c.Listen == "" {
		return fmt.Errorf("resources server %s: listen is empty", c.Name)
	}
	switch c.CheckpointMode {
	case "", ModeSaved, ModeStateless, ModeRestartOnly:
	default:
		return fmt.Errorf("resources server %s: checkpoint_mode %q is not saved, stateless or restart_only", c.Name, c.CheckpointMode)
	}
	if c.CheckpointMode == ModeSaved && c.Type != TypeCounter {
		// Only the counter has state to export; saving a type with no
		// export hooks would silently checkpoint nothing.
		return fmt.Errorf("resources server %s: checkpoint_mode saved needs session state hooks, which type %s does not have (use stateless or restart_only)", c.Name, c.Type)
	}
	switch c.VerifyMode {
	case "", VerifyWait, VerifyReplay:
	default:
		return fmt.Errorf("resources server %s: verify_mode %q is not wait or replay", c.Name, c.VerifyMode)
	}
	if err := c.Checkpoint.Validate(); err != nil {
		return fmt.Errorf("resources server %s: %w", c.Name, err)
	}
	if err := c.HTTP.Validate(); err != nil {
		return fmt.Errorf("resources server %s: %w", c.Name, err)
	}
	return nil
}

// ProcessConfig is the configuration file of cmd/resourceserver: one process
// running one or more resources servers.
type ProcessConfig struct {
	LogLevel   string          `mapstructure:"log_level"`
	Checkpoint ctlplane.Config `mapstructure:"checkpoint"`
	// Pprof serves net/http/pprof under /debug/pprof/ on every server of
	// the process (off by default).
	Pprof bool `mapstructure:"pprof"`
	// HTTP is the http: section every server of the process shares: the
	// HTTP stack (lean or nethttp) and TLS of its listeners.
	HTTP httpconf.Config `mapstructure:"http"`
	// Runtime is the runtime: section: whether every server of the process steers the Go
	// runtime (pkg/infra/runtimetune).
	Runtime runtimetune.Config `mapstructure:"runtime"`
	// Servers is a list, not a map: viper lower-cases map keys.
	Servers []Config `mapstructure:"servers"`
}

// DefaultProcessConfig is info logging, checkpointing off and no servers.
func DefaultProcessConfig() ProcessConfig {
	return ProcessConfig{LogLevel: "info", Checkpoint: ctlplane.DefaultConfig()}
}

// ServerConfigs returns the servers with the process's checkpoint block,
// pprof and http keys copied into each.
func (p ProcessConfig) ServerConfigs() []Config {
	out := slices.Clone(p.Servers)
	for i := range out {
		out[i].Checkpoint = p.Checkpoint
		out[i].Pprof = p.Pprof
		out[i].HTTP = p.HTTP
	}
	return out
}

// Validate checks every server, and that names and listen addresses are unique.
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
	if len(p.Servers) == 0 {
		return errors.New("servers is empty: configure at least one resources server")
	}
	names := map[string]bool{}
	addrs := map[string]string{}
	for _, c := range p.ServerConfigs() {
		if err := c.Validate(); err != nil {
			return err
		}
		if names[c.Name] {
			return fmt.Errorf("resources server name %q appears twice", c.Name)
		}
		names[c.Name] = true
		if !strings.HasSuffix(c.Listen, ":0") {
			if other, dup := addrs[c.Listen]; dup {
				return fmt.Errorf("resources servers %s and %s both listen on %s", other, c.Name, c.Listen)
			}
			addrs[c.Listen] = c.Name
		}
	}
	return nil
}
