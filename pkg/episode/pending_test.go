package episode_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/episode"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

func record(t *testing.T, e rollout.EpisodeID) ctlplane.Record {
	t.Helper()
	data, err := codec.Marshal(episode.Record{EpisodeID: e, TaskDigest: "d", Boundary: codec.RawMessage(`{"next":"x"}`)})
	if err != nil {
		t.Fatal(err)
	}
	return ctlplane.Record{EpisodeID: e, Data: data}
}

// TestRetireDropsPendingRecords: a retire drops the restored records filed
// under the attempt it names and earlier ones of the same rollout, and
// nothing else; a claimed or deleted record is gone from the index too.
func TestRetireDropsPendingRecords(t *testing.T) {
	tr := episode.NewTracker()
	var recs []ctlplane.Record
	for _, e := range []rollout.EpisodeID{id("a", 0), id("a-b", 0), id("b", 3), id("c", 0), id("d", 0)} {
		recs = append(recs, record(t, e))
	}
	if _, err := tr.Install(recs); err != nil {
		t.Fatal(err)
	}
	// Pending: a-a1, a-b-a1, b-a4, c-a1, d-a1.
	if err := tr.Retire(context.Background(), []rollout.EpisodeID{id("a", 1), id("b", 3), id("zz", 0)}); err != nil {
		t.Fatal(err)
	}
	if got, want := tr.Pending(), []string{"a-b-a1", "b-a4", "c-a1", "d-a1"}; !slices.Equal(got, want) {
		t.Fatalf("after retiring a-a1 and b-a3: pending %v, want %v", got, want)
	}
	if _, _, err := tr.Begin(id("c", 1), "d", nil); err != nil {
		t.Fatal(err)
	}
	tr.DeleteRestoredOutside(ctlplane.NewScope([]rollout.EpisodeID{id("a-b", 1), id("b", 4)}))
	if err := tr.Retire(context.Background(), []rollout.EpisodeID{id("b", 4), id("a-b", 2)}); err != nil {
		t.Fatal(err)
	}
	if got := tr.Pending(); len(got) != 0 {
		t.Fatalf("pending %v, want none", got)
	}
}

// TestRetireOfManyRollouts: a retire naming every restored rollout at once
// drops every record (through the index by rollout: it used to scan every
// pending record for every attempt it named).
func TestRetireOfManyRollouts(t *testing.T) {
	tr := episode.NewTracker()
	var recs []ctlplane.Record
	var ids []rollout.EpisodeID
	for i := range 2000 {
		e := id(fmt.Sprintf("r%d", i), 0)
		ids = append(ids, e.Next())
		recs = append(recs, record(t, e))
	}
	if _, err := tr.Install(recs); err != nil {
		t.Fatal(err)
	}
	if err := tr.Retire(context.Background(), ids); err != nil {
		t.Fatal(err)
	}
	if got := tr.Pending(); len(got) != 0 {
		t.Fatalf("%d records pending after retiring all", len(got))
	}
}
