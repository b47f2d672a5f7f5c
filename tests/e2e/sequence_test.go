package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/servers/environment"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/control"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// The random-sequence suite (reliability.md §1.6; protocol.md §10.2–10.3):
// a seeded generator picks operations, a controller modelled here applies
// them to a real fleet of processes, and after every step the model checks
// the invariants against what the fleet answers. Every call the fleet makes
// to fakeinference is held until an operation releases some, so rollouts
// arrive, park and finish at the generator's pace.
//
// Environment variables:
//
//	GYMFLEET_SEQ_SEEDS     seeds to run, "3" or "1,5,9"; default 1 to 12
//	GYMFLEET_SEQ_STEPS     operations per seed; default 40
//	GYMFLEET_SEQ_OPS       run this operation list instead of a seed's (a shrunk failure's)
//	GYMFLEET_SEQ_DURATION  keep running fresh seeds until this much time has passed (make soak)
//	GYMFLEET_SEQ_SHRINK    on a failure, look for a shorter failing list (each try is a fresh fleet)

// seqOp is one generated operation: its kind and a number that picks among
// the candidates the state offers (a rollout, a process, a count).
type seqOp struct {
	Kind string
	N    int
}

func (o seqOp) String() string { return o.Kind + ":" + strconv.Itoa(o.N) }

// seqWeights are the operations and how often each is drawn.
var seqWeights = []struct {
	kind   string
	weight int
}{
	{"start", 5}, {"release", 7}, {"prepare", 3}, {"renew", 1}, {"commit", 3},
	{"resume", 3}, {"checkpoint", 2}, {"crash", 3}, {"crash_one", 1}, {"retire", 1}, {"forget", 1}, {"lease", 1},
}

func genOps(seed uint64, steps int) []seqOp {
	rng := rand.New(rand.NewPCG(seed, 0x5e9))
	total := 0
	for _, w := range seqWeights {
		total += w.weight
	}
	ops := make([]seqOp, steps)
	for i := range ops {
		x := rng.IntN(total)
		for _, w := range seqWeights {
			if x < w.weight {
				ops[i] = seqOp{Kind: w.kind, N: rng.IntN(1 << 20)}
				break
			}
			x -= w.weight
		}
	}
	return ops
}

func parseOps(t *testing.T, s string) []seqOp {
	var ops []seqOp
	for _, f := range strings.Split(s, ",") {
		k, n, ok := strings.Cut(strings.TrimSpace(f), ":")
		v, err := strconv.Atoi(n)
		if !ok || err != nil {
			t.Fatalf("GYMFLEET_SEQ_OPS: %q is not kind:n", f)
		}
		ops = append(ops, seqOp{Kind: k, N: v})
	}
	return ops
}

func formatOps(ops []seqOp) string {
	parts := make([]string, len(ops))
	for i, o := range ops {
		parts[i] = o.String()
	}
	return strings.Join(parts, ",")
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return n
}

// TestSequences runs seeded random operation sequences against a real
// fleet; a failing seed prints the line that reproduces it.
func TestSequences(t *testing.T) {
	steps := envInt(t, "GYMFLEET_SEQ_STEPS", 40)
	if ops := os.Getenv("GYMFLEET_SEQ_OPS"); ops != "" {
		list := parseOps(t, ops)
		if err := runSequence(t, list); err != nil {
			t.Fatalf("GYMFLEET_SEQ_OPS=%q: %v", ops, err)
		}
		return
	}
	var seeds []uint64
	if v := os.Getenv("GYMFLEET_SEQ_SEEDS"); v != "" {
		for _, s := range strings.Split(v, ",") {
			n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
			if err != nil {
				t.Fatalf("GYMFLEET_SEQ_SEEDS: %v", err)
			}
			seeds = append(seeds, n)
		}
	} else {
		for i := uint64(1); i <= 12; i++ {
			seeds = append(seeds, i)
		}
	}
	if d := os.Getenv("GYMFLEET_SEQ_DURATION"); d != "" {
		dur, err := time.ParseDuration(d)
		if err != nil {
			t.Fatalf("GYMFLEET_SEQ_DURATION: %v", err)
		}
		// Soak: fresh seeds from a base drawn now (printed, so any failure
		// names its seed) until the time is up.
		base := uint64(time.Now().UnixNano()) & (1<<40 - 1)
		t.Logf("soak for %v from seed %d", dur, base)
		end := time.Now().Add(dur)
		for i := uint64(0); time.Now().Before(end); i++ {
			if !runSeed(t, base+i, steps) {
				return
			}
		}
		return
	}
	for _, seed := range seeds {
		if !runSeed(t, seed, steps) {
			return
		}
	}
}

// runSeed runs one seed as a subtest and reports whether it passed.
func runSeed(t *testing.T, seed uint64, steps int) bool {
	return t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
		// Printed on any failure, the harness's too (a timeout).
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("reproduce: GYMFLEET_SEQ_SEEDS=%d GYMFLEET_SEQ_STEPS=%d GYMFLEET_E2E_STACK=%s GYMFLEET_BIN=$PWD/bin go test ./tests/e2e -run 'TestSequences' -count=1 -v",
					seed, steps, httpConf().EffectiveStack())
			}
		})
		ops := genOps(seed, steps)
		err := runSequence(t, ops)
		if err == nil {
			return
		}
		msg := fmt.Sprintf("seed %d failed: %v", seed, err)
		if os.Getenv("GYMFLEET_SEQ_SHRINK") != "" {
			short := shrinkOps(t, ops)
			msg += fmt.Sprintf("\nshrunk to %d operations: GYMFLEET_SEQ_OPS='%s' GYMFLEET_E2E_STACK=%s GYMFLEET_BIN=$PWD/bin go test ./tests/e2e -run 'TestSequences' -count=1 -v",
				len(short), formatOps(short), httpConf().EffectiveStack())
		}
		t.Fatal(msg)
	})
}

// shrinkOps removes chunks of the list, halving the chunk size, keeping
// each removal after which the sequence still fails. Operations apply to
// whatever state they meet, so any sub-list is a valid sequence.
func shrinkOps(t *testing.T, ops []seqOp) []seqOp {
	for chunk := len(ops) / 2; chunk >= 1; chunk /= 2 {
		for i := 0; i+chunk <= len(ops); {
			try := append(append([]seqOp(nil), ops[:i]...), ops[i+chunk:]...)
			failed := false
			t.Run(fmt.Sprintf("shrink%d", len(try)), func(t *testing.T) {
				failed = runSequence(t, try) != nil
			})
			if failed {
				ops = try
			} else {
				i += chunk
			}
		}
	}
	return ops
}

// Rollout states of the model.
const (
	stRunning  = "running"  // its current attempt's /run is in flight
	stPending  = "pending"  // refused admission_closed: to be sent again
	stAwaiting = "awaiting" // restored: its replacement is sent at resume
	stRestart  = "restart"  // its attempt died: retire it, start the next over
	stFinished = "finished"
	stRetired  = "retired"
)

type seqRollout struct {
	id    string
	row   map[string]any
	calls int // model calls of an uninterrupted run
	// attempt is the current attempt; run its /run while running.
	attempt int
	run     *Run
	state   string
	// doomed: the controller killed or retired the attempt in flight, so
	// its failure is expected.
	doomed   bool
	finishes int
	// fenced: a retire raised its mark; forgotten: forget dropped it.
	fenced, forgotten bool
}

type seqCkpt struct {
	id    string
	scope []rollout.EpisodeID
}

// ledgerCheck is a finished attempt whose ledger is to be checked.
type ledgerCheck struct {
	r       *seqRollout
	attempt int
	retired bool
}

// checkLedgers checks the ledgers of the finishes taken so far.
func (s *seqRun) checkLedgers() {
	for _, c := range s.ledgerDue {
		s.checkLedger(c.r, c.attempt, c.retired)
	}
	s.ledgerDue = nil
}

// seqRun is the modelled controller of one sequence.
type seqRun struct {
	t        *testing.T
	f        *Fleet
	c        *coordination.Coordinator
	phase    control.Phase
	open     string // the checkpoint id open on the fleet, if any
	next     int    // checkpoint ids
	prepared *coordination.PrepareResult
	latest   *seqCkpt
	rs       []*seqRollout
	log      []string
	// restores counts restores; epoch is the last one's.
	restores int
	epoch    uint64
	// ledgerDue are the finishes whose ledgers are still to check.
	ledgerDue []ledgerCheck
	// continued counts episodes restores continued; recrashes, crashes
	// while a restore was under way or not yet resumed.
	continued, recrashes int
}

// maxRollouts bounds one sequence's rollouts (each is a few model calls).
const maxRollouts = 6

// seqFailure is a broken invariant.
type seqFailure struct{ msg string }

func (s *seqRun) failf(format string, args ...any) {
	panic(seqFailure{fmt.Sprintf(format, args...)})
}

// runSequence runs ops on a fresh fleet and returns the first broken
// invariant (the test fails outright on harness errors).
func runSequence(t *testing.T, ops []seqOp) (err error) {
	f := startFleet(t, func(tp *fleet.Topology) {
		tp.GenerationCuts = false
		// Short, so the lease operation sees one expire without waiting
		// long; every other control call's deadline is far beyond it.
		tp.LeaseGraceSeconds = 0.5
	})
	s := &seqRun{t: t, f: f, phase: control.PhaseIdle}
	if _, err := f.Fake.HoldAfterCalls(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	s.c = f.Coord()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("operations run:\n  %s", strings.Join(s.log, "\n  "))
		}
	})
	defer func() {
		if r := recover(); r != nil {
			sf, ok := r.(seqFailure)
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("%s", sf.msg)
		}
	}()
	s.check()
	for i, op := range ops {
		s.log = append(s.log, fmt.Sprintf("%d %s (phase %s)", i, op, s.phase))
		s.apply(op)
		s.poll()
		s.sendPending()
		s.checkLedgers()
		s.check()
	}
	s.drain()
	counts := map[string]int{}
	for _, r := range s.rs {
		counts[r.state]++
	}
	t.Logf("%d operations: %s; rollouts %v, restores %d continuing %d episodes, crashes during a restore %d, epoch %d", len(ops), formatOps(ops), counts, s.restores, s.continued, s.recrashes, s.epoch)
	return nil
}

func (s *seqRun) ctx() context.Context { return context.Background() }

func dl() time.Time { return time.Now().Add(20 * time.Second) }

func (s *seqRun) apply(op seqOp) {
	switch op.Kind {
	case "start":
		s.start(op.N)
	case "release":
		if _, err := s.f.Fake.ReleaseCalls(s.ctx(), 1+op.N%3); err != nil {
			s.t.Fatal(err)
		}
		s.settle()
	case "prepare":
		s.prepare(op.N)
	case "renew":
		s.renew()
	case "commit":
		s.commit(op.N%2 == 0)
	case "resume":
		s.resume()
	case "checkpoint":
		// prepare, commit and (every other time) resume in one step, as
		// a periodic controller does.
		if s.phase == control.PhaseIdle {
			s.prepare(op.N)
			s.commit(op.N%2 == 0)
			if op.N%4 < 2 && s.phase == control.PhaseCommitted {
				s.resume()
			}
		}
	case "crash":
		s.crash(op.N)
	case "crash_one":
		s.crashOne(op.N)
	case "retire":
		s.retire(op.N)
	case "forget":
		s.forget(op.N)
	case "lease":
		s.lease()
	default:
		s.t.Fatalf("unknown operation %q", op.Kind)
	}
}

// start sends a new rollout: a counter task of one to three increments
// (its reward proves no increment ran twice and none was lost) or a
// weather task.
func (s *seqRun) start(n int) {
	if len(s.rs) >= maxRollouts {
		return
	}
	id := fmt.Sprintf("s%d", len(s.rs))
	r := &seqRollout{id: id, state: stRunning}
	if n%4 == 0 {
		r.row, r.calls = weatherRow(id, "weather_agent", "Lima"), 2
	} else {
		incs := []int{1, 2, 3}[:1+n%3]
		r.row, r.calls = counterRow(id, "counter_agent", n%5, incs...), len(incs)+1
	}
	s.rs = append(s.rs, r)
	r.run = s.f.Start(withAttempt(r.row, 0))
	s.settle()
}

// settle waits until every call the fleet can make has reached
// fakeinference: the count of calls received stops changing for a moment
// while nothing it released is still generating.
func (s *seqRun) settle() {
	last := -1
	stable := 0
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		cc, err := s.f.Fake.Calls(s.ctx())
		if err != nil {
			s.t.Fatal(err)
		}
		busy := false
		for _, c := range cc {
			if c.Status == fakeinference.StatusGenerating {
				busy = true
			}
		}
		if !busy && len(cc) == last {
			stable++
			if stable >= 5 {
				return
			}
		} else {
			stable = 0
		}
		last = len(cc)
		<-time.After(20 * time.Millisecond)
	}
}

// poll takes every reply that has arrived.
func (s *seqRun) poll() {
	for _, r := range s.rs {
		if r.run != nil && r.run.Replied() {
			s.take(r, r.run.Wait(s.t, 0))
		}
	}
}

// take applies one /run reply to the model and checks it.
func (s *seqRun) take(r *seqRollout, rep Reply) {
	r.run = nil
	switch {
	case rep.Err == nil && rep.Status == http.StatusOK:
		if r.state == stRetired {
			s.failf("%s finished after it was retired: %v", r.id, rep.Body)
		}
		r.finishes++
		if r.finishes > 1 {
			s.failf("%s finished %d times", r.id, r.finishes)
		}
		if rep.Reward() != 1.0 {
			s.failf("%s (attempt %d) finished with reward %v, an uninterrupted run's is 1.0: %v", r.id, r.attempt, rep.Reward(), rep.Body)
		}
		// Checked once the step is over: the reply may have come in just
		// before the model server was killed.
		s.ledgerDue = append(s.ledgerDue, ledgerCheck{r: r, attempt: r.attempt, retired: r.doomed})
		r.state, r.doomed = stFinished, false
	case rep.Code() == string(apierror.AdmissionClosed):
		if r.state == stRunning {
			r.state = stPending
		}
	case r.doomed:
		// The controller killed or retired this attempt.
	default:
		s.failf("%s (attempt %d) failed without the controller causing it: status %d err %v %v", r.id, r.attempt, rep.Status, rep.Err, rep.Body)
	}
}

// checkLedger: the finished attempt's capture ledger holds one row per
// model call of an uninterrupted run, each with a longer prompt than the
// one before: no delivered call was made twice, and no row of a dead run
// survived a restore.
//
// A finish that raced a retire of its attempt may find the ledger retired
// (410): the controller asked for that.
func (s *seqRun) checkLedger(r *seqRollout, attempt int, retired bool) {
	key := ep(r.id, attempt).CaptureKey()
	st, m := s.f.Manifest(key)
	if retired && st == http.StatusGone {
		return
	}
	if st != http.StatusOK {
		s.failf("ledger of %s: %d %v", key, st, m)
	}
	recs, _ := m["records"].([]any)
	if len(recs) != r.calls {
		s.failf("ledger of %s has %d rows, an uninterrupted run makes %d calls: %v", key, len(recs), r.calls, recs)
	}
	prev := -1
	for _, x := range recs {
		row, _ := x.(map[string]any)
		ids, _ := row["prompt_token_ids"].([]any)
		if len(ids) <= prev {
			s.failf("ledger of %s: a call's prompt (%d tokens) is not longer than the one before (%d): a call repeated", key, len(ids), prev)
		}
		prev = len(ids)
	}
	if fails, _ := m["failures"].([]any); len(fails) > 0 {
		s.failf("ledger of %s has failures: %v", key, fails)
	}
}

// sendPending sends again, once admission is open, the rollouts refused
// admission_closed and the replacements of restored or restarted ones.
func (s *seqRun) sendPending() {
	if s.phase != control.PhaseIdle {
		return
	}
	sent := false
	for _, r := range s.rs {
		switch r.state {
		case stPending, stAwaiting:
			r.state, r.doomed = stRunning, false
			r.run = s.f.Start(withAttempt(r.row, r.attempt))
			sent = true
		}
	}
	var restart []rollout.EpisodeID
	for _, r := range s.rs {
		if r.state == stRestart {
			restart = append(restart, ep(r.id, r.attempt))
		}
	}
	if len(restart) > 0 {
		// Fence the dead attempts before their next ones start.
		if err := s.c.Retire(s.ctx(), "", restart, dl()); err != nil {
			s.failf("retire of dead attempts %v: %v", restart, err)
		}
		for _, r := range s.rs {
			if r.state == stRestart {
				r.fenced, r.forgotten = true, false
				r.attempt++
				r.state, r.doomed = stRunning, false
				r.run = s.f.Start(withAttempt(r.row, r.attempt))
			}
		}
		sent = true
	}
	if sent {
		s.settle()
		s.poll()
	}
}

func (s *seqRun) running() []*seqRollout {
	var out []*seqRollout
	for _, r := range s.rs {
		if r.state == stRunning {
			out = append(out, r)
		}
	}
	return out
}

// prepare opens a checkpoint; on a fleet with one open it must be refused
// and change nothing.
func (s *seqRun) prepare(n int) {
	s.next++
	id := fmt.Sprintf("k%d", s.next)
	res, err := s.c.Prepare(s.ctx(), id, dl())
	if s.phase != control.PhaseIdle {
		if err == nil && res.Prepared {
			s.failf("prepare of %s was accepted while %s is %s", id, s.open, s.phase)
		}
		return
	}
	if err != nil {
		s.failf("prepare %s: %v", id, err)
	}
	if !res.Prepared {
		// A miss: abort, as a controller does (then retire or retry).
		if err := s.c.Resume(s.ctx(), id, dl()); err != nil {
			s.failf("resume after a missed prepare of %s: %v", id, err)
		}
		return
	}
	s.phase, s.open, s.prepared = control.PhasePrepared, id, res
}

// renew extends the lease of the open checkpoint; with none open every
// participant refuses it.
func (s *seqRun) renew() {
	id := s.open
	if id == "" {
		id = "none"
	}
	for _, m := range s.c.Members() {
		rep, err := httpclient.Do(s.ctx(), s.f.ctl, http.MethodPost, m.URL+ctlplane.RoutePrefix+"/renew",
			http.Header{"Authorization": {"Bearer " + token}}, control.CheckpointRequest{CheckpointID: id, DeadlineTS: unix(dl())})
		if err != nil {
			s.t.Fatal(err)
		}
		if ok := rep.OK(); ok != (s.phase != control.PhaseIdle) {
			s.failf("renew of %q on %s in phase %s: %d %s", id, m.Name, s.phase, rep.Status, rep.Body)
		}
	}
}

func unix(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// commit publishes the prepared checkpoint with every episode the
// environment holds that the controller continues; in any other phase it
// must be refused.
func (s *seqRun) commit(stop bool) {
	if s.phase != control.PhasePrepared {
		if s.phase == control.PhaseIdle {
			if _, err := s.c.Commit(s.ctx(), "none", s.f.Dir("none"), []rollout.EpisodeID{}, dl(), stop); err == nil {
				s.failf("a commit with no checkpoint open was accepted")
			}
		}
		return
	}
	live := s.envEpisodes()
	var inFlight []rollout.EpisodeID
	for _, r := range s.running() {
		if live[ep(r.id, r.attempt).CaptureKey()] {
			inFlight = append(inFlight, ep(r.id, r.attempt))
		}
	}
	scope := s.prepared.Continued(inFlight)
	if _, err := s.c.Commit(s.ctx(), s.open, s.f.Dir(s.open), scope, dl(), stop); err != nil {
		s.failf("commit %s with scope %v: %v", s.open, scope, err)
	}
	s.phase = control.PhaseCommitted
	s.latest = &seqCkpt{id: s.open, scope: scope}
}

// envEpisodes is the set of capture keys the environment has in flight.
func (s *seqRun) envEpisodes() map[string]bool {
	var rep environment.EpisodesReply
	if _, err := httpclient.GetJSON(s.ctx(), s.f.ctl, s.f.EnvURL+"/episodes", nil, &rep); err != nil {
		s.t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range rep.Episodes {
		out[e.EpisodeID.CaptureKey()] = true
	}
	return out
}

// resume reopens the fleet (an abort when nothing was committed).
func (s *seqRun) resume() {
	id := s.open
	if id == "" {
		id = fmt.Sprintf("k%d", s.next) // already resumed: idempotent
	}
	if err := s.c.Resume(s.ctx(), id, dl()); err != nil {
		s.failf("resume %s: %v", id, err)
	}
	s.phase, s.open, s.prepared = control.PhaseIdle, "", nil
}

// crash kills every server (fakeinference survives), starts fresh ones and
// restores the latest committed checkpoint, continuing each of its
// episodes that has not finished since as its next attempt. Every other
// unfinished rollout starts over as its next attempt. A crash while a
// restore is open is the second crash during restore.
func (s *seqRun) crash(n int) {
	if s.phase == control.PhaseRestored {
		s.recrashes++
	}
	for _, r := range s.rs {
		if r.run != nil {
			r.doomed = true
		}
	}
	s.f.Crash()
	s.waitReplies()
	s.f.Restart()
	s.c = s.f.Coord()
	s.phase, s.open, s.prepared = control.PhaseIdle, "", nil
	byID := map[string]*seqRollout{}
	for _, r := range s.rs {
		byID[r.id] = r
		if r.state == stRunning || r.state == stPending {
			r.state = stRestart
		}
		if r.state == stAwaiting {
			// Restored before and not yet sent: restored again below, or
			// started over.
			r.attempt--
			r.state = stRestart
		}
	}
	if s.latest == nil {
		return
	}
	var scope []rollout.EpisodeID
	for _, e := range s.latest.scope {
		if r := byID[e.RolloutID]; r != nil && r.state == stRestart && r.attempt == e.Attempt {
			scope = append(scope, e)
		}
	}
	if n%3 == 0 {
		// A crash in the middle of the restore: every server is killed
		// while the restore's calls are under way (or just sent, or just
		// answered), the fleet starts fresh again and the same restore
		// runs again.
		done := make(chan struct{})
		c := s.c
		go func() {
			defer close(done)
			_, _ = c.Restore(s.ctx(), s.latest.id, s.f.Dir(s.latest.id), scope, dl())
		}()
		s.f.Crash()
		<-done
		s.f.Restart()
		s.c = s.f.Coord()
		s.recrashes++
	}
	res, err := s.c.Restore(s.ctx(), s.latest.id, s.f.Dir(s.latest.id), scope, dl())
	if err != nil {
		s.failf("restore %s (scope %v) into fresh processes: %v", s.latest.id, scope, err)
	}
	if res.Epoch <= s.epoch {
		s.failf("restore %s into epoch %d, not past the last restore's %d", s.latest.id, res.Epoch, s.epoch)
	}
	s.restores, s.epoch = s.restores+1, res.Epoch
	for _, e := range scope {
		r := byID[e.RolloutID]
		r.attempt, r.state = e.Attempt+1, stAwaiting
	}
	s.continued += len(scope)
	s.phase, s.open = control.PhaseRestored, s.latest.id
}

// waitReplies waits for the reply of every /run in flight and takes it.
func (s *seqRun) waitReplies() {
	for _, r := range s.rs {
		if r.run != nil {
			s.take(r, r.run.Wait(s.t, 2*time.Minute))
		}
	}
}

// crashOne kills one server process and starts it again fresh, with no
// restore: the controller retires every attempt in flight and starts each
// unfinished one over.
func (s *seqRun) crashOne(n int) {
	if s.phase != control.PhaseIdle {
		return
	}
	names := []string{"policy_model", "resources", "agents", "env"}
	name := names[n%len(names)]
	var inFlight []rollout.EpisodeID
	for _, r := range s.rs {
		if r.run != nil {
			r.doomed, r.fenced, r.forgotten = true, true, false
			inFlight = append(inFlight, ep(r.id, r.attempt))
		}
	}
	if err := s.f.L.Kill(name); err != nil {
		s.t.Fatal(err)
	}
	s.f.client.CloseIdleConnections()
	s.f.ctl.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.f.L.Start(ctx, name); err != nil {
		s.t.Fatal(err)
	}
	if len(inFlight) > 0 {
		if err := s.c.Retire(s.ctx(), "", inFlight, dl()); err != nil {
			s.failf("retire after %s crashed: %v", name, err)
		}
	}
	// Replies of the retired attempts come back once the held calls they
	// wait on are cut off by the retire; each that finished first counts.
	s.waitReplies()
	for _, r := range s.rs {
		if r.state == stRunning {
			r.attempt++
			r.state, r.doomed = stRunning, false
			r.run = s.f.Start(withAttempt(r.row, r.attempt))
		}
	}
	s.settle()
}

// retire stops one running rollout for good.
func (s *seqRun) retire(n int) {
	run := s.running()
	if s.phase != control.PhaseIdle || len(run) == 0 {
		return
	}
	r := run[n%len(run)]
	r.doomed, r.fenced, r.forgotten = true, true, false
	if err := s.c.Retire(s.ctx(), "", []rollout.EpisodeID{ep(r.id, r.attempt)}, dl()); err != nil {
		s.failf("retire %s: %v", r.id, err)
	}
	if r.run != nil {
		s.take(r, r.run.Wait(s.t, 2*time.Minute))
	}
	if r.state != stFinished {
		r.state = stRetired
	}
}

// forget drops the fence of one retired rollout.
func (s *seqRun) forget(n int) {
	var cands []*seqRollout
	for _, r := range s.rs {
		if r.state == stRetired && !r.forgotten {
			cands = append(cands, r)
		}
	}
	if s.phase != control.PhaseIdle || len(cands) == 0 {
		return
	}
	r := cands[n%len(cands)]
	if err := s.c.Forget(s.ctx(), []string{r.id}, dl()); err != nil {
		s.failf("forget %s: %v", r.id, err)
	}
	r.forgotten = true
}

// lease opens a checkpoint with a deadline moments away and no controller
// behind it: its lease expires and every participant reopens by itself.
func (s *seqRun) lease() {
	if s.phase != control.PhaseIdle {
		return
	}
	s.next++
	id := fmt.Sprintf("k%d", s.next)
	if _, err := s.c.Prepare(s.ctx(), id, time.Now().Add(500*time.Millisecond)); err != nil {
		s.failf("prepare %s: %v", id, err)
	}
	s.f.WaitFor("every lease of "+id+" to expire", 30*time.Second, func() bool {
		for _, st := range s.f.Status(s.c) {
			if st["phase"] != control.PhaseIdle.String() {
				return false
			}
		}
		return true
	})
}

// check compares every participant's phase with the model's.
func (s *seqRun) check() {
	for name, st := range s.f.Status(s.c) {
		if st["phase"] != s.phase.String() {
			s.failf("%s is in phase %v, the model says %s", name, st["phase"], s.phase)
		}
		if s.phase != control.PhaseIdle && st["checkpoint_id"] != s.open {
			s.failf("%s has checkpoint %v open, the model says %s", name, st["checkpoint_id"], s.open)
		}
	}
}

// drain reopens the fleet, releases every held call and lets each rollout
// finish; then every accepted rollout finished exactly once or was
// retired, and the fleet holds nothing.
func (s *seqRun) drain() {
	s.log = append(s.log, "drain")
	if s.phase != control.PhaseIdle {
		s.resume()
	}
	if _, err := s.f.Fake.Release(s.ctx()); err != nil {
		s.t.Fatal(err)
	}
	for range 10 {
		s.sendPending()
		s.waitReplies()
		done := true
		for _, r := range s.rs {
			if r.state != stFinished && r.state != stRetired {
				done = false
			}
		}
		if done {
			break
		}
	}
	var forget []string
	for _, r := range s.rs {
		switch {
		case r.state == stFinished && r.finishes == 1:
		case r.state == stRetired && r.finishes == 0:
		default:
			s.failf("%s ended %s after %d finishes", r.id, r.state, r.finishes)
		}
		// Done for good: its marks can go.
		if r.fenced && !r.forgotten {
			forget = append(forget, r.id)
		}
	}
	s.checkLedgers()
	if len(forget) > 0 {
		if err := s.c.Forget(s.ctx(), forget, dl()); err != nil {
			s.failf("forget %v: %v", forget, err)
		}
	}
	s.check()
	for name, st := range s.f.Status(s.c) {
		if n, _ := st["retired_rollouts"].(float64); n != 0 {
			s.failf("%s still fences %v rollouts after every retired one was forgotten", name, n)
		}
	}
}
