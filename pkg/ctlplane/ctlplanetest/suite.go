package ctlplanetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Subject is one server under test, started with checkpointing enabled.
type Subject struct {
	// URL is the server's base URL.
	URL string
	// Kind and Instance are what its status must report.
	Kind, Instance string
	// Probe sends one data request that belongs to episode id and returns
	// the reply's status and error code (empty when not an error). The suite
	// uses it to check the attempt fence.
	Probe func(ctx context.Context, id rollout.EpisodeID) (status int, code string)
}

// Factory starts a fresh server (a "fresh process") whose control API uses
// cfg, and stops it at the end of the test.
type Factory func(t *testing.T, cfg ctlplane.Config) Subject

// Token is the bearer token the suite configures.
const Token = "conformance-token"

// Config is the checkpoint configuration the suite starts subjects with.
// Its root is the temp directory, which holds every t.TempDir() the
// suite commits to.
func Config() ctlplane.Config {
	return ctlplane.Config{Enabled: true, ControlAuthToken: Token, LeaseGraceSeconds: 600, Root: os.TempDir()}
}

// Run is the conformance suite: auth, bad input, the prepare/commit/resume
// cycle, restore into a fresh process, the fence, lease expiry and both
// route prefixes. Every participant kind runs it against itself.
func Run(t *testing.T, newSubject Factory) {
	t.Run("Auth", func(t *testing.T) { testAuth(t, newSubject(t, Config())) })
	t.Run("BadInputChangesNothing", func(t *testing.T) { testBadInput(t, newSubject(t, Config())) })
	t.Run("PrepareCommitResume", func(t *testing.T) { testCycle(t, newSubject(t, Config())) })
	t.Run("RestoreIntoFreshProcess", func(t *testing.T) { testRestore(t, newSubject) })
	t.Run("RetireFencesUntilForget", func(t *testing.T) { testFence(t, newSubject(t, Config())) })
	t.Run("CheckpointsConfinedToTheRoot", func(t *testing.T) { testConfined(t, newSubject) })
	t.Run("SignedCheckpoints", func(t *testing.T) { testSigned(t, newSubject) })
	t.Run("LeaseExpiryReopens", func(t *testing.T) {
		cfg := Config()
		cfg.LeaseGraceSeconds = 0.2
		testLease(t, newSubject(t, cfg))
	})
}

// RunDisabled checks a server started with checkpointing off: no control
// route answers.
func RunDisabled(t *testing.T, url string) {
	t.Helper()
	c := newClient(t, url, Token)
	for _, prefix := range []string{ctlplane.RoutePrefix, ctlplane.ReferenceRoutePrefix} {
		if st, _, _ := c.do(http.MethodGet, prefix+"/status", nil); st != http.StatusNotFound {
			t.Errorf("GET %s/status with checkpointing off answered %d, want 404", prefix, st)
		}
		if st, _, _ := c.do(http.MethodPost, prefix+"/prepare", map[string]any{"checkpoint_id": "c1", "deadline_ts": future(10)}); st != http.StatusNotFound {
			t.Errorf("POST %s/prepare with checkpointing off answered %d, want 404", prefix, st)
		}
	}
}

type client struct {
	url, token string
	prefix     string
	// scheme of the Authorization header; empty means "Bearer".
	scheme string
	t      *testing.T
	http   *http.Client
}

// newClient returns a client of the control API whose connections close
// when the test ends.
func newClient(t *testing.T, url, token string) client {
	hc := httpclient.New(httpclient.Options{})
	t.Cleanup(hc.CloseIdleConnections)
	return client{url: url, token: token, t: t, http: hc}
}

func (c client) do(method, path string, body any) (int, string, map[string]any) {
	c.t.Helper()
	h := http.Header{}
	if c.token != "" {
		scheme := c.scheme
		if scheme == "" {
			scheme = "Bearer"
		}
		h.Set("Authorization", scheme+" "+c.token)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := httpclient.Do(ctx, c.http, method, c.url+path, h, body)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	var m map[string]any
	_ = codec.Unmarshal(rep.Body, &m)
	code := ""
	if e, ok := m["error"].(map[string]any); ok {
		code, _ = e["code"].(string)
	}
	return rep.Status, code, m
}

func (c client) op(name string, body any) (int, string, map[string]any) {
	c.t.Helper()
	p := c.prefix
	if p == "" {
		p = ctlplane.RoutePrefix
	}
	if name == "status" {
		return c.do(http.MethodGet, p+"/status", nil)
	}
	return c.do(http.MethodPost, p+"/"+name, body)
}

func (c client) want(name string, body any, wantStatus int, wantCode string) map[string]any {
	c.t.Helper()
	st, code, m := c.op(name, body)
	if st != wantStatus || code != wantCode {
		c.t.Fatalf("%s %v: got %d %q (%v), want %d %q", name, body, st, code, m, wantStatus, wantCode)
	}
	return m
}

func (c client) phase() string {
	c.t.Helper()
	m := c.want("status", nil, http.StatusOK, "")
	p, _ := m["phase"].(string)
	return p
}

func future(seconds float64) float64 {
	return float64(time.Now().Add(time.Duration(seconds*float64(time.Second))).UnixNano()) / 1e9
}

func req(id string) map[string]any {
	return map[string]any{"checkpoint_id": id, "deadline_ts": future(30)}
}

func commitReq(id, dir string, scope []rollout.EpisodeID) map[string]any {
	if scope == nil {
		scope = []rollout.EpisodeID{}
	}
	return map[string]any{"checkpoint_id": id, "deadline_ts": future(30), "checkpoint_dir": dir, "episode_ids": scope, "stop": false}
}

func testAuth(t *testing.T, s Subject) {
	routes := []string{"status", "prepare", "renew", "commit", "restore", "resume", "retire", "forget"}
	for _, tok := range []string{"", "wrong-token"} {
		c := newClient(t, s.URL, tok)
		for _, r := range routes {
			if st, code, _ := c.op(r, req("c1")); st != http.StatusUnauthorized || code != "unauthorized" {
				t.Errorf("%s with token %q: got %d %q, want 401 unauthorized", r, tok, st, code)
			}
		}
	}
	// RFC 7235: the scheme is case-insensitive.
	for _, scheme := range []string{"bearer", "BEARER"} {
		c := newClient(t, s.URL, "")
		c.scheme = scheme
		c.token = Token
		if st, code, m := c.op("status", nil); st != http.StatusOK {
			t.Errorf("status with scheme %q: got %d %q (%v), want 200", scheme, st, code, m)
		}
	}
	c := newClient(t, s.URL, Token)
	m := c.want("status", nil, http.StatusOK, "")
	if m["kind"] != s.Kind || m["instance"] != s.Instance || m["phase"] != "idle" {
		t.Fatalf("status = %v, want kind %s instance %s phase idle", m, s.Kind, s.Instance)
	}
	for _, k := range []string{"checkpoint_id", "lease_expires_at", "retired_rollouts", "report"} {
		if _, ok := m[k]; !ok {
			t.Errorf("status lacks %q: %v", k, m)
		}
	}
}

// testBadInput: every body refused answers 422, as NeMo Gym's FastAPI
// routes answer the bodies their request models refuse (control.py), in
// our envelope, and changes nothing.
func testBadInput(t *testing.T, s Subject) {
	c := newClient(t, s.URL, Token)
	dir := t.TempDir()
	past := float64(time.Now().Add(-time.Minute).Unix())
	cases := []struct {
		name   string
		op     string
		body   any
		status int
		code   string
	}{
		{"unknown field", "prepare", map[string]any{"checkpoint_id": "c1", "deadline_ts": future(30), "extra": 1}, 422, "invalid_request"},
		{"malformed json", "prepare", []byte(`{"checkpoint_id":`), 422, "invalid_request"},
		{"trailing data", "prepare", []byte(`{"checkpoint_id":"c1","deadline_ts":1e10} {}`), 422, "invalid_request"},
		{"wrong type", "prepare", map[string]any{"checkpoint_id": 7, "deadline_ts": future(30)}, 422, "invalid_request"},
		{"bad id", "prepare", map[string]any{"checkpoint_id": "../etc", "deadline_ts": future(30)}, 422, "invalid_request"},
		{"empty id", "prepare", map[string]any{"checkpoint_id": "", "deadline_ts": future(30)}, 422, "invalid_request"},
		{"deadline in the past", "prepare", map[string]any{"checkpoint_id": "c1", "deadline_ts": past}, 409, "deadline_exceeded"},
		{"missing deadline", "prepare", map[string]any{"checkpoint_id": "c1"}, 422, "invalid_request"},
		{"deadline past int64 nanoseconds", "prepare", map[string]any{"checkpoint_id": "c1", "deadline_ts": 9999999999}, 422, "invalid_request"},
		{"deadline far in the future", "prepare", map[string]any{"checkpoint_id": "c1", "deadline_ts": 1e23}, 422, "invalid_request"},
		{"commit in idle", "commit", commitReq("c1", dir, nil), 409, "invalid_phase"},
		// No scope is NeMo Gym's "everything held" (control.py
		// CommitRequest), still refused in idle.
		{"commit without scope in idle", "commit", map[string]any{"checkpoint_id": "c1", "deadline_ts": future(30), "checkpoint_dir": dir}, 409, "invalid_phase"},
		{"relative dir", "commit", commitReq("c1", "relative/dir", nil), 422, "invalid_request"},
		{"bad episode id", "commit", commitReq("c1", dir, []rollout.EpisodeID{{RolloutID: "bad/id"}}), 422, "invalid_request"},
		{"renew in idle", "renew", req("c1"), 409, "invalid_phase"},
		{"retire without episodes", "retire", map[string]any{"checkpoint_id": "c1", "deadline_ts": future(30), "episode_ids": []any{}}, 422, "invalid_request"},
		{"retire unknown field", "retire", map[string]any{"deadline_ts": future(30), "episode_ids": []any{map[string]any{"rollout_id": "r", "attempt": 0, "x": 1}}}, 422, "invalid_request"},
		{"forget bad rollout id", "forget", map[string]any{"checkpoint_id": "c1", "deadline_ts": future(30), "rollout_ids": []string{"a/b"}}, 422, "invalid_request"},
		{"restore relative dir", "restore", map[string]any{"checkpoint_id": "c1", "deadline_ts": future(30), "checkpoint_dir": "x", "episode_ids": []any{}}, 422, "invalid_request"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c.t = t
			c.want(tc.op, tc.body, tc.status, tc.code)
			if p := c.phase(); p != "idle" {
				t.Fatalf("phase after a refused %s = %s, want idle", tc.op, p)
			}
		})
	}
	// Refusals in an open checkpoint leave it as it was.
	c.t = t
	c.want("prepare", req("c1"), http.StatusOK, "")
	c.want("prepare", req("c2"), http.StatusConflict, "checkpoint_conflict")
	c.want("retire", map[string]any{"checkpoint_id": "c1", "deadline_ts": future(30), "episode_ids": []any{map[string]any{"rollout_id": "r", "attempt": 0}}}, http.StatusConflict, "invalid_phase")
	c.want("forget", map[string]any{"checkpoint_id": "c1", "deadline_ts": future(30), "rollout_ids": []string{"r"}}, http.StatusConflict, "invalid_phase")
	c.want("restore", map[string]any{"checkpoint_id": "c1", "deadline_ts": future(30), "checkpoint_dir": dir, "episode_ids": []any{}}, http.StatusConflict, "invalid_phase")
	if p := c.phase(); p != "prepared" {
		t.Fatalf("phase = %s, want prepared", p)
	}
	c.want("resume", req("c1"), http.StatusOK, "")
}

// testConfined: a control token reaches checkpoint files beneath the
// configured root only. A checkpoint_dir outside it, one climbing out with
// "..", and one reaching it through a symbolic link are refused as bad
// requests, nothing is written outside, and a restore through a link to a
// system file answers without a byte of it.
func testConfined(t *testing.T, newSubject Factory) {
	base := t.TempDir()
	root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := Config()
	cfg.Root = root // made by the server at start
	s := newSubject(t, cfg)
	c := newClient(t, s.URL, Token)
	c.want("prepare", req("c1"), http.StatusOK, "")
	for _, dir := range []string{outside, root + "/ck/../../outside", root + "/a/../ck", base} {
		c.want("commit", commitReq("c1", dir, nil), http.StatusUnprocessableEntity, "invalid_request")
		c.want("restore", map[string]any{"checkpoint_id": "c1", "deadline_ts": future(30), "checkpoint_dir": dir, "episode_ids": []any{}}, http.StatusUnprocessableEntity, "invalid_request")
	}
	linked := filepath.Join(root, "linked")
	if err := os.MkdirAll(linked, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(linked, "gym")); err != nil {
		t.Fatal(err)
	}
	c.want("commit", commitReq("c1", linked, nil), http.StatusUnprocessableEntity, "invalid_request")
	if p := c.phase(); p != "prepared" {
		t.Fatalf("phase after a refused commit = %s, want prepared", p)
	}
	c.want("commit", commitReq("c1", filepath.Join(root, "good"), nil), http.StatusOK, "")
	c.want("resume", req("c1"), http.StatusOK, "")
	if entries, err := os.ReadDir(outside); err != nil || len(entries) != 0 {
		t.Fatalf("the directory outside the root holds %v (%v), want nothing", entries, err)
	}

	const sys = "/etc/passwd"
	content, err := os.ReadFile(sys)
	if err != nil || len(content) == 0 {
		t.Fatalf("reading %s: %v", sys, err)
	}
	evil := filepath.Join(root, "evil")
	inst := ckptstore.Target{Dir: evil, Kind: s.Kind, Instance: s.Instance}.ParticipantDir()
	if err := os.MkdirAll(inst, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(sys, filepath.Join(inst, ckptstore.ManifestFile)); err != nil {
		t.Fatal(err)
	}
	fresh := newClient(t, newSubject(t, cfg).URL, Token)
	restore := func(dir string) string {
		m := fresh.want("restore", map[string]any{"checkpoint_id": "r1", "deadline_ts": future(30), "checkpoint_dir": dir, "episode_ids": []any{}},
			http.StatusUnprocessableEntity, "invalid_checkpoint_state")
		e, _ := m["error"].(map[string]any)
		detail, _ := e["detail"].(string)
		return detail
	}
	linkedDetail := restore(evil)
	first, _, _ := strings.Cut(string(content), "\n")
	sum := sha256.Sum256(content)
	for _, leak := range []string{first, hex.EncodeToString(sum[:])[:12], "'" + string(content[0]) + "'"} {
		if strings.Contains(linkedDetail, leak) {
			t.Errorf("a restore through a link to %s answered %q, which holds %q", sys, linkedDetail, leak)
		}
	}
	// A missing manifest is the same answer, bar the directory named.
	missingDetail := restore(filepath.Join(root, "missing"))
	if strings.ReplaceAll(missingDetail, filepath.Join(root, "missing"), evil) != linkedDetail {
		t.Errorf("a missing manifest answered %q, a linked one %q: they must not be told apart", missingDetail, linkedDetail)
	}
}

// testSigned: with checkpoint.signing_key_file set, a commit's manifest
// is signed and a restore refuses a manifest unsigned or signed with
// another key, without quoting the signature; without a key, signed
// manifests restore as any other.
func testSigned(t *testing.T, newSubject Factory) {
	keys := t.TempDir()
	keyed := func(name, key string) ctlplane.Config {
		p := filepath.Join(keys, name)
		if err := os.WriteFile(p, []byte(key+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := Config()
		cfg.SigningKeyFile = p
		return cfg
	}
	cfgA := keyed("a", strings.Repeat("a1", 32))
	cfgB := keyed("b", strings.Repeat("b2", 32))
	commit := func(cfg ctlplane.Config, id string) (string, map[string]any) {
		c := newClient(t, newSubject(t, cfg).URL, Token)
		dir := t.TempDir()
		c.want("prepare", req(id), http.StatusOK, "")
		m := c.want("commit", commitReq(id, dir, nil), http.StatusOK, "")
		c.want("resume", req(id), http.StatusOK, "")
		man, _ := m["manifest"].(map[string]any)
		return dir, man
	}
	restore := func(cfg ctlplane.Config, id, dir string, status int, code string) string {
		f := newClient(t, newSubject(t, cfg).URL, Token)
		m := f.want("restore", map[string]any{"checkpoint_id": id, "deadline_ts": future(30), "checkpoint_dir": dir, "episode_ids": []any{}}, status, code)
		if status == http.StatusOK {
			f.want("resume", req(id), http.StatusOK, "")
			return ""
		}
		e, _ := m["error"].(map[string]any)
		detail, _ := e["detail"].(string)
		return detail
	}
	signedDir, man := commit(cfgA, "s1")
	sig, _ := man[ckptstore.HMACField].(string)
	if len(sig) != 64 {
		t.Fatalf("a keyed commit's manifest carries %s %q, want 64 hex digits (manifest %v)", ckptstore.HMACField, sig, man)
	}
	restore(cfgA, "s1", signedDir, http.StatusOK, "")
	restore(Config(), "s1", signedDir, http.StatusOK, "")
	detail := restore(cfgB, "s1", signedDir, http.StatusUnprocessableEntity, "invalid_checkpoint_state")
	if !strings.Contains(detail, "signature") || strings.Contains(detail, sig[:12]) {
		t.Errorf("restore with another key answered %q: want it to name the signature, not quote it", detail)
	}
	unsignedDir, man := commit(Config(), "u1")
	if _, ok := man[ckptstore.HMACField]; ok {
		t.Errorf("an unkeyed commit's manifest is signed: %v", man)
	}
	if detail := restore(cfgA, "u1", unsignedDir, http.StatusUnprocessableEntity, "invalid_checkpoint_state"); !strings.Contains(detail, "signature") {
		t.Errorf("restore of an unsigned checkpoint with a key answered %q, want it to name the signature", detail)
	}
}

func testCycle(t *testing.T, s Subject) {
	for _, prefix := range []string{ctlplane.RoutePrefix, ctlplane.ReferenceRoutePrefix} {
		t.Run(strings.TrimPrefix(prefix, "/"), func(t *testing.T) {
			c := newClient(t, s.URL, Token)
			c.prefix = prefix
			id := "cycle-" + strings.ReplaceAll(strings.Trim(prefix, "/"), "/", "-")
			dir := t.TempDir()
			m := c.want("prepare", req(id), http.StatusOK, "")
			if m["phase"] != "prepared" {
				t.Fatalf("an idle participant must prepare at once, got %v", m)
			}
			rep, _ := m["report"].(map[string]any)
			if rep["ready"] != true || rep["blocker_count"] != float64(0) {
				t.Fatalf("report of an idle participant = %v", rep)
			}
			if again := c.want("prepare", req(id), http.StatusOK, ""); again["phase"] != "prepared" {
				t.Fatalf("a retried prepare replays the prepared reply, got %v", again)
			}
			c.want("prepare", req(id+"-other"), http.StatusConflict, "checkpoint_conflict")
			st := c.want("status", nil, http.StatusOK, "")
			if st["phase"] != "prepared" || st["checkpoint_id"] != id || st["lease_expires_at"] == nil {
				t.Fatalf("status while prepared = %v", st)
			}
			if r := c.want("renew", req(id), http.StatusOK, ""); r["lease_expires_at"] == nil {
				t.Fatalf("renew reply = %v", r)
			}
			cm := c.want("commit", commitReq(id, dir, nil), http.StatusOK, "")
			if secs, ok := cm["write_seconds"].(float64); cm["phase"] != "committed" || !ok || secs <= 0 {
				t.Fatalf("commit reply = %v", cm)
			}
			man, _ := cm["manifest"].(map[string]any)
			if man["checkpoint_id"] != id || man["kind"] != s.Kind || man["instance"] != s.Instance || man["schema_version"] != float64(1) {
				t.Fatalf("manifest = %v", man)
			}
			store, err := ckptstore.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			got, _, _, err := store.Read(context.Background(), ckptstore.Target{Dir: dir, Kind: s.Kind, Instance: s.Instance, CheckpointID: id}, nil)
			if err != nil {
				t.Fatalf("the committed directory does not verify: %v", err)
			}
			if got.RecordsSHA256 != man["records_sha256"] {
				t.Fatalf("manifest on disk %v differs from the reply %v", got, man)
			}
			again := c.want("commit", commitReq(id, dir, nil), http.StatusOK, "")
			if m2, _ := again["manifest"].(map[string]any); m2["records_sha256"] != man["records_sha256"] {
				t.Fatalf("a retried commit must replay the manifest: %v vs %v", m2, man)
			}
			c.want("commit", commitReq(id, t.TempDir(), nil), http.StatusConflict, "checkpoint_conflict")
			c.want("commit", commitReq(id, dir, []rollout.EpisodeID{{RolloutID: "someone-else"}}), http.StatusConflict, "checkpoint_conflict")
			c.want("retire", map[string]any{"checkpoint_id": id, "deadline_ts": future(30), "episode_ids": []any{map[string]any{"rollout_id": "r"}}}, http.StatusConflict, "invalid_phase")
			if r := c.want("resume", req(id), http.StatusOK, ""); r["phase"] != "idle" || r["idempotent"] != false {
				t.Fatalf("resume reply = %v", r)
			}
			if r := c.want("resume", req(id), http.StatusOK, ""); r["idempotent"] != true {
				t.Fatalf("a second resume must be idempotent: %v", r)
			}
			c.want("prepare", req(id), http.StatusConflict, "stale_checkpoint")
			c.want("commit", commitReq(id, dir, nil), http.StatusConflict, "stale_checkpoint")
			if st := c.want("status", nil, http.StatusOK, ""); st["phase"] != "idle" || st["lease_expires_at"] != nil {
				t.Fatalf("status after resume = %v", st)
			}
		})
	}
}

func testRestore(t *testing.T, newSubject Factory) {
	src := newSubject(t, Config())
	c := newClient(t, src.URL, Token)
	dir := t.TempDir()
	c.want("prepare", req("r1"), http.StatusOK, "")
	c.want("commit", commitReq("r1", dir, nil), http.StatusOK, "")
	c.want("resume", req("r1"), http.StatusOK, "")

	fresh := newSubject(t, Config())
	f := newClient(t, fresh.URL, Token)
	restoreReq := map[string]any{"checkpoint_id": "r1", "deadline_ts": future(30), "checkpoint_dir": dir, "episode_ids": []any{}}
	m := f.want("restore", restoreReq, http.StatusOK, "")
	read, okRead := m["read_seconds"].(float64)
	install, okInstall := m["install_seconds"].(float64)
	if m["phase"] != "restored" || m["source_checkpoint_id"] != "r1" || !okRead || !okInstall || read <= 0 || install < 0 {
		t.Fatalf("restore reply = %v", m)
	}
	if again := f.want("restore", restoreReq, http.StatusOK, ""); again["phase"] != "restored" {
		t.Fatalf("a retried restore replays: %v", again)
	}
	if p := f.phase(); p != "restored" {
		t.Fatalf("phase = %s, want restored", p)
	}
	f.want("resume", req("r1"), http.StatusOK, "")

	// A directory without this participant's commit is refused, and the
	// participant stays idle and open.
	other := newSubject(t, Config())
	o := newClient(t, other.URL, Token)
	o.want("restore", map[string]any{"checkpoint_id": "r2", "deadline_ts": future(30), "checkpoint_dir": t.TempDir(), "episode_ids": []any{}}, http.StatusUnprocessableEntity, "invalid_checkpoint_state")
	if p := o.phase(); p != "idle" {
		t.Fatalf("phase after a refused restore = %s, want idle", p)
	}
	// A directory another checkpoint id wrote restores, naming it as the
	// source (NeMo Gym's control.py _restore; NeMo RL's adapter checks
	// source_checkpoint_id).
	if r := o.want("restore", map[string]any{"checkpoint_id": "r3", "deadline_ts": future(30), "checkpoint_dir": dir, "episode_ids": []any{}}, http.StatusOK, ""); r["source_checkpoint_id"] != "r1" {
		t.Fatalf("restore of r1's directory as r3 = %v, want source_checkpoint_id r1", r)
	}
	o.want("resume", req("r3"), http.StatusOK, "")
	o.want("prepare", req("r4"), http.StatusOK, "")
	o.want("resume", req("r4"), http.StatusOK, "")
}

func testFence(t *testing.T, s Subject) {
	c := newClient(t, s.URL, Token)
	ctx := context.Background()
	retired := rollout.EpisodeID{RolloutID: "fenced-1", Attempt: 1}
	if st, code := s.Probe(ctx, retired); code == "stale_attempt" {
		t.Fatalf("before retire the probe must not be fenced, got %d %s", st, code)
	}
	// Both bodies name a checkpoint, as NeMo Gym's RetireRequest and
	// ForgetRequest require (nemo_gym/_checkpoint/control.py).
	c.want("retire", map[string]any{"deadline_ts": future(30), "episode_ids": []rollout.EpisodeID{retired}}, http.StatusUnprocessableEntity, "invalid_request")
	c.want("forget", map[string]any{"deadline_ts": future(30), "rollout_ids": []string{"fenced-1"}}, http.StatusUnprocessableEntity, "invalid_request")
	m := c.want("retire", map[string]any{"checkpoint_id": "ops", "deadline_ts": future(30), "episode_ids": []rollout.EpisodeID{retired}}, http.StatusOK, "")
	if fmt.Sprint(m["retired"]) != "[fenced-1-a1]" {
		t.Fatalf("retire reply = %v", m)
	}
	for _, id := range []rollout.EpisodeID{retired, {RolloutID: "fenced-1", Attempt: 0}} {
		if st, code := s.Probe(ctx, id); st != http.StatusConflict || code != "stale_attempt" {
			t.Fatalf("probe of retired %s: got %d %q, want 409 stale_attempt", id, st, code)
		}
	}
	if _, code := s.Probe(ctx, rollout.EpisodeID{RolloutID: "fenced-1", Attempt: 2}); code == "stale_attempt" {
		t.Fatalf("the next attempt must not be fenced")
	}
	if st := c.want("status", nil, http.StatusOK, ""); st["retired_rollouts"] != float64(1) {
		t.Fatalf("status retired_rollouts = %v, want 1", st["retired_rollouts"])
	}
	if f := c.want("forget", map[string]any{"checkpoint_id": "ops", "deadline_ts": future(30), "rollout_ids": []string{"fenced-1", "a-done"}}, http.StatusOK, ""); fmt.Sprint(f["forgotten"]) != "[a-done fenced-1]" {
		t.Fatalf("forget reply = %v, want the rollouts sorted", f)
	}
	if _, code := s.Probe(ctx, retired); code == "stale_attempt" {
		t.Fatalf("forget must clear the fence")
	}
	if st := c.want("status", nil, http.StatusOK, ""); st["retired_rollouts"] != float64(0) {
		t.Fatalf("status retired_rollouts after forget = %v, want 0", st["retired_rollouts"])
	}
}

func testLease(t *testing.T, s Subject) {
	c := newClient(t, s.URL, Token)
	c.want("prepare", map[string]any{"checkpoint_id": "lease-1", "deadline_ts": future(0.3)}, http.StatusOK, "")
	// A controller that died: nobody resumes, and the lease (deadline +
	// 0.2 s) reopens the participant by itself.
	deadline := time.Now().Add(10 * time.Second)
	for c.phase() != "idle" {
		if time.Now().After(deadline) {
			t.Fatalf("the lease never expired: phase %s", c.phase())
		}
		pollPause()
	}
	c.want("commit", commitReq("lease-1", filepath.Join(t.TempDir(), "x"), nil), http.StatusConflict, "stale_checkpoint")
}

// pollPause waits between two polls of a condition.
func pollPause() { <-time.After(20 * time.Millisecond) }

// Store is a store confined to root, made if missing (tests read and write
// a checkpoint directory through one rooted at it), closed when t ends.
func Store(t testing.TB, root string) *ckptstore.Store {
	t.Helper()
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := ckptstore.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
