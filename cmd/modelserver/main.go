// Command modelserver runs the policy model server: an OpenAI-compatible
// proxy (/v1/chat/completions, /v1/responses, /v1/models) in front of a
// vLLM-shaped endpoint, with Responses ⇄ Chat conversion and per-rollout
// token capture.
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
	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
)

// version is the build's (the Makefile sets it with -X main.version).
var version = "dev"

func main() {
	lifecycle.Main("modelserver", run)
}

// loadConfig reads the configuration the flags name and validates it.
func loadConfig(flags configload.Flags, getenv func(string) string) (modelproxy.Config, error) {
	return lifecycle.LoadConfig(flags, getenv, modelproxy.DefaultConfig(), func(cfg *modelproxy.Config, addr string) error {
		cfg.Listen = addr
		return nil
	})
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return lifecycle.Command[modelproxy.Config]{
		Name:     "modelserver",
		Version:  version,
		Environ:  os.Environ,
		Load:     loadConfig,
		LogLevel: func(cfg modelproxy.Config) string { return cfg.LogLevel },
		Tuning:   func(cfg modelproxy.Config) runtimetune.Config { return cfg.Runtime },
		Servers: func(cfg modelproxy.Config, rt lifecycle.Runtime) ([]lifecycle.Named, error) {
			log := rt.Logger("model", cfg.Name)
			srv, err := modelproxy.New(cfg, modelproxy.Deps{Logger: log, Registry: prometheus.NewRegistry(), Tracer: rt.Tracer, Tuning: rt.Tuner})
			if err != nil {
				return nil, err
			}
			return []lifecycle.Named{{Name: cfg.Name, Server: srv}}, nil
		},
		Announce: func(cfg modelproxy.Config, name, addr string) string {
			ckpt := "off"
			if cfg.Checkpoint.Enabled {
				ckpt = "on"
			}
			return fmt.Sprintf("%s listening on http://%s (upstream %s, model %s, capture dir %s, checkpointing %s)",
				name, addr, cfg.Upstream.Workers(), cfg.Upstream.Model, cfg.Capture.Dir, ckpt)
		},
	}.Run(ctx, args, getenv, stdout, stderr)
}
