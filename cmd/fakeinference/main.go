// Command fakeinference runs the deterministic vLLM stand-in (see
// pkg/servers/fakeinference): OpenAI-compatible chat completions with token ids,
// test control routes, and the generation-cut worker route.
package main

import (
	"context"
	"io"
	"os"

	"github.com/gymfleet/gymfleet/cmd/internal/configload"
	"github.com/gymfleet/gymfleet/cmd/internal/lifecycle"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
)

// name is the process's kind and instance name in logs and the address file.
const name = "fakeinference"

// version is the build's (the Makefile sets it with -X main.version).
var version = "dev"

func main() {
	lifecycle.Main(name, run)
}

// loadConfig reads the flags' configuration file and applies --listen.
func loadConfig(flags configload.Flags, getenv func(string) string) (fakeinference.Config, error) {
	return lifecycle.LoadConfig(flags, getenv, fakeinference.DefaultConfig(), func(cfg *fakeinference.Config, addr string) error {
		cfg.Listen = addr
		return nil
	})
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return lifecycle.Command[fakeinference.Config]{
		Name:     name,
		Version:  version,
		Environ:  os.Environ,
		Load:     loadConfig,
		LogLevel: func(cfg fakeinference.Config) string { return cfg.LogLevel },
		Tuning:   func(cfg fakeinference.Config) runtimetune.Config { return cfg.Runtime },
		// The stand-in keeps Go's own GC goal, not the servers'
		// (runtimetune.ServerGCPercent): it is not part of the fleet whose
		// memory the scale targets bound, and on the bench's machine its
		// collections at the servers' goal land in the prepare, where it
		// unwinds the calls the model server cuts, on the cores the
		// fleet's checkpoint runs on.
		GoGCGoal: true,
		Servers: func(cfg fakeinference.Config, rt lifecycle.Runtime) ([]lifecycle.Named, error) {
			log := rt.Logger(name, name)
			if cfg.ControlAuthToken == "" {
				log.Warn("control_auth_token is empty: POST /ng-control/v1/generation-cut refuses every call")
			}
			srv, err := fakeinference.New(cfg, fakeinference.Deps{Logger: log, Tracer: rt.Tracer})
			if err != nil {
				return nil, err
			}
			return []lifecycle.Named{{Name: name, Server: srv}}, nil
		},
	}.Run(ctx, args, getenv, stdout, stderr)
}
