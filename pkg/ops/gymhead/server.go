package gymhead

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// Options configure a Server.
type Options struct {
	// Listen is host:port (port 0 picks one); empty: the fleet file's
	// gym.head_server.
	Listen string
	// PID names the process id of a fleet process, 0 when unknown (a
	// static fleet started elsewhere); /server_instances reports it.
	PID func(process string) int
	// Logger receives the server's own errors.
	Logger *slog.Logger
	// Now is the clock of /server_instances' start_time (nil: time.Now).
	Now func() time.Time
}

// Server serves a fleet's document on Gym's head-server routes, over
// HTTP/1.1 in the clear as Gym's own (uvicorn) head does: Gym's clients
// build http://host:port. It is a small net/http server, so gymctl, which
// links no fleet server code, can run it.
type Server struct {
	srv     *http.Server
	ln      net.Listener
	doc     *Document
	cfg     *fleet.Config
	opts    Options
	started time.Time
}

// New returns a server for the fleet; Listen binds its address and builds
// the document naming the bound address (so port 0 works).
func New(cfg *fleet.Config, opts Options) (*Server, error) {
	if opts.Listen == "" {
		opts.Listen = cfg.Gym.HeadServer
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.PID == nil {
		opts.PID = func(string) int { return 0 }
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, opts: opts, started: opts.Now()}
	mux := http.NewServeMux()
	ok := func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, []byte(`{"status":"ok"}`)) }
	// Gym's HeadServer liveness and readiness routes; ours are ready once
	// the fleet is (gymctl up serves after StartAll).
	for _, p := range []string{"/{$}", "/livez", "/readyz", "/healthz", "/health"} {
		mux.HandleFunc("GET "+p, ok)
	}
	mux.HandleFunc("GET /global_config_dict_yaml", s.globalConfig)
	mux.HandleFunc("GET /server_instances", s.serverInstances)
	s.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		ErrorLog:          slog.NewLogLogger(opts.Logger.Handler(), slog.LevelWarn),
	}
	return s, nil
}

// Listen binds the address and builds the document naming it.
func (s *Server) Listen() error {
	ln, err := net.Listen("tcp", s.opts.Listen)
	if err != nil {
		return err
	}
	doc, err := Build(s.cfg, ln.Addr().String())
	if err != nil {
		_ = ln.Close()
		return err
	}
	s.ln, s.doc = ln, doc
	return nil
}

// Serve serves until Close.
func (s *Server) Serve() error {
	if err := s.srv.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Close stops the server, letting requests in progress finish until ctx
// ends.
func (s *Server) Close(ctx context.Context) error {
	if err := s.srv.Shutdown(ctx); err != nil {
		return errors.Join(err, s.srv.Close())
	}
	return nil
}

// URL is the server's base URL.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Document is what the server serves (nil before Listen).
func (s *Server) Document() *Document { return s.doc }

// globalConfig answers as Gym's HeadServer.global_config_dict_yaml: FastAPI
// returns the YAML text as a JSON string, which ServerClient json.loads
// and hands to OmegaConf.create.
func (s *Server) globalConfig(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, codec.AppendString(nil, string(s.doc.YAML())))
}

// instanceView is ServerInstanceDisplayConfig as RunHelper fills it and
// FastAPI serializes it: every field, unset ones null.
type instanceView struct {
	ConfigPath    string   `json:"config_path"`
	DirPath       *string  `json:"dir_path"`
	Entrypoint    *string  `json:"entrypoint"`
	Host          string   `json:"host"`
	Name          string   `json:"name"`
	PID           *int     `json:"pid"`
	Port          int      `json:"port"`
	ProcessName   string   `json:"process_name"`
	ServerType    string   `json:"server_type"`
	StartTime     float64  `json:"start_time"`
	Status        *string  `json:"status"`
	UptimeSeconds *float64 `json:"uptime_seconds"`
	URL           string   `json:"url"`
}

// serverInstances lists our servers as RunHelper lists the processes it
// started: process_name and config_path are the instance name, server_type
// its kind, name its implementation; start_time is always a number, since
// `gym env status` subtracts it from the time. An instance that only names
// an environment route is no server and is not listed.
func (s *Server) serverInstances(w http.ResponseWriter, _ *http.Request) {
	start := float64(s.started.UnixNano()) / 1e9
	out := make([]instanceView, 0, len(s.doc.Instances))
	for _, in := range s.doc.Instances {
		if in.RouteOf != "" {
			continue
		}
		v := instanceView{
			ConfigPath: in.Name, Host: in.Host, Name: in.Impl, Port: in.Port,
			ProcessName: in.Name, ServerType: in.Kind, StartTime: start, URL: in.URL(),
		}
		if pid := s.opts.PID(in.Process); pid > 0 {
			v.PID = &pid
		}
		out = append(out, v)
	}
	b, err := json.Marshal(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	writeJSON(w, b)
}

func writeJSON(w http.ResponseWriter, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}
