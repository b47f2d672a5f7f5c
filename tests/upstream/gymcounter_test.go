package upstream_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/rollout"
)

// gymCounterCookie is the session cookie's name: NeMo Gym names it after the
// server class and instance (server_utils.py get_session_middleware_key,
// 551-555).
const gymCounterCookie = "StatefulCounterResourcesServer___counter"

// gymCounter stands in for NeMo Gym's example_session_state_mgmt resources
// server (resources_servers/example_session_state_mgmt/app.py 35-95 at
// 07d6b0d07b22) behind Starlette's SessionMiddleware as Gym installs it
// (server_utils.py 557-577): the session lives only in a cookie, a request
// without one starts a new session, and every reply sets the cookie again.
// It lets the corpus check that our environment and agent carry a Gym
// resources server's cookies.
type gymCounter struct {
	srv      *httptest.Server
	mu       sync.Mutex
	next     int
	counters map[string]int
}

func newGymCounter(t *testing.T) *gymCounter {
	g := &gymCounter{counters: map[string]int{}}
	g.srv = httptest.NewServer(http.HandlerFunc(g.serve))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *gymCounter) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var in map[string]any
	_ = json.Unmarshal(body, &in)

	g.mu.Lock()
	defer g.mu.Unlock()
	sid := ""
	if c, err := r.Cookie(gymCounterCookie); err == nil {
		sid = c.Value
	}
	if sid == "" {
		g.next++
		sid = "session-" + strconv.Itoa(g.next)
	}
	http.SetCookie(w, &http.Cookie{Name: gymCounterCookie, Value: sid, Path: "/", HttpOnly: true, SameSite: http.SameSiteLaxMode})

	num := func(k string) (int, bool) {
		f, ok := in[k].(float64)
		return int(f), ok
	}
	var out any
	// RolloutContextMiddleware strips /ng-rollout/<id> on Gym's resources
	// servers (base_resources_server.py, rollout_correlation.py).
	_, path, _ := rollout.SplitPath(r.URL.Path)
	switch path {
	case "/seed_session":
		n, ok := num("initial_count")
		if !ok {
			http.Error(w, `{"detail":"initial_count is required"}`, http.StatusUnprocessableEntity)
			return
		}
		if _, seeded := g.counters[sid]; !seeded {
			g.counters[sid] = n
		}
		out = map[string]any{}
	case "/increment_counter":
		n, ok := num("count")
		if !ok {
			http.Error(w, `{"detail":"count is required"}`, http.StatusUnprocessableEntity)
			return
		}
		g.counters[sid] += n
		out = map[string]any{"success": true}
	case "/get_counter_value":
		out = map[string]any{"count": g.counters[sid]}
	case "/verify":
		want, ok := num("expected_count")
		if !ok {
			http.Error(w, `{"detail":"expected_count is required"}`, http.StatusUnprocessableEntity)
			return
		}
		reward := 0.0
		if n, seeded := g.counters[sid]; seeded && n == want {
			reward = 1.0
		}
		// BaseVerifyResponse(**body.model_dump(), reward=...) keeps only
		// its own fields.
		out = map[string]any{"responses_create_params": in["responses_create_params"], "response": in["response"], "reward": reward}
	default:
		http.Error(w, `{"detail":"Not Found"}`, http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
