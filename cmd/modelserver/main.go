// Command modelserver runs the policy model server: an OpenAI-compatible
// proxy (/v1/chat/completions, /v1/responses, /v1/models) in front of a
// vLLM-shaped endpoint, with Responses ⇄ Chat conversion and per-rollout
// token capture.
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
	"github.com/gymfleet/gymfleet/pkg/logging"
	"github.com/gymfleet/gymfleet/pkg/modelproxy"
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
		fmt.Fprintln(os.Stderr, "modelserver:", err)
		os.Exit(1)
	}
}

// loadConfig reads the configuration the flags name and validates it.
func loadConfig(flags configload.Flags, getenv func(string) string) (modelproxy.Config, error) {
	cfg := modelproxy.DefaultConfig()
	if err := configload.Load(flags.Config, getenv, &cfg); err != nil {
		return cfg, err
	}
	if flags.Listen != "" {
		cfg.Listen = flags.Listen
	}
	return cfg, cfg.Validate()
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	flags, err := configload.ParseFlags("modelserver", args, stderr)
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
	log := logging.New(stderr, level, "model", cfg.Name)
	srv, err := modelproxy.New(cfg, modelproxy.Deps{Logger: log, Registry: prometheus.NewRegistry()})
	if err != nil {
		return err
	}
	ckpt := "off"
	if cfg.Checkpoint.Enabled {
		ckpt = "on"
	}
	return lifecycle.Run(ctx, []lifecycle.Named{{Name: cfg.Name, Server: srv}}, flags.AddrFile, func(name, addr string) {
		fmt.Fprintf(stdout, "%s listening on http://%s (upstream %s, model %s, capture dir %s, checkpointing %s)\n",
			name, addr, cfg.Upstream.BaseURL, cfg.Upstream.Model, cfg.Capture.Dir, ckpt)
	})
}
