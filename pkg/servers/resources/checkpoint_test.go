package resources_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/servers/resources"
)

// verifyBody is a /verify body every type accepts.
const verifyBody = `{"responses_create_params":{},"response":{"output":[]},"expected_count":3}`

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCounterExample is protocol §6.4: a counter checkpointed at 3 continues
// at 3 in a fresh process as the next attempt, and reaches 4.
func TestCounterExample(t *testing.T) {
	src := checkpointed(t, resources.TypeCounter, "", "")
	expect(t, "seed", src.post("/ng-rollout/r-a1/seed_session", "s1", `{"initial_count":1}`), 200, `{}`)
	expect(t, "increment", src.post("/ng-rollout/r-a1/increment", "s1", `{"by":1}`), 200, `{"count":2}`)
	expect(t, "increment", src.post("/ng-rollout/r-a1/increment", "s1", `{"by":1}`), 200, `{"count":3}`)
	if m := src.mustCtl("prepare", ckptReq("c1")); m["phase"] != "prepared" {
		t.Fatalf("prepare = %v", m)
	}
	dir := t.TempDir()
	m := src.mustCtl("commit", scopeReq("c1", dir, episodes("r-a1")...))
	man := m["manifest"].(map[string]any)
	if man["record_count"] != float64(1) || man["resources_type"] != "counter" || man["checkpoint_mode"] != "saved" || jsonOf(t, m["episode_ids"]) != `["r-a1"]` {
		t.Fatalf("commit reply = %v", m)
	}
	if got := records(t, dir, "counter", "c1"); jsonOf(t, got) != jsonOf(t, []string{`{"episode_id":{"rollout_id":"r","attempt":1},"session_id":"s1","state":{"count":3}}`}) {
		t.Fatalf("records = %v", got)
	}
	src.mustCtl("resume", ckptReq("c1"))

	dst := checkpointed(t, resources.TypeCounter, "", "")
	m = dst.mustCtl("restore", scopeReq("c1", dir, episodes("r-a1")...))
	if m["phase"] != "restored" || jsonOf(t, m["restored"]) != `["r-a2"]` {
		t.Fatalf("restore reply = %v", m)
	}
	early := dst.async("/ng-rollout/r-a2/get_counter_value", "s1", `{}`)
	dst.waitHTTPInFlight(1)
	pending(t, "a tool call before resume", early)
	dst.mustCtl("resume", ckptReq("c1"))
	expect(t, "the call that waited", <-early, 200, `{"count":3}`)
	expect(t, "increment after resume", dst.post("/ng-rollout/r-a2/increment", "s1", `{"by":1}`), 200, `{"count":4}`)
	expectCode(t, "the checkpointed attempt", dst.post("/ng-rollout/r-a1/increment", "s1", `{"by":1}`), 409, "stale_attempt")
	st := dst.status()
	if st["mode"] != "saved" || st["verify"] != "replay" || st["sessions"] != float64(1) || st["retired_sessions"] != float64(0) {
		t.Fatalf("status = %v", st)
	}
}

// TestRestoredSessionReseeded: the next attempt's seed of a restored session
// keeps its state, so a counter at 4 continues to 6.
func TestRestoredSessionReseeded(t *testing.T) {
	dir := writeCheckpoint(t, "counter", "c1", map[string]string{
		"row-7": `{"episode_id":{"rollout_id":"row-7","attempt":0},"session_id":"s1","state":{"count":4}}`,
	}, nil)
	ts := checkpointed(t, resources.TypeCounter, "", "")
	ts.mustCtl("restore", scopeReq("c1", dir, episodes("row-7")...))
	ts.mustCtl("resume", ckptReq("c1"))
	expect(t, "re-seed", ts.post("/ng-rollout/row-7-a1/seed_session", "s1", `{"initial_count":3}`), 200, `{}`)
	expect(t, "increment", ts.post("/ng-rollout/row-7-a1/increment", "s1", `{"by":2}`), 200, `{"count":6}`)
}

// TestStatelessRestore: a stateless server records its sessions with null
// state, so the restored session routes, and a retire frees it later.
func TestStatelessRestore(t *testing.T) {
	src := checkpointed(t, resources.TypeWeather, "", "")
	src.post("/ng-rollout/w/seed_session", "s1", `{}`)
	src.post("/ng-rollout/other/seed_session", "s2", `{}`)
	src.mustCtl("prepare", ckptReq("c1"))
	dir := t.TempDir()
	src.mustCtl("commit", scopeReq("c1", dir, episodes("w")...))
	if got := records(t, dir, "weather", "c1"); jsonOf(t, got) != jsonOf(t, []string{`{"episode_id":{"rollout_id":"w","attempt":0},"session_id":"s1","state":null}`}) {
		t.Fatalf("records = %v", got)
	}
	src.mustCtl("resume", ckptReq("c1"))

	dst := checkpointed(t, resources.TypeWeather, "", "")
	dst.mustCtl("restore", scopeReq("c1", dir, episodes("w")...))
	dst.mustCtl("resume", ckptReq("c1"))
	if st := dst.status(); st["sessions"] != float64(1) {
		t.Fatalf("status after restore = %v", st)
	}
	expectCode(t, "the restored session is bound to w-a1", dst.post("/ng-rollout/w/get_weather", "s1", `{"city":"Oslo"}`), 409, "stale_attempt")
	dst.mustCtl("retire", map[string]any{"checkpoint_id": "ops", "episode_ids": episodes("w-a1")})
	if st := dst.status(); st["sessions"] != float64(0) || st["retired_sessions"] != float64(1) {
		t.Fatalf("status after retire = %v", st)
	}
}

// TestRestoredStatelessCounter: a counter restored from a stateless
// checkpoint has no state until the next attempt seeds it.
func TestRestoredStatelessCounter(t *testing.T) {
	dir := writeCheckpoint(t, "counter", "c1", map[string]string{
		"r": `{"episode_id":{"rollout_id":"r","attempt":0},"session_id":"s1","state":null}`,
	}, nil)
	ts := checkpointed(t, resources.TypeCounter, resources.ModeStateless, "")
	ts.mustCtl("restore", scopeReq("c1", dir, episodes("r")...))
	ts.mustCtl("resume", ckptReq("c1"))
	expectCode(t, "tool before the seed", ts.post("/ng-rollout/r-a1/increment", "s1", `{"by":1}`), 404, "unknown_session")
	expect(t, "seed", ts.post("/ng-rollout/r-a1/seed_session", "s1", `{"initial_count":5}`), 200, `{}`)
	expect(t, "increment", ts.post("/ng-rollout/r-a1/increment", "s1", `{"by":1}`), 200, `{"count":6}`)
}

// TestInflightBlocksPrepare: a wait-mode verify in flight blocks prepare
// until it finishes; the report names its episode.
func TestInflightBlocksPrepare(t *testing.T) {
	ts := checkpointed(t, resources.TypeSlowVerify, "", "")
	ts.post("/ng-rollout/r-a1/seed_session", "s1", `{}`)
	ts.post("/_ctl/verify/hold", "", ``)
	held := ts.async("/ng-rollout/r-a1/verify", "s1", verifyBody)
	ts.waitCount(`{"started":1,"finished":0,"waiting":1}`)
	r := ts.ctl("prepare", map[string]any{"checkpoint_id": "c1", "deadline_ts": deadlineIn(300 * time.Millisecond)})
	var m map[string]any
	if err := json.Unmarshal([]byte(r.body), &m); err != nil || r.status != 200 || m["phase"] != "preparing" {
		t.Fatalf("prepare with a verify in flight = %d %s", r.status, r.body)
	}
	if got, want := jsonOf(t, m["report"]), `{"blocker_count":1,"blockers":["r-a1"],"counts":{"inflight":1,"sessions":1},"ready":false,"restarts":[]}`; got != want {
		t.Fatalf("report = %s\nwant %s", got, want)
	}
	ts.post("/_ctl/verify/release", "", ``)
	if r := <-held; r.status != 200 {
		t.Fatalf("held verify: %d %s", r.status, r.body)
	}
	if m := ts.mustCtl("prepare", ckptReq("c1")); m["phase"] != "prepared" {
		t.Fatalf("prepare after the verify finished = %v", m)
	}
	ts.mustCtl("resume", ckptReq("c1"))
}

// TestRequestsWaitDuringCheckpoint: seeds, tool calls and closes wait while
// a checkpoint is open, are not in flight, and do not change what is
// exported; /tools and a replayable verify are admitted.
func TestRequestsWaitDuringCheckpoint(t *testing.T) {
	ts := checkpointed(t, resources.TypeCounter, "", "")
	ts.post("/ng-rollout/r/seed_session", "s1", `{"initial_count":1}`)
	ts.post("/ng-rollout/c/seed_session", "s3", `{}`)
	ts.mustCtl("prepare", ckptReq("c1"))

	seed := ts.async("/ng-rollout/q/seed_session", "s2", `{}`)
	tool := ts.async("/ng-rollout/r/increment", "s1", `{"by":1}`)
	closing := ts.async("/ng-rollout/c/close_session", "s3", ``)
	ts.waitHTTPInFlight(3)
	pending(t, "seed", seed)
	pending(t, "tool call", tool)
	pending(t, "close", closing)
	if got, want := ts.report(), `{"blocker_count":0,"blockers":[],"counts":{"inflight":0,"sessions":2},"ready":true,"restarts":[]}`; got != want {
		t.Fatalf("report while requests wait = %s\nwant %s", got, want)
	}
	expect(t, "tools", ts.do(http.MethodGet, "/tools", "", ""), 200, ts.do(http.MethodGet, "/tools", "", "").body)
	expect(t, "replayable verify", ts.post("/ng-rollout/r/verify", "s1", `{"responses_create_params":{},"response":{"output":[]},"expected_count":1}`), 200,
		`{"expected_count":1,"response":{"output":[]},"responses_create_params":{},"reward":1.0}`)

	dir := t.TempDir()
	ts.mustCtl("commit", scopeReq("c1", dir, episodes("r", "q", "c")...))
	want := []string{
		`{"episode_id":{"rollout_id":"c","attempt":0},"session_id":"s3","state":{"count":0}}`,
		`{"episode_id":{"rollout_id":"r","attempt":0},"session_id":"s1","state":{"count":1}}`,
	}
	if got := records(t, dir, "counter", "c1"); jsonOf(t, got) != jsonOf(t, want) {
		t.Fatalf("records = %v\nwant %v", got, want)
	}
	ts.mustCtl("resume", ckptReq("c1"))
	expect(t, "seed after resume", <-seed, 200, `{}`)
	expect(t, "tool after resume", <-tool, 200, `{"count":2}`)
	expect(t, "close after resume", <-closing, 200, `{"closed":true}`)
}

// TestReplayVerifyNotCounted: a replayable verify held in flight neither
// blocks prepare nor ends its session's export.
func TestReplayVerifyNotCounted(t *testing.T) {
	ts := checkpointed(t, resources.TypeSlowVerify, "", resources.VerifyReplay)
	if got := ts.post("/ng-rollout/r/seed_session", "s1", `{}`).header.Get(resources.VerifyModeHeader); got != "replay" {
		t.Fatalf("seed announced verify %q", got)
	}
	ts.post("/_ctl/verify/hold", "", ``)
	held := ts.async("/ng-rollout/r/verify", "s1", verifyBody)
	ts.waitCount(`{"started":1,"finished":0,"waiting":1}`)
	if m := ts.mustCtl("prepare", ckptReq("c1")); m["phase"] != "prepared" {
		t.Fatalf("prepare with a replayable verify in flight = %v", m)
	}
	dir := t.TempDir()
	ts.mustCtl("commit", scopeReq("c1", dir, episodes("r")...))
	if got := records(t, dir, "slow_verify", "c1"); len(got) != 1 {
		t.Fatalf("records = %v, want the session with a verify in flight", got)
	}
	ts.mustCtl("resume", ckptReq("c1"))
	ts.post("/_ctl/verify/release", "", ``)
	if r := <-held; r.status != 200 {
		t.Fatalf("verify: %d %s", r.status, r.body)
	}
}

// TestRestartOnly: prepare never waits, every live session is a restart,
// a commit naming one is refused, and seeds still wait.
func TestRestartOnly(t *testing.T) {
	ts := checkpointed(t, resources.TypeSlowVerify, resources.ModeRestartOnly, "")
	seeded := ts.post("/ng-rollout/r-a1/seed_session", "s1", `{}`)
	if h := seeded.header.Get(resources.RestartHeader); h != "1" {
		t.Fatalf("seed restart header = %q", h)
	}
	ts.post("/ng-rollout/q/seed_session", "s2", `{}`)
	ts.post("/_ctl/verify/hold", "", ``)
	held := ts.async("/ng-rollout/r-a1/verify", "s1", verifyBody)
	ts.waitCount(`{"started":1,"finished":0,"waiting":1}`)
	m := ts.mustCtl("prepare", ckptReq("c1"))
	if got, want := jsonOf(t, m), `{"phase":"prepared","report":{"blocker_count":0,"blockers":[],"counts":{"inflight":0,"sessions":2},"ready":true,"restarts":["q","r-a1"]}}`; got != want {
		t.Fatalf("prepare = %s\nwant %s", got, want)
	}
	seed := ts.async("/ng-rollout/n/seed_session", "s3", `{}`)
	ts.waitHTTPInFlight(2) // the held verify and the seed
	pending(t, "seed on a restart_only server", seed)
	expect(t, "tool call passes", ts.post("/ng-rollout/q/get_weather", "s2", `{"city":"Oslo"}`), 200, `{"city":"Oslo","weather_description":"The weather in Oslo is rainy."}`)

	dir := t.TempDir()
	expectCode(t, "commit naming a restart", ts.ctl("commit", scopeReq("c1", dir, episodes("r-a1")...)), 409, "restart_in_scope")
	m = ts.mustCtl("commit", scopeReq("c1", dir))
	if man := m["manifest"].(map[string]any); man["record_count"] != float64(0) || man["checkpoint_mode"] != "restart_only" {
		t.Fatalf("commit = %v", m)
	}
	ts.mustCtl("resume", ckptReq("c1"))
	expect(t, "seed after resume", <-seed, 200, `{}`)
	ts.post("/_ctl/verify/release", "", ``)
	if r := <-held; r.status != 200 {
		t.Fatalf("verify: %d %s", r.status, r.body)
	}
}

// TestRestartOnly_RefusesRecords: a restart_only server restores nothing.
func TestRestartOnly_RefusesRecords(t *testing.T) {
	dir := writeCheckpoint(t, "counter", "c1", map[string]string{
		"r": `{"episode_id":{"rollout_id":"r","attempt":0},"session_id":"s1","state":{"count":1}}`,
	}, nil)
	ts := checkpointed(t, resources.TypeCounter, resources.ModeRestartOnly, "")
	got := ts.ctl("restore", scopeReq("c1", dir, episodes("r")...))
	expectCode(t, "restore", got, 422, "invalid_checkpoint_state")
	if !strings.Contains(got.body, "restart_only") {
		t.Errorf("refusal does not say why: %s", got.body)
	}
	ts.mustCtl("restore", scopeReq("c1", dir)) // nothing in scope: nothing to refuse
}

// TestInstallAllOrNothing: one bad record fails the restore, nothing is
// installed and the phase stays idle.
func TestInstallAllOrNothing(t *testing.T) {
	good := `{"episode_id":{"rollout_id":"good","attempt":0},"session_id":"s1","state":{"count":1}}`
	cases := []struct {
		name, key, record, detail string
		manifest                  map[string]any
	}{
		{"count not an integer", "bad", `{"episode_id":{"rollout_id":"bad","attempt":0},"session_id":"s2","state":{"count":"x"}}`, "invalid counter state", nil},
		{"fractional count", "bad", `{"episode_id":{"rollout_id":"bad","attempt":0},"session_id":"s2","state":{"count":1.5}}`, "invalid counter state", nil},
		{"null state", "bad", `{"episode_id":{"rollout_id":"bad","attempt":0},"session_id":"s2","state":null}`, "invalid counter state", nil},
		{"extra state field", "bad", `{"episode_id":{"rollout_id":"bad","attempt":0},"session_id":"s2","state":{"count":1,"x":2}}`, "invalid counter state", nil},
		{"state missing", "bad", `{"episode_id":{"rollout_id":"bad","attempt":0},"session_id":"s2"}`, "state is missing", nil},
		{"bad session id", "bad", `{"episode_id":{"rollout_id":"bad","attempt":0},"session_id":"a b","state":{"count":1}}`, "session_id", nil},
		{"unknown field", "bad", `{"episode_id":{"rollout_id":"bad","attempt":0},"session_id":"s2","state":{"count":1},"owner":"x"}`, "unknown field", nil},
		{"duplicate session", "bad", `{"episode_id":{"rollout_id":"bad","attempt":0},"session_id":"s1","state":{"count":1}}`, "appears twice", nil},
		{"other type", "fine", `{"episode_id":{"rollout_id":"fine","attempt":0},"session_id":"s2","state":{"count":1}}`, "weather server", map[string]any{"resources_type": "weather"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := writeCheckpoint(t, "counter", "c1", map[string]string{"good": good, c.key: c.record}, c.manifest)
			ts := checkpointed(t, resources.TypeCounter, "", "")
			got := ts.ctl("restore", scopeReq("c1", dir, episodes("good", c.key)...))
			expectCode(t, "restore", got, 422, "invalid_checkpoint_state")
			if !strings.Contains(got.body, c.detail) {
				t.Errorf("detail of %s lacks %q", got.body, c.detail)
			}
			st := ts.status()
			if st["phase"] != "idle" || st["sessions"] != float64(0) {
				t.Fatalf("status after a refused restore = %v", st)
			}
			expectCode(t, "the good record was not installed", ts.post("/ng-rollout/good-a1/get_counter_value", "s1", `{}`), 404, "unknown_session")
		})
	}
}

// TestRestoreNeedsFreshProcess: a process that served a session refuses.
func TestRestoreNeedsFreshProcess(t *testing.T) {
	dir := writeCheckpoint(t, "counter", "c1", nil, nil)
	ts := checkpointed(t, resources.TypeCounter, "", "")
	ts.post("/seed_session", "s1", `{}`)
	got := ts.ctl("restore", scopeReq("c1", dir))
	expectCode(t, "restore", got, 409, "checkpoint_error")
	if !strings.Contains(got.body, "requires a process that has not served sessions") {
		t.Errorf("refusal = %s", got.body)
	}
}

// TestRetire: a retire refuses the attempt's sessions at once, waits for
// their requests in flight, and, cut short, keeps blocking until retried;
// forget is refused until it finished; the next attempt is unaffected.
func TestRetire(t *testing.T) {
	ts := checkpointed(t, resources.TypeSlowVerify, "", "")
	ts.post("/ng-rollout/r-a1/seed_session", "s1", `{}`)
	ts.post("/ng-rollout/other/seed_session", "s9", `{}`)
	ts.post("/_ctl/verify/hold", "", ``)
	held := ts.async("/ng-rollout/r-a1/verify", "s1", verifyBody)
	ts.waitCount(`{"started":1,"finished":0,"waiting":1}`)

	retire := map[string]any{"checkpoint_id": "ops", "episode_ids": episodes("r-a1"), "deadline_ts": deadlineIn(300 * time.Millisecond)}
	expectCode(t, "retire cut short", ts.ctl("retire", retire), 409, "deadline_exceeded")
	if st := ts.status(); st["sessions"] != float64(1) || st["retired_sessions"] != float64(1) {
		t.Fatalf("status after a cut-short retire = %v", st)
	}
	expectCode(t, "forget before the retire finished", ts.ctl("forget", map[string]any{"checkpoint_id": "ops", "rollout_ids": []string{"r"}}), 409, "retire_incomplete")
	expectCode(t, "late tool call by cookie", ts.post("/get_weather", "s1", `{"city":"Oslo"}`), 409, "stale_attempt")
	expectCode(t, "late seed", ts.post("/ng-rollout/r-a1/seed_session", "s1", `{}`), 409, "stale_attempt")
	expectCode(t, "next attempt's seed while the retire is unfinished", ts.post("/ng-rollout/r-a2/seed_session", "s1", `{}`), 409, "retire_incomplete")
	expect(t, "close is never refused", ts.post("/close_session", "s1", ``), 200, `{"closed":false}`)
	r := ts.ctl("prepare", map[string]any{"checkpoint_id": "c1", "deadline_ts": deadlineIn(200 * time.Millisecond)})
	if r.status != 200 || !strings.Contains(r.body, `"blockers":["r-a1"]`) {
		t.Fatalf("prepare with the retired verify in flight = %d %s", r.status, r.body)
	}
	ts.mustCtl("resume", ckptReq("c1"))

	// The retried retire waits for the verify, then frees the session.
	retried := make(chan reply, 1)
	go func() {
		retried <- ts.ctl("retire", map[string]any{"checkpoint_id": "ops", "episode_ids": episodes("r-a1")})
	}()
	ts.waitHTTPInFlight(2) // the held verify and the retire
	pending(t, "retire with a request in flight", retried)
	ts.post("/_ctl/verify/release", "", ``)
	if r := <-held; r.status != 200 {
		t.Fatalf("the verify admitted before the retire: %d %s", r.status, r.body)
	}
	expect(t, "retried retire", <-retried, 200, `{"retired":["r-a1"]}`)
	if st := ts.status(); st["sessions"] != float64(1) || st["retired_sessions"] != float64(1) {
		t.Fatalf("status after the retire = %v", st)
	}
	expectCode(t, "late tool call after the retire", ts.post("/get_weather", "s1", `{"city":"Oslo"}`), 409, "stale_attempt")
	expectCode(t, "late verify", ts.post("/verify", "s1", verifyBody), 409, "stale_attempt")

	// The next attempt seeds the same id afresh.
	expect(t, "next attempt's seed", ts.post("/ng-rollout/r-a2/seed_session", "s1", `{}`), 200, `{}`)
	expect(t, "next attempt's tool call", ts.post("/ng-rollout/r-a2/get_weather", "s1", `{"city":"Oslo"}`), 200, `{"city":"Oslo","weather_description":"The weather in Oslo is rainy."}`)
	ts.mustCtl("forget", map[string]any{"checkpoint_id": "ops", "rollout_ids": []string{"r"}})
	if st := ts.status(); st["sessions"] != float64(2) || st["retired_sessions"] != float64(0) {
		t.Fatalf("status after forget = %v", st)
	}
}

// TestRetire_Counter: the retired attempt's counter is gone; the next
// attempt's seed starts from its row; forget drops the refusal.
func TestRetire_Counter(t *testing.T) {
	ts := checkpointed(t, resources.TypeCounter, "", "")
	ts.post("/ng-rollout/r-a1/seed_session", "s1", `{"initial_count":5}`)
	ts.post("/ng-rollout/r-a1/increment", "s1", `{"by":1}`)
	ts.post("/ng-rollout/r/seed_session", "s0", `{}`) // an earlier attempt's session goes too
	ts.mustCtl("retire", map[string]any{"checkpoint_id": "ops", "episode_ids": episodes("r-a1")})
	if st := ts.status(); st["sessions"] != float64(0) || st["retired_sessions"] != float64(2) {
		t.Fatalf("status after retire = %v", st)
	}
	expectCode(t, "late increment by cookie", ts.post("/increment", "s1", `{"by":1}`), 409, "stale_attempt")
	expectCode(t, "late increment by prefix", ts.post("/ng-rollout/r-a1/increment", "s1", `{"by":1}`), 409, "stale_attempt")
	expectCode(t, "next attempt before seeding", ts.post("/ng-rollout/r-a2/increment", "s1", `{"by":1}`), 404, "unknown_session")
	ts.mustCtl("forget", map[string]any{"checkpoint_id": "ops", "rollout_ids": []string{"r"}})
	if st := ts.status(); st["retired_sessions"] != float64(0) {
		t.Fatalf("status after forget = %v", st)
	}
	expect(t, "next attempt's seed", ts.post("/ng-rollout/r-a2/seed_session", "s1", `{"initial_count":0}`), 200, `{}`)
	expect(t, "fresh count", ts.post("/ng-rollout/r-a2/increment", "s1", `{"by":1}`), 200, `{"count":1}`)
}

// TestRetire_SeedWaitingOutRestore: a seed waiting out a restore does not
// hold up a retire of its attempt, and is refused afterwards.
func TestRetire_SeedWaitingOutRestore(t *testing.T) {
	dir := writeCheckpoint(t, "counter", "c1", map[string]string{
		"r": `{"episode_id":{"rollout_id":"r","attempt":0},"session_id":"s1","state":{"count":2}}`,
	}, nil)
	ts := checkpointed(t, resources.TypeCounter, "", "")
	ts.mustCtl("restore", scopeReq("c1", dir, episodes("r")...))
	seed := ts.async("/ng-rollout/r-a1/seed_session", "s1", `{}`)
	ts.waitHTTPInFlight(1)
	expect(t, "retire", ts.ctl("retire", map[string]any{"checkpoint_id": "c1", "episode_ids": episodes("r-a1")}), 200, `{"retired":["r-a1"]}`)
	ts.mustCtl("resume", ckptReq("c1"))
	expectCode(t, "the seed that waited", <-seed, 409, "stale_attempt")
}

// TestCommitDropsUnusedRestoredSessions: a restored session is exported
// again while the scope continues it, and deleted (no fence) by a commit
// whose scope drops it, unless a request used it since the restore.
func TestCommitDropsUnusedRestoredSessions(t *testing.T) {
	dir := writeCheckpoint(t, "counter", "c0", map[string]string{
		"r": `{"episode_id":{"rollout_id":"r","attempt":0},"session_id":"s1","state":{"count":7}}`,
		"q": `{"episode_id":{"rollout_id":"q","attempt":0},"session_id":"s2","state":{"count":1}}`,
	}, nil)
	ts := checkpointed(t, resources.TypeCounter, "", "")
	ts.mustCtl("restore", scopeReq("c0", dir, episodes("r", "q")...))
	ts.mustCtl("resume", ckptReq("c0"))

	ts.mustCtl("prepare", ckptReq("c1"))
	dir1 := t.TempDir()
	ts.mustCtl("commit", scopeReq("c1", dir1, episodes("r-a1", "q-a1")...))
	want := []string{
		`{"episode_id":{"rollout_id":"q","attempt":1},"session_id":"s2","state":{"count":1}}`,
		`{"episode_id":{"rollout_id":"r","attempt":1},"session_id":"s1","state":{"count":7}}`,
	}
	if got := records(t, dir1, "counter", "c1"); jsonOf(t, got) != jsonOf(t, want) {
		t.Fatalf("records = %v\nwant %v", got, want)
	}
	ts.mustCtl("resume", ckptReq("c1"))

	expect(t, "q-a1 uses its session", ts.post("/ng-rollout/q-a1/get_counter_value", "s2", `{}`), 200, `{"count":1}`)
	ts.mustCtl("prepare", ckptReq("c2"))
	m := ts.mustCtl("commit", scopeReq("c2", t.TempDir()))
	if m["manifest"].(map[string]any)["record_count"] != float64(0) {
		t.Fatalf("commit = %v", m)
	}
	ts.mustCtl("resume", ckptReq("c2"))
	if st := ts.status(); st["sessions"] != float64(1) || st["retired_sessions"] != float64(0) || st["retired_rollouts"] != float64(0) {
		t.Fatalf("status = %v, want only the used session left and no fence", st)
	}
	expectCode(t, "dropped session", ts.post("/ng-rollout/r-a1/get_counter_value", "s1", `{}`), 404, "unknown_session")
	expect(t, "reseed", ts.post("/ng-rollout/r-a1/seed_session", "s1", `{"initial_count":2}`), 200, `{}`)
	expect(t, "reseeded count", ts.post("/ng-rollout/r-a1/get_counter_value", "s1", `{}`), 200, `{"count":2}`)
	expect(t, "the used session stays", ts.post("/ng-rollout/q-a1/get_counter_value", "s2", `{}`), 200, `{"count":1}`)
}

// TestRetireIndex: retiring one rollout leaves the others' sessions alone.
func TestRetireIndex(t *testing.T) {
	ts := checkpointed(t, resources.TypeCounter, "", "")
	for i := range 20 {
		ts.post(fmt.Sprintf("/ng-rollout/r%d/seed_session", i), fmt.Sprintf("s%d", i), `{"initial_count":1}`)
	}
	ts.mustCtl("retire", map[string]any{"checkpoint_id": "ops", "episode_ids": episodes("r3", "r7")})
	if st := ts.status(); st["sessions"] != float64(18) || st["retired_sessions"] != float64(2) {
		t.Fatalf("status = %v", st)
	}
	expect(t, "another rollout", ts.post("/ng-rollout/r4/increment", "s4", `{"by":1}`), 200, `{"count":2}`)
	expectCode(t, "retired", ts.post("/increment", "s7", `{"by":1}`), 409, "stale_attempt")
}

// TestCommitWithoutScope: a commit with episode_ids null exports every
// session the server holds, live and restored, as NeMo Gym's resources
// participant does (nemo_gym/_checkpoint/resources.py @ 011c3386d691,
// export with episode_ids None; control.py: nothing restored is deleted),
// and a retry without a scope is the same commit while one with a list is
// another.
func TestCommitWithoutScope(t *testing.T) {
	dir := writeCheckpoint(t, "counter", "c0", map[string]string{
		"r": `{"episode_id":{"rollout_id":"r","attempt":0},"session_id":"s1","state":{"count":7}}`,
	}, nil)
	ts := checkpointed(t, resources.TypeCounter, "", "")
	ts.mustCtl("restore", scopeReq("c0", dir, episodes("r")...))
	ts.mustCtl("resume", ckptReq("c0"))
	expect(t, "seed", ts.post("/ng-rollout/q-a2/seed_session", "s2", `{"initial_count":1}`), 200, `{}`)

	ts.mustCtl("prepare", ckptReq("c1"))
	dir1 := t.TempDir()
	null := map[string]any{"checkpoint_id": "c1", "checkpoint_dir": dir1, "episode_ids": nil}
	m := ts.mustCtl("commit", null)
	if jsonOf(t, m["episode_ids"]) != `["q-a2","r-a1"]` || m["phase"] != "committed" {
		t.Fatalf("commit reply = %v", m)
	}
	want := []string{
		`{"episode_id":{"rollout_id":"q","attempt":2},"session_id":"s2","state":{"count":1}}`,
		`{"episode_id":{"rollout_id":"r","attempt":1},"session_id":"s1","state":{"count":7}}`,
	}
	if got := records(t, dir1, "counter", "c1"); jsonOf(t, got) != jsonOf(t, want) {
		t.Fatalf("records = %v\nwant %v", got, want)
	}
	absent := map[string]any{"checkpoint_id": "c1", "checkpoint_dir": dir1}
	if again := ts.mustCtl("commit", absent); jsonOf(t, again) != jsonOf(t, m) {
		t.Fatalf("a retry without episode_ids = %v, want the first reply %v", again, m)
	}
	expectCode(t, "the same id with a scope", ts.ctl("commit", scopeReq("c1", dir1, episodes("q-a2")...)), 409, "checkpoint_conflict")
	ts.mustCtl("resume", ckptReq("c1"))
	expect(t, "the restored session stays", ts.post("/ng-rollout/r-a1/get_counter_value", "s1", `{}`), 200, `{"count":7}`)
}
