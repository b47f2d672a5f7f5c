package resources

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

func newParticipant(t *testing.T, typ, mode, verify string) (*Server, *participant) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Name, cfg.Type, cfg.CheckpointMode, cfg.VerifyMode = typ, typ, mode, verify
	cfg.Checkpoint = ctlplane.Config{Enabled: true, ControlAuthToken: "t", LeaseGraceSeconds: 600, Root: os.TempDir()}
	s, err := New(cfg, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.ckpt.ctl.Close)
	return s, &participant{s: s, ck: s.ckpt}
}

// request is a data request, of the episode key names when not empty.
func request(key string) *http.Request {
	r := httptest.NewRequest("POST", "/x", nil)
	if key != "" {
		id, err := rollout.ParseCaptureKey(key)
		if err != nil {
			panic(err)
		}
		r = r.WithContext(rollout.WithEpisode(r.Context(), id))
	}
	return r
}

// TestReadyNotifies: readiness is a count, and reaching 0 notifies.
func TestReadyNotifies(t *testing.T) {
	s, p := newParticipant(t, TypeCounter, "", "")
	_, leave, err := s.enter(request("r"), opSeed, "s1", &counterState{})
	if err != nil {
		t.Fatal(err)
	}
	changed := p.ReadyChanged()
	if p.Ready() {
		t.Fatal("ready with a seed in flight")
	}
	if rep := p.Report(ctlplane.MaxBlockers); rep.BlockerCount != 1 || rep.Blockers[0] != "r" {
		t.Fatalf("report = %+v", rep)
	}
	leave()
	leave() // a second leave changes nothing
	select {
	case <-changed:
	default:
		t.Fatal("ReadyChanged was not notified when the count reached 0")
	}
	if !p.Ready() || p.ck.blocking != 0 || len(p.ck.blockingBy) != 0 {
		t.Fatalf("after leave: ready %v, blocking %d %v", p.Ready(), p.ck.blocking, p.ck.blockingBy)
	}
}

// TestAdmitClosesTheRace: a request that passed the controller's gate just
// before admission closed still waits in enter, without counting, until
// admission reopens.
func TestAdmitClosesTheRace(t *testing.T) {
	s, p := newParticipant(t, TypeCounter, "", "")
	if _, leave, err := s.enter(request("r"), opSeed, "s1", &counterState{}); err != nil {
		t.Fatal(err)
	} else {
		leave()
	}
	if err := p.CloseAdmission(context.Background()); err != nil {
		t.Fatal(err)
	}
	entered := make(chan error, 1)
	go func() {
		_, leave, err := s.enter(request("r"), opTool, "s1", nil)
		if err == nil {
			leave()
		}
		entered <- err
	}()
	// A replayable verify is admitted meanwhile, and does not count.
	_, leave, err := s.enter(request("r"), opVerify, "s1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Ready() {
		t.Fatal("a replayable verify counted toward readiness")
	}
	leave()
	select {
	case err := <-entered:
		t.Fatalf("a tool call entered while admission was closed: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	p.OpenAdmission()
	if err := <-entered; err != nil {
		t.Fatalf("tool call after reopen: %v", err)
	}
}

// TestFreshProcessHoldsEverything: while a fresh process is closed (a
// restore installing), even requests a checkpoint admits wait.
func TestFreshProcessHoldsEverything(t *testing.T) {
	s, p := newParticipant(t, TypeCounter, ModeRestartOnly, "")
	if err := p.CloseAdmission(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	r := request("r").WithContext(ctx)
	if _, _, err := s.enter(r, opTool, "", nil); err == nil {
		t.Fatal("a tool call entered a fresh process during a restore")
	}
	if err := p.Fresh(); err != nil {
		t.Fatalf("a request that only waited made the process not fresh: %v", err)
	}
	if _, err := p.Install(context.Background(), nil, ctlplane.NewScope(nil), ctlplane.Extras{}); err != nil {
		t.Fatal(err)
	}
	_, leave, err := s.enter(request("r"), opTool, "", nil)
	if err != nil {
		t.Fatalf("after install a restart_only tool call passes: %v", err)
	}
	leave()
}

// FuzzInstallRecord feeds arbitrary record bytes to a counter's restore:
// it refuses or installs, never panics, and an installed session works.
func FuzzInstallRecord(f *testing.F) {
	for _, s := range []string{
		`{"episode_id":{"rollout_id":"r","attempt":0},"session_id":"s1","state":{"count":3}}`,
		`{"episode_id":{"rollout_id":"r","attempt":0},"session_id":"s1","state":null}`,
		`{"episode_id":{"rollout_id":"r","attempt":0},"session_id":"s1","state":{"count":1e2}}`,
		`{"episode_id":{"rollout_id":"r","attempt":0},"session_id":"s1","state":{"count":9223372036854775808}}`,
		`{"session_id":"s1","episode_id":{"rollout_id":"r","attempt":-1},"state":{"count":1}}`,
		`{"episode_id":{"rollout_id":"r","attempt":0},"session_id":"","state":{}}`,
		`{"session_id":"s1","episode_id":{"rollout_id":"r"},"state":[1]}`,
		`{"session_id":"s1"}`, `null`, `[]`, `{`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, p := newParticipant(t, TypeCounter, "", "")
		ep := rollout.EpisodeID{RolloutID: "r"}
		next, err := p.Install(context.Background(), []ctlplane.Record{{EpisodeID: ep, Data: data}}, ctlplane.NewScope([]rollout.EpisodeID{ep}), ctlplane.Extras{})
		if err != nil {
			if st := p.StatusExtra(); st["sessions"] != 0 {
				t.Fatalf("a refused install left sessions: %v", st)
			}
			return
		}
		rec, derr := DecodeSessionRecord(data)
		if derr != nil || len(next) != 1 || next[0] != ep.Next() {
			t.Fatalf("installed %v from a record that decodes with %v", next, derr)
		}
		sess := s.sessions[rec.SessionID]
		sess.mu.Lock()
		_, err = counterOf(sess)
		sess.mu.Unlock()
		if err != nil {
			t.Fatalf("installed session has no counter: %v", err)
		}
	})
}

// Ensure an install names an episode with several sessions once, indexes
// every session under its rollout, and Forget removes each retired one
// from the list it walks.
func TestInstall_SessionsOfOneEpisode(t *testing.T) {
	s, p := newParticipant(t, TypeCounter, "", "")
	r, q := rollout.EpisodeID{RolloutID: "r"}, rollout.EpisodeID{RolloutID: "q"}
	record := func(session string, ep rollout.EpisodeID) ctlplane.Record {
		data := fmt.Sprintf(`{"session_id":%q,"episode_id":{"rollout_id":%q,"attempt":%d},"state":{"count":1}}`, session, ep.RolloutID, ep.Attempt)
		return ctlplane.Record{EpisodeID: ep, Data: []byte(data)}
	}
	records := []ctlplane.Record{record("s1", r), record("s2", q), record("s3", r)}
	next, err := p.Install(context.Background(), records, ctlplane.NewScope([]rollout.EpisodeID{r, q}), ctlplane.Extras{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []rollout.EpisodeID{q.Next(), r.Next()}; !slices.Equal(next, want) {
		t.Fatalf("installed %v, want %v", next, want)
	}
	if got := len(s.byRollout["r"]); got != 2 {
		t.Fatalf("rollout r indexes %d sessions, want 2", got)
	}
	if err := p.Retire(context.Background(), []rollout.EpisodeID{r.Next()}); err != nil {
		t.Fatal(err)
	}
	if err := p.Forget(context.Background(), []string{"r"}); err != nil {
		t.Fatal(err)
	}
	if list, ok := s.byRollout["r"]; ok || s.sessions["s1"] != nil || s.sessions["s3"] != nil {
		t.Fatalf("after retire and forget rollout r still indexes %d sessions (s1 %v, s3 %v)", len(list), s.sessions["s1"] != nil, s.sessions["s3"] != nil)
	}
	if len(s.byRollout["q"]) != 1 || s.sessions["s2"] == nil {
		t.Fatal("forgetting rollout r touched rollout q")
	}
}
