// Command agentserver runs one or more Simple Agents, each on its own
// listener, from one configuration file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/gymfleet/gymfleet/cmd/internal/configload"
	"github.com/gymfleet/gymfleet/cmd/internal/lifecycle"
	"github.com/gymfleet/gymfleet/pkg/agent"
	"github.com/gymfleet/gymfleet/pkg/logging"
)

func main() {
	lifecycle.SetServerGC(os.Getenv)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "agentserver:", err)
		os.Exit(1)
	}
}

// loadConfig reads the flags' configuration file and applies --listen.
func loadConfig(flags configload.Flags, getenv func(string) string) (agent.ProcessConfig, error) {
	cfg := agent.DefaultProcessConfig()
	if err := configload.Load(flags.Config, getenv, &cfg); err != nil {
		return cfg, err
	}
	if flags.Listen != "" {
		if len(cfg.Agents) != 1 {
			return cfg, fmt.Errorf("--listen needs exactly one configured agent, the configuration has %d", len(cfg.Agents))
		}
		cfg.Agents[0].Listen = flags.Listen
	}
	return cfg, cfg.Validate()
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	flags, err := configload.ParseFlags("agentserver", args, stderr)
	if err != nil {
		return err
	}
	cfg, err := loadConfig(flags, getenv)
	if err != nil {
		return err
	}
	level, err := logging.ParseLevel(cfg.LogLevel)
	if err != nil {
		return err
	}
	var servers []lifecycle.Named
	for _, ac := range cfg.AgentConfigs() {
		srv, err := agent.New(ac, agent.Deps{Logger: logging.New(stderr, level, "agent", ac.Name)})
		if err != nil {
			return fmt.Errorf("%s: %w", ac.Name, err)
		}
		servers = append(servers, lifecycle.Named{Name: ac.Name, Server: srv})
	}
	return lifecycle.Run(ctx, servers, flags.AddrFile, func(name, addr string) {
		fmt.Fprintf(stdout, "%s listening on http://%s\n", name, addr)
	})
}
