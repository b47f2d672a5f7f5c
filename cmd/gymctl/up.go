package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/ops/gymhead"
)

func runUp(ctx context.Context, args []string, _ func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("up", stderr)
	config := fs.String("config", "configs/local.yaml", "fleet file")
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg, err := fleet.Load(*config)
	if err != nil {
		return err
	}
	l := fleet.NewLauncher(cfg, fleet.Options{})
	fmt.Fprintf(stdout, "starting %d processes (logs in %s)\n", len(cfg.Processes), cfg.LogPath("<process>"))
	if err := l.StartAll(ctx); err != nil {
		return err
	}
	for _, p := range cfg.Processes {
		if !p.Local() {
			fmt.Fprintf(stdout, "%-14s runs on %s (not started here)\n", p.Name, p.Host)
			continue
		}
		for _, e := range p.Endpoints {
			fmt.Fprintf(stdout, "%-14s %-12s %s  ready\n", e.Name, e.Kind, e.URL)
		}
	}
	var head *servedHead
	if cfg.Gym.HeadServer != "" {
		if head, err = startGymHead(cfg, gymhead.Options{PID: l.PID}, stdout); err != nil {
			return errors.Join(err, l.StopAll())
		}
	}
	fmt.Fprintln(stdout, "fleet is up; Ctrl-C stops it")
	err = waitFleet(ctx, l)
	fmt.Fprintln(stdout, "stopping the fleet")
	if head != nil {
		if stopErr := head.stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
	}
	if stopErr := l.StopAll(); stopErr != nil {
		err = errors.Join(err, stopErr)
	}
	return err
}

// waitFleet blocks until ctx ends (nil) or a process exits on its own (an
// error with its log tail).
func waitFleet(ctx context.Context, l *fleet.Launcher) error {
	exited := make(chan string, len(l.Config().Processes))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, p := range l.Config().Processes {
		ch := l.Exited(p.Name)
		if ch == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-ch:
				exited <- p.Name
			case <-stop:
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	select {
	case <-ctx.Done():
		return nil
	case name := <-exited:
		return fmt.Errorf("process %s %s\n--- last lines of its log ---\n%s", name, l.ExitReason(name), l.Logs(name))
	}
}
