package episode_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/episode"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func id(r string, a int) rollout.EpisodeID { return rollout.EpisodeID{RolloutID: r, Attempt: a} }

// collect is an Export emit that keeps copies of the records: Export may
// reuse a record's buffer once emit returns.
func collect(into *[]ctlplane.Record) func(ctlplane.Record) error {
	return func(r ctlplane.Record) error {
		r.Data = slices.Clone(r.Data)
		*into = append(*into, r)
		return nil
	}
}

type boundary struct {
	Next string `json:"next"`
	N    int    `json:"n,omitempty"`
}

func TestNilTrackerCostsNothing(t *testing.T) {
	var tr *episode.Tracker
	ep, cont, err := tr.Begin(id("r", 0), "d", nil)
	if ep != nil || cont != nil || err != nil {
		t.Fatalf("nil tracker Begin = %v %v %v", ep, cont, err)
	}
	ran := false
	if err := ep.Step(context.Background(), episode.Wait, func(context.Context) error { ran = true; return nil }); err != nil || !ran {
		t.Fatal("a nil episode must still run its steps")
	}
	if err := ep.Boundary(context.Background(), boundary{Next: "x"}); err != nil {
		t.Fatal(err)
	}
	ep.Finishing()
	ep.End()
}

func TestBegin(t *testing.T) {
	tr := episode.NewTracker()
	e, cont, err := tr.Begin(id("r", 0), "digest", nil)
	if err != nil || cont != nil {
		t.Fatalf("Begin = %v %v", cont, err)
	}
	if _, _, err := tr.Begin(id("r", 0), "digest", nil); !apierror.HasCode(err, apierror.EpisodeRunning) {
		t.Fatalf("duplicate of a running attempt: %v", err)
	}
	tr.CloseAdmission()
	if _, _, err := tr.Begin(id("new", 0), "digest", nil); !apierror.HasCode(err, apierror.AdmissionClosed) {
		t.Fatalf("new episode while closed: %v", err)
	}
	tr.OpenAdmission()
	e.End()
	if _, _, err := tr.Begin(id("r", 0), "digest", nil); err != nil {
		t.Fatalf("the same attempt after it ended: %v", err)
	}
}

func TestReadiness(t *testing.T) {
	tr := episode.NewTracker()
	ctx := context.Background()
	if !tr.Ready() {
		t.Fatal("an empty tracker is ready")
	}
	e, _, _ := tr.Begin(id("r", 0), "d", nil)
	if tr.Ready() {
		t.Fatal("a running episode blocks")
	}
	inStep := make(chan struct{})
	release := make(chan struct{})
	go e.Step(ctx, episode.Replay, func(context.Context) error {
		close(inStep)
		<-release
		return nil
	})
	<-inStep
	if !tr.Ready() {
		t.Fatal("an episode inside a replay step does not block")
	}
	close(release)
	waitUntil(t, func() bool { return !tr.Ready() })
	waited := make(chan struct{})
	inWait, stepped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stepped)
		e.Step(ctx, episode.Wait, func(context.Context) error {
			close(inWait)
			<-waited
			return nil
		})
	}()
	<-inWait
	if tr.Ready() {
		t.Fatal("an episode inside a wait step blocks")
	}
	changed := tr.ReadyChanged()
	tr.CloseAdmission()
	close(waited)
	parkedDone := make(chan error, 1)
	// The step must have ended before the episode records its next
	// boundary, as it does in an episode's own goroutine.
	<-stepped
	if tr.Ready() {
		t.Fatal("an episode running between steps blocks")
	}
	go func() { parkedDone <- e.Boundary(ctx, boundary{Next: "verify"}) }()
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("parking the last blocker must notify readiness")
	}
	if !tr.Ready() {
		t.Fatal("a parked episode does not block")
	}
	select {
	case err := <-parkedDone:
		t.Fatalf("Boundary returned %v while admission is closed", err)
	default:
	}
	rep := tr.Report(100)
	if rep.Counts["parked"] != 1 || rep.BlockerCount != 0 {
		t.Fatalf("report = %+v", rep)
	}
	tr.OpenAdmission()
	if err := <-parkedDone; err != nil {
		t.Fatal(err)
	}
	e.End()
}

func TestExportAndInstall(t *testing.T) {
	tr := episode.NewTracker()
	ctx := context.Background()
	a, _, _ := tr.Begin(id("a", 0), "da", nil)
	b, _, _ := tr.Begin(id("b", 2), "db", nil)
	c, _, _ := tr.Begin(id("c", 0), "dc", nil)
	tr.CloseAdmission()
	parked := make(chan error, 2)
	go func() { parked <- a.Boundary(ctx, boundary{Next: "invoke_agent", N: 7}) }()
	stepIn := make(chan struct{})
	stepOut := make(chan struct{})
	go b.Step(ctx, episode.Replay, func(context.Context) error { close(stepIn); <-stepOut; return nil })
	<-stepIn
	cDone := make(chan struct{})
	go func() { c.MarkRestart(ctx); close(cDone) }() // waits for reopen, parked
	waitUntil(t, func() bool { return tr.Report(10).Counts["parked"] == 3 })
	if !tr.Ready() {
		t.Fatal("an episode waiting to become a restart waits at its boundary and must not block")
	}
	scope := ctlplane.NewScope([]rollout.EpisodeID{id("a", 0), id("b", 2)})
	var recs []ctlplane.Record
	if err := tr.Export(scope, collect(&recs)); err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 {
		t.Fatalf("exported %d records, want 2", len(recs))
	}
	if got, want := string(recs[0].Data), `{"episode_id":{"rollout_id":"a","attempt":0},"task_digest":"da","boundary":{"next":"invoke_agent","n":7}}`; got != want {
		t.Fatalf("record a = %s, want %s", got, want)
	}
	if got, want := string(recs[1].Data), `{"episode_id":{"rollout_id":"b","attempt":2},"task_digest":"db","boundary":null}`; got != want {
		t.Fatalf("record b (no boundary yet) = %s, want %s", got, want)
	}
	tr.OpenAdmission()
	close(stepOut)
	<-cDone
	if err := <-parked; err != nil {
		t.Fatal(err)
	}
	rep := tr.Report(10)
	if !slices.Equal(rep.Restarts, []string{"c"}) {
		t.Fatalf("restarts = %v", rep.Restarts)
	}
	a.End()
	b.End()
	c.End()

	fresh := episode.NewTracker()
	bad := append(slices.Clone(recs), ctlplane.Record{EpisodeID: id("x", 0), Data: codec.RawMessage(`{"episode_id":{"rollout_id":"x","attempt":0},"boundary":{}}`)})
	if _, err := fresh.Install(bad); err == nil {
		t.Fatal("a record without a task digest must fail the whole install")
	}
	if got := fresh.Pending(); len(got) != 0 {
		t.Fatalf("a failed install left %v", got)
	}
	next, err := fresh.Install(recs)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fresh.Pending(), []string{"a-a1", "b-a3"}) || len(next) != 2 {
		t.Fatalf("pending = %v, next %v", fresh.Pending(), next)
	}
	if _, _, err := fresh.Begin(id("a", 1), "not-da", nil); !apierror.HasCode(err, apierror.TaskMismatch) {
		t.Fatalf("a replacement with another task: %v", err)
	}
	// A checkpoint before the replacement starts exports the pending record
	// under the replacement attempt; a scope without it deletes it.
	var again []ctlplane.Record
	fresh.Export(ctlplane.NewScope([]rollout.EpisodeID{id("a", 1)}), collect(&again))
	if len(again) != 1 || again[0].EpisodeID != id("a", 1) {
		t.Fatalf("re-export of the pending record = %v", again)
	}
	if n := fresh.DeleteRestoredOutside(ctlplane.NewScope([]rollout.EpisodeID{id("a", 1)})); n != 1 || !slices.Equal(fresh.Pending(), []string{"a-a1"}) {
		t.Fatalf("delete outside scope: %d, pending %v", n, fresh.Pending())
	}
	// Admission closed does not stop a replacement with a pending record.
	fresh.CloseAdmission()
	e, cont, err := fresh.Begin(id("a", 1), "da", nil)
	if err != nil || cont == nil || string(cont.Boundary) != `{"next":"invoke_agent","n":7}` {
		t.Fatalf("claim = %v %v", cont, err)
	}
	fresh.OpenAdmission()
	e.End()
	if err := fresh.Fresh(); err == nil {
		t.Fatal("a tracker that ran episodes is not fresh")
	}
}

func TestRetire(t *testing.T) {
	tr := episode.NewTracker()
	ctx, cancel := context.WithCancel(context.Background())
	e, _, _ := tr.Begin(id("r", 1), "d", cancel)
	ended := make(chan struct{})
	go func() {
		<-ctx.Done() // the episode's work stops on cancel
		e.Finishing()
		e.End()
		close(ended)
	}()
	if err := tr.Retire(context.Background(), []rollout.EpisodeID{id("r", 2)}); err != nil {
		t.Fatal(err)
	}
	<-ended
	if tr.Len() != 0 {
		t.Fatal("a retired episode must be gone when retire returns")
	}

	// An episode in its final cleanup is waited for, not cancelled.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	f, _, _ := tr.Begin(id("f", 0), "d", cancel2)
	f.Finishing()
	retired := make(chan error, 1)
	go func() { retired <- tr.Retire(context.Background(), []rollout.EpisodeID{id("f", 0)}) }()
	waitUntil(t, func() bool { return !tr.Ready() }) // being retired blocks
	if ctx2.Err() != nil {
		t.Fatal("retire cancelled an episode in its final cleanup")
	}
	select {
	case err := <-retired:
		t.Fatalf("retire replied (%v) before the episode ended", err)
	default:
	}
	f.End()
	if err := <-retired; err != nil {
		t.Fatal(err)
	}
	if !tr.Ready() {
		t.Fatal("ready again once the retired episode ended")
	}

	// A retire cut short keeps the episode blocking.
	g, _, _ := tr.Begin(id("g", 0), "d", func() {})
	short, cancelShort := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancelShort()
	if err := tr.Retire(short, []rollout.EpisodeID{id("g", 0)}); err == nil {
		t.Fatal("retire of an episode that does not stop must fail at its deadline")
	}
	if tr.Ready() {
		t.Fatal("a half-retired episode blocks the next prepare")
	}
	g.End()
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		<-time.After(time.Millisecond)
	}
}

// appendingBoundary encodes itself by hand, as environment.Boundary does.
type appendingBoundary struct {
	Next string `json:"next"`
}

func (b appendingBoundary) AppendJSON(dst []byte) ([]byte, error) {
	dst = append(dst, `{"next":`...)
	return append(codec.AppendString(dst, b.Next), '}'), nil
}

func TestExport_RecordsOfAppendingBoundariesAsMarshalWritesThem(t *testing.T) {
	tr := episode.NewTracker()
	ctx := context.Background()
	boundaries := []any{appendingBoundary{Next: "verify"}, appendingBoundary{Next: "<&>\u2028\xff"}, nil, map[string]int{"n": 1}}
	var eps []*episode.Episode
	var ids []rollout.EpisodeID
	want := map[rollout.EpisodeID]string{}
	for i, b := range boundaries {
		e, _, err := tr.Begin(id(string(rune('a'+i)), i), "digest-\"quoted\"", nil)
		if err != nil {
			t.Fatal(err)
		}
		rec := struct {
			EpisodeID  rollout.EpisodeID `json:"episode_id"`
			TaskDigest string            `json:"task_digest"`
			Boundary   any               `json:"boundary"`
		}{e.ID(), "digest-\"quoted\"", b}
		data, err := codec.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		eps, ids, want[e.ID()] = append(eps, e), append(ids, e.ID()), string(data)
	}
	tr.CloseAdmission()
	// Each episode parks at its boundary; the one without a boundary sits
	// in a replay step, which exports too.
	done := make(chan error, len(eps))
	stepIn, stepOut := make(chan struct{}), make(chan struct{})
	for i, e := range eps {
		if boundaries[i] == nil {
			go func() {
				done <- e.Step(ctx, episode.Replay, func(context.Context) error { close(stepIn); <-stepOut; return nil })
			}()
			<-stepIn
			continue
		}
		go func() { done <- e.Boundary(ctx, boundaries[i]) }()
	}
	waitUntil(t, func() bool { return tr.Ready() && tr.Report(10).Counts["parked"] == len(eps) })
	var recs []ctlplane.Record
	err := tr.Export(ctlplane.NewScope(ids), collect(&recs))
	tr.OpenAdmission()
	close(stepOut)
	for range eps {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range eps {
		e.End()
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(want) {
		t.Fatalf("exported %d records, want %d", len(recs), len(want))
	}
	for _, r := range recs {
		if string(r.Data) != want[r.EpisodeID] {
			t.Errorf("record of %v =\n%s\ncodec.Marshal writes\n%s", r.EpisodeID, r.Data, want[r.EpisodeID])
		}
	}
}

// An export lists its records in the scope's order (by rollout id, then
// attempt), running and pending episodes alike, whatever order the
// episodes began in. Rollouts "q" (attempt 1) and "q-" (attempt 0) come in
// the other order by capture key ("q-" before "q-a1").
func TestExport_ListsRecordsInScopeOrder(t *testing.T) {
	ctx := context.Background()
	ids := func(attempt int, n ...int) []rollout.EpisodeID {
		out := []rollout.EpisodeID{id("q", attempt+1), id("q-", attempt)}
		for _, i := range n {
			out = append(out, id(fmt.Sprintf("r%02d", i), attempt))
		}
		return out
	}
	exportedIDs := func(recs []ctlplane.Record) []rollout.EpisodeID {
		var out []rollout.EpisodeID
		for _, r := range recs {
			out = append(out, r.EpisodeID)
		}
		return out
	}
	// park begins each episode and parks it at a boundary while admission
	// is closed; the returned function reopens and ends them.
	park := func(tr *episode.Tracker, begin []rollout.EpisodeID) func() {
		t.Helper()
		var eps []*episode.Episode
		for _, i := range begin {
			e, _, err := tr.Begin(i, "d", nil)
			if err != nil {
				t.Fatal(err)
			}
			eps = append(eps, e)
		}
		tr.CloseAdmission()
		done := make(chan error, len(eps))
		for _, e := range eps {
			go func() { done <- e.Boundary(ctx, boundary{Next: "invoke_agent"}) }()
		}
		waitUntil(t, func() bool { return tr.Report(100).Counts["parked"] == len(eps) })
		return func() {
			tr.OpenAdmission()
			for range eps {
				if err := <-done; err != nil {
					t.Error(err)
				}
			}
			for _, e := range eps {
				e.End()
			}
		}
	}

	tr := episode.NewTracker()
	started := ids(0, 7, 2, 9, 0, 5, 3, 8, 1, 6, 4)
	slices.Reverse(started)
	reopen := park(tr, started)
	var recs []ctlplane.Record
	err := tr.Export(ctlplane.NewScope(ids(0, 9, 8, 7, 6, 5, 4, 3, 2, 1)), collect(&recs))
	reopen()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := exportedIDs(recs), ids(0, 1, 2, 3, 4, 5, 6, 7, 8, 9); !slices.Equal(got, want) {
		t.Fatalf("exported %v, want %v", got, want)
	}

	// Restored, three of them running again and the others pending.
	fresh := episode.NewTracker()
	if _, err := fresh.Install(recs); err != nil {
		t.Fatal(err)
	}
	reopen = park(fresh, ids(1, 8, 2, 5))
	recs = nil
	err = fresh.Export(ctlplane.NewScope(ids(1, 1, 2, 3, 4, 5, 6, 7, 8, 9)), collect(&recs))
	reopen()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := exportedIDs(recs), ids(1, 1, 2, 3, 4, 5, 6, 7, 8, 9); !slices.Equal(got, want) {
		t.Fatalf("exported after a restore %v, want %v", got, want)
	}
}
