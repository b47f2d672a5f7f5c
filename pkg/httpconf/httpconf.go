// Package httpconf is the `http:` section of every process's configuration:
// which HTTP stack a process speaks (our lean HTTP/2 or net/http's own) and
// its TLS settings for fleets spread over hosts. It is plain data shared by
// pkg/httpserver (listeners) and pkg/httpclient (peers), so both sides of a
// call are configured by one value.
package httpconf

import (
	"errors"
	"fmt"
)

// Stack names an HTTP implementation.
type Stack string

const (
	// StackLean is the fleet's own HTTP/2 (pkg/h2server, pkg/h2client) next
	// to net/http's HTTP/1.1. It is the default.
	StackLean Stack = "lean"
	// StackNetHTTP is net/http's server and transport for both HTTP/1.1
	// and HTTP/2: the baseline the lean stack is measured against.
	StackNetHTTP Stack = "nethttp"
)

// Config is the `http:` section.
type Config struct {
	// Stack is lean (default) or nethttp; empty means lean.
	Stack Stack `mapstructure:"stack"`
	// TLS serves and verifies TLS; all fields empty means plain h2c and
	// HTTP/1.1, the default on one host.
	TLS TLS `mapstructure:"tls"`
}

// TLS is the `http.tls` section.
type TLS struct {
	// CertFile and KeyFile are the listener's PEM certificate chain and key;
	// set both to serve TLS (HTTP/2 by ALPN, HTTP/1.1 otherwise).
	CertFile string `mapstructure:"cert_file"`
	KeyFile  string `mapstructure:"key_file"`
	// CAFile is a PEM bundle the process's clients verify https:// peers
	// against; empty means the system's roots.
	CAFile string `mapstructure:"ca_file"`
}

// Serving reports whether the listener serves TLS.
func (t TLS) Serving() bool { return t.CertFile != "" || t.KeyFile != "" }

// EffectiveStack is Stack with the default applied.
func (c Config) EffectiveStack() Stack {
	if c.Stack == "" {
		return StackLean
	}
	return c.Stack
}

// Validate checks the section's values (not that the files exist: the
// server reports an unreadable file when it loads it).
func (c Config) Validate() error {
	switch c.EffectiveStack() {
	case StackLean, StackNetHTTP:
	default:
		return fmt.Errorf("http.stack %q: want %q or %q", c.Stack, StackLean, StackNetHTTP)
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		return errors.New("http.tls: cert_file and key_file are set together or not at all")
	}
	return nil
}
