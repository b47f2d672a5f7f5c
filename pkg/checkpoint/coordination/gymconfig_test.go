package coordination_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
)

var wantGymEndpoints = []coordination.Endpoint{
	{Name: "counter_env", URL: "http://127.0.0.1:7101"},
	{Name: "policy_model", URL: "http://127.0.0.1:7102"},
	{Name: "simple_agent", URL: "http://localhost:7103"},
	{Name: "counter", URL: "http://127.0.0.1:7104"},
}

// TestEndpointsFromGymConfig: the servers of a Gym global config are its
// entries holding a server type, each at the host and port of its first
// implementation, in the config's order; settings are not servers.
func TestEndpointsFromGymConfig(t *testing.T) {
	doc, err := os.ReadFile("testdata/gym_global_config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got, err := coordination.EndpointsFromGymConfig(doc)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, wantGymEndpoints) {
		t.Fatalf("endpoints = %v, want %v", got, wantGymEndpoints)
	}
	for _, bad := range []string{
		"head_server: {host: h, port: 1}\n",
		"a:\n  resources_servers:\n    x: {host: h}\n",
		"a:\n  resources_servers:\n    x: {host: h, port: nope}\n",
		"a:\n  resources_servers: {}\n",
		"- not a mapping\n",
	} {
		if eps, err := coordination.EndpointsFromGymConfig([]byte(bad)); err == nil {
			t.Errorf("%q read as %v, want an error", bad, eps)
		}
	}
}

// TestFetchGymConfig: the head server's /global_config_dict_yaml is a JSON
// string holding the YAML (FastAPI's encoding of the str the route
// returns), read as ServerClient.load_from_global_config reads it.
func TestFetchGymConfig(t *testing.T) {
	doc, err := os.ReadFile("testdata/gym_global_config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	head := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != coordination.GymConfigRoute {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(string(doc))
	}))
	defer head.Close()
	got, err := coordination.FetchGymConfig(context.Background(), nil, head.URL)
	if err != nil {
		t.Fatal(err)
	}
	eps, err := coordination.EndpointsFromGymConfig(got)
	if err != nil || !reflect.DeepEqual(eps, wantGymEndpoints) {
		t.Fatalf("endpoints = %v (%v), want %v", eps, err, wantGymEndpoints)
	}
}

// TestGymCheckpointToken: the token of a Gym config's checkpoint: block,
// as Gym's settings.py reads it (7f40a593c741): none when the block is
// absent or off, an error when it is on without one.
func TestGymCheckpointToken(t *testing.T) {
	for _, c := range []struct{ doc, want, err string }{
		{"a: 1\n", "", ""},
		{"checkpoint: {enabled: false, control_auth_token: t}\n", "", ""},
		{"checkpoint: {enabled: true, control_auth_token: tok}\nx: {resources_servers: {}}\n", "tok", ""},
		{"checkpoint: {enabled: true}\n", "", "control_auth_token is required"},
	} {
		got, err := coordination.GymCheckpointToken([]byte(c.doc))
		if got != c.want || (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%q: %q, %v; want %q, %q", c.doc, got, err, c.want, c.err)
		}
	}
}
