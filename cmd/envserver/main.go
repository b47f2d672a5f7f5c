// Command envserver runs an environment server: POST /run runs one episode of
// a NeMo Gym dataset row (single_agent_turn or the legacy relay).
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gymfleet/gymfleet/cmd/internal/configload"
	"github.com/gymfleet/gymfleet/cmd/internal/lifecycle"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/servers/environment"
)

// version is the build's (the Makefile sets it with -X main.version).
var version = "dev"

func main() {
	lifecycle.Main("envserver", run)
}

// loadConfig reads the configuration the flags name and validates it.
func loadConfig(flags configload.Flags, getenv func(string) string) (environment.Config, error) {
	return lifecycle.LoadConfig(flags, getenv, environment.DefaultConfig(), func(cfg *environment.Config, addr string) error {
		cfg.Listen = addr
		return nil
	})
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return lifecycle.Command[environment.Config]{
		Name:     "envserver",
		Version:  version,
		Environ:  os.Environ,
		Load:     loadConfig,
		LogLevel: func(cfg environment.Config) string { return cfg.LogLevel },
		Tuning:   func(cfg environment.Config) runtimetune.Config { return cfg.Runtime },
		Servers: func(cfg environment.Config, rt lifecycle.Runtime) ([]lifecycle.Named, error) {
			log := rt.Logger("environment", cfg.Name)
			srv, err := environment.New(cfg, environment.Deps{Logger: log, Registry: prometheus.NewRegistry(), Tracer: rt.Tracer, Tuning: rt.Tuner})
			if err != nil {
				return nil, err
			}
			return []lifecycle.Named{{Name: cfg.Name, Server: srv}}, nil
		},
		Announce: func(cfg environment.Config, name, addr string) string {
			return fmt.Sprintf("%s listening on http://%s (protocol %s)", name, addr, cfg.Protocol)
		},
	}.Run(ctx, args, getenv, stdout, stderr)
}
