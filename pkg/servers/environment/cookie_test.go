package environment_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/servers/environment"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
	"github.com/gymfleet/gymfleet/tests/gymstandin"
)

// gymSetCookie is a session cookie as NeMo Gym's SessionMiddleware sets it
// (nemo_gym/server_utils.py, Gym 07d6b0d07b22): a signed session id.
const (
	gymSetCookie = `StatefulCounterResourcesServer___counter=eyJzZXNzaW9uX2lkIjogIjEifQ==.aB9x.Zk; path=/; Max-Age=1209600; httponly; samesite=lax`
	gymCookie    = `StatefulCounterResourcesServer___counter=eyJzZXNzaW9uX2lkIjogIjEifQ==.aB9x.Zk`
)

// seedSettingCookie answers a seed as a cookie-only (Gym) resources server.
func seedSettingCookie(setCookie string) route {
	return func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Add("Set-Cookie", setCookie)
		jsonReply(200, `{}`)(w, r, nil)
	}
}

// TestRun_CookieOnlyResources: the cookie a seed reply sets reaches the
// agent session (for its tool calls), /verify and /close_session; a
// resources server without /close_session (Gym's) is not an error.
func TestRun_CookieOnlyResources(t *testing.T) {
	f := newFixture(t, environment.ProtocolSingleAgentTurn, func(_, res map[string]route) {
		res["/seed_session"] = seedSettingCookie(gymSetCookie)
		delete(res, "/close_session")
	})
	status, body, err := postRun(t.Context(), t, f.url, row)
	if err != nil || status != 200 {
		t.Fatalf("/run = %d %s, %v", status, body, err)
	}
	calls := f.rec.snapshot()
	if len(calls) != 6 {
		t.Fatalf("requests: %q", f.rec.paths())
	}
	if c := calls[0].Headers["Cookie"]; c != "" {
		t.Errorf("the first seed sent cookies %q", c)
	}
	rs, as := calls[0].Headers[environment.HeaderSessionID], calls[2].Headers[environment.HeaderAgentSession]
	assertJSON(t, "agent session body", calls[1].Body, `{"session_id":"`+as+`","resources_session_id":"`+rs+`","resources_cookies":"`+gymCookie+`","request":`+row+`}`)
	for _, i := range []int{4, 5} {
		if calls[i].Headers["Cookie"] != gymCookie || calls[i].Headers[environment.HeaderSessionID] != rs {
			t.Errorf("%s: Cookie %q, session %q", calls[i].Path, calls[i].Headers["Cookie"], calls[i].Headers[environment.HeaderSessionID])
		}
	}
	if calls[2].Headers["Cookie"] != "" {
		t.Errorf("the agent's activation carried the resources cookie: %q", calls[2].Headers["Cookie"])
	}
}

// TestRun_SeedCookiesBounded: a seed reply setting more cookie than a
// session may carry fails the run as an upstream error.
func TestRun_SeedCookiesBounded(t *testing.T) {
	f := newFixture(t, environment.ProtocolSingleAgentTurn, func(_, res map[string]route) {
		res["/seed_session"] = seedSettingCookie("a=" + strings.Repeat("x", 5000))
	})
	status, body, err := postRun(t.Context(), t, f.url, row)
	if err != nil || status != 502 || !strings.Contains(body, "upstream_error") || !strings.Contains(body, "too large") {
		t.Fatalf("/run = %d %s, %v", status, body, err)
	}
}

// TestEnvironment_CookiesSurviveRestore: the seed's cookies are part of the
// boundary's handles: the replacement attempt, restored in a fresh process
// past the seed, verifies and closes with them.
func TestEnvironment_CookiesSurviveRestore(t *testing.T) {
	rec := newRecorder()
	release := make(chan struct{})
	agent := newStandIn(t, "agent", rec, map[string]route{
		"/v1/agent_sessions": jsonReply(200, `{"session_id":"s"}`),
		"/v1/responses": func(w http.ResponseWriter, r *http.Request, _ []byte) {
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			jsonReply(200, `{"id":"resp","output":[]}`)(w, r, nil)
		},
		"/v1/agent_sessions/close": jsonReply(200, `{"closed":true,"observations":{}}`),
	})
	resources := newStandIn(t, "resources", rec, map[string]route{
		"/seed_session": seedSettingCookie(gymSetCookie),
		"/verify":       jsonReply(200, `{"reward":1.0}`),
	})
	ck := ctlplanetest.Config()
	_, url := startEnv(t, checkpointConfig(agent.URL, resources.URL, ck))
	hc := httpclient.New(httpclient.Options{})
	t.Cleanup(hc.CloseIdleConnections)
	ctl := control{t: t, url: url, c: hc}
	id := rollout.EpisodeID{RolloutID: "r1"}
	first := make(chan int, 1)
	go func() {
		st, _, _ := postRun(context.Background(), t, url, runBody(id, "t1"))
		first <- st
	}()
	rec.waitFor(t, "agent /ng-rollout/r1/v1/responses")
	ctl.call("prepare", map[string]any{"checkpoint_id": "c1", "deadline_ts": dl(10 * time.Second)})
	dir := t.TempDir()
	ctl.call("commit", map[string]any{"checkpoint_id": "c1", "deadline_ts": dl(10 * time.Second), "checkpoint_dir": dir, "episode_ids": []rollout.EpisodeID{id}})
	close(release)
	ctl.call("resume", map[string]any{"checkpoint_id": "c1", "deadline_ts": dl(10 * time.Second)})
	if st := <-first; st != 200 {
		t.Fatalf("the first run: %d", st)
	}

	rec2 := newRecorder()
	agent2 := newStandIn(t, "agent", rec2, map[string]route{
		"/v1/responses":            jsonReply(200, `{"id":"resp2","output":[]}`),
		"/v1/agent_sessions/close": jsonReply(200, `{"closed":true,"observations":{}}`),
	})
	resources2 := newStandIn(t, "resources", rec2, map[string]route{"/verify": jsonReply(200, `{"reward":1.0}`)})
	_, url2 := startEnv(t, checkpointConfig(agent2.URL, resources2.URL, ck))
	ctl2 := control{t: t, url: url2, c: hc}
	ctl2.call("restore", map[string]any{"checkpoint_id": "c1", "deadline_ts": dl(10 * time.Second), "checkpoint_dir": dir, "episode_ids": []rollout.EpisodeID{id}})
	ctl2.call("resume", map[string]any{"checkpoint_id": "c1", "deadline_ts": dl(10 * time.Second)})
	st, body, _ := postRun(context.Background(), t, url2, runBody(rollout.EpisodeID{RolloutID: "r1", Attempt: 1}, "t1"))
	if st != 200 {
		t.Fatalf("replacement: %d %s", st, body)
	}
	var got []string
	for _, c := range rec2.snapshot() {
		if strings.HasPrefix(c.Path, "/ng-rollout/r1-a1/verify") || strings.HasPrefix(c.Path, "/ng-rollout/r1-a1/close_session") {
			got = append(got, fmt.Sprintf("%s %s", c.Path, c.Headers["Cookie"]))
		}
	}
	want := []string{"/ng-rollout/r1-a1/verify " + gymCookie, "/ng-rollout/r1-a1/close_session " + gymCookie}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("replacement resources calls:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestRun_LegacyToGymAgent: an agent configured gym (NeMo Gym's simple
// agent under uvicorn) is called over HTTP/1.1, found out by the client,
// and gets /run unprefixed, the only /run it routes; the row names its
// rollout in the body.
func TestRun_LegacyToGymAgent(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	gymAgent := gymstandin.StartUvicorn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%s HTTP/%d", r.URL.Path, r.ProtoMajor), string(body))
		mu.Unlock()
		if r.URL.Path != "/run" {
			http.Error(w, `{"detail":"Not Found"}`, http.StatusNotFound)
			return
		}
		jsonReply(200, verifyReply)(w, r, nil)
	}))
	cfg := environment.DefaultConfig()
	cfg.Protocol = environment.ProtocolLegacy
	cfg.Agents = []environment.AgentConfig{{Name: "weather_agent", URL: gymAgent.URL, ResourcesURL: "http://127.0.0.1:1", Gym: true}}
	_, url := startEnv(t, cfg)
	status, body, err := postRun(t.Context(), t, url, row)
	if err != nil || status != 200 {
		t.Fatalf("/run = %d %s, %v", status, body, err)
	}
	assertJSON(t, "reply", body, strings.TrimSuffix(verifyReply, "}")+`,"episode_id":{"rollout_id":"7-0","attempt":0}}`)
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 || seen[0] != "/run HTTP/1" {
		t.Fatalf("the Gym agent saw %q", seen)
	}
	assertJSON(t, "the row relayed", seen[1], row)
}
