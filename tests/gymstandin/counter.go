package gymstandin

import (
	"encoding/json"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// CounterName is the config name of Gym's example counter server
// (resources_servers/example_session_state_mgmt/configs).
const CounterName = "example_session_state_mgmt_resources_server"

// CounterCookie is the session cookie of a counter server named
// CounterName: Gym names the cookie after the server's class and config
// name (get_session_middleware_key, nemo_gym/server_utils.py 551-555).
const CounterCookie = counterClass + "___" + CounterName

const counterClass = "StatefulCounterResourcesServer"

// CounterOptions shape a Counter.
type CounterOptions struct {
	// Name is the server's config name, which names its cookie ("":
	// CounterName).
	Name string
}

// Counter keeps sessions as Gym's StatefulCounterResourcesServer does: the
// session is its cookie alone (X-Ng-Session-Id means nothing to it); a
// request without the cookie starts a new session; every reply sets the
// cookie again, its value re-signed (here "<session id>.<n>", n counting
// replies, as Starlette's timestamp signature changes it); a missing or
// non-integer field is FastAPI's 422; /close_session takes nemo-gym 0.7.0's
// ResourcesCloseSessionRequest {resources_session_id, episode_id} (422 for
// anything else, {} included) and, the counter not overriding it, answers
// {resources_session_id} and keeps the count (Gym 07d6b0d had no such route).
// It records every request for the tests to read.
type Counter struct {
	// URL is set by StartCounter; a Counter served otherwise has none.
	URL string
	// Cookie is the session cookie's name.
	Cookie string

	mu       sync.Mutex
	counters map[string]int
	started  int
	signed   int
	log      []string
	// closes counts /close_session calls taken and refused.
	closes, refusedCloses int
}

// NewCounter returns a Counter to serve as the test likes (it is an
// http.Handler); StartCounter serves one as uvicorn does.
func NewCounter(opts CounterOptions) *Counter {
	name := opts.Name
	if name == "" {
		name = CounterName
	}
	return &Counter{Cookie: counterClass + "___" + name, counters: map[string]int{}}
}

// StartCounter serves a new Counter over HTTP/1.1 only, as Gym's uvicorn
// does (StartUvicorn), until the test ends.
func StartCounter(t testing.TB, opts CounterOptions) *Counter {
	t.Helper()
	c := NewCounter(opts)
	c.URL = StartUvicorn(t, c).URL
	return c
}

func (c *Counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	// RolloutContextMiddleware strips the /ng-rollout/<id> prefix.
	_, path, _ := rollout.SplitPath(r.URL.Path)
	c.mu.Lock()
	defer c.mu.Unlock()
	sid, seen := "", "new"
	if ck, err := r.Cookie(c.Cookie); err == nil {
		if id, _, ok := strings.Cut(ck.Value, "."); ok && id != "" {
			sid, seen = id, id
		}
	}
	if sid == "" {
		c.started++
		sid = "s" + strconv.Itoa(c.started)
	}
	c.log = append(c.log, path+" session="+seen)
	c.signed++
	// Starlette's SessionMiddleware defaults: 14 days, httponly, lax.
	http.SetCookie(w, &http.Cookie{Name: c.Cookie, Value: sid + "." + strconv.Itoa(c.signed), Path: "/", MaxAge: 1209600, HttpOnly: true, SameSite: http.SameSiteLaxMode})
	w.Header().Set("Content-Type", "application/json")
	var in map[string]json.RawMessage
	_ = json.Unmarshal(body, &in)
	need := func(k string) (int, bool) {
		var f float64
		if err := json.Unmarshal(in[k], &f); err != nil || f != math.Trunc(f) {
			w.WriteHeader(http.StatusUnprocessableEntity)
			io.WriteString(w, `{"detail":"`+k+` must be an integer"}`)
			return 0, false
		}
		return int(f), true
	}
	switch path {
	case "/seed_session":
		n, ok := need("initial_count")
		if !ok {
			return
		}
		if _, seeded := c.counters[sid]; !seeded {
			c.counters[sid] = n
		}
		io.WriteString(w, `{}`)
	case "/increment_counter":
		n, ok := need("count")
		if !ok {
			return
		}
		c.counters[sid] += n
		io.WriteString(w, `{"success":true}`)
	case "/get_counter_value":
		n := c.counters[sid] // setdefault(session_id, 0), as Gym's does
		c.counters[sid] = n
		io.WriteString(w, `{"count":`+strconv.Itoa(n)+`}`)
	case "/verify":
		want, ok := need("expected_count")
		if !ok {
			return
		}
		reward := "0.0"
		if n, seeded := c.counters[sid]; seeded && n == want {
			reward = "1.0"
		}
		if in["responses_create_params"] == nil || in["response"] == nil {
			w.WriteHeader(http.StatusUnprocessableEntity)
			io.WriteString(w, `{"detail":"responses_create_params and response are required"}`)
			return
		}
		// BaseVerifyResponse(**body.model_dump(), reward=...) keeps only
		// its own fields.
		out, _ := json.Marshal(map[string]json.RawMessage{
			"responses_create_params": in["responses_create_params"],
			"response":                in["response"],
			"reward":                  json.RawMessage(reward),
		})
		w.Write(out)
	case "/close_session":
		// SimpleResourcesServer.close_resources_session (nemo-gym 0.7.0,
		// nemo_gym/base_resources_server.py): extra="forbid", both fields
		// required, episode_id an EpisodeId.
		var req struct {
			ResourcesSessionID *string `json:"resources_session_id"`
			EpisodeID          *struct {
				RolloutID string `json:"rollout_id"`
				Attempt   *int   `json:"attempt"`
			} `json:"episode_id"`
		}
		dec := json.NewDecoder(strings.NewReader(string(body)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil || req.ResourcesSessionID == nil || req.EpisodeID == nil ||
			!rollout.ValidID(req.EpisodeID.RolloutID) || (req.EpisodeID.Attempt != nil && *req.EpisodeID.Attempt < 0) {
			c.refusedCloses++
			w.WriteHeader(http.StatusUnprocessableEntity)
			io.WriteString(w, `{"detail":"resources_session_id and episode_id {rollout_id, attempt} are required"}`)
			return
		}
		c.closes++
		out, _ := json.Marshal(map[string]string{"resources_session_id": *req.ResourcesSessionID})
		w.Write(out)
	default:
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"detail":"Not Found"}`)
	}
}

// Requests is every request so far as "<path> session=<id>" ("new" for a
// request without the cookie), the capture prefix stripped.
func (c *Counter) Requests() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.log)
}

// Count is the counter of session sid, and whether it has one.
func (c *Counter) Count(sid string) (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.counters[sid]
	return n, ok
}

// SetCount sets the counter of session sid, as if a seed had.
func (c *Counter) SetCount(sid string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counters[sid] = n
}

// Closes is how many /close_session calls the server took and refused.
func (c *Counter) Closes() (taken, refused int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closes, c.refusedCloses
}

// Sessions is how many sessions requests without the cookie started, and
// how many sessions have a counter.
func (c *Counter) Sessions() (started, counted int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.started, len(c.counters)
}
