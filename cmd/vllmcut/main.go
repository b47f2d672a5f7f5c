// Command vllmcut runs the generation-cut worker in front of a vLLM OpenAI
// server (see pkg/servers/vllmcut): the policy model server's upstream,
// proxying vLLM and serving the worker's cut routes.
package main

import (
	"context"
	"io"
	"os"

	"github.com/gymfleet/gymfleet/cmd/internal/configload"
	"github.com/gymfleet/gymfleet/cmd/internal/lifecycle"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/servers/vllmcut"
)

// name is the process's kind and instance name in logs and the address file.
const name = "vllmcut"

// version is the build's (the Makefile sets it with -X main.version).
var version = "dev"

func main() {
	lifecycle.Main(name, run)
}

func loadConfig(flags configload.Flags, getenv func(string) string) (vllmcut.Config, error) {
	return lifecycle.LoadConfig(flags, getenv, vllmcut.DefaultConfig(), func(cfg *vllmcut.Config, addr string) error {
		cfg.Listen = addr
		return nil
	})
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return lifecycle.Command[vllmcut.Config]{
		Name:     name,
		Version:  version,
		Environ:  os.Environ,
		Load:     loadConfig,
		LogLevel: func(cfg vllmcut.Config) string { return cfg.LogLevel },
		Tuning:   func(cfg vllmcut.Config) runtimetune.Config { return cfg.Runtime },
		// Like fakeinference, it stands with the inference server, outside
		// the fleet whose memory the servers' GC goal is tuned for.
		GoGCGoal: true,
		Servers: func(cfg vllmcut.Config, rt lifecycle.Runtime) ([]lifecycle.Named, error) {
			log := rt.Logger(name, name)
			if cfg.ControlAuthToken == "" {
				log.Warn("control_auth_token is empty: the generation-cut routes refuse every call")
			}
			srv, err := vllmcut.New(cfg, vllmcut.Deps{Logger: log, Tracer: rt.Tracer})
			if err != nil {
				return nil, err
			}
			return []lifecycle.Named{{Name: name, Server: srv}}, nil
		},
	}.Run(ctx, args, getenv, stdout, stderr)
}
