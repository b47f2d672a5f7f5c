// Command resourceserver runs one or more resources servers (weather,
// counter, slow_verify), each on its own listener, from one configuration file.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/gymfleet/gymfleet/cmd/internal/configload"
	"github.com/gymfleet/gymfleet/cmd/internal/lifecycle"
	"github.com/gymfleet/gymfleet/pkg/logging"
	"github.com/gymfleet/gymfleet/pkg/resources"
	"github.com/gymfleet/gymfleet/pkg/runtimetune"
)

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
		Load:     loadConfig,
		LogLevel: func(cfg resources.ProcessConfig) string { return cfg.LogLevel },
		Runtime:  func(cfg resources.ProcessConfig) runtimetune.Config { return cfg.Runtime },
		Servers: func(cfg resources.ProcessConfig, level slog.Level, stderr io.Writer, tuner *runtimetune.Tuner) ([]lifecycle.Named, error) {
			var servers []lifecycle.Named
			for _, sc := range cfg.ServerConfigs() {
				srv, err := resources.New(sc, resources.Deps{Logger: logging.New(stderr, level, "resources", sc.Name), Tuning: tuner})
				if err != nil {
					return nil, fmt.Errorf("%s: %w", sc.Name, err)
				}
				servers = append(servers, lifecycle.Named{Name: sc.Name, Server: srv})
			}
			return servers, nil
		},
	}.Run(ctx, args, getenv, stdout, stderr)
}
