// Command envserver runs an environment server: POST /run runs one episode of
// a NeMo Gym dataset row (single_agent_turn or the legacy relay).
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

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gymfleet/gymfleet/cmd/internal/configload"
	"github.com/gymfleet/gymfleet/cmd/internal/lifecycle"
	"github.com/gymfleet/gymfleet/pkg/environment"
	"github.com/gymfleet/gymfleet/pkg/logging"
)

func main() {
	lifecycle.SetServerGC(os.Getenv)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "envserver:", err)
		os.Exit(1)
	}
}

// loadConfig reads the configuration the flags name and validates it.
func loadConfig(flags configload.Flags, getenv func(string) string) (environment.Config, error) {
	cfg := environment.DefaultConfig()
	if err := configload.Load(flags.Config, getenv, &cfg); err != nil {
		return cfg, err
	}
	if flags.Listen != "" {
		cfg.Listen = flags.Listen
	}
	return cfg, cfg.Validate()
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	flags, err := configload.ParseFlags("envserver", args, stderr)
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
	log := logging.New(stderr, level, "environment", cfg.Name)
	srv, err := environment.New(cfg, environment.Deps{Logger: log, Registry: prometheus.NewRegistry()})
	if err != nil {
		return err
	}
	return lifecycle.Run(ctx, []lifecycle.Named{{Name: cfg.Name, Server: srv}}, flags.AddrFile, func(name, addr string) {
		fmt.Fprintf(stdout, "%s listening on http://%s (protocol %s)\n", name, addr, cfg.Protocol)
	})
}
