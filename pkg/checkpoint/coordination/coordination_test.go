package coordination_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

const token = "coord-token"

type fleet struct {
	fakes     map[string]*ctlplanetest.Fake
	endpoints []coordination.Endpoint
	mu        sync.Mutex
	calls     []string
}

func (f *fleet) record(op string, m coordination.Member) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, op+" "+m.Name)
}

func (f *fleet) callsOf(op string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		if strings.HasPrefix(c, op+" ") {
			out = append(out, strings.TrimPrefix(c, op+" "))
		}
	}
	return out
}

// newFleet starts one in-process server per named participant, plus a
// server that does not take part (fakeinference-like).
func newFleet(t *testing.T, kinds map[string]string) *fleet {
	t.Helper()
	return newFleetWith(t, kinds, ctlplane.Config{Enabled: true, ControlAuthToken: token, LeaseGraceSeconds: 600, Root: os.TempDir(), EpochFile: filepath.Join(t.TempDir(), "EPOCH")})
}

func newFleetWith(t *testing.T, kinds map[string]string, cfg ctlplane.Config) *fleet {
	t.Helper()
	f := &fleet{fakes: map[string]*ctlplanetest.Fake{}}
	for name, kind := range kinds {
		fake := ctlplanetest.NewFake(kind, name)
		c, err := ctlplane.New(cfg, fake, ctlplane.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		r := httpserver.NewRouter(httpserver.RouterOptions{})
		c.Mount(r)
		url := serve(t, r)
		t.Cleanup(c.Close)
		f.fakes[name] = fake
		f.endpoints = append(f.endpoints, coordination.Endpoint{Name: name, URL: url})
	}
	f.endpoints = append(f.endpoints, coordination.Endpoint{Name: "fakeinference", URL: serve(t, httpserver.NewRouter(httpserver.RouterOptions{}))})
	return f
}

// serve runs h on a real fleet server (HTTP/1.1 and h2c) on a free port.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	s := httpserver.New(httpserver.Config{Addr: "127.0.0.1:0"}, h)
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() {
		s.Close(context.Background())
		<-done
	})
	return s.URL()
}

var standard = map[string]string{
	"env": "environment", "policy": "model", "agent": "agent", "weather": "resources", "counter": "resources",
}

func (f *fleet) discover(t *testing.T) *coordination.Coordinator {
	t.Helper()
	c, err := coordination.Discover(context.Background(), f.endpoints, coordination.Options{Token: token, OnCall: f.record})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func in(d time.Duration) time.Time { return time.Now().Add(d) }

func TestDiscover(t *testing.T) {
	f := newFleet(t, standard)
	c := f.discover(t)
	var names []string
	for _, m := range c.Members() {
		names = append(names, m.Name+":"+m.Kind)
	}
	want := []string{"env:environment", "policy:model", "agent:agent", "counter:resources", "weather:resources"}
	if !slices.Equal(names, want) {
		t.Fatalf("members %v, want %v (prepare order, then name; fakeinference is no participant)", names, want)
	}
	t.Run("WrongToken", func(t *testing.T) {
		_, err := coordination.Discover(context.Background(), f.endpoints, coordination.Options{Token: "nope"})
		var ce *coordination.Error
		if !errors.As(err, &ce) || ce.Code() != "unauthorized" {
			t.Fatalf("got %v, want an unauthorized coordination error", err)
		}
	})
	t.Run("Unreachable", func(t *testing.T) {
		eps := append(append([]coordination.Endpoint(nil), f.endpoints...), coordination.Endpoint{Name: "gone", URL: "http://127.0.0.1:1"})
		_, err := coordination.Discover(context.Background(), eps, coordination.Options{Token: token})
		if err == nil || !strings.Contains(err.Error(), "gone") {
			t.Fatalf("an unreachable server must fail discovery by name, got %v", err)
		}
	})
	t.Run("NoModel", func(t *testing.T) {
		g := newFleet(t, map[string]string{"env": "environment"})
		if _, err := coordination.Discover(context.Background(), g.endpoints, coordination.Options{Token: token}); err == nil {
			t.Fatal("a fleet without a policy model must be refused")
		}
	})
}

func TestCycle_OrderOfCalls(t *testing.T) {
	f := newFleet(t, standard)
	c := f.discover(t)
	ctx := context.Background()
	live := rollout.EpisodeID{RolloutID: "r1"}
	for _, fake := range f.fakes {
		fake.SetEpisode(live, true)
	}
	res, err := c.Prepare(ctx, "c1", in(30*time.Second))
	if err != nil || !res.Prepared {
		t.Fatalf("prepare: %+v %v", res, err)
	}
	if got := f.callsOf("prepare"); !ordered(got, [][]string{{"env"}, {"policy"}, {"agent"}, {"counter", "weather"}}) {
		t.Fatalf("prepare calls %v are not stage by stage env, model, agent, resources", got)
	}
	if len(res.Stages) != 4 {
		t.Fatalf("stages = %d, want 4", len(res.Stages))
	}
	dir := t.TempDir()
	cm, err := c.Commit(ctx, "c1", dir, []rollout.EpisodeID{live}, in(30*time.Second), false)
	if err != nil {
		t.Fatal(err)
	}
	if got := cm.Exported(); !slices.Equal(got, []string{"r1"}) {
		t.Fatalf("exported %v", got)
	}
	if ms, err := c.Verify(ctx, dir, "c1", nil); err != nil || len(ms) != 5 {
		t.Fatalf("verify: %d manifests, %v", len(ms), err)
	}
	if err := c.Resume(ctx, "c1", in(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := f.callsOf("resume"); !ordered(got, [][]string{{"counter", "weather"}, {"agent"}, {"policy"}, {"env"}}) {
		t.Fatalf("resume calls %v are not in reverse order", got)
	}
	for name, fake := range f.fakes {
		if fake.Closed() {
			t.Fatalf("%s still closed after resume", name)
		}
	}
	if err := c.Retire(ctx, "", []rollout.EpisodeID{live}, in(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := f.callsOf("retire"); !ordered(got, [][]string{{"env"}, {"agent"}, {"counter", "policy", "weather"}}) {
		t.Fatalf("retire calls %v: want environment, then agent, then model and resources", got)
	}
	if err := c.Forget(ctx, []string{"r1"}, in(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := f.callsOf("forget"); !ordered(got, [][]string{{"env"}, {"agent"}, {"counter", "policy", "weather"}}) {
		t.Fatalf("forget calls %v", got)
	}
}

// ordered reports whether calls consist of the groups in order, each group
// in any order.
func ordered(calls []string, groups [][]string) bool {
	i := 0
	for _, g := range groups {
		if i+len(g) > len(calls) {
			return false
		}
		got := slices.Clone(calls[i : i+len(g)])
		slices.Sort(got)
		want := slices.Clone(g)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			return false
		}
		i += len(g)
	}
	return i == len(calls)
}

func TestPrepare_StopsAtTheFirstStageNotPreparedAndNamesBlockers(t *testing.T) {
	f := newFleet(t, standard)
	c := f.discover(t)
	f.fakes["agent"].SetEpisode(rollout.EpisodeID{RolloutID: "slow", Attempt: 1}, false)
	f.fakes["env"].SetRestart(rollout.EpisodeID{RolloutID: "restart"})
	res, err := c.Prepare(context.Background(), "c1", in(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if res.Prepared {
		t.Fatal("prepared with a blocking agent")
	}
	if got := f.callsOf("prepare"); slices.Contains(got, "weather") || slices.Contains(got, "counter") {
		t.Fatalf("resources were prepared after the agent stage failed: %v", got)
	}
	if b := res.Blockers(); len(b) != 1 || !slices.Equal(b["agent"], []string{"slow-a1"}) {
		t.Fatalf("blockers = %v, want agent: [slow-a1]", b)
	}
	if r := res.Restarts(); !slices.Equal(r, []string{"restart"}) {
		t.Fatalf("restarts = %v", r)
	}
	cont := res.Continued([]rollout.EpisodeID{{RolloutID: "restart"}, {RolloutID: "slow", Attempt: 1}})
	if len(cont) != 1 || cont[0].RolloutID != "slow" {
		t.Fatalf("continued = %v, want restarts left out", cont)
	}
	if err := c.Resume(context.Background(), "c1", in(30*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// Ensure a restore that fails on one participant leaves every participant
// open with nothing installed.
func TestRestore_AllOrNothing(t *testing.T) {
	src := newFleet(t, standard)
	c := src.discover(t)
	ctx := context.Background()
	ids := []rollout.EpisodeID{{RolloutID: "r1"}, {RolloutID: "r2", Attempt: 3}}
	for _, fake := range src.fakes {
		for _, id := range ids {
			fake.SetEpisode(id, true)
		}
	}
	dir := t.TempDir()
	if res, err := c.Prepare(ctx, "c1", in(30*time.Second)); err != nil || !res.Prepared {
		t.Fatal(res, err)
	}
	if _, err := c.Commit(ctx, "c1", dir, ids, in(30*time.Second), false); err != nil {
		t.Fatal(err)
	}
	if err := c.Resume(ctx, "c1", in(30*time.Second)); err != nil {
		t.Fatal(err)
	}

	t.Run("OneParticipantFails", func(t *testing.T) {
		fresh := newFleet(t, standard)
		fresh.fakes["counter"].InstallErr = errors.New("counter state is not an integer")
		fc := fresh.discover(t)
		_, err := fc.Restore(ctx, "c1", dir, ids, in(30*time.Second))
		if err == nil || !strings.Contains(err.Error(), "counter") {
			t.Fatalf("restore must fail naming counter, got %v", err)
		}
		for name, fake := range fresh.fakes {
			if fake.Closed() {
				t.Errorf("%s left closed after a failed restore", name)
			}
			if eps := fake.Episodes(); len(eps) != 0 {
				t.Errorf("%s kept installed episodes %v after a failed restore", name, eps)
			}
		}
		st, err := fc.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for name, s := range st {
			if s["phase"] != "idle" {
				t.Errorf("%s phase %v, want idle", name, s["phase"])
			}
		}
		if got := fresh.callsOf("retire"); len(got) != 5 {
			t.Errorf("the next attempts must be retired everywhere, retire calls: %v", got)
		}
	})
	t.Run("AllSucceed", func(t *testing.T) {
		fresh := newFleet(t, standard)
		fc := fresh.discover(t)
		res, err := fc.Restore(ctx, "c1", dir, ids, in(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for name, rep := range res.Replies {
			if !slices.Equal(rep.Restored, []string{"r1-a1", "r2-a4"}) {
				t.Fatalf("%s restored %v, want the next attempts", name, rep.Restored)
			}
			if res.Seconds[name] <= 0 {
				t.Errorf("%s: call time %v, want the call timed", name, res.Seconds[name])
			}
		}
		if len(res.Seconds) != len(res.Replies) {
			t.Errorf("%d call times for %d replies", len(res.Seconds), len(res.Replies))
		}
		if err := fc.Resume(ctx, "c1", in(30*time.Second)); err != nil {
			t.Fatal(err)
		}
	})
}

func TestControlCallsCarryDeadlinesAndAreNotRetried(t *testing.T) {
	var mu sync.Mutex
	hits := 0
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits++
		mu.Unlock()
		w.WriteHeader(http.StatusBadGateway)
	}))
	c := coordination.New([]coordination.Member{{Name: "m", URL: url, Kind: "model", Instance: "m"}}, coordination.Options{Token: token})
	_, err := c.Commit(context.Background(), "c1", "/tmp/x", nil, in(time.Second), false)
	if err == nil {
		t.Fatal("a 502 must fail the commit")
	}
	if hits != 1 {
		t.Fatalf("commit was sent %d times; control calls are never retried", hits)
	}
}

// Verify checks signatures when given the servers' key, refuses the
// checkpoint with another key, and without one reports which manifests
// carry a signature it did not check.
func TestVerify_SignedCheckpoint(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "key")
	key := []byte(strings.Repeat("k", 32))
	if err := os.WriteFile(keyFile, append(key, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := ctlplane.Config{Enabled: true, ControlAuthToken: token, LeaseGraceSeconds: 600, Root: os.TempDir(), SigningKeyFile: keyFile, EpochFile: filepath.Join(t.TempDir(), "EPOCH")}
	f := newFleetWith(t, standard, cfg)
	c := f.discover(t)
	ctx := context.Background()
	if res, err := c.Prepare(ctx, "s1", in(30*time.Second)); err != nil || !res.Prepared {
		t.Fatalf("prepare: %+v %v", res, err)
	}
	dir := t.TempDir()
	if _, err := c.Commit(ctx, "s1", dir, nil, in(30*time.Second), false); err != nil {
		t.Fatal(err)
	}
	if err := c.Resume(ctx, "s1", in(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	ms, err := c.Verify(ctx, dir, "s1", key)
	if err != nil || len(ms) != 5 {
		t.Fatalf("verify with the key: %d manifests, %v", len(ms), err)
	}
	ms, err = c.Verify(ctx, dir, "s1", nil)
	if err != nil || len(ms) != 5 {
		t.Fatalf("verify without a key: %d manifests, %v", len(ms), err)
	}
	for _, m := range ms {
		if m.HMAC == "" {
			t.Errorf("%s/%s: the manifest carries no signature", m.Kind, m.Instance)
		}
	}
	_, err = c.Verify(ctx, dir, "s1", []byte(strings.Repeat("x", 32)))
	if apierror.CodeOf(err) != apierror.InvalidCheckpointState || !strings.Contains(err.Error(), "signature") {
		t.Fatalf("verify with another key: %v, want invalid_checkpoint_state naming the signature", err)
	}
}
