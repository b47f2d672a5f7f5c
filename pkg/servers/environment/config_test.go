package environment_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/servers/environment"
)

func validConfig() environment.Config {
	cfg := environment.DefaultConfig()
	cfg.Agents = []environment.AgentConfig{{Name: "a", URL: "http://127.0.0.1:1", ResourcesURL: "http://127.0.0.1:2"}}
	return cfg
}

func TestConfig_Validate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*environment.Config)
		want string // substring of the error; empty means valid
	}{
		{"valid", func(*environment.Config) {}, ""},
		{"legacy needs no resources", func(c *environment.Config) {
			c.Protocol = environment.ProtocolLegacy
			c.Agents[0].ResourcesURL = ""
		}, ""},
		{"no agents", func(c *environment.Config) { c.Agents = nil }, "agents is empty"},
		{"bad protocol", func(c *environment.Config) { c.Protocol = "x" }, `protocol "x"`},
		{"bad agent protocol", func(c *environment.Config) { c.Agents[0].Protocol = "x" }, `agents[0].protocol "x"`},
		{"missing resources", func(c *environment.Config) { c.Agents[0].ResourcesURL = "" }, "agents[0].resources_url"},
		{"relative url", func(c *environment.Config) { c.Agents[0].URL = "localhost:1" }, "agents[0].url"},
		{"duplicate agent", func(c *environment.Config) { c.Agents = append(c.Agents, c.Agents[0]) }, "used twice"},
		{"unknown default", func(c *environment.Config) { c.DefaultAgent = "b" }, "default_agent"},
		{"zero episode timeout", func(c *environment.Config) { c.EpisodeTimeout = 0 }, "episode_timeout"},
		{"negative cleanup timeout", func(c *environment.Config) { c.CleanupTimeout = -time.Second }, "cleanup_timeout"},
		{"negative cleanup retry window", func(c *environment.Config) { c.CleanupRetryWindow = -time.Second }, "cleanup_retry_window"},
		{"cleanup retries off", func(c *environment.Config) { c.CleanupRetryWindow = 0 }, ""},
		{"bad name", func(c *environment.Config) { c.Name = "has space" }, "name"},
		{"empty listen", func(c *environment.Config) { c.Listen = "" }, "listen"},
		{"bad log level", func(c *environment.Config) { c.LogLevel = "loud" }, "log_level"},
		{"checkpoint without token", func(c *environment.Config) { c.Checkpoint.Enabled = true }, "control_auth_token"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := validConfig()
			tc.edit(&cfg)
			err := cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestDefaultConfig_CleanupRetryWindow(t *testing.T) {
	if got := environment.DefaultConfig().CleanupRetryWindow; got != 10*time.Minute {
		t.Errorf("default cleanup_retry_window = %v, want 10m", got)
	}
}

func TestNew_RefusesInvalidConfig(t *testing.T) {
	if _, err := environment.New(environment.DefaultConfig(), environment.Deps{}); err == nil {
		t.Fatal("New accepted a configuration without agents")
	}
}
