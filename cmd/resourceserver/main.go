// Command resourceserver runs one or more resources servers (weather,
// counter, slow_verify), each on its own listener, from one configuration file.
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/gymfleet/gymfleet/cmd/internal/configload"
	"github.com/gymfleet/gymfleet/cmd/internal/lifecycle"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/servers/resources"
)

// version is the build's (the Makefile sets it with -X main.version).
var version = "dev"

func main() {
	lifecycle.Main("resourceserver", run)
}

// loadConfig reads the flags' configuration file and applies --listen.
func loadConfig(flags configload.Flags, getenv func(string) string) (resources.ProcessConfig, error) {
	return lifecycle.LoadConfig(flags, getenv, resources.DefaultProcessConfig(), func(cfg *resources.ProcessConfig, addr string) error {
		if len(cfg.Servers) != 1 {
			return fmt.Errorf("--listen needs exactly one configured server, the configuration has %d", len(cfg.Servers))
		}
		cfg.Servers[0].Listen = addr
		return nil
	})
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return lifecycle.Command[resources.ProcessConfig]{
		Name:     "resourceserver",
		Version:  version,
		Environ:  os.Environ,
		Load:     loadConfig,
		LogLevel: func(cfg resources.ProcessConfig) string { return cfg.LogLevel },
		Tuning:   func(cfg resources.ProcessConfig) runtimetune.Config { return cfg.Runtime },
		Servers: func(cfg resources.ProcessConfig, rt lifecycle.Runtime) ([]lifecycle.Named, error) {
			var servers []lifecycle.Named
			for _, sc := range cfg.ServerConfigs() {
				srv, err := resources.New(sc, resources.Deps{Logger: rt.Logger("resources", sc.Name), Tracer: rt.Tracer, Tuning: rt.Tuner})
				if err != nil {
					return nil, fmt.Errorf("%s: %w", sc.Name, err)
				}
				servers = append(servers, lifecycle.Named{Name: sc.Name, Server: srv})
			}
			return servers, nil
		},
	}.Run(ctx, args, getenv, stdout, stderr)
}
