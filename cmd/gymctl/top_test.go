package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
)

// Ensure top shows each server's in-flight count, requests per second
// between two frames and checkpoint phase, and an unreachable server as
// such.
func TestTop_Frames(t *testing.T) {
	var requests atomic.Int64
	requests.Store(100)
	env := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "# TYPE gymfleet_rollouts_in_flight gauge\ngymfleet_rollouts_in_flight 7\n"+
			"# TYPE gymfleet_http_requests_total counter\ngymfleet_http_requests_total{route=\"/run\",method=\"POST\",code=\"200\"} %d\n"+
			"# TYPE gymfleet_ckpt_phase gauge\ngymfleet_ckpt_phase 1\n"+
			"# TYPE gymfleet_ckpt_operations_total counter\ngymfleet_ckpt_operations_total{op=\"prepare\",outcome=\"ok\"} 2\n", requests.Load())
	}))
	defer env.Close()
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	client := httpclient.New(httpclient.Options{})
	defer client.CloseIdleConnections()
	tp := newTop([]fleet.Endpoint{{Name: "env", Kind: "environment", URL: env.URL}, {Name: "gone", Kind: "model", URL: down.URL}}, client)

	first := string(tp.frame(context.Background()))
	row := func(frame, name string) string {
		for _, l := range strings.Split(frame, "\n") {
			if strings.HasPrefix(l, name+" ") {
				return strings.Join(strings.Fields(l), " ")
			}
		}
		return ""
	}
	if got := row(first, "env"); got != "env environment 7 - preparing 2" {
		t.Errorf("first env row: %q\n%s", got, first)
	}
	if got := row(first, "gone"); got != "gone model unreachable - - -" {
		t.Errorf("unreachable row: %q", got)
	}
	requests.Add(50)
	second := string(tp.frame(context.Background()))
	fields := strings.Fields(row(second, "env"))
	if len(fields) != 6 || fields[3] == "-" || fields[3] == "0.0" {
		t.Errorf("no request rate in the second frame: %q", fields)
	}
	if !strings.Contains(second, "rollouts in flight (environments): 7") {
		t.Errorf("no totals line:\n%s", second)
	}
}
