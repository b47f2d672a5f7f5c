package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/tokencapture"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/control"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// recordingPorts remembers the ports a fleet took, so a replacement fleet
// can take the same ones (its servers then answer at the addresses the
// zombie's configuration names) except the zombie's, which it still holds.
type recordingPorts struct {
	src   fleet.PortSource
	mu    sync.Mutex
	taken []int
}

func (r *recordingPorts) Take(n int) ([]int, error) {
	p, err := r.src.Take(n)
	r.mu.Lock()
	r.taken = append([]int(nil), p...)
	r.mu.Unlock()
	return p, err
}

// fixedPorts hands out a given list.
type fixedPorts []int

func (f fixedPorts) Take(n int) ([]int, error) { return f[:n], nil }

// replacementFleet generates and starts the restored fleet beside f while
// f's process zombie is paused: the same topology, checkpoint root and
// epoch file, every server on the port it had in f except the zombie's
// servers, which move to fresh ports. f's fakeinference serves both.
func replacementFleet(t *testing.T, f *Fleet, rec *recordingPorts, zombie string) *Fleet {
	t.Helper()
	spec, _ := f.Cfg.Process(zombie)
	held := map[int]bool{}
	for _, e := range spec.Endpoints {
		held[portOf(t, e.URL)] = true
	}
	rec.mu.Lock()
	list := append([]int(nil), rec.taken...)
	rec.mu.Unlock()
	fresh, err := ports.Take(len(held))
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range list {
		if held[p] {
			list[i], fresh = fresh[0], fresh[1:]
		}
	}
	topo := f.topo
	topo.Dir = filepath.Join(f.topo.Dir, "replacement")
	topo.EpochFile = filepath.Join(f.topo.Dir, "EPOCH")
	topo.Ports = fixedPorts(list)
	cfg, err := fleet.Generate(topo)
	if err != nil {
		t.Fatal(err)
	}
	hc := cfg.HTTP.Conf(cfg.BaseDir)
	hc.TLS = httpconf.TLS{CAFile: hc.TLS.CAFile}
	b := &Fleet{
		t: t, topo: topo, Cfg: cfg, Fake: f.Fake,
		L:       fleet.NewLauncher(cfg, fleet.Options{StopGrace: 5 * time.Second}),
		client:  httpclient.New(httpclient.Options{H2C: true, HTTP: hc}),
		ctl:     httpclient.New(httpclient.Options{H2C: true, HTTP: hc}),
		CkptDir: f.CkptDir,
	}
	env, _ := cfg.Endpoint("env")
	b.EnvURL = env.URL
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range cfg.Names() {
				if name != "fakeinference" {
					t.Logf("--- log of replacement %s ---\n%s", name, b.L.Logs(name))
				}
			}
		}
		_ = b.L.KillAll()
		b.client.CloseIdleConnections()
		b.ctl.CloseIdleConnections()
	})
	b.Restart()
	return b
}

func portOf(t *testing.T, u string) int {
	t.Helper()
	i := len(u) - 1
	for i >= 0 && u[i] != ':' {
		i--
	}
	p, err := strconv.Atoi(u[i+1:])
	if err != nil {
		t.Fatalf("no port in %s", u)
	}
	return p
}

// signal sends sig to a launcher process's group.
func signal(t *testing.T, f *Fleet, name string, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(-f.L.PID(name), sig); err != nil {
		t.Fatalf("signal %v to %s: %v", sig, name, err)
	}
}

// post sends one request and returns the reply (a transport error fails).
func (f *Fleet) post(url string, h http.Header, body any) *httpclient.Reply {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := httpclient.Do(ctx, f.ctl, http.MethodPost, url, h, body)
	if err != nil {
		f.t.Fatalf("POST %s: %v", url, err)
	}
	return rep
}

func wantCode(t *testing.T, what string, rep *httpclient.Reply, code apierror.Code) {
	t.Helper()
	e := apierror.Parse(rep.Status, rep.Body)
	if rep.Status != apierror.Status(code) || e == nil || e.Code != code {
		t.Fatalf("%s: status %d %s, want %d %s", what, rep.Status, rep.Body, apierror.Status(code), code)
	}
}

// TestZombie_FencedAfterRestore pauses one process of each participant
// kind with SIGSTOP after a checkpoint was committed and another prepared,
// kills the rest, restores the checkpoint into fresh processes (on the
// same addresses but the paused one's) and finishes the rollout there;
// then it resumes the paused process with SIGCONT and drives it. Its
// replies, its ledger appends, its commit of the prepared checkpoint and
// any later checkpoint are all refused with stale_epoch, the restored
// fleet refuses calls of its epoch, and nothing it could write is there
// for a later restore to accept.
func TestZombie_FencedAfterRestore(t *testing.T) {
	for _, zombie := range []string{"env", "agents", "policy_model", "resources"} {
		t.Run(zombie, func(t *testing.T) { testZombie(t, zombie) })
	}
}

func testZombie(t *testing.T, zombie string) {
	rec := &recordingPorts{src: ports}
	f := startFleet(t, func(tp *fleet.Topology) { tp.Ports = rec; tp.GenerationCuts = false })
	ctx := context.Background()
	row := counterRow("z1", "counter_agent", 3, 1, 2)
	f.HoldSecondCalls()
	run := f.Start(row)
	f.WaitHeld("z1", 2)
	c := f.Coord()
	f.Checkpoint(c, "c1", ep("z1", 0))
	f.Resume(c, "c1")
	// c2 is prepared everywhere, not committed, when the zombie is paused.
	if res, err := c.Prepare(ctx, "c2", deadline(30*time.Second)); err != nil || !res.Prepared {
		t.Fatalf("prepare c2: %v %+v", err, res)
	}
	var members []coordination.Member
	spec, _ := f.Cfg.Process(zombie)
	for _, m := range c.Members() {
		for _, e := range spec.Endpoints {
			if e.URL == m.URL {
				members = append(members, m)
			}
		}
	}
	if len(members) == 0 {
		t.Fatalf("no participant of process %s", zombie)
	}

	signal(t, f, zombie, syscall.SIGSTOP)
	continued := false
	t.Cleanup(func() {
		if !continued {
			_ = syscall.Kill(-f.L.PID(zombie), syscall.SIGCONT)
		}
	})
	for _, name := range f.Cfg.Names() {
		if name != "fakeinference" && name != zombie {
			if err := f.L.Kill(name); err != nil {
				t.Fatal(err)
			}
		}
	}
	b := replacementFleet(t, f, rec, zombie)
	cb := b.Coord()
	res, err := cb.Restore(ctx, "c1", f.Dir("c1"), []rollout.EpisodeID{ep("z1", 0)}, deadline(30*time.Second))
	if err != nil {
		t.Fatalf("restore c1 into the replacement: %v", err)
	}
	if res.Epoch != 1 {
		t.Fatalf("the restore's epoch is %d, want 1 (the paused fleet's was 0)", res.Epoch)
	}
	b.Resume(cb, "c1")
	f.Release()
	assertReward(t, b.RunOK(withAttempt(row, 1)), 1.0)
	callsBefore := len(f.Calls("z1"))

	signal(t, f, zombie, syscall.SIGCONT)
	continued = true
	auth := http.Header{"Authorization": {"Bearer " + token}}

	// Its data routes deliver nothing.
	zr := counterRow("zz", "counter_agent", 0, 1)
	url := func(name string) string {
		e, ok := f.Cfg.Endpoint(name)
		if !ok {
			t.Fatalf("no endpoint %s", name)
		}
		return e.URL
	}
	switch zombie {
	case "env":
		wantCode(t, "zombie /run", f.post(url("env")+"/run", nil, zr), apierror.StaleEpoch)
		// The run in flight at the pause ends without a result.
		if rep := run.Wait(t, 2*time.Minute); rep.Err == nil && rep.Status == http.StatusOK {
			t.Fatalf("the paused environment delivered z1's result: %v", rep.Body)
		}
	case "agents":
		wantCode(t, "zombie agent /run", f.post(url("counter_agent")+"/run", nil, zr), apierror.StaleEpoch)
		wantCode(t, "zombie agent session", f.post(url("counter_agent")+"/v1/agent_sessions", nil, map[string]any{"session_id": "zz", "episode_id": map[string]any{"rollout_id": "zz", "attempt": 0}}), apierror.StaleEpoch)
	case "policy_model":
		chat := map[string]any{"model": fleet.ServedModel, "messages": []any{map[string]any{"role": "user", "content": "hi"}}}
		wantCode(t, "zombie chat completion", f.post(url("policy_model")+rollout.Path(ep("zz", 0), "/v1/chat/completions"), nil, chat), apierror.StaleEpoch)
	case "resources":
		wantCode(t, "zombie seed", f.post(url("counter")+rollout.Path(ep("zz", 0), "/seed_session"), nil, zr), apierror.StaleEpoch)
		wantCode(t, "zombie tool call", f.post(url("counter")+rollout.Path(ep("zz", 0), "/increment"), nil, map[string]any{"by": 1}), apierror.StaleEpoch)
	}
	if n := len(f.Calls("zz")); n != 0 {
		t.Fatalf("the zombie's work reached the inference server: %d calls of zz", n)
	}
	if n := len(f.Calls("z1")); n != callsBefore {
		t.Fatalf("z1 made %d model calls after the zombie resumed, had %d", n, callsBefore)
	}
	// The checkpoint prepared before the pause cannot be committed.
	for _, m := range members {
		body := control.CommitRequest{CheckpointID: "c2", DeadlineTS: float64(deadline(30 * time.Second).Unix()), CheckpointDir: f.Dir("c2"), EpisodeIDs: control.EpisodeIDs{}}
		wantCode(t, "zombie commit of c2 on "+m.Name, f.post(m.URL+ctlplane.RoutePrefix+"/commit", auth, body), apierror.StaleEpoch)
		rep := f.post(m.URL+ctlplane.RoutePrefix+"/resume", auth, control.CheckpointRequest{CheckpointID: "c2", DeadlineTS: float64(deadline(30 * time.Second).Unix())})
		if !rep.OK() {
			t.Fatalf("zombie resume of c2 on %s: %d %s", m.Name, rep.Status, rep.Body)
		}
		// Nor can it take part in a later one.
		wantCode(t, "zombie prepare of c3 on "+m.Name, f.post(m.URL+ctlplane.RoutePrefix+"/prepare", auth, control.CheckpointRequest{CheckpointID: "c3", DeadlineTS: float64(deadline(30 * time.Second).Unix())}), apierror.StaleEpoch)
	}

	// The zombie, refused once, now stamps its epoch and the restored
	// fleet refuses it on every route a zombie of each kind calls.
	stale := http.Header{ctlplane.EpochHeader: {"0"}}
	for what, u := range map[string]string{
		"model":     b.url("policy_model") + rollout.Path(ep("zz", 0), "/v1/chat/completions"),
		"resources": b.url("counter") + rollout.Path(ep("zz", 0), "/seed_session"),
		"agent":     b.url("counter_agent") + "/run",
		"env":       b.url("env") + "/run",
	} {
		wantCode(t, "a call of epoch 0 to the restored "+what, b.post(u, stale, zr), apierror.StaleEpoch)
	}
	// The restored fleet's own replies carry its epoch.
	rep := b.post(b.url("env")+"/run", nil, counterRow("z2", "counter_agent", 0, 1))
	if !rep.OK() || rep.Header.Get(ctlplane.EpochHeader) != "1" {
		t.Fatalf("the restored fleet's /run: %d epoch %q %s", rep.Status, rep.Header.Get(ctlplane.EpochHeader), rep.Body)
	}

	// Nothing of the zombie is in c2 or c3 for a restore to accept.
	if err := f.L.Kill(zombie); err != nil {
		t.Fatal(err)
	}
	store := ctlplanetest.Store(t, f.CkptDir)
	for _, m := range members {
		for _, id := range []string{"c2", "c3"} {
			if _, _, _, err := store.Read(ctx, ckptstore.Target{Dir: f.Dir(id), Kind: m.Kind, Instance: m.Instance, CheckpointID: id}, nil); err == nil {
				t.Fatalf("the zombie %s published its part of %s", m.Name, id)
			}
		}
	}
	if zombie == "policy_model" {
		// The zombie's ledger kept the row of z1's first call and no other:
		// the held second call, released after the restore, was not
		// appended, and neither was anything of zz.
		l, err := tokencapture.Open(filepath.Join(f.topo.Dir, "run", "capture"), tokencapture.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		rows, _ := l.Rows("z1")
		if len(rows) != 1 {
			t.Fatalf("the zombie's ledger has %d rows of z1, want the 1 appended before the pause", len(rows))
		}
		if slices.Contains(l.Keys(), "zz") {
			t.Fatal("the zombie's ledger has a key zz")
		}
	}
	if _, err := os.Stat(filepath.Join(f.topo.Dir, "EPOCH")); err != nil {
		t.Fatalf("the epoch file: %v", err)
	}
}

// url is an endpoint's URL.
func (f *Fleet) url(name string) string {
	f.t.Helper()
	e, ok := f.Cfg.Endpoint(name)
	if !ok {
		f.t.Fatalf("no endpoint %s", name)
	}
	return e.URL
}
