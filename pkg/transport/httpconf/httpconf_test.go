package httpconf_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf/tlstest"
)

func TestValidate(t *testing.T) {
	f := tlstest.New(t)
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pem")
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  httpconf.Config
		// wantErr is a part of the error, or "" for none.
		wantErr string
	}{
		{"zero value is lean without TLS", httpconf.Config{}, ""},
		{"nethttp", httpconf.Config{Stack: httpconf.StackNetHTTP}, ""},
		{"unknown stack", httpconf.Config{Stack: "quic"}, "http.stack"},
		{"cert without key", httpconf.Config{TLS: httpconf.TLS{CertFile: f.Cert}}, "together"},
		{"key without cert", httpconf.Config{TLS: httpconf.TLS{KeyFile: f.Key}}, "together"},
		{"cert and key", httpconf.Config{TLS: httpconf.TLS{CertFile: f.Cert, KeyFile: f.Key}}, ""},
		{"CA only (a client)", httpconf.Config{TLS: httpconf.TLS{CAFile: f.CA}}, ""},
		{"missing cert", httpconf.Config{TLS: httpconf.TLS{CertFile: missing, KeyFile: f.Key}}, "http.tls.cert_file"},
		{"missing key", httpconf.Config{TLS: httpconf.TLS{CertFile: f.Cert, KeyFile: missing}}, "http.tls.key_file"},
		{"key not matching", httpconf.Config{TLS: httpconf.TLS{CertFile: f.Cert, KeyFile: garbage}}, "http.tls.cert_file"},
		{"missing CA", httpconf.Config{TLS: httpconf.TLS{CAFile: missing}}, "http.tls.ca_file"},
		{"CA without a certificate", httpconf.Config{TLS: httpconf.TLS{CAFile: garbage}}, "http.tls.ca_file"},
	} {
		err := tc.cfg.Validate()
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s: Validate() = %v, want nil", tc.name, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: Validate() = %v, want an error naming %q", tc.name, err, tc.wantErr)
		}
	}
	if got := (httpconf.Config{}).EffectiveStack(); got != httpconf.StackLean {
		t.Errorf("default stack = %q, want lean", got)
	}
}

func TestTLSConfigs(t *testing.T) {
	f := tlstest.New(t)
	srv, err := f.Server().ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	if len(srv.Certificates) != 1 || strings.Join(srv.NextProtos, ",") != "h2,http/1.1" {
		t.Errorf("server config: %d certificates, ALPN %v; want 1, [h2 http/1.1]", len(srv.Certificates), srv.NextProtos)
	}
	cli, err := f.Client().ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cli.RootCAs == nil {
		t.Error("client config with a CA file has no roots")
	}
	sys, err := httpconf.TLS{}.ClientConfig()
	if err != nil || sys.RootCAs != nil {
		t.Errorf("client config without a CA file: roots %v, err %v; want the system's (nil)", sys.RootCAs, err)
	}
}
