package tokencapture_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/tokencapture"
)

// FuzzReplay opens a ledger whose only segment holds arbitrary bytes. Open
// either refuses it or yields a consistent ledger: every key's rows read
// back (or fail with an error, never a panic), and the ledger still takes
// appends and reopens to the same keys.
func FuzzReplay(f *testing.F) {
	seeds := []string{
		"",
		`{"op":"append","key":"r","row":{"call_id":"c1","seq":1,"prompt_token_ids":[1],"generation_token_ids":[2],"generation_log_probs":[-1]}}` + "\n",
		`{"op":"import","key":"r","rows":[{"call_id":"a","seq":1},{"call_id":"b","seq":2}]}` + "\n" + `{"op":"retire","keys":["s"]}` + "\n",
		`{"op":"snapshot"}` + "\n" + `{"op":"fail","key":"r","failure":{"call_id":"x","reason":"r"}}` + "\n" + `{"op":"delete","keys":["r"]}` + "\n",
		`{"op":"append","key":"r","row":{"call_id":"c1"}}` + "\n" + `{"op":"app`,
		`{"op":"append","key":"../x","row":{"call_id":"c1"}}` + "\n",
		`{"op":"retire","keys":["r"]}` + "\n" + `{"op":"append","key":"r","row":{"call_id":"c1","seq":1}}` + "\n",
		`{"op":"append","key":"r","row":{"call_id":"c1","seq":1,"prompt_token_ids":"oops"}}` + "\n",
		"\x00\x00\n{}\n",
		`{"op":"import","key":"r"}` + "\n" + `{"op":"snapshot"}` + "\n",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "seg-00000000000000000001.jsonl"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		l, err := tokencapture.Open(dir, tokencapture.Options{CompactMinBytes: -1})
		if err != nil {
			return
		}
		keys := l.Keys()
		for _, k := range keys {
			rows, err := l.Rows(k)
			if errors.Is(err, tokencapture.ErrRetired) {
				t.Fatalf("Keys lists retired key %q", k)
			}
			if err == nil {
				for _, r := range rows {
					if r.CallID == "" {
						t.Fatalf("row without call_id in %q", k)
					}
				}
			}
			if _, err := l.Append(k, tokencapture.Row{CallID: "fuzz-next"}); err != nil {
				t.Fatalf("Append to replayed key %q: %v", k, err)
			}
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l, err = tokencapture.Open(dir, tokencapture.Options{CompactMinBytes: -1})
		if err != nil {
			t.Fatalf("reopen after appends: %v", err)
		}
		defer l.Close()
		if got := l.Keys(); len(got) != len(keys) {
			t.Fatalf("keys after reopen = %v, before %v", got, keys)
		}
	})
}
