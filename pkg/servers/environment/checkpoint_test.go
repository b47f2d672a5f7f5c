package environment_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/servers/environment"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

func checkpointConfig(agent, resources string, ck ctlplane.Config) environment.Config {
	cfg := environment.DefaultConfig()
	cfg.Agents = []environment.AgentConfig{{Name: "a", URL: agent, ResourcesURL: resources}}
	cfg.Checkpoint = ck
	return cfg
}

func runBody(id rollout.EpisodeID, task string) string {
	return fmt.Sprintf(`{"responses_create_params":{"input":"hi"},"task":%q,"_ng_rollout_id":%q,"_ng_attempt_index":%d}`, task, id.RolloutID, id.Attempt)
}

func TestEnvironment_Conformance(t *testing.T) {
	ctlplanetest.Run(t, func(t *testing.T, ck ctlplane.Config) ctlplanetest.Subject {
		_, url := startEnv(t, checkpointConfig("http://127.0.0.1:1", "http://127.0.0.1:1", ck))
		c := httpclient.New(httpclient.Options{})
		t.Cleanup(c.CloseIdleConnections)
		return ctlplanetest.Subject{URL: url, Kind: "environment", Instance: "env", Probe: func(ctx context.Context, id rollout.EpisodeID) (int, string) {
			rep, err := httpclient.Do(ctx, c, http.MethodPost, url+"/run", nil, []byte(runBody(id, "probe")))
			if err != nil {
				return 0, err.Error()
			}
			if e := apierror.Parse(rep.Status, rep.Body); e != nil {
				return rep.Status, string(e.Code)
			}
			return rep.Status, ""
		}}
	})
	t.Run("Disabled", func(t *testing.T) {
		_, url := startEnv(t, checkpointConfig("http://127.0.0.1:1", "http://127.0.0.1:1", ctlplane.DefaultConfig()))
		ctlplanetest.RunDisabled(t, url)
	})
}

// control drives one environment's control API.
type control struct {
	t   *testing.T
	url string
	c   *http.Client
}

func (c control) call(op string, body any) map[string]any {
	c.t.Helper()
	rep, err := httpclient.Do(context.Background(), c.c, http.MethodPost, c.url+"/_ckpt/"+op, http.Header{"Authorization": {"Bearer " + ctlplanetest.Token}}, body)
	if err != nil {
		c.t.Fatal(err)
	}
	var m map[string]any
	_ = codec.Unmarshal(rep.Body, &m)
	if rep.Status != 200 {
		c.t.Fatalf("%s: %d %s", op, rep.Status, rep.Body)
	}
	return m
}

func dl(d time.Duration) float64 { return float64(time.Now().Add(d).UnixNano()) / 1e9 }

// Ensure an episode inside the agent's activation (a replay step) does not
// hold a checkpoint back, is exported at the boundary before the activation,
// and that a replacement attempt in a fresh process continues from it.
func TestEnvironment_CheckpointAndContinue(t *testing.T) {
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
		"/v1/agent_sessions/close": jsonReply(200, `{"closed":true,"observations":{"model_calls":2}}`),
	})
	resources := newStandIn(t, "resources", rec, map[string]route{
		"/seed_session": func(w http.ResponseWriter, r *http.Request, _ []byte) {
			w.Header().Set(environment.HeaderCheckpointVerify, "replay")
			jsonReply(200, `{}`)(w, r, nil)
		},
		"/verify":        jsonReply(200, `{"reward":1.0}`),
		"/close_session": jsonReply(200, `{"closed":true}`),
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

	prep := ctl.call("prepare", map[string]any{"checkpoint_id": "c1", "deadline_ts": dl(10 * time.Second)})
	if prep["phase"] != "prepared" {
		t.Fatalf("an episode inside its replay activation must not block: %v", prep)
	}
	// A new /run is refused while the checkpoint is open.
	if st, body, _ := postRun(context.Background(), t, url, runBody(rollout.EpisodeID{RolloutID: "new"}, "t")); st != 409 || !strings.Contains(body, "admission_closed") {
		t.Fatalf("new /run while closed: %d %s", st, body)
	}
	dir := t.TempDir()
	cm := ctl.call("commit", map[string]any{"checkpoint_id": "c1", "deadline_ts": dl(10 * time.Second), "checkpoint_dir": dir, "episode_ids": []rollout.EpisodeID{id}})
	if fmt.Sprint(cm["episode_ids"]) != "[r1]" {
		t.Fatalf("commit exported %v", cm["episode_ids"])
	}
	// The activation finishes while prepared: the episode parks at the
	// boundary after it and does not reply.
	close(release)
	select {
	case st := <-first:
		t.Fatalf("the episode replied (%d) while a checkpoint is open", st)
	case <-time.After(100 * time.Millisecond):
	}
	ctl.call("resume", map[string]any{"checkpoint_id": "c1", "deadline_ts": dl(10 * time.Second)})
	if st := <-first; st != 200 {
		t.Fatalf("after resume the episode finishes: %d", st)
	}

	// A fresh environment restores the record and the replacement continues
	// at invoke_agent: no reseed, same session ids.
	rec2 := newRecorder()
	agent2 := newStandIn(t, "agent", rec2, map[string]route{
		"/v1/responses":            jsonReply(200, `{"id":"resp2","output":[]}`),
		"/v1/agent_sessions/close": jsonReply(200, `{"closed":true,"observations":{}}`),
	})
	resources2 := newStandIn(t, "resources", rec2, map[string]route{
		"/verify":        jsonReply(200, `{"reward":1.0}`),
		"/close_session": jsonReply(200, `{"closed":true}`),
	})
	_, url2 := startEnv(t, checkpointConfig(agent2.URL, resources2.URL, ck))
	ctl2 := control{t: t, url: url2, c: hc}
	r := ctl2.call("restore", map[string]any{"checkpoint_id": "c1", "deadline_ts": dl(10 * time.Second), "checkpoint_dir": dir, "episode_ids": []rollout.EpisodeID{id}})
	if fmt.Sprint(r["restored"]) != "[r1-a1]" {
		t.Fatalf("restored %v", r["restored"])
	}
	ctl2.call("resume", map[string]any{"checkpoint_id": "c1", "deadline_ts": dl(10 * time.Second)})
	if st, body, _ := postRun(context.Background(), t, url2, runBody(rollout.EpisodeID{RolloutID: "r1", Attempt: 1}, "other task")); st != 409 || !strings.Contains(body, "task_mismatch") {
		t.Fatalf("a replacement with another task: %d %s", st, body)
	}
	st, body, _ := postRun(context.Background(), t, url2, runBody(rollout.EpisodeID{RolloutID: "r1", Attempt: 1}, "t1"))
	if st != 200 {
		t.Fatalf("replacement: %d %s", st, body)
	}
	want := []string{
		"agent /ng-rollout/r1-a1/v1/responses",
		"agent /ng-rollout/r1-a1/v1/agent_sessions/close",
		"resources /ng-rollout/r1-a1/verify",
		"resources /ng-rollout/r1-a1/close_session",
	}
	if got := rec2.paths(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("replacement calls:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	firstSeed := rec.snapshot()[0]
	if got := rec2.snapshot()[0].Headers[environment.HeaderAgentSession]; got == "" || rec.snapshot()[1].Body == "" || !strings.Contains(rec.snapshot()[1].Body, got) {
		t.Fatalf("the replacement must use the recorded agent session id %q (seed was %v)", got, firstSeed)
	}
}

// Ensure a wait step (close_agent) holds a checkpoint back and a retire
// stops an episode only after its cleanup.
func TestEnvironment_WaitStepBlocksAndRetire(t *testing.T) {
	rec := newRecorder()
	var closes atomic.Int32
	agent := newStandIn(t, "agent", rec, map[string]route{
		"/v1/agent_sessions": jsonReply(200, `{}`),
		"/v1/responses":      jsonReply(200, `{"id":"resp","output":[]}`),
		"/v1/agent_sessions/close": func(w http.ResponseWriter, r *http.Request, _ []byte) {
			// The episode's own close hangs until cancelled; the close of
			// its final cleanup answers.
			if closes.Add(1) == 1 {
				<-r.Context().Done()
				return
			}
			jsonReply(200, `{"closed":true}`)(w, r, nil)
		},
	})
	resources := newStandIn(t, "resources", rec, map[string]route{
		"/seed_session":  jsonReply(200, `{}`),
		"/verify":        jsonReply(200, `{"reward":1.0}`),
		"/close_session": jsonReply(200, `{"closed":true}`),
	})
	_, url := startEnv(t, checkpointConfig(agent.URL, resources.URL, ctlplanetest.Config()))
	hc := httpclient.New(httpclient.Options{})
	t.Cleanup(hc.CloseIdleConnections)
	ctl := control{t: t, url: url, c: hc}
	id := rollout.EpisodeID{RolloutID: "w1"}
	done := make(chan int, 1)
	go func() {
		st, _, _ := postRun(context.Background(), t, url, runBody(id, "t"))
		done <- st
	}()
	rec.waitFor(t, "agent /ng-rollout/w1/v1/agent_sessions/close")
	prep := ctl.call("prepare", map[string]any{"checkpoint_id": "c1", "deadline_ts": dl(300 * time.Millisecond)})
	rep, _ := prep["report"].(map[string]any)
	if prep["phase"] != "preparing" || fmt.Sprint(rep["blockers"]) != "[w1]" {
		t.Fatalf("an episode inside its wait step must block: %v", prep)
	}
	ctl.call("resume", map[string]any{"checkpoint_id": "c1", "deadline_ts": dl(10 * time.Second)})
	retired := make(chan map[string]any, 1)
	go func() {
		retired <- ctl.call("retire", map[string]any{"checkpoint_id": "ops", "deadline_ts": dl(10 * time.Second), "episode_ids": []rollout.EpisodeID{id}})
	}()
	if st := <-done; st != 409 {
		t.Fatalf("a retired episode's /run answers %d, want 409 stale_attempt", st)
	}
	<-retired
	paths := rec.paths()
	if paths[len(paths)-1] != "resources /ng-rollout/w1/close_session" {
		t.Fatalf("the retired episode's cleanup must close its sessions: %v", paths)
	}
	if st, body, _ := postRun(context.Background(), t, url, runBody(id, "t")); st != 409 || !strings.Contains(body, "stale_attempt") {
		t.Fatalf("a duplicate /run of the retired attempt: %d %s", st, body)
	}
}
