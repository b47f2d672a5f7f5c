package modelproxy

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/infra/logging"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Defaults for Config.
const (
	DefaultListen          = "127.0.0.1:18010"
	DefaultName            = "policy_model"
	DefaultUpstreamBaseURL = "http://127.0.0.1:18000/v1"
	DefaultUpstreamModel   = "fake-model"
	DefaultCaptureDir      = ".gymfleet/capture/policy_model"
)

// Config configures the policy model server.
type Config struct {
	// Listen is host:port; port 0 picks a free one.
	Listen string `mapstructure:"listen"`
	// Name is the server's instance name (logs, the checkpoint participant).
	Name string `mapstructure:"name"`
	// LogLevel is read by cmd/modelserver (debug, info, warn, error).
	LogLevel string         `mapstructure:"log_level"`
	Upstream UpstreamConfig `mapstructure:"upstream"`
	// ReturnTokenIDs asks the upstream for token ids and log-probs on every
	// call and returns them as prompt_token_ids, generation_token_ids and
	// generation_log_probs (NeMo Gym's return_token_id_information).
	ReturnTokenIDs bool          `mapstructure:"return_token_ids"`
	Capture        CaptureConfig `mapstructure:"capture"`
	// Checkpoint is the checkpoint: block. Enabled, the server is a
	// checkpoint participant of kind model (pkg/ctlplane) named Name.
	Checkpoint ctlplane.Config `mapstructure:"checkpoint"`
	// GenerationCuts configures the cuts a checkpoint asks the inference
	// worker for; used only with checkpointing enabled.
	GenerationCuts GenerationCutsConfig `mapstructure:"generation_cuts"`
	// Pprof serves net/http/pprof under /debug/pprof/ (off by default).
	Pprof bool `mapstructure:"pprof"`
	// HTTP is the http: section: the HTTP stack (lean or nethttp) and TLS
	// of the server's listener and of its clients to fleet peers.
	HTTP httpconf.Config `mapstructure:"http"`
	// Runtime is the runtime: section: whether the process steers the Go
	// runtime (pkg/infra/runtimetune).
	Runtime runtimetune.Config `mapstructure:"runtime"`
}

// GenerationCutsConfig configures generation cuts: when a checkpoint closes
// admission, calls still generating upstream are cut by the worker each
// runs on (POST <worker root>/ng-control/v1/generation-cut, the worker root being
// its base URL without the trailing /v1), which stages their prefixes so
// the re-issued call continues instead of regenerating.
type GenerationCutsConfig struct {
	// Enabled asks for cuts; a cut is optional (a failed or skipped one only
	// costs regeneration), so turning this off never breaks a checkpoint.
	Enabled bool `mapstructure:"enabled"`
	// ControlAuthToken is the bearer the worker's cut route requires; empty
	// disables cuts.
	ControlAuthToken string `mapstructure:"control_auth_token"`
	// InventoryCalls is the most calls one inventory lists (0:
	// DefaultInventoryCalls, at most gencut.MaxActive). A worker holding
	// more is sent several, two at a time, instead of one it would refuse.
	InventoryCalls int `mapstructure:"inventory_calls"`
}

// DefaultInventoryCalls is GenerationCutsConfig.InventoryCalls' default,
// the most our workers take in one request: up to it a worker gets one
// inventory, as NeMo Gym's model server sends. Smaller parts gave a
// prepare no shorter (docs/scale-log.md), so they are not the default.
const DefaultInventoryCalls = gencut.MaxActive

// inventoryCalls is the configured bound, or its default.
func (g GenerationCutsConfig) inventoryCalls() int {
	if g.InventoryCalls <= 0 {
		return DefaultInventoryCalls
	}
	return g.InventoryCalls
}

// UpstreamConfig names the OpenAI-compatible inference endpoint (vLLM or
// fakeinference) the server calls.
type UpstreamConfig struct {
	// BaseURL ends in /v1: chat completions go to <base_url>/chat/completions.
	// Empty (with BaseURLs empty too) means DefaultUpstreamBaseURL.
	BaseURL string `mapstructure:"base_url"`
	// BaseURLs lists several inference workers instead of BaseURL (set one
	// of the two): calls are balanced by outstanding calls, a rollout's
	// calls stay on one worker while it is healthy (picker.go), and
	// generation cuts are asked of every worker holding calls.
	BaseURLs []string `mapstructure:"base_urls"`
	// APIKey is sent as a bearer token when set.
	APIKey string `mapstructure:"api_key"`
	// Model is the model every call is made with, whatever the client named.
	Model string `mapstructure:"model"`
	// Protocol is how the upstream is spoken to: auto (the default) finds
	// it out with a GET of <base_url>/models, h2c first, then HTTP/1.1, at
	// the first model call or readiness check; h2c is HTTP/2 without TLS
	// (fakeinference, our own servers); http1 is HTTP/1.1 (every vLLM) or
	// HTTPS.
	Protocol string `mapstructure:"protocol"`
	// H2C true is the older spelling of protocol: h2c.
	H2C bool `mapstructure:"h2c"`
	// MaxConnsPerHost bounds HTTP/1.1 connections; 0 means 1024.
	MaxConnsPerHost int `mapstructure:"max_conns_per_host"`
	// ExtraBody is a JSON object text of fields merged under every upstream
	// request (NeMo Gym's extra_body): a request's own field wins, and a
	// row's metadata.extra_body updates it. A text, not a map: viper would
	// lower-case a map's keys.
	ExtraBody string `mapstructure:"extra_body"`
	// ChatTemplateKwargs is a JSON object text sent as chat_template_kwargs,
	// updated by a row's metadata.chat_template_kwargs (NeMo Gym's
	// chat_template_kwargs).
	ChatTemplateKwargs string `mapstructure:"chat_template_kwargs"`
	// ForwardRequestChatTemplateKwargs merges a chat request's own
	// chat_template_kwargs over ChatTemplateKwargs (and under a row's
	// metadata.chat_template_kwargs); off, they are dropped, as NeMo Gym's
	// vllm_model drops them unless its forward_request_chat_template_kwargs
	// is on (nemo-gym 0.7.0).
	ForwardRequestChatTemplateKwargs bool `mapstructure:"forward_request_chat_template_kwargs"`
}

// CaptureConfig configures token capture.
type CaptureConfig struct {
	// Dir holds the capture ledger (pkg/tokencapture).
	Dir string `mapstructure:"dir"`
	// ControlAuthToken guards the ledger routes (/capture/...) with a
	// bearer token; empty leaves them open.
	ControlAuthToken string `mapstructure:"control_auth_token"`
}

// DefaultConfig returns the defaults of every field.
func DefaultConfig() Config {
	return Config{
		Listen:   DefaultListen,
		Name:     DefaultName,
		LogLevel: "info",
		Upstream: UpstreamConfig{
			Model:    DefaultUpstreamModel,
			Protocol: ProtocolAuto,
		},
		ReturnTokenIDs: true,
		Capture:        CaptureConfig{Dir: DefaultCaptureDir},
		Checkpoint:     ctlplane.DefaultConfig(),
		GenerationCuts: GenerationCutsConfig{Enabled: true},
	}
}

// protocol is the protocol the configuration asks for: h2c, http1 or auto.
func (u UpstreamConfig) protocol() string {
	switch {
	case u.H2C:
		return ProtocolH2C
	case u.Protocol == "":
		if u.https() {
			return ProtocolHTTP1
		}
		return ProtocolAuto
	case u.Protocol == ProtocolAuto && u.https():
		// TLS negotiates its protocol itself.
		return ProtocolHTTP1
	}
	return u.Protocol
}

// https reports whether the first worker is spoken to over TLS (all
// workers share one protocol).
func (u UpstreamConfig) https() bool {
	return strings.HasPrefix(u.Workers()[0], "https:")
}

// cutsOn reports whether generation cuts are asked for.
func (c Config) cutsOn() bool {
	return c.Checkpoint.Enabled && c.GenerationCuts.Enabled && c.GenerationCuts.ControlAuthToken != ""
}

// Workers are the inference workers' base URLs, without trailing slashes:
// upstream.base_urls, or upstream.base_url alone.
func (u UpstreamConfig) Workers() []string {
	list := u.BaseURLs
	switch {
	case len(list) > 0:
	case u.BaseURL == "":
		list = []string{DefaultUpstreamBaseURL}
	default:
		list = []string{u.BaseURL}
	}
	out := make([]string, len(list))
	for i, b := range list {
		out[i] = strings.TrimRight(b, "/")
	}
	return out
}

// workerRoot is an inference worker's root URL: its base URL without a
// trailing /v1.
func workerRoot(base string) string {
	return strings.TrimSuffix(strings.TrimRight(base, "/"), "/v1")
}

// maxWorkers bounds upstream.base_urls (each is a metric label value).
const maxWorkers = 64

// validateURLs checks upstream.base_url and upstream.base_urls: exactly
// one is set, every URL is absolute http(s), none repeats.
func (u UpstreamConfig) validateURLs() []error {
	valid := func(s string) bool {
		p, err := url.Parse(s)
		return err == nil && (p.Scheme == "http" || p.Scheme == "https") && p.Host != ""
	}
	if len(u.BaseURLs) == 0 {
		if u.BaseURL != "" && !valid(u.BaseURL) {
			return []error{fmt.Errorf("upstream.base_url %q must be an absolute http(s) URL such as http://127.0.0.1:18000/v1", u.BaseURL)}
		}
		return nil
	}
	var errs []error
	if u.BaseURL != "" {
		errs = append(errs, errors.New("upstream.base_url and upstream.base_urls are exclusive: list every worker in upstream.base_urls"))
	}
	if len(u.BaseURLs) > maxWorkers {
		errs = append(errs, fmt.Errorf("upstream.base_urls holds %d workers, more than %d", len(u.BaseURLs), maxWorkers))
	}
	seen := make(map[string]bool, len(u.BaseURLs))
	for i, b := range u.BaseURLs {
		if !valid(b) {
			errs = append(errs, fmt.Errorf("upstream.base_urls[%d] %q must be an absolute http(s) URL such as http://127.0.0.1:18000/v1", i, b))
		}
		k := strings.TrimRight(b, "/")
		if seen[k] {
			errs = append(errs, fmt.Errorf("upstream.base_urls[%d] %q is listed twice", i, b))
		}
		seen[k] = true
	}
	return errs
}

// Validate reports every invalid field at once.
func (c Config) Validate() error {
	var errs []error
	if strings.TrimSpace(c.Listen) == "" {
		errs = append(errs, errors.New("listen must be host:port"))
	}
	if !rollout.ValidID(c.Name) {
		errs = append(errs, fmt.Errorf("name %q must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", c.Name))
	}
	if c.LogLevel != "" {
		if _, err := logging.ParseLevel(c.LogLevel); err != nil {
			errs = append(errs, fmt.Errorf("log_level: %w", err))
		}
	}
	if err := c.Runtime.Validate(); err != nil {
		return err
	}
	if err := c.HTTP.Validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.Upstream.validateURLs()...)
	switch c.Upstream.Protocol {
	case "", ProtocolAuto, ProtocolH2C, ProtocolHTTP1:
	default:
		errs = append(errs, fmt.Errorf("upstream.protocol %q must be auto, h2c or http1", c.Upstream.Protocol))
	}
	if c.Upstream.H2C && c.Upstream.Protocol == ProtocolHTTP1 {
		errs = append(errs, errors.New("upstream.h2c: true contradicts upstream.protocol: http1; drop upstream.h2c"))
	}
	if strings.TrimSpace(c.Upstream.Model) == "" {
		errs = append(errs, errors.New("upstream.model must not be empty"))
	}
	if _, err := parseObject(c.Upstream.ExtraBody); err != nil {
		errs = append(errs, fmt.Errorf("upstream.extra_body: %w", err))
	}
	if _, err := parseObject(c.Upstream.ChatTemplateKwargs); err != nil {
		errs = append(errs, fmt.Errorf("upstream.chat_template_kwargs: %w", err))
	}
	if c.Upstream.MaxConnsPerHost < 0 {
		errs = append(errs, fmt.Errorf("upstream.max_conns_per_host must be >= 0, got %d", c.Upstream.MaxConnsPerHost))
	}
	if strings.TrimSpace(c.Capture.Dir) == "" {
		errs = append(errs, errors.New("capture.dir must not be empty"))
	}
	if n := c.GenerationCuts.InventoryCalls; n < 0 || n > gencut.MaxActive {
		errs = append(errs, fmt.Errorf("generation_cuts.inventory_calls must be 0 (the default) to %d, got %d", gencut.MaxActive, n))
	}
	if err := c.Checkpoint.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
