package fakeinference

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/infra/logging"
	"github.com/gymfleet/gymfleet/pkg/infra/runtimetune"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

// Defaults for Config.
const (
	DefaultListen           = "127.0.0.1:18000"
	DefaultModel            = "fake-model"
	DefaultTokensPerSecond  = 2000
	DefaultMinCallSeconds   = 0.002
	DefaultMaxContextTokens = 32768
	DefaultVocabSize        = 32000
)

// Config configures the fake inference server.
type Config struct {
	// Listen is host:port; port 0 picks a free one.
	Listen string `mapstructure:"listen"`
	// LogLevel is read by cmd/fakeinference only (debug, info, warn, error).
	LogLevel string `mapstructure:"log_level"`
	// Model is the one model name served (GET /v1/models, replies' model).
	Model string `mapstructure:"model"`
	// TokensPerSecond paces generation; 0 means no per-token delay.
	TokensPerSecond float64 `mapstructure:"tokens_per_second"`
	// MinCallSeconds is the least time a generation takes, however short.
	MinCallSeconds float64 `mapstructure:"min_call_seconds"`
	// MaxContextTokens is the context length: prompt plus max_tokens beyond
	// it is refused as vLLM refuses it.
	MaxContextTokens int `mapstructure:"max_context_tokens"`
	// VocabSize bounds token ids; ids below FirstTextTokenID are special.
	VocabSize int `mapstructure:"vocab_size"`
	// Script is the default policy script as JSON text (see Script); empty
	// means the policy derived from the conversation.
	Script string `mapstructure:"script"`
	// ControlAuthToken is the bearer POST /ng-control/v1/generation-cut requires.
	// Empty disables generation cuts: the route then refuses every call
	// with 401, so an unconfigured server can never be made to cut.
	ControlAuthToken string `mapstructure:"control_auth_token"`
	// Pprof serves net/http/pprof under /debug/pprof/ (off by default).
	Pprof bool `mapstructure:"pprof"`
	// HTTP is the http: section: the HTTP stack (lean or nethttp) and TLS
	// of the server's listener.
	HTTP httpconf.Config `mapstructure:"http"`
	// Runtime is the runtime: section: whether the process steers the Go
	// runtime (pkg/infra/runtimetune).
	Runtime runtimetune.Config `mapstructure:"runtime"`
}

// DefaultConfig returns the defaults of every field.
func DefaultConfig() Config {
	return Config{
		Listen:           DefaultListen,
		LogLevel:         "info",
		Model:            DefaultModel,
		TokensPerSecond:  DefaultTokensPerSecond,
		MinCallSeconds:   DefaultMinCallSeconds,
		MaxContextTokens: DefaultMaxContextTokens,
		VocabSize:        DefaultVocabSize,
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
	if err := c.Runtime.Validate(); err != nil {
		return err
	}
	if err := c.HTTP.Validate(); err != nil {
		errs = append(errs, err)
	}
	if strings.TrimSpace(c.Model) == "" {
		errs = append(errs, errors.New("model must not be empty"))
	}
	if c.TokensPerSecond < 0 {
		errs = append(errs, fmt.Errorf("tokens_per_second must be >= 0, got %v", c.TokensPerSecond))
	}
	if c.MinCallSeconds < 0 || c.MinCallSeconds > 3600 {
		errs = append(errs, fmt.Errorf("min_call_seconds must be in [0, 3600], got %v", c.MinCallSeconds))
	}
	if c.MaxContextTokens < 16 {
		errs = append(errs, fmt.Errorf("max_context_tokens must be >= 16, got %d", c.MaxContextTokens))
	}
	if c.VocabSize < MinVocabSize {
		errs = append(errs, fmt.Errorf("vocab_size must be >= %d, got %d", MinVocabSize, c.VocabSize))
	}
	if c.Script != "" {
		if _, err := ParseScript(c.Script); err != nil {
			errs = append(errs, fmt.Errorf("script: %w", err))
		}
	}
	return errors.Join(errs...)
}
