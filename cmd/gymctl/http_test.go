package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf/tlstest"
)

// gymctl's clients speak the fleet file's http.stack, else the one
// GYMFLEET_HTTP_STACK names, else lean.
func TestFleetHTTP(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "GYMFLEET_HTTP_STACK" {
				return v
			}
			return ""
		}
	}
	for _, tc := range []struct {
		name  string
		cfg   *fleet.Config
		env   string
		want  string
		error bool
	}{
		{"nothing set", nil, "", "lean", false},
		{"the environment", nil, "nethttp", "nethttp", false},
		{"a fleet file without a stack", &fleet.Config{}, "nethttp", "nethttp", false},
		{"the fleet file wins", &fleet.Config{HTTP: fleet.HTTP{Stack: "lean"}}, "nethttp", "lean", false},
		{"an unknown stack", nil, "quic", "", true},
	} {
		hc, err := fleetHTTP(tc.cfg, env(tc.env))
		switch {
		case tc.error:
			if err == nil || !strings.Contains(err.Error(), "GYMFLEET_HTTP_STACK") {
				t.Errorf("%s: err %v, want one naming GYMFLEET_HTTP_STACK", tc.name, err)
			}
		case err != nil || string(hc.EffectiveStack()) != tc.want:
			t.Errorf("%s: %q, %v; want %s", tc.name, hc.Stack, err, tc.want)
		}
	}
}

// gymctl's clients verify https:// endpoints against the fleet file's
// http.tls.ca_file (relative to its directory), else the one
// GYMFLEET_HTTP_TLS_CA_FILE names; a missing one is an error naming it.
func TestFleetHTTP_CAFile(t *testing.T) {
	files := tlstest.New(t)
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "GYMFLEET_HTTP_TLS_CA_FILE" {
				return v
			}
			return ""
		}
	}
	dir, name := filepath.Split(files.CA)
	for _, tc := range []struct {
		name string
		cfg  *fleet.Config
		env  string
		want string
	}{
		{"nothing set", nil, "", ""},
		{"the environment", nil, files.CA, files.CA},
		{"the fleet file, relative", &fleet.Config{BaseDir: dir, HTTP: fleet.HTTP{TLS: fleet.TLS{CAFile: name}}}, "/elsewhere.pem", files.CA},
	} {
		hc, err := fleetHTTP(tc.cfg, env(tc.env))
		if err != nil || hc.TLS.CAFile != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.name, hc.TLS.CAFile, err, tc.want)
		}
	}
	if _, err := fleetHTTP(nil, env(files.CA+".missing")); err == nil || !strings.Contains(err.Error(), "GYMFLEET_HTTP_TLS_CA_FILE") {
		t.Errorf("a missing CA file: %v, want an error naming GYMFLEET_HTTP_TLS_CA_FILE", err)
	}
}
