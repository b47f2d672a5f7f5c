package vllmcut

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/gymfleet/gymfleet/pkg/infra/logging"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

// Defaults for Config.
const (
	DefaultListen      = "127.0.0.1:18100"
	DefaultCutWait     = 30 * time.Second
	DefaultMaxStaged   = 4096
	DefaultMaxInFlight = 100000
)

// Config configures the cut worker.
type Config struct {
	// Listen is host:port; port 0 picks a free one.
	Listen string `mapstructure:"listen"`
	// LogLevel is read by cmd/vllmcut only (debug, info, warn, error).
	LogLevel string `mapstructure:"log_level"`
	// VLLMURL is the root URL of the vLLM OpenAI server (no /v1), started
	// with --enable-scale-out so its /inference/v1/abort_requests answers.
	VLLMURL string `mapstructure:"vllm_url"`
	// ControlAuthToken is the bearer both generation-cut routes require.
	// Empty refuses every cut with 401 (the OpenAI routes still proxy).
	ControlAuthToken string `mapstructure:"control_auth_token"`
	// CutWait bounds how long a cut round waits for the aborted calls'
	// replies, which carry their prefixes.
	CutWait time.Duration `mapstructure:"cut_wait"`
	// MaxStaged bounds the token store: past it the oldest prefix is
	// dropped (its continuation then regenerates, as a lost prefix does).
	MaxStaged int `mapstructure:"max_staged"`
	// MaxInFlight bounds the calls tracked at once; past it calls are
	// proxied untracked (and cannot be cut).
	MaxInFlight int `mapstructure:"max_in_flight"`
	// HTTP is the http: section of the listener.
	HTTP httpconf.Config `mapstructure:"http"`
	// Runtime is the runtime: section (pkg/infra/runtimetune).
	Runtime runtimetune.Config `mapstructure:"runtime"`
}

// DefaultConfig returns the defaults of every field.
func DefaultConfig() Config {
	return Config{
		Listen: DefaultListen, LogLevel: "info", CutWait: DefaultCutWait,
		MaxStaged: DefaultMaxStaged, MaxInFlight: DefaultMaxInFlight,
	}
}

// Validate reports every invalid field at once.
func (c Config) Validate() error {
	var errs []error
	if strings.TrimSpace(c.Listen) == "" {
		errs = append(errs, errors.New("listen must be host:port"))
	}
	if c.LogLevel != "" {
		if _, err := logging.ParseLevel(c.LogLevel); err != nil {
			errs = append(errs, fmt.Errorf("log_level: %w", err))
		}
	}
	if u, err := url.Parse(c.VLLMURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("vllm_url must be an http(s) root URL, got %q", c.VLLMURL))
	} else if strings.HasSuffix(strings.TrimRight(u.Path, "/"), "/v1") {
		errs = append(errs, fmt.Errorf("vllm_url is the server's root, without /v1: %q", c.VLLMURL))
	}
	if c.CutWait <= 0 {
		errs = append(errs, fmt.Errorf("cut_wait must be positive, got %v", c.CutWait))
	}
	if c.MaxStaged < 1 {
		errs = append(errs, fmt.Errorf("max_staged must be >= 1, got %d", c.MaxStaged))
	}
	if c.MaxInFlight < 1 {
		errs = append(errs, fmt.Errorf("max_in_flight must be >= 1, got %d", c.MaxInFlight))
	}
	if err := c.HTTP.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Runtime.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
