package modelproxy_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
)

// Ensure an export assembled on its own goroutine emits every episode's
// record once, across batches, in the order the ledger holds their rows
// (the order the calls finished), and the same records again when
// exported again; that an emit failing in a later batch stops the export
// there with its error; and that a cancelled export returns the context's
// error.
func TestExport_AssemblesWhileEmitting(t *testing.T) {
	ids := ctlplanetest.EpisodeIDs(2500) // about 2.5 MB of records: three batches
	m := newBenchModel(t, ids)
	scope := ctlplane.NewScope(ids)
	ctx := context.Background()

	export := func() []ctlplane.Record {
		t.Helper()
		var got []ctlplane.Record
		if _, err := m.p.Export(ctx, scope, func(r ctlplane.Record) error {
			got = append(got, ctlplane.Record{EpisodeID: r.EpisodeID, Data: bytes.Clone(r.Data)})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	got := export()
	if len(got) != len(ids) {
		t.Fatalf("%d records for %d episodes", len(got), len(ids))
	}
	for i, at := range benchCallOrder(len(ids)) {
		id := ids[at]
		rec, err := modelproxy.DecodeModelRecord(got[i].Data)
		if got[i].EpisodeID != id || err != nil || len(rec.Rows) != 1 || rec.Rows[0].CaptureKey != id.CaptureKey() {
			t.Fatalf("record %d is %s's (%v), want %s's one row: %s", i, got[i].EpisodeID, err, id, got[i].Data)
		}
	}
	if again := export(); !slices.EqualFunc(again, got, func(a, b ctlplane.Record) bool {
		return a.EpisodeID == b.EpisodeID && bytes.Equal(a.Data, b.Data)
	}) {
		t.Fatal("a second export of the same state emitted other records or another order")
	}

	errFull := errors.New("disk full")
	emitted := 0
	_, err := m.p.Export(ctx, scope, func(ctlplane.Record) error {
		emitted++
		if emitted == 2000 {
			return errFull
		}
		return nil
	})
	if !errors.Is(err, errFull) || emitted != 2000 {
		t.Fatalf("Export with an emit failing at record 2000: %d emitted, %v", emitted, err)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := m.p.Export(cancelled, scope, func(ctlplane.Record) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Export with a cancelled context: %v", err)
	}
}
