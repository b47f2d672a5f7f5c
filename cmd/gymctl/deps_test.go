package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The CLI is a controller: it speaks the control API through its wire
// contracts (pkg/wire/control, fiwire) and links no server, router or metrics
// server code (issue 34).
func TestLinksNoServerCode(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is needed to list gymctl's dependencies: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	forbidden := []string{
		"github.com/gymfleet/gymfleet/pkg/ctlplane",
		"github.com/gymfleet/gymfleet/pkg/servers/fakeinference",
		"github.com/gymfleet/gymfleet/pkg/transport/httpserver",
		"github.com/gymfleet/gymfleet/pkg/transport/h2server",
		"github.com/gymfleet/gymfleet/cmd/internal/lifecycle",
		"github.com/go-chi/chi/v5",
		"github.com/prometheus/client_golang/prometheus",
	}
	for _, d := range deps {
		for _, f := range forbidden {
			if d == f {
				t.Errorf("gymctl links %s", d)
			}
		}
	}
	if !strings.Contains(string(out), "github.com/gymfleet/gymfleet/pkg/wire/control\n") {
		t.Errorf("gymctl does not link pkg/wire/control: is this list right?\n%s", out)
	}
}
