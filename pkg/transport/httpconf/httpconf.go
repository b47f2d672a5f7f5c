// Package httpconf is the `http:` section of every process's configuration:
// which HTTP stack a process speaks (our lean HTTP/2 or net/http's own) and
// its TLS settings for fleets spread over hosts. It is plain data shared by
// pkg/transport/httpserver (listeners) and pkg/transport/httpclient (peers), so both sides of a
// call are configured by one value.
package httpconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// Stack names an HTTP implementation.
type Stack string

const (
	// StackLean is the fleet's own HTTP/2 (pkg/transport/h2server, pkg/transport/h2client) next
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

// Validate checks the section's values and that its TLS files can be
// read and parsed, so that a process refuses to start with an error naming
// the key rather than failing its first handshake.
func (c Config) Validate() error {
	switch c.EffectiveStack() {
	case StackLean, StackNetHTTP:
	default:
		return fmt.Errorf("http.stack %q: want %q or %q", c.Stack, StackLean, StackNetHTTP)
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		return errors.New("http.tls: cert_file and key_file are set together or not at all")
	}
	if c.TLS.Serving() {
		if _, err := c.TLS.ServerConfig(); err != nil {
			return err
		}
	}
	if c.TLS.CAFile != "" {
		if _, err := c.TLS.roots(); err != nil {
			return err
		}
	}
	return nil
}

// ALPN protocol names a TLS listener offers, HTTP/2 first (RFC 7301, RFC
// 9113 §3.2).
const (
	ALPNHTTP2  = "h2"
	ALPNHTTP11 = "http/1.1"
)

// ServerConfig loads the listener's certificate and key into a TLS
// configuration offering HTTP/2 and HTTP/1.1 by ALPN. Errors name the key
// whose file could not be used.
func (t TLS) ServerConfig() (*tls.Config, error) {
	for _, f := range []struct{ key, path string }{{"http.tls.cert_file", t.CertFile}, {"http.tls.key_file", t.KeyFile}} {
		if _, err := os.Stat(f.path); err != nil {
			return nil, fmt.Errorf("%s: %w", f.key, err)
		}
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("http.tls.cert_file %s and key_file %s: %w", t.CertFile, t.KeyFile, err)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{ALPNHTTP2, ALPNHTTP11},
	}, nil
}

// ClientConfig is the TLS configuration clients verify https:// peers
// with: the CA file's roots, or the system's when it is empty. It offers
// HTTP/2 and HTTP/1.1 by ALPN; a client speaking only HTTP/1.1 narrows
// NextProtos.
func (t TLS) ClientConfig() (*tls.Config, error) {
	roots, err := t.roots()
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		RootCAs:    roots,
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{ALPNHTTP2, ALPNHTTP11},
	}, nil
}

// roots is the pool of CAFile's certificates; nil (the system's) when
// CAFile is empty.
func (t TLS) roots() (*x509.CertPool, error) {
	if t.CAFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(t.CAFile)
	if err != nil {
		return nil, fmt.Errorf("http.tls.ca_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("http.tls.ca_file %s: no PEM certificate in it", t.CAFile)
	}
	return pool, nil
}
