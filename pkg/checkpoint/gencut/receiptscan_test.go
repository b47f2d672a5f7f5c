package gencut

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// scanAgrees fails unless what scanReceipt reads from body, if it reads
// it, is what the decoder decodes from it; it reports whether the scanner
// read it.
func scanAgrees(t *testing.T, body []byte, inv *Inventory) bool {
	t.Helper()
	got, scanned := scanReceipt(body, inv)
	want := receiptFor(*inv)
	err := codec.UnmarshalStrictFast(body, &want)
	if !scanned {
		return false
	}
	if err != nil {
		t.Fatalf("scanReceipt reads %s\nthe decoder refuses it: %v", body, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("scanReceipt reads %s\nas %+v\nthe decoder as %+v", body, got, want)
	}
	return true
}

// scanInventory is the inventory the scanner's tests answer.
func scanInventory() Inventory {
	return BuildInventory("ckpt-1", "policy_model", []ActivePrefix{
		{TicketID: "0123456789abcdef0123456789abcdef", RolloutID: "w000001", Attempt: 1, ModelCallID: "0123456789abcdef0123456789abcdef", AdmittedAt: 1765000000.123456},
		{TicketID: "5d7963c4f471e142f5a72214a9666fb1", RolloutID: "w000002", Attempt: 0, ModelCallID: "5d7963c4f471e142f5a72214a9666fb1", AdmittedAt: 1765000000},
		{TicketID: "f00d", RolloutID: "w.x_y-z", Attempt: 7, ModelCallID: "call-f00d", AdmittedAt: 1e16},
	})
}

// scanReceipts are receipts in the form the scanner reads, as
// EncodeReceipt writes them: failures, durable prefixes, terminal
// completions with each kind of stop reason, acks in and out of the
// inventory's order, acks of tickets not listed, an ack with several
// staging keys, no acks.
func scanReceipts(inv Inventory) [][]byte {
	digest := strings.Repeat("0f", 32)
	p := inv.ActivePrefixes
	terminal := func(q ActivePrefix, reason, stop string) PrefixAck {
		a := DurablePrefix(q, "k-"+q.TicketID, 5, digest, 9)
		kind := CutKindTerminalCompletion
		a.CutKind, a.TerminalFinishReason, a.TerminalStopReason = &kind, &reason, codec.RawMessage(stop)
		return a
	}
	several := DurablePrefix(p[2], "k1", 3, digest, 4)
	several.StagingKeys = []string{"k0", "k1", "k2"}
	stranger := Failure(ActivePrefix{TicketID: "zzz", RolloutID: "q", Attempt: 2, ModelCallID: "m", AdmittedAt: -1.5e-7})
	var out [][]byte
	for _, acks := range [][]PrefixAck{
		{Failure(p[0]), Failure(p[1]), Failure(p[2])},
		{DurablePrefix(p[0], StagingKey(p[0].CaptureKey(), p[0].ModelCallID), 12, digest, 100), Failure(p[1]), DurablePrefix(p[2], "k", 0, digest, 1)},
		{terminal(p[0], "stop", `"</s>"`), terminal(p[1], "length", "128001"), terminal(p[2], "stop", "-3")},
		{Failure(p[2]), several, Failure(p[0]), stranger},
		{Failure(p[1])},
		{},
	} {
		rc := Receipt{CheckpointID: inv.CheckpointID, CutID: "0123456789abcdef", InventoryDigest: inv.InventoryDigest, Inventory: inv, BackendSnapshotID: "snap", Prefixes: acks}
		b, err := EncodeReceipt(rc)
		if err != nil {
			panic(err)
		}
		out = append(out, b)
	}
	// Another inventory echoed, and none.
	other := BuildInventory("ckpt-2", "other", []ActivePrefix{{TicketID: "a", RolloutID: "r", ModelCallID: "b", AdmittedAt: 0.5}})
	for _, echoed := range []Inventory{other, {}} {
		b, err := EncodeReceipt(Receipt{CheckpointID: "c", CutID: "u", InventoryDigest: "d", Inventory: echoed, BackendSnapshotID: "s", Prefixes: []PrefixAck{Failure(p[0])}})
		if err != nil {
			panic(err)
		}
		out = append(out, b)
	}
	return out
}

// TestScanReceipt: the scanner reads receipts as workers write them
// (EncodeReceipt's; Gym's, with Python's floats and a closing newline) to
// what the decoder decodes, and leaves every other form to the decoder.
func TestScanReceipt(t *testing.T) {
	inv := scanInventory()
	bodies := scanReceipts(inv)
	python := strings.NewReplacer(`"admitted_at":1765000000,`, `"admitted_at":1765000000.0,`, `"admitted_at":10000000000000000,`, `"admitted_at":1e+16,`)
	for _, b := range bodies {
		for _, body := range [][]byte{b, append(bytes.Clone(b), '\n'), []byte(python.Replace(string(b)) + "\r\n \t")} {
			if !scanAgrees(t, body, &inv) {
				t.Errorf("the scanner leaves to the decoder %s", body)
			}
		}
	}
	b := string(bodies[1])
	for _, c := range []struct{ old, new string }{
		{`{"checkpoint_id"`, `{ "checkpoint_id"`},
		{`"cut_id":"0123456789abcdef"`, `"cut_id":"0123456789abcde\u0066"`},
		{`"cut_id":"0123456789abcdef"`, `"cut_id":"0123456789abcdé"`},
		{`"cut_id":"0123456789abcdef"`, "\"cut_id\":\"0123456789abcde\x7f\""},
		{`"cut_id":"0123456789abcdef"`, "\"cut_id\":\"0123456789abcde\xff\""},
		{`"cut_id"`, `"Cut_ID"`},
		{`"checkpoint_id":"ckpt-1","cut_id":"0123456789abcdef"`, `"cut_id":"0123456789abcdef","checkpoint_id":"ckpt-1"`},
		{`"backend_snapshot_id":"snap",`, ``},
		{`"backend_snapshot_id":"snap",`, `"backend_snapshot_id":"snap","reason":"x",`},
		{`"active_prefixes":[`, `"active_prefixes":null,"x":[`},
		{`"prefixes":[`, `"prefixes":null,"x":[`},
		{`"staging_keys":[]`, `"staging_keys":null`},
		{`"attempt":1,`, `"attempt":1.0,`},
		{`"attempt":1,`, `"attempt":1e0,`},
		{`"attempt":1,`, `"attempt":01,`},
		{`"attempt":1,`, `"attempt":-,`},
		{`"attempt":1,`, `"attempt":99999999999999999999,`},
		{`"attempt":1,`, `"attempt":"1",`},
		{`"admitted_at":1765000000.123456`, `"admitted_at":1e400`},
		{`"admitted_at":1765000000.123456`, `"admitted_at":1765000000.`},
		{`"admitted_at":1765000000.123456`, `"admitted_at":.5`},
		{`"admitted_at":1765000000.123456`, `"admitted_at":1e`},
		{`"admitted_at":1765000000.123456`, `"admitted_at":null`},
		{`"prefix_token_count":12`, `"prefix_token_count":12.5`},
		{`"cut_kind":"active_prefix"`, `"cut_kind":1`},
		{`"terminal_stop_reason":null}`, `"terminal_stop_reason":{"a":1}}`},
		{`"terminal_stop_reason":null}`, `"terminal_stop_reason":1.5}`},
		{`"terminal_stop_reason":null}`, `"terminal_stop_reason":nul}`},
		{`"terminal_stop_reason":null}`, `"terminal_stop_reason":"\x"}`},
		{`"terminal_stop_reason":null}`, `"terminal_stop_reason":"\u12"}`},
		{`"terminal_stop_reason":null}`, "\"terminal_stop_reason\":\"a\tb\"}"},
		{`"terminal_stop_reason":null}`, `"terminal_stop_reason":"é"}`},
		{`"terminal_stop_reason":null}`, `"terminal_stop_reason":"open}`},
	} {
		if !strings.Contains(b, c.old) {
			t.Fatalf("%s is not in %s", c.old, b)
		}
		body := []byte(strings.Replace(b, c.old, c.new, 1))
		if scanAgrees(t, body, &inv) {
			t.Errorf("the scanner reads %s", body)
		}
	}
	// A stop reason's escapes are kept as they are, not decoded.
	for _, stop := range []string{`"\u003c/s\u003e"`, `"\"\\\/\b\f\n\r\t"`, `"\ud800\u0000"`, `""`, `0`, `-0`} {
		body := []byte(strings.Replace(b, `"terminal_stop_reason":null}`, `"terminal_stop_reason":`+stop+`}`, 1))
		if !scanAgrees(t, body, &inv) {
			t.Errorf("the scanner leaves to the decoder %s", body)
		}
	}
	for _, tail := range []string{"x", "{}", "]", "\x00"} {
		if body := []byte(b + tail); scanAgrees(t, body, &inv) {
			t.Errorf("the scanner reads %q", body)
		}
	}
	for n := range len(b) {
		if scanAgrees(t, []byte(b[:n]), &inv) {
			t.Errorf("the scanner reads %d bytes of %d", n, len(b))
		}
	}
}

// FuzzScanReceipt: whatever the body, what the scanner reads is what the
// decoder decodes: a receipt DecodeReceiptFor scans is accepted or refused
// and read as the decoder alone would have it.
func FuzzScanReceipt(f *testing.F) {
	inv := scanInventory()
	for _, b := range scanReceipts(inv) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body []byte) { scanAgrees(t, body, &inv) })
}

// FuzzScanEncodedReceipt: receipts EncodeReceipt writes from any strings
// and numbers, answering an inventory that lists some of their calls,
// are read by the scanner, when it reads them, as the decoder reads them.
func FuzzScanEncodedReceipt(f *testing.F) {
	f.Add("ckpt-1", "0123456789abcdef", "w000001", 1, "durable_prefix", "active_prefix", "k", 10, 100, 1765000000.123456, "stop", []byte(`"</s>"`), uint16(0xffff))
	f.Add("", "", "", 0, "", "", "", 0, 0, 0.0, "", []byte(nil), uint16(0))
	f.Add("c\"1", "t\\", "r\xff", -3, "x&y", "\x7f", "k\x01é", -1, 1<<62, math.Copysign(0, -1), "length", []byte(" 42 "), uint16(0x5555))
	f.Add("c", "t", "r", 0, "durable_failure", "k", "s", 0, 0, 1e21, "l", []byte("128001"), uint16(0x0aaa))
	f.Fuzz(func(t *testing.T, ckpt, ticket, rolloutID string, attempt int, disposition, kind, key string, count, limit int,
		admitted float64, reason string, stop []byte, set uint16) {
		has := func(bit int) bool { return set&(1<<bit) != 0 }
		p := ActivePrefix{TicketID: ticket, RolloutID: rolloutID, Attempt: attempt, ModelCallID: key + ticket, AdmittedAt: admitted}
		q := ActivePrefix{TicketID: key, RolloutID: rolloutID, Attempt: count, ModelCallID: kind, AdmittedAt: -admitted / 3}
		a := PrefixAck{ActivePrefix: p, Disposition: disposition}
		if has(0) {
			a.CutKind = &kind
		}
		if has(1) {
			a.FrozenBufferID = &key
		}
		if has(2) {
			a.StagingKeys = []string{key, reason}
		}
		if has(3) {
			a.PrefixTokenCount = &count
		}
		if has(4) {
			a.PrefixDigest = &ckpt
		}
		if has(5) {
			a.EffectiveOutputLimit = &limit
		}
		if has(6) {
			a.TerminalFinishReason = &reason
		}
		if has(7) {
			a.TerminalStopReason = stop
		}
		listed := []ActivePrefix{p, q}
		if has(8) {
			listed = listed[:1]
		}
		inv := BuildInventory(ckpt, reason, listed)
		if has(9) {
			inv.ActivePrefixes = []ActivePrefix{q, p} // unsorted
		}
		rc := Receipt{CheckpointID: ckpt, CutID: key, InventoryDigest: inv.InventoryDigest, Inventory: inv, BackendSnapshotID: reason}
		if has(10) {
			rc.Inventory = BuildInventory(reason, ckpt, []ActivePrefix{q})
		}
		rc.Prefixes = []PrefixAck{a, Failure(q)}
		if has(11) {
			rc.Prefixes = []PrefixAck{Failure(q), a}
		}
		body, err := EncodeReceipt(rc)
		if err != nil {
			return
		}
		scanAgrees(t, body, &inv)
	})
}
