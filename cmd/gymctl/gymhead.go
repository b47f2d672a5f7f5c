package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/ops/gymhead"
)

// runGymHead serves NeMo Gym's head-server routes for the servers of a
// fleet file, started by something other than this gymctl (a static fleet:
// systemd, Kubernetes, Slurm, another host), until Ctrl-C.
func runGymHead(ctx context.Context, args []string, _ func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("gym-head", stderr)
	config := fs.String("config", "configs/local.yaml", "fleet file")
	listen := fs.String("listen", "", "host:port to serve on (default: the fleet file's gym.head_server, else 127.0.0.1:11000, NeMo Gym's default)")
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg, err := fleet.Load(*config)
	if err != nil {
		return err
	}
	addr := headAddr(cfg, *listen)
	head, err := startGymHead(cfg, gymhead.Options{Listen: addr}, stdout)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "serving until Ctrl-C")
	<-ctx.Done()
	return head.stop()
}

// runGymConfig prints the NeMo Gym global config of a fleet file, as its
// head server serves it: a Gym config file for config_paths (NeMo RL's
// env.nemo_gym, `gym eval run --config`) naming the fleet's servers.
func runGymConfig(_ context.Context, args []string, _ func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("gym-config", stderr)
	config := fs.String("config", "configs/local.yaml", "fleet file")
	head := fs.String("head", "", "the head_server host:port the document names (default: the fleet file's gym.head_server, else 127.0.0.1:11000)")
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg, err := fleet.Load(*config)
	if err != nil {
		return err
	}
	doc, err := gymhead.Build(cfg, headAddr(cfg, *head))
	if err != nil {
		return err
	}
	_, err = stdout.Write(doc.YAML())
	return err
}

func headAddr(cfg *fleet.Config, flag string) string {
	switch {
	case flag != "":
		return flag
	case cfg.Gym.HeadServer != "":
		return cfg.Gym.HeadServer
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(gymhead.DefaultPort))
}

// servedHead is a running head server and the goroutine serving it.
type servedHead struct {
	srv  *gymhead.Server
	done chan error
}

func startGymHead(cfg *fleet.Config, opts gymhead.Options, stdout io.Writer) (*servedHead, error) {
	srv, err := gymhead.New(cfg, opts)
	if err != nil {
		return nil, err
	}
	if err := srv.Listen(); err != nil {
		return nil, fmt.Errorf("gym head server: %w", err)
	}
	h := &servedHead{srv: srv, done: make(chan error, 1)}
	go func() { h.done <- srv.Serve() }()
	host, port, _ := net.SplitHostPort(srv.Document().Head)
	fmt.Fprintf(stdout, "%-14s %-12s %s  (NeMo Gym: +head_server.host=%s +head_server.port=%s)\n", "gym_head", "gym", srv.URL(), host, port)
	return h, nil
}

func (h *servedHead) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := h.srv.Close(ctx)
	if serr := <-h.done; serr != nil {
		err = errors.Join(err, serr)
	}
	return err
}
