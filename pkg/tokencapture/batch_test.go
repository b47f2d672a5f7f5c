package tokencapture_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/tokencapture"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// readRowsAll collects what ReadRows reports for keys, and the order it
// reported them in (positions in keys), each exactly once.
func readRowsAll(t *testing.T, l *tokencapture.Ledger, keys []string) ([][]tokencapture.Row, []error, []int) {
	t.Helper()
	rows, errs := make([][]tokencapture.Row, len(keys)), make([]error, len(keys))
	var order []int
	seen := make([]bool, len(keys))
	err := l.ReadRows(keys, func(i int, r []tokencapture.Row, err error) error {
		if i < 0 || i >= len(keys) || seen[i] {
			t.Fatalf("ReadRows reported key %d twice or out of range (%d keys)", i, len(keys))
		}
		seen[i] = true
		order = append(order, i)
		rows[i], errs[i] = r, err
		return nil
	})
	if err != nil {
		t.Fatalf("ReadRows: %v", err)
	}
	if len(order) != len(keys) {
		t.Fatalf("ReadRows reported %d of %d keys", len(order), len(keys))
	}
	return rows, errs, order
}

// TestLedger_ReadRowsIsRows: ReadRows reports for every key what Rows
// returns, whatever the order of the records in the log (interleaved
// appends, imports, several segments, retired and absent keys, the same
// key twice): keys without records first, as given, then the others in
// the order their first records were written.
func TestLedger_ReadRowsIsRows(t *testing.T) {
	dir := t.TempDir()
	l := openLedger(t, dir, tokencapture.Options{SegmentBytes: 4 << 10})
	var keys []string
	for i := range 60 {
		keys = append(keys, fmt.Sprintf("r%02d", i))
	}
	for round := range 3 {
		for i, k := range keys {
			if (i+round)%4 != 0 {
				mustAppend(t, l, k, testRow(fmt.Sprintf("%s-c%d", k, round), 10+i))
			}
		}
	}
	if err := l.Import("imp", []tokencapture.Row{testRow("i1", 5), testRow("i2", 5)}); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, l, "imp", testRow("i3", 3))
	if _, _, err := l.Retire([]string{"r07"}); err != nil {
		t.Fatal(err)
	}
	query := append(slices.Clone(keys), "imp", "absent", "r07", "r03")
	slices.Reverse(query)
	// Keys without records (r07 retired, asked for twice) come as asked
	// for. Round 0 wrote the first records of the keys whose index is not
	// a multiple of 4, round 1 those of the others; "imp" came after.
	wantOrder := []string{"r07", "absent", "r07"}
	for _, firstRound := range []bool{true, false} {
		for i, k := range keys {
			if k != "r07" && (i%4 != 0) == firstRound {
				wantOrder = append(wantOrder, k)
				if k == "r03" {
					wantOrder = append(wantOrder, k) // asked for twice
				}
			}
		}
	}
	wantOrder = append(wantOrder, "imp")
	check := func(l *tokencapture.Ledger) {
		t.Helper()
		rows, errs, order := readRowsAll(t, l, query)
		var gotOrder []string
		for _, i := range order {
			gotOrder = append(gotOrder, query[i])
		}
		if !slices.Equal(gotOrder, wantOrder) {
			t.Fatalf("ReadRows reported the keys in the order %v, want %v", gotOrder, wantOrder)
		}
		for i, k := range query {
			want, wantErr := l.Rows(k)
			if (errs[i] == nil) != (wantErr == nil) || (wantErr != nil && errs[i].Error() != wantErr.Error()) {
				t.Fatalf("ReadRows(%s) error = %v, Rows says %v", k, errs[i], wantErr)
			}
			if !reflect.DeepEqual(rows[i], want) {
				t.Fatalf("ReadRows(%s) = %v, Rows says %v", k, callIDs(rows[i]), callIDs(want))
			}
		}
		if !errors.Is(errs[slices.Index(query, "r07")], tokencapture.ErrRetired) {
			t.Fatal("a retired key must report ErrRetired")
		}
	}
	check(l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2 := openLedger(t, dir, tokencapture.Options{SegmentBytes: 4 << 10})
	check(l2)

	stop := errors.New("stop")
	calls := 0
	if err := l.ReadRows(query, func(int, []tokencapture.Row, error) error { calls++; return stop }); !errors.Is(err, tokencapture.ErrClosed) {
		t.Fatalf("ReadRows on a closed ledger = %v, want ErrClosed", err)
	}
	if err := l2.ReadRows(query, func(int, []tokencapture.Row, error) error { calls++; return stop }); !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("ReadRows after fn failed = %v after %d calls, want stop after 1", err, calls)
	}
}

// TestLedger_ImportManyIsImport: ImportMany leaves the ledger (and its log,
// byte for byte, and replayed) as one Import per key does, across segment
// rotations and across write batches.
func TestLedger_ImportManyIsImport(t *testing.T) {
	t.Run("rotations", func(t *testing.T) { testImportManyIsImport(t, 40, 8<<10) })
	t.Run("batches", func(t *testing.T) { testImportManyIsImport(t, 6000, 0) })
}

func testImportManyIsImport(t *testing.T, keys int, segmentBytes int64) {
	now := time.Unix(1700000000, 0)
	opts := tokencapture.Options{SegmentBytes: segmentBytes, Now: func() time.Time { return now }}
	var imports []tokencapture.Import
	rowsOf := map[string][]tokencapture.Row{}
	for i := range keys {
		im := tokencapture.Import{Key: fmt.Sprintf("k%02d-a1", i)}
		for j := range i % 3 {
			r := testRow(fmt.Sprintf("k%d-c%d", i, j), 20)
			r.Seq = int64(j + 5)
			rowsOf[im.Key] = append(rowsOf[im.Key], r)
			ir, err := tokencapture.ImportRowOf(r)
			if err != nil {
				t.Fatal(err)
			}
			im.Rows = append(im.Rows, ir)
		}
		imports = append(imports, im)
	}
	one, many := t.TempDir(), t.TempDir()
	lOne, lMany := openLedger(t, one, opts), openLedger(t, many, opts)
	mustAppend(t, lOne, "k03-a1", testRow("old", 4))
	mustAppend(t, lMany, "k03-a1", testRow("old", 4))
	for _, im := range imports {
		if err := lOne.Import(im.Key, rowsOf[im.Key]); err != nil {
			t.Fatal(err)
		}
	}
	if err := lMany.ImportMany(imports); err != nil {
		t.Fatal(err)
	}
	same := func(a, b *tokencapture.Ledger) {
		t.Helper()
		if !slices.Equal(a.Keys(), b.Keys()) {
			t.Fatalf("keys %v and %v", a.Keys(), b.Keys())
		}
		for _, k := range a.Keys() {
			ra, rb := mustRows(t, a, k), mustRows(t, b, k)
			if !reflect.DeepEqual(ra, rb) {
				t.Fatalf("rows of %s: %v and %v", k, callIDs(ra), callIDs(rb))
			}
		}
	}
	same(lOne, lMany)
	// Appends continue after the imported rows in both.
	a, b := mustAppend(t, lOne, "k05-a1", testRow("next", 2)), mustAppend(t, lMany, "k05-a1", testRow("next", 2))
	if a.Seq != b.Seq || a.ParentCallID != b.ParentCallID || a.Seq != 7 {
		t.Fatalf("append after import: seq %d parent %q and seq %d parent %q", a.Seq, a.ParentCallID, b.Seq, b.ParentCallID)
	}
	if err := lOne.Close(); err != nil {
		t.Fatal(err)
	}
	if err := lMany.Close(); err != nil {
		t.Fatal(err)
	}
	if a, b := logBytes(t, one), logBytes(t, many); !bytes.Equal(a, b) {
		t.Fatalf("the logs differ:\n%s\n%s", a, b)
	}
	same(openLedger(t, one, opts), openLedger(t, many, opts))

	bad := append(slices.Clone(imports), tokencapture.Import{Key: "../x"})
	l := openLedger(t, t.TempDir(), opts)
	if err := l.ImportMany(bad); err == nil {
		t.Fatal("ImportMany accepted an invalid key")
	}
	if keys := l.Keys(); len(keys) != 0 {
		t.Fatalf("a refused ImportMany imported %v", keys)
	}
}

// checkRawRows asserts ReadRawRows reports every key's rows as the bytes
// codec.Marshal writes for what Rows returns.
func checkRawRows(t *testing.T, l *tokencapture.Ledger, keys []string) {
	t.Helper()
	err := l.ReadRawRows(keys, func(i int, raw []codec.RawMessage, err error) error {
		want, wantErr := l.Rows(keys[i])
		if (err == nil) != (wantErr == nil) || len(raw) != len(want) {
			t.Fatalf("ReadRawRows(%s) = %d rows, %v; Rows says %d, %v", keys[i], len(raw), err, len(want), wantErr)
		}
		for j := range want {
			var got tokencapture.Row
			if err := codec.Unmarshal(raw[j], &got); err != nil || !reflect.DeepEqual(got, want[j]) {
				t.Fatalf("ReadRawRows(%s)[%d] = %s, which decodes to %+v (%v); Rows says %+v", keys[i], j, raw[j], got, err, want[j])
			}
			// Byte for byte, too, unless a string held invalid UTF-8: the
			// row kept the encoder's \ufffd escape, which decodes to
			// U+FFFD, which the encoder writes unescaped.
			enc, err := codec.Marshal(want[j])
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(raw[j], enc) && !bytes.Contains(raw[j], []byte(`\ufffd`)) {
				t.Fatalf("ReadRawRows(%s)[%d] =\n %s\nMarshal(Rows(%s)[%d]) =\n %s", keys[i], j, raw[j], keys[i], j, enc)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestLedger_ReadRawRowsIsMarshalledRows: appended rows (reordered),
// imported rows and mixes of both read back raw as their encoding.
func TestLedger_ReadRawRowsIsMarshalledRows(t *testing.T) {
	dir := t.TempDir()
	l := openLedger(t, dir, tokencapture.Options{SegmentBytes: 4 << 10})
	var keys []string
	for i := range 30 {
		k := fmt.Sprintf("k%02d", i)
		keys = append(keys, k)
		if i%3 == 0 {
			imported := testRow(k+"-imp", 7)
			imported.Seq, imported.ContinuedFrom = 4, "__generation_cut__/k/x\"y"
			if err := l.Import(k, []tokencapture.Row{imported}); err != nil {
				t.Fatal(err)
			}
		}
		for j := range i % 4 {
			r := testRow(fmt.Sprintf("%s-<&>\u2028-%d", k, j), 3+j)
			r.Model = "m\"\\\x01é"
			r.ParentCallID = []string{"", "p<>&\u2029", "q\\\"", "\xff"}[j]
			mustAppend(t, l, k, r)
		}
	}
	keys = append(keys, "absent")
	checkRawRows(t, l, keys)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	checkRawRows(t, openLedger(t, dir, tokencapture.Options{}), keys)
}

// FuzzReadRawRows: whatever a row holds, ReadRawRows reads it back as
// codec.Marshal encodes what Rows reads.
func FuzzReadRawRows(f *testing.F) {
	f.Add("c1", "", "fake-model", "stop", "", 0.25, 3)
	f.Add("c<>&", "p\u2028", "m\"\\", "length", "cut\"/1", -1e-7, 0)
	f.Add("\xff", "\x00", "é", "", "x", 1.7976931348623157e308, 1)
	f.Fuzz(func(t *testing.T, callID, parent, model, finish, continued string, logprob float64, tokens int) {
		if callID == "" || tokens < 0 || tokens > 64 || logprob != logprob || logprob > 1e308 || logprob < -1e308 {
			return
		}
		l := openLedger(t, t.TempDir(), tokencapture.Options{})
		r := testRow(callID, tokens)
		r.ParentCallID, r.Model, r.FinishReason, r.ContinuedFrom = parent, model, finish, continued
		if len(r.GenerationLogProbs) > 0 {
			r.GenerationLogProbs[0] = logprob
		}
		if _, err := l.Append("a", r); err != nil {
			t.Fatal(err)
		}
		if err := l.Import("b", []tokencapture.Row{r}); err != nil {
			t.Fatal(err)
		}
		checkRawRows(t, l, []string{"a", "b"})
	})
}

// logBytes is the log of the ledger in dir: its segments in order, back
// to back.
func logBytes(t *testing.T, dir string) []byte {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "seg-*.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(paths)
	var all []byte
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	return all
}

// TestLedger_ReadRawRowsAcrossBatches: the rows' buffer is reused batch
// after batch (rowsBatch keys each) and filled in chunks; every key's rows
// still read back as their encoding, past a batch boundary and across
// chunks, with rows of several records per key and rows larger than a
// chunk.
func TestLedger_ReadRawRowsAcrossBatches(t *testing.T) {
	l := openLedger(t, t.TempDir(), tokencapture.Options{})
	var keys []string
	for i := range 5000 {
		k := fmt.Sprintf("k%04d", i)
		keys = append(keys, k)
		tokens := 40 + i%60
		if i == 4500 {
			tokens = 120_000 // one row past the 1 MiB chunk
		}
		for j := range 1 + i%3 {
			mustAppend(t, l, k, testRow(fmt.Sprintf("%s-%d", k, j), tokens+j))
		}
	}
	checkRawRows(t, l, keys)
}
