package lifecycle

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/cmd/internal/configload"
	"github.com/gymfleet/gymfleet/pkg/infra/logging"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
)

// RunFunc is a server command's run: main is a shim over it, and the
// command's tests call it with their own arguments, environment and output.
type RunFunc func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error

// Main is a server command's main: it runs run with the process's
// arguments, environment and output until SIGINT or SIGTERM, then exits
// with ExitCode.
func Main(name string, run RunFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(ExitCode(name, err, os.Stderr))
}

// ExitCode is the exit status of a run that returned err: 0 on success, 2
// for -h (the flag package's usage status), otherwise 1 after writing
// "<name>: <err>" to stderr.
func ExitCode(name string, err error, stderr io.Writer) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 2
	}
	fmt.Fprintln(stderr, name+":", err)
	return 1
}

// VersionString is v, or "dev" for a build that did not set it.
func VersionString(v string) string {
	if v == "" {
		return "dev"
	}
	return v
}

// Validator is a configuration that checks itself once loaded.
type Validator interface{ Validate() error }

// LoadConfig fills cfg (holding its defaults) from the file the flags name
// and the environment, applies --listen through listen when it is set, and
// validates the result.
func LoadConfig[C Validator](flags configload.Flags, getenv func(string) string, cfg C, listen func(cfg *C, addr string) error) (C, error) {
	if err := configload.Load(flags.Config, getenv, &cfg); err != nil {
		return cfg, err
	}
	if flags.Listen != "" {
		if err := listen(&cfg, flags.Listen); err != nil {
			return cfg, err
		}
	}
	return cfg, cfg.Validate()
}

// Command is what a server command adds to the common start-up: parse the
// flags, load the configuration, make a logger, build the servers, and
// serve them (Run) until the context ends.
type Command[C any] struct {
	// Name is the command's name in its usage text.
	Name string
	// Load reads and validates the configuration the flags name.
	Load func(flags configload.Flags, getenv func(string) string) (C, error)
	// LogLevel is the configuration's log level (debug, info, warn, error).
	LogLevel func(cfg C) string
	// Tuning is the configuration's runtime: section; nil means its
	// defaults.
	Tuning func(cfg C) runtimetune.Config
	// GoGCGoal keeps Go's own GC goal even with tuning on: for a process
	// that is not a fleet server (fakeinference).
	GoGCGoal bool
	// Servers builds the configuration's servers with what the process
	// gives them (logger settings, tracer).
	Servers func(cfg C, rt Runtime) ([]Named, error)
	// Announce is the line printed once a server listens; nil prints
	// "<name> listening on http://<addr>".
	Announce func(cfg C, name, addr string) string
	// Version is what --version prints (main.version, set by the build).
	Version string
	// Environ lists the process's environment (os.Environ), to report a
	// GYMFLEET_* variable that looks like a misspelled setting; nil
	// reports none.
	Environ func() []string
}

// Runtime is what a process gives each of its servers.
type Runtime struct {
	// Level and Stderr are the logger's: JSON lines at Level on Stderr.
	Level  slog.Level
	Stderr io.Writer
	// Tracer is the process's tracer provider: the no-op one unless the
	// OTEL_* variables ask for an exporter (pkg/infra/tracing).
	Tracer trace.TracerProvider
	// Tuner is the process's one runtime steering (pkg/infra/runtimetune), for
	// every server.
	Tuner *runtimetune.Tuner
}

// Logger is a server's logger (logging.New) with this runtime's settings.
func (rt Runtime) Logger(kind, instance string) *slog.Logger {
	return logging.New(rt.Stderr, rt.Level, kind, instance)
}

// Run runs the command: it is the body of the command's run.
func (c Command[C]) Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	flags, err := configload.ParseFlags(c.Name, args, stderr)
	if err != nil {
		return err
	}
	if flags.Version {
		fmt.Fprintln(stdout, c.Name, VersionString(c.Version))
		return nil
	}
	cfg, err := c.Load(flags, getenv)
	if err != nil {
		return err
	}
	level, err := logging.ParseLevel(c.LogLevel(cfg))
	if err != nil {
		return err
	}
	rt := runtimetune.DefaultConfig()
	if c.Tuning != nil {
		rt = c.Tuning(cfg)
	}
	tuner := runtimetune.New(rt)
	if !c.GoGCGoal {
		// Before the servers allocate much; given back when the run ends,
		// for the commands' tests that run in one process.
		defer tuner.SetServerGC(getenv)()
	}
	if c.Environ != nil {
		var zero C
		log := logging.New(stderr, level, c.Name, c.Name)
		for _, m := range configload.Misspelled(c.Environ(), &zero) {
			log.Warn("ignoring an environment variable", "detail", m)
		}
	}
	ts, err := tracing.FromEnv(getenv, c.Name)
	if err != nil {
		return err
	}
	tp, err := tracing.New(ctx, ts)
	if err != nil {
		return err
	}
	defer func() {
		// Spans still batched go out before the process exits.
		sctx, cancel := context.WithTimeout(context.Background(), ShutdownGrace)
		defer cancel()
		_ = tp.Shutdown(sctx)
	}()
	servers, err := c.Servers(cfg, Runtime{Level: level, Stderr: stderr, Tracer: tp, Tuner: tuner})
	if err != nil {
		return err
	}
	return Run(ctx, servers, flags.AddrFile, func(name, addr string) {
		line := fmt.Sprintf("%s listening on http://%s", name, addr)
		if c.Announce != nil {
			line = c.Announce(cfg, name, addr)
		}
		fmt.Fprintln(stdout, line)
	}, tuner)
}
