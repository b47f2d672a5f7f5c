// Package lifecycle runs servers from a cmd/ main: listen, announce the bound
// addresses, serve until the context ends, then close gracefully.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
)

// Server is what every fleet server type provides.
type Server interface {
	Listen() error
	Serve() error
	Close(ctx context.Context) error
	Addr() string
}

// Named is a server with the instance name it is announced under.
type Named struct {
	Name   string
	Server Server
}

// ShutdownGrace bounds a graceful close after the process is asked to stop.
const ShutdownGrace = 10 * time.Second

// Run listens on every server, writes "<name> <addr>" lines to addrFile (if
// set) once all listen, serves until ctx is done or one server fails, and
// closes them all. While they serve, tuner holds collections off when the
// process is parked (runtimetune.Tuner.RunIdle; nothing when it is off or
// nil).
func Run(ctx context.Context, servers []Named, addrFile string, announce func(name, addr string), tuner *runtimetune.Tuner) error {
	for i, s := range servers {
		if err := s.Server.Listen(); err != nil {
			closeAll(servers[:i])
			return fmt.Errorf("%s: %w", s.Name, err)
		}
	}
	var lines strings.Builder
	for _, s := range servers {
		fmt.Fprintf(&lines, "%s %s\n", s.Name, s.Server.Addr())
		if announce != nil {
			announce(s.Name, s.Server.Addr())
		}
	}
	if err := WriteAddrFile(addrFile, lines.String()); err != nil {
		closeAll(servers)
		return fmt.Errorf("write address file: %w", err)
	}
	errc := make(chan error, len(servers))
	var wg sync.WaitGroup
	// Collections wait while the process is parked (runtimetune's
	// IdleCollections): every fleet server parks a goroutine or two per
	// rollout in flight.
	idleCtx, stopIdle := context.WithCancel(context.Background())
	wg.Add(1)
	go func() {
		defer wg.Done()
		tuner.RunIdle(idleCtx)
	}()
	for _, s := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Server.Serve(); err != nil {
				errc <- fmt.Errorf("%s: serve: %w", s.Name, err)
			}
		}()
	}
	var runErr error
	select {
	case runErr = <-errc:
	case <-ctx.Done():
	}
	stopIdle()
	cctx, cancel := context.WithTimeout(context.Background(), ShutdownGrace)
	defer cancel()
	for _, s := range servers {
		if err := s.Server.Close(cctx); err != nil && runErr == nil {
			runErr = fmt.Errorf("%s: close: %w", s.Name, err)
		}
	}
	wg.Wait()
	return runErr
}

func closeAll(servers []Named) {
	for _, s := range servers {
		_ = s.Server.Close(context.Background())
	}
}

// WriteAddrFile writes content to path through a temp file and a rename, so
// a poller never reads a partial file.
func WriteAddrFile(path, content string) error {
	if path == "" {
		return nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ErrNoServers reports a configuration that names no server to run.
var ErrNoServers = errors.New("the configuration names no server to run")
