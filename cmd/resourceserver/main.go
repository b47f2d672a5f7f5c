// Command resourceserver runs one or more resources servers (weather,
// counter, slow_verify), each on its own listener, from one configuration file.
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
	"github.com/gymfleet/gymfleet/pkg/logging"
	"github.com/gymfleet/gymfleet/pkg/resources"
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
		fmt.Fprintln(os.Stderr, "resourceserver:", err)
		os.Exit(1)
	}
}

// loadConfig reads the flags' configuration file and applies --listen.
func loadConfig(flags configload.Flags, getenv func(string) string) (resources.ProcessConfig, error) {
	cfg := resources.DefaultProcessConfig()
	if err := configload.Load(flags.Config, getenv, &cfg); err != nil {
		return cfg, err
	}
	if flags.Listen != "" {
		if len(cfg.Servers) != 1 {
			return cfg, fmt.Errorf("--listen needs exactly one configured server, the configuration has %d", len(cfg.Servers))
		}
		cfg.Servers[0].Listen = flags.Listen
	}
	return cfg, cfg.Validate()
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	flags, err := configload.ParseFlags("resourceserver", args, stderr)
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
	for _, sc := range cfg.ServerConfigs() {
		srv, err := resources.New(sc, resources.Deps{Logger: logging.New(stderr, level, "resources", sc.Name)})
		if err != nil {
			return fmt.Errorf("%s: %w", sc.Name, err)
		}
		servers = append(servers, lifecycle.Named{Name: sc.Name, Server: srv})
	}
	return lifecycle.Run(ctx, servers, flags.AddrFile, func(name, addr string) {
		fmt.Fprintf(stdout, "%s listening on http://%s\n", name, addr)
	})
}
