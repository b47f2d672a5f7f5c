package tokencapture_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gymfleet/gymfleet/pkg/infra/atomicfile"
	"github.com/gymfleet/gymfleet/pkg/tokencapture"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

const helperEnv = "GYMFLEET_LEDGER_HELPER_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(helperEnv); dir != "" {
		os.Exit(runAppender(dir))
	}
	goleak.VerifyTestMain(m)
}

// runAppender is the child process of TestLedger_SurvivesSIGKILL: it appends
// rows forever and prints each call id once Append has returned.
func runAppender(dir string) int {
	l, err := tokencapture.Open(dir, tokencapture.Options{SegmentBytes: 64 << 10})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	w := bufio.NewWriter(os.Stdout)
	for i := 0; ; i++ {
		key := fmt.Sprintf("r%d", i%7)
		row, err := l.Append(key, testRow(fmt.Sprintf("call-%d", i), 40))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Fprintf(w, "%s %s %d\n", key, row.CallID, row.Seq)
		w.Flush()
	}
}

func testRow(callID string, tokens int) tokencapture.Row {
	r := tokencapture.Row{
		CallID: callID, Model: "fake-model", RequestDigest: "d-" + callID, FinishReason: "stop",
		PromptTokenIDs: make([]int, tokens), GenerationTokenIDs: make([]int, tokens/2), GenerationLogProbs: make([]float64, tokens/2),
	}
	for i := range r.PromptTokenIDs {
		r.PromptTokenIDs[i] = i + 1
	}
	for i := range r.GenerationTokenIDs {
		r.GenerationTokenIDs[i] = 1000 + i
		r.GenerationLogProbs[i] = -float64(i) / 8
	}
	return r
}

func openLedger(t *testing.T, dir string, opts tokencapture.Options) *tokencapture.Ledger {
	t.Helper()
	l, err := tokencapture.Open(dir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func mustAppend(t *testing.T, l *tokencapture.Ledger, key string, row tokencapture.Row) tokencapture.Row {
	t.Helper()
	got, err := l.Append(key, row)
	if err != nil {
		t.Fatalf("Append(%s, %s): %v", key, row.CallID, err)
	}
	return got
}

func mustRows(t *testing.T, l *tokencapture.Ledger, key string) []tokencapture.Row {
	t.Helper()
	rows, err := l.Rows(key)
	if err != nil {
		t.Fatalf("Rows(%s): %v", key, err)
	}
	return rows
}

func callIDs(rows []tokencapture.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.CallID
	}
	return out
}

// checkChain asserts rows form one lineage: seq 1.., each parent the row before.
func checkChain(t *testing.T, key string, rows []tokencapture.Row) {
	t.Helper()
	for i, r := range rows {
		wantParent := ""
		if i > 0 {
			wantParent = rows[i-1].CallID
		}
		if r.Seq != int64(i+1) || r.ParentCallID != wantParent || r.CaptureKey != key {
			t.Fatalf("%s row %d = seq %d parent %q key %q; want seq %d parent %q key %q", key, i, r.Seq, r.ParentCallID, r.CaptureKey, i+1, wantParent, key)
		}
	}
}

func TestLedger_RoundTrip(t *testing.T) {
	dir := t.TempDir()
	now := time.Unix(1700000000, 250_000_000)
	l := openLedger(t, dir, tokencapture.Options{Now: func() time.Time { return now }})

	a1 := mustAppend(t, l, "r", testRow("a1", 8))
	want := testRow("a1", 8)
	want.Seq, want.CaptureKey, want.CreatedAt = 1, "r", 1700000000.25
	if !reflect.DeepEqual(a1, want) {
		t.Fatalf("Append returned %+v, want %+v", a1, want)
	}
	mustAppend(t, l, "r", testRow("a2", 8))
	explicit := testRow("a3", 0)
	explicit.ParentCallID = "a1" // a retry continues from a1, not a2
	explicit.ContinuedFrom = "__generation_cut__/r/a2"
	mustAppend(t, l, "r", explicit)
	mustAppend(t, l, "s", testRow("b1", 4))

	check := func(l *tokencapture.Ledger) {
		t.Helper()
		rows := mustRows(t, l, "r")
		if got := callIDs(rows); !slices.Equal(got, []string{"a1", "a2", "a3"}) {
			t.Fatalf("rows of r = %v", got)
		}
		if rows[1].ParentCallID != "a1" || rows[2].ParentCallID != "a1" || rows[2].Seq != 3 || rows[2].ContinuedFrom != "__generation_cut__/r/a2" {
			t.Fatalf("lineage of r = %+v", rows)
		}
		if rows[2].PromptTokenIDs == nil || len(rows[2].PromptTokenIDs) != 0 {
			t.Fatalf("empty token arrays must read back as [], got %#v", rows[2].PromptTokenIDs)
		}
		if !reflect.DeepEqual(rows[0], a1) {
			t.Fatalf("row read back = %+v, want %+v", rows[0], a1)
		}
		last, ok := l.Last("r")
		if !ok || last.CallID != "a3" {
			t.Fatalf("Last(r) = %v, %v", last.CallID, ok)
		}
		if _, ok := l.Last("nobody"); ok {
			t.Fatal("Last of an unknown key reported a row")
		}
		if rows := mustRows(t, l, "nobody"); len(rows) != 0 {
			t.Fatalf("Rows of an unknown key = %v", rows)
		}
		if got := l.Keys(); !slices.Equal(got, []string{"r", "s"}) {
			t.Fatalf("Keys = %v", got)
		}
	}
	check(l)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := l.Append("r", testRow("late", 1)); !errors.Is(err, tokencapture.ErrClosed) {
		t.Fatalf("Append after Close = %v, want ErrClosed", err)
	}

	l2 := openLedger(t, dir, tokencapture.Options{})
	check(l2)
	a4 := mustAppend(t, l2, "r", testRow("a4", 2))
	if a4.Seq != 4 || a4.ParentCallID != "a3" {
		t.Fatalf("append after reopen = seq %d parent %q, want 4 and a3", a4.Seq, a4.ParentCallID)
	}
}

func TestLedger_InvalidInput(t *testing.T) {
	l := openLedger(t, t.TempDir(), tokencapture.Options{})
	for _, key := range []string{"", "a/b", "../x", "-a", strings.Repeat("x", rollout.MaxIDLength+1)} {
		if _, err := l.Append(key, testRow("c", 1)); !errors.Is(err, tokencapture.ErrInvalidKey) {
			t.Errorf("Append(%q) = %v, want ErrInvalidKey", key, err)
		}
	}
	if _, err := l.Append("r", tokencapture.Row{}); err == nil {
		t.Error("Append accepted a row without call_id")
	}
	if _, _, err := l.Retire([]string{"ok", "not ok"}); !errors.Is(err, tokencapture.ErrInvalidKey) {
		t.Errorf("Retire with an invalid key = %v", err)
	}
	if err := l.Import("r", []tokencapture.Row{{}}); err == nil {
		t.Error("Import accepted a row without call_id")
	}
}

func TestLedger_DirectoryLock(t *testing.T) {
	dir := t.TempDir()
	l := openLedger(t, dir, tokencapture.Options{})
	if _, err := tokencapture.Open(dir, tokencapture.Options{}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second Open of a held directory = %v, want an in-use error", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	openLedger(t, dir, tokencapture.Options{})
}

func TestLedger_RetireDeleteImport(t *testing.T) {
	dir := t.TempDir()
	l := openLedger(t, dir, tokencapture.Options{})
	mustAppend(t, l, "r", testRow("dead1", 2))
	mustAppend(t, l, "r", testRow("dead2", 2))
	mustAppend(t, l, "q", testRow("q1", 2))
	if err := l.Fail("q", tokencapture.Failure{CallID: "q2", Reason: "no token ids"}); err != nil {
		t.Fatal(err)
	}

	// Import replaces a dead execution's rows and failures.
	imported := []tokencapture.Row{testRow("c0", 3), testRow("c1", 3)}
	imported[0].Seq, imported[0].CaptureKey = 1, "r0"
	imported[1].Seq, imported[1].CaptureKey, imported[1].ParentCallID = 2, "r0", "c0"
	if err := l.Import("r", imported); err != nil {
		t.Fatal(err)
	}
	if err := l.Import("q", nil); err != nil {
		t.Fatal(err)
	}

	// Retire removes and fences.
	removed, absent, err := l.Retire([]string{"q", "never", "q"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{"q"}) || !slices.Equal(absent, []string{"never"}) {
		t.Fatalf("Retire = removed %v absent %v", removed, absent)
	}

	check := func(l *tokencapture.Ledger) {
		t.Helper()
		rows := mustRows(t, l, "r")
		if !reflect.DeepEqual(callIDs(rows), []string{"c0", "c1"}) || rows[0].CaptureKey != "r0" {
			t.Fatalf("imported rows = %+v", rows)
		}
		for _, k := range []string{"q", "never"} {
			if _, err := l.Rows(k); !errors.Is(err, tokencapture.ErrRetired) {
				t.Fatalf("Rows(%s) = %v, want ErrRetired", k, err)
			}
			if _, err := l.Append(k, testRow("x", 1)); !errors.Is(err, tokencapture.ErrRetired) {
				t.Fatalf("Append(%s) = %v, want ErrRetired", k, err)
			}
			if !l.Retired(k) {
				t.Fatalf("Retired(%s) = false", k)
			}
		}
		if got := l.Keys(); !slices.Equal(got, []string{"r"}) {
			t.Fatalf("Keys = %v", got)
		}
	}
	check(l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLedger(t, dir, tokencapture.Options{})
	check(l)

	// An append after an import continues its lineage.
	next := mustAppend(t, l, "r", testRow("c2", 1))
	if next.Seq != 3 || next.ParentCallID != "c1" || next.CaptureKey != "r" {
		t.Fatalf("append after import = %+v", next)
	}

	// Import clears a fence.
	if err := l.Import("q", []tokencapture.Row{testRow("q9", 1)}); err != nil {
		t.Fatal(err)
	}
	if rows := mustRows(t, l, "q"); !slices.Equal(callIDs(rows), []string{"q9"}) || rows[0].CaptureKey != "q" {
		t.Fatalf("rows of q after import = %+v", rows)
	}
	if f, err := l.Failures("q"); err != nil || len(f) != 0 {
		t.Fatalf("failures after import = %v, %v", f, err)
	}

	// Delete removes rows and clears the fence; a fence alone counts as removed.
	removed, absent, err = l.Delete([]string{"r", "never", "nothing"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{"r", "never"}) || !slices.Equal(absent, []string{"nothing"}) {
		t.Fatalf("Delete = removed %v absent %v", removed, absent)
	}
	if rows := mustRows(t, l, "r"); len(rows) != 0 {
		t.Fatalf("rows after delete = %v", rows)
	}
	fresh := mustAppend(t, l, "never", testRow("n1", 1))
	if fresh.Seq != 1 || fresh.ParentCallID != "" {
		t.Fatalf("append after delete = %+v", fresh)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLedger(t, dir, tokencapture.Options{})
	if got := l.Keys(); !slices.Equal(got, []string{"never", "q"}) {
		t.Fatalf("Keys after reopen = %v", got)
	}
}

func TestLedger_Failures(t *testing.T) {
	dir := t.TempDir()
	l := openLedger(t, dir, tokencapture.Options{})
	mustAppend(t, l, "r", testRow("c1", 1))
	if err := l.Fail("r", tokencapture.Failure{CallID: "c2", Reason: strings.Repeat("x", 5000)}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLedger(t, dir, tokencapture.Options{})
	f, err := l.Failures("r")
	if err != nil || len(f) != 1 || f[0].CallID != "c2" || len(f[0].Reason) != tokencapture.MaxFailureReason || f[0].CreatedAt == 0 {
		t.Fatalf("Failures = %+v, %v", f, err)
	}
	if _, _, err := l.Retire([]string{"r"}); err != nil {
		t.Fatal(err)
	}
	if err := l.Fail("r", tokencapture.Failure{CallID: "c3"}); !errors.Is(err, tokencapture.ErrRetired) {
		t.Fatalf("Fail on a retired key = %v", err)
	}
}

// copyDir copies the ledger files as they are in the kernel right now: what a
// process killed at this instant leaves behind.
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func segments(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "seg-*.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(m)
	return m
}

func appendToFile(t *testing.T, path string, data string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(data); err != nil {
		t.Fatal(err)
	}
}

func TestLedger_ReopenAfterCrash(t *testing.T) {
	src := t.TempDir()
	l := openLedger(t, src, tokencapture.Options{})
	for i := 0; i < 5; i++ {
		mustAppend(t, l, "r", testRow(fmt.Sprintf("c%d", i), 16))
	}
	// The process "dies" here: no Close, no Sync.
	tests := []struct {
		name string
		tail string
	}{
		{"no close", ""},
		{"torn final line", `{"op":"append","key":"r","row":{"parent_call_id":"c4","seq":6,"call_id":"c5","prompt_tok`},
		{"garbage tail lines", "\x00\x00\x00\n{\"op\":\"append\"\n\x00\x00"},
		{"complete record without its newline", `{"op":"append","key":"r","row":{"call_id":"c5","seq":6}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := copyDir(t, src)
			segs := segments(t, dir)
			appendToFile(t, segs[len(segs)-1], tt.tail)
			l := openLedger(t, dir, tokencapture.Options{})
			rows := mustRows(t, l, "r")
			if got := callIDs(rows); !slices.Equal(got, []string{"c0", "c1", "c2", "c3", "c4"}) {
				t.Fatalf("rows after crash = %v", got)
			}
			checkChain(t, "r", rows)
			// Appends after the crash land in a new segment, never after the torn line.
			mustAppend(t, l, "r", testRow("c5", 1))
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			l = openLedger(t, dir, tokencapture.Options{})
			rows = mustRows(t, l, "r")
			if got := callIDs(rows); !slices.Equal(got, []string{"c0", "c1", "c2", "c3", "c4", "c5"}) {
				t.Fatalf("rows after crash and restart = %v", got)
			}
			checkChain(t, "r", rows)
		})
	}

	t.Run("corruption followed by valid records is refused", func(t *testing.T) {
		dir := copyDir(t, src)
		segs := segments(t, dir)
		b, err := os.ReadFile(segs[len(segs)-1])
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.SplitAfter(string(b), "\n")
		lines[1] = "{not json}\n"
		if err := os.WriteFile(segs[len(segs)-1], []byte(strings.Join(lines, "")), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := tokencapture.Open(dir, tokencapture.Options{}); err == nil || !strings.Contains(err.Error(), "corrupt record") {
			t.Fatalf("Open of a corrupt log = %v, want a corrupt record error", err)
		}
	})
}

// TestLedger_SurvivesSIGKILL kills a process that is appending and checks that
// every row it acknowledged (Append returned) is in the ledger.
func TestLedger_SurvivesSIGKILL(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	acked := map[string][]string{}
	sc := bufio.NewScanner(out)
	for n := 0; n < 3000 && sc.Scan(); n++ {
		var key, id string
		var seq int
		if _, err := fmt.Sscanf(sc.Text(), "%s %s %d", &key, &id, &seq); err != nil {
			t.Fatalf("helper line %q: %v", sc.Text(), err)
		}
		acked[key] = append(acked[key], id)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, out)
	_ = cmd.Wait()
	if len(acked) != 7 {
		t.Fatalf("helper acknowledged rows on %d keys, want 7", len(acked))
	}

	l := openLedger(t, dir, tokencapture.Options{})
	for key, ids := range acked {
		rows := mustRows(t, l, key)
		got := callIDs(rows)
		// Rows written after the last line we read may be there too.
		if len(got) < len(ids) || !slices.Equal(got[:len(ids)], ids) {
			t.Fatalf("%s: ledger has %d rows, acknowledged %d; first mismatch in %v vs %v", key, len(got), len(ids), got[:min(5, len(got))], ids[:min(5, len(ids))])
		}
		checkChain(t, key, rows)
	}
}

func TestLedger_ConcurrentAppends(t *testing.T) {
	dir := t.TempDir()
	l := openLedger(t, dir, tokencapture.Options{SegmentBytes: 32 << 10})
	const keys, perKey, writersPerKey = 40, 12, 3
	var wg sync.WaitGroup
	for k := 0; k < keys; k++ {
		for w := 0; w < writersPerKey; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprintf("roll-%d", k)
				for i := 0; i < perKey; i++ {
					if _, err := l.Append(key, testRow(fmt.Sprintf("k%d-w%d-%d", k, w, i), 24)); err != nil {
						t.Error(err)
						return
					}
					if i%4 == 0 {
						if _, err := l.Rows(key); err != nil {
							t.Error(err)
							return
						}
					}
				}
			}()
		}
	}
	wg.Wait()
	check := func(l *tokencapture.Ledger) {
		t.Helper()
		if got := len(l.Keys()); got != keys {
			t.Fatalf("Keys = %d, want %d", got, keys)
		}
		for k := 0; k < keys; k++ {
			key := fmt.Sprintf("roll-%d", k)
			rows := mustRows(t, l, key)
			if len(rows) != perKey*writersPerKey {
				t.Fatalf("%s has %d rows, want %d", key, len(rows), perKey*writersPerKey)
			}
			checkChain(t, key, rows)
		}
	}
	check(l)
	if n := len(segments(t, dir)); n < 2 {
		t.Fatalf("%d segments: the small SegmentBytes should have rotated", n)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	check(openLedger(t, dir, tokencapture.Options{SegmentBytes: 32 << 10}))
}

func TestLedger_Compaction(t *testing.T) {
	dir := t.TempDir()
	opts := tokencapture.Options{SegmentBytes: 8 << 10, CompactMinBytes: 16 << 10}
	l := openLedger(t, dir, opts)
	for k := 0; k < 30; k++ {
		for i := 0; i < 4; i++ {
			mustAppend(t, l, fmt.Sprintf("k%d", k), testRow(fmt.Sprintf("k%d-%d", k, i), 32))
		}
	}
	// Kept: k0 (appended), k1 (imported, then appended), k2 (empty import),
	// k3 (a failure), fenced: k4 and "ghost". Everything else is deleted.
	if err := l.Import("k1", []tokencapture.Row{testRow("imp", 4)}); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, l, "k1", testRow("after-imp", 4))
	if err := l.Import("k2", nil); err != nil {
		t.Fatal(err)
	}
	if err := l.Fail("k3", tokencapture.Failure{CallID: "k3-x", Reason: "mismatch"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Retire([]string{"k4", "ghost"}); err != nil {
		t.Fatal(err)
	}
	var doomed []string
	for k := 5; k < 30; k++ {
		doomed = append(doomed, fmt.Sprintf("k%d", k))
	}
	if _, _, err := l.Delete(doomed); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{}
	for _, k := range []string{"k0", "k1", "k2", "k3"} {
		want[k] = callIDs(mustRows(t, l, k))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	before := len(segments(t, dir))
	// A temp file left by a compaction that crashed is cleaned up.
	if err := os.WriteFile(filepath.Join(dir, ".seg-crashed.tmp"), []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}

	check := func(l *tokencapture.Ledger) {
		t.Helper()
		for k, ids := range want {
			if got := callIDs(mustRows(t, l, k)); !slices.Equal(got, ids) {
				t.Fatalf("%s after compaction = %v, want %v", k, got, ids)
			}
		}
		if got := l.Keys(); !slices.Equal(got, []string{"k0", "k1", "k2", "k3"}) {
			t.Fatalf("Keys after compaction = %v", got)
		}
		for _, k := range []string{"k4", "ghost"} {
			if !l.Retired(k) {
				t.Fatalf("%s lost its fence in compaction", k)
			}
		}
		if f, err := l.Failures("k3"); err != nil || len(f) != 1 || f[0].Reason != "mismatch" {
			t.Fatalf("k3 failures after compaction = %+v, %v", f, err)
		}
		next := mustAppend(t, l, "k1", testRow(fmt.Sprintf("more-%d", len(want["k1"])), 1))
		if next.ParentCallID != want["k1"][len(want["k1"])-1] {
			t.Fatalf("k1 lineage after compaction: parent %q", next.ParentCallID)
		}
		want["k1"] = append(want["k1"], next.CallID)
	}
	l = openLedger(t, dir, opts)
	check(l)
	after := segments(t, dir)
	if len(after) != 2 || before <= 2 {
		t.Fatalf("segments before %d, after %v: want the snapshot and a new active segment", before, after)
	}
	if _, err := os.Stat(filepath.Join(dir, ".seg-crashed.tmp")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("leftover temp file: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLedger(t, dir, opts)
	check(l)
}

// TestLedger_SnapshotWins replays an older segment still present beside a
// snapshot (a crash between publishing it and removing the old ones): the
// snapshot wins, so nothing the older segment holds comes back, and the old
// segment is removed.
func TestLedger_SnapshotWins(t *testing.T) {
	dir := t.TempDir()
	opts := tokencapture.Options{CompactMinBytes: 1}
	l := openLedger(t, dir, opts)
	mustAppend(t, l, "gone", testRow("g1", 64))
	mustAppend(t, l, "kept", testRow("k1", 1))
	if _, _, err := l.Delete([]string{"gone"}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLedger(t, dir, opts) // compacts into a snapshot segment
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, "seg-00000000000000000000.jsonl")
	if err := os.WriteFile(stale, []byte(`{"op":"append","key":"zombie","row":{"call_id":"z","seq":1}}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l = openLedger(t, dir, tokencapture.Options{CompactMinBytes: -1})
	if got := l.Keys(); !slices.Equal(got, []string{"kept"}) {
		t.Fatalf("Keys = %v, want only kept", got)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("segment older than the snapshot was not removed: %v", err)
	}
}

func BenchmarkAppend(b *testing.B) {
	l, err := tokencapture.Open(b.TempDir(), tokencapture.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	row := testRow("", 2048) // a 2k-token prompt, 1k generated
	var n sync.Mutex
	next := 0
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		n.Lock()
		key := fmt.Sprintf("bench-%d", next)
		next++
		n.Unlock()
		i := 0
		for pb.Next() {
			r := row
			r.CallID = fmt.Sprintf("%s-%d", key, i)
			i++
			if _, err := l.Append(key, r); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// failingRename is the real filesystem except that renames fail.
type failingRename struct{ atomicfile.FS }

func (failingRename) Rename(string, string) error { return errors.New("injected rename failure") }

// TestLedger_FailedCompactionStillOpens: compaction only saves space, so a
// failure in it (here the rename of the snapshot) leaves a ledger that opens
// with every row and no leftover temp file.
func TestLedger_FailedCompactionStillOpens(t *testing.T) {
	dir := t.TempDir()
	l := openLedger(t, dir, tokencapture.Options{CompactMinBytes: -1})
	mustAppend(t, l, "gone", testRow("g", 256))
	mustAppend(t, l, "kept", testRow("k", 1))
	if _, _, err := l.Delete([]string{"gone"}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLedger(t, dir, tokencapture.Options{CompactMinBytes: 1, FS: failingRename{atomicfile.OS}})
	if got := callIDs(mustRows(t, l, "kept")); !slices.Equal(got, []string{"k"}) || !slices.Equal(l.Keys(), []string{"kept"}) {
		t.Fatalf("after a failed compaction: rows %v keys %v", got, l.Keys())
	}
	if tmp, _ := filepath.Glob(filepath.Join(dir, ".seg-*")); len(tmp) != 0 {
		t.Fatalf("temp files left: %v", tmp)
	}
}

func TestLedger_RolloutKeys(t *testing.T) {
	dir := t.TempDir()
	l := openLedger(t, dir, tokencapture.Options{})
	mustAppend(t, l, "r", testRow("c0", 4))
	mustAppend(t, l, "r-a2", testRow("c1", 4))
	mustAppend(t, l, "other", testRow("c2", 4))
	if err := l.Fail("r-a3", tokencapture.Failure{CallID: "c3", Reason: "x"}); err != nil {
		t.Fatal(err)
	}
	if err := l.Import("r-a1", nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Retire([]string{"r-a4"}); err != nil {
		t.Fatal(err)
	}
	want := []string{"r", "r-a1", "r-a2", "r-a3", "r-a4"}
	if got := l.RolloutKeys("r"); !slices.Equal(got, want) {
		t.Fatalf("RolloutKeys(r) = %v, want %v (a fence counts, another rollout does not)", got, want)
	}
	if _, _, err := l.Delete([]string{"r-a2", "r-a4"}); err != nil {
		t.Fatal(err)
	}
	want = []string{"r", "r-a1", "r-a3"}
	if got := l.RolloutKeys("r"); !slices.Equal(got, want) {
		t.Fatalf("after delete RolloutKeys(r) = %v, want %v", got, want)
	}
	if got := l.RolloutKeys("nobody"); len(got) != 0 {
		t.Fatalf("RolloutKeys(nobody) = %v, want none", got)
	}
	// The index is rebuilt from the log.
	if _, _, err := l.Retire([]string{"r"}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLedger(t, dir, tokencapture.Options{})
	if got := l.RolloutKeys("r"); !slices.Equal(got, want) {
		t.Fatalf("after reopen RolloutKeys(r) = %v, want %v", got, want)
	}
	if got := l.RolloutKeys("other"); !slices.Equal(got, []string{"other"}) {
		t.Fatalf("after reopen RolloutKeys(other) = %v", got)
	}
}

// Ensure Stats counts the keys, rows and live bytes of the ledger, drops
// retired keys, and reads the same after a reopen replays the log.
func TestLedger_StatsFollowAppendsRetiresAndReplay(t *testing.T) {
	dir := t.TempDir()
	l, err := tokencapture.Open(dir, tokencapture.Options{CompactMinBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st != (tokencapture.Stats{}) {
		t.Fatalf("empty ledger: %+v", st)
	}
	for i := range 5 {
		mustAppend(t, l, fmt.Sprintf("r%d", i%2), testRow(fmt.Sprintf("call-%d", i), 40))
	}
	st := l.Stats()
	if st.Keys != 2 || st.Rows != 5 || st.Bytes <= 0 {
		t.Fatalf("after 5 rows under 2 keys: %+v", st)
	}
	if _, _, err := l.Retire([]string{"r1"}); err != nil {
		t.Fatal(err)
	}
	after := l.Stats()
	if after.Keys != 1 || after.Rows != 3 || after.Bytes <= 0 || after.Bytes >= st.Bytes {
		t.Fatalf("after retiring r1 (2 rows): %+v, before %+v", after, st)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLedger(t, dir, tokencapture.Options{CompactMinBytes: -1})
	if got := l.Stats(); got != after {
		t.Fatalf("after reopening: %+v, want %+v", got, after)
	}
}

// Ensure appends and failure records are written through the fence, and a
// refusing fence leaves nothing: not in the ledger, nor in the ledger
// reopened from its files.
func TestLedger_FenceWrapsTheWrite(t *testing.T) {
	dir := t.TempDir()
	l, err := tokencapture.Open(dir, tokencapture.Options{})
	if err != nil {
		t.Fatal(err)
	}
	superseded := errors.New("epoch superseded")
	refuse, writes := false, 0
	l.SetFence(func(write func() error) error {
		if refuse {
			return superseded
		}
		writes++
		return write()
	})
	if _, err := l.Append("r1", testRow("call-1", 4)); err != nil || writes != 1 {
		t.Fatalf("append through the fence: %v, %d writes through it", err, writes)
	}
	refuse = true
	if _, err := l.Append("r1", testRow("call-2", 4)); !errors.Is(err, superseded) {
		t.Fatalf("append through a refusing fence: %v", err)
	}
	if err := l.Fail("r1", tokencapture.Failure{Reason: "x"}); !errors.Is(err, superseded) {
		t.Fatalf("failure record through a refusing fence: %v", err)
	}
	if rows, err := l.Rows("r1"); err != nil || len(rows) != 1 || rows[0].CallID != "call-1" {
		t.Fatalf("rows: %+v %v, want call-1 only", rows, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := tokencapture.Open(dir, tokencapture.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if rows, err := again.Rows("r1"); err != nil || len(rows) != 1 {
		t.Fatalf("reopened rows: %+v %v, want call-1 only", rows, err)
	}
	if f, err := again.Failures("r1"); err != nil || len(f) != 0 {
		t.Fatalf("reopened failures: %+v %v, want none", f, err)
	}
}
