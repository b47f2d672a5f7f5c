package main

import (
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/fleet"
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
