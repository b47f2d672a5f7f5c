// Command agentserver runs one or more Simple Agents, each on its own
// listener, from one configuration file.
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/gymfleet/gymfleet/cmd/internal/configload"
	"github.com/gymfleet/gymfleet/cmd/internal/lifecycle"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/servers/agent"
)

// version is the build's (the Makefile sets it with -X main.version).
var version = "dev"

func main() {
	lifecycle.Main("agentserver", run)
}

// loadConfig reads the flags' configuration file and applies --listen.
func loadConfig(flags configload.Flags, getenv func(string) string) (agent.ProcessConfig, error) {
	return lifecycle.LoadConfig(flags, getenv, agent.DefaultProcessConfig(), func(cfg *agent.ProcessConfig, addr string) error {
		if len(cfg.Agents) != 1 {
			return fmt.Errorf("--listen needs exactly one configured agent, the configuration has %d", len(cfg.Agents))
		}
		cfg.Agents[0].Listen = addr
		return nil
	})
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return lifecycle.Command[agent.ProcessConfig]{
		Name:     "agentserver",
		Version:  version,
		Environ:  os.Environ,
		Load:     loadConfig,
		LogLevel: func(cfg agent.ProcessConfig) string { return cfg.LogLevel },
		Tuning:   func(cfg agent.ProcessConfig) runtimetune.Config { return cfg.Runtime },
		Servers: func(cfg agent.ProcessConfig, rt lifecycle.Runtime) ([]lifecycle.Named, error) {
			var servers []lifecycle.Named
			for _, ac := range cfg.AgentConfigs() {
				srv, err := agent.New(ac, agent.Deps{Logger: rt.Logger("agent", ac.Name), Tracer: rt.Tracer, Tuning: rt.Tuner})
				if err != nil {
					return nil, fmt.Errorf("%s: %w", ac.Name, err)
				}
				servers = append(servers, lifecycle.Named{Name: ac.Name, Server: srv})
			}
			return servers, nil
		},
	}.Run(ctx, args, getenv, stdout, stderr)
}
