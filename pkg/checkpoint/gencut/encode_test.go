package gencut_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// The encoders write what codec.Marshal and encoding/json write, whatever
// the strings hold (escapes, HTML characters, invalid UTF-8) and whichever
// optional fields are set.
func FuzzEncodeLegacyRequest(f *testing.F) {
	f.Add("ck-1", "policy_model", "m1", "r-a1", 2, false)
	f.Add("", "", "", "", 0, true)
	f.Add("c<1>", "s&\"\\", "m\u2028\x00", "r\xff", 3, false)
	f.Fuzz(func(t *testing.T, ckpt, server, callID, key string, n int, nilActive bool) {
		req := gencut.LegacyRequest{CheckpointID: ckpt, ServerName: server}
		if !nilActive {
			req.Active = []gencut.LegacyActiveCall{}
			for i := range n % 4 {
				req.Active = append(req.Active, gencut.LegacyActiveCall{ModelCallID: callID[:min(i, len(callID))] + callID, CaptureKey: key})
			}
		}
		sameAsMarshal(t, req, gencut.EncodeLegacyRequest(req))
	})
}

func FuzzEncodeLegacyReceipt(f *testing.F) {
	f.Add("ck-1", "0123abcd", "m1", "r-a1", "durable_prefix", "", "__generation_cut__/r-a1/m1", 7, "d1")
	f.Add("ck-1", "0123abcd", "m1", "r-a1", "durable_failure", "held", "", 0, "")
	f.Add("c<1>", "", "m\u2028", "r\xff", "x&y", "capture_key_mismatch: the call belongs to \"q\"", "k\x01", -3, "<d>")
	f.Fuzz(func(t *testing.T, ckpt, cutID, callID, key, disposition, reason, staging string, count int, digest string) {
		for _, prefixes := range [][]gencut.LegacyPrefix{nil, {}, {
			{ModelCallID: callID, CaptureKey: key, Disposition: disposition, Reason: reason, StagingKey: staging, PrefixTokenCount: count, PrefixDigest: digest},
			{ModelCallID: key, CaptureKey: callID, Disposition: disposition},
		}} {
			rc := gencut.LegacyReceipt{CheckpointID: ckpt, CutID: cutID, Prefixes: prefixes}
			sameAsMarshal(t, rc, gencut.EncodeLegacyReceipt(rc))
		}
	})
}

func sameAsMarshal(t *testing.T, v any, got []byte) {
	t.Helper()
	want, err := codec.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	std, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) || !bytes.Equal(got, std) {
		t.Fatalf("encoded %s\ncodec.Marshal %s\nencoding/json %s", got, want, std)
	}
}

// marshalReceipt is how EncodeReceipt wrote a receipt before it was
// written by hand, kept as its oracle: codec.Marshal of the receipt with
// its unset lists as [] and unset stop reasons as null.
func marshalReceipt(rc gencut.Receipt) ([]byte, error) {
	if rc.Inventory.ActivePrefixes == nil {
		rc.Inventory.ActivePrefixes = []gencut.ActivePrefix{}
	}
	if rc.Prefixes == nil {
		rc.Prefixes = []gencut.PrefixAck{}
	}
	rc.Prefixes = slices.Clone(rc.Prefixes)
	for i := range rc.Prefixes {
		if rc.Prefixes[i].StagingKeys == nil {
			rc.Prefixes[i].StagingKeys = []string{}
		}
		if len(rc.Prefixes[i].TerminalStopReason) == 0 {
			rc.Prefixes[i].TerminalStopReason = codec.RawMessage("null")
		}
	}
	return codec.Marshal(rc)
}

// sameAsMarshalReceipt fails unless EncodeReceipt writes rc as
// marshalReceipt does, or both refuse it.
func sameAsMarshalReceipt(t *testing.T, rc gencut.Receipt) {
	t.Helper()
	got, gerr := gencut.EncodeReceipt(rc)
	want, werr := marshalReceipt(rc)
	if (gerr == nil) != (werr == nil) {
		t.Fatalf("EncodeReceipt error %v, codec.Marshal error %v, for %+v", gerr, werr, rc)
	}
	if werr == nil && !bytes.Equal(got, want) {
		t.Fatalf("EncodeReceipt wrote\n%s\ncodec.Marshal\n%s", got, want)
	}
}

func ptr[T any](v T) *T { return &v }

// TestEncodeReceipt: EncodeReceipt writes every kind of receipt as
// codec.Marshal did: null for each unset field, [] for unset lists, the
// stop reason compacted and HTML-safe, strings escaped as Marshal escapes
// them (quotes, backslashes, control bytes, DEL, U+2028, <, >, &, invalid
// UTF-8 and characters past the basic plane), numbers at their extremes.
func TestEncodeReceipt(t *testing.T) {
	p := gencut.ActivePrefix{TicketID: "0123456789abcdef0123456789abcdef", RolloutID: "w000001", Attempt: 1,
		ModelCallID: "0123456789abcdef0123456789abcdef", AdmittedAt: 1765000000.123456}
	odd := "q\"b\\s\x00\x01\x1f\x7f\t\n\r\b\f<a&b>\u2028\u2029é\U0001F600\xff\xc3"
	digest := "aa" + string(bytes.Repeat([]byte("0f"), 31))
	terminal := func(reason, stop string) gencut.PrefixAck {
		a := gencut.DurablePrefix(p, "__generation_cut__/w000001-a1/k", 7, digest, 64)
		a.CutKind, a.TerminalFinishReason = ptr(gencut.CutKindTerminalCompletion), ptr(reason)
		if stop != "" {
			a.TerminalStopReason = codec.RawMessage(stop)
		}
		return a
	}
	inv := gencut.BuildInventory("ckpt-1", "policy_model", []gencut.ActivePrefix{p})
	base := gencut.Receipt{CheckpointID: "ckpt-1", CutID: "cut", InventoryDigest: inv.InventoryDigest, Inventory: inv, BackendSnapshotID: "snap"}
	with := func(acks ...gencut.PrefixAck) gencut.Receipt {
		rc := base
		rc.Prefixes = acks
		return rc
	}
	oddPrefix := gencut.ActivePrefix{TicketID: odd, RolloutID: odd, Attempt: -1, ModelCallID: odd, AdmittedAt: math.Copysign(0, -1)}
	for name, rc := range map[string]gencut.Receipt{
		"empty":                   {},
		"no acks":                 base,
		"empty lists":             {Inventory: gencut.Inventory{ActivePrefixes: []gencut.ActivePrefix{}}, Prefixes: []gencut.PrefixAck{}},
		"a failure":               with(gencut.Failure(p)),
		"a failure, nil keys":     with(gencut.PrefixAck{ActivePrefix: p, Disposition: gencut.DispositionDurableFailure}),
		"a durable prefix":        with(gencut.DurablePrefix(p, "__generation_cut__/w000001-a1/k", 12, digest, 100), gencut.Failure(p)),
		"several staging keys":    with(gencut.PrefixAck{ActivePrefix: p, Disposition: "durable_prefix", StagingKeys: []string{"a", "b<", odd}}),
		"terminal, string stop":   with(terminal("stop", `"</s>"`)),
		"terminal, integer stop":  with(terminal("stop", "128001")),
		"terminal, spaced stop":   with(terminal("length", " \t\n 42 \r")),
		"terminal, explicit null": with(terminal("length", "null")),
		"terminal, unset stop":    with(terminal("length", "")),
		"terminal, odd stop":      with(terminal("stop", `"a&b \u2028 \"q\" \\"`)),
		"odd strings": {
			CheckpointID: odd, CutID: odd, InventoryDigest: odd, BackendSnapshotID: odd,
			Inventory: gencut.Inventory{CheckpointID: odd, ServerName: odd, InventoryDigest: odd, ActivePrefixes: []gencut.ActivePrefix{oddPrefix, oddPrefix}},
			Prefixes: []gencut.PrefixAck{{ActivePrefix: oddPrefix, Disposition: odd, CutKind: ptr(odd), FrozenBufferID: ptr(odd), StagingKeys: []string{odd, ""},
				PrefixDigest: ptr(odd), TerminalFinishReason: ptr(odd), TerminalStopReason: codec.RawMessage(`"` + "\u00e9<" + `"`)}},
		},
		"extreme numbers": with(
			gencut.PrefixAck{ActivePrefix: gencut.ActivePrefix{Attempt: math.MaxInt, AdmittedAt: math.MaxFloat64}, PrefixTokenCount: ptr(math.MinInt), EffectiveOutputLimit: ptr(-1)},
			gencut.PrefixAck{ActivePrefix: gencut.ActivePrefix{Attempt: math.MinInt, AdmittedAt: math.SmallestNonzeroFloat64}, PrefixTokenCount: ptr(0), EffectiveOutputLimit: ptr(math.MaxInt)},
			gencut.PrefixAck{ActivePrefix: gencut.ActivePrefix{AdmittedAt: 1e21}}, gencut.PrefixAck{ActivePrefix: gencut.ActivePrefix{AdmittedAt: 1e20 + 12345}},
			gencut.PrefixAck{ActivePrefix: gencut.ActivePrefix{AdmittedAt: 1e-6}}, gencut.PrefixAck{ActivePrefix: gencut.ActivePrefix{AdmittedAt: -1.2345678901234567e-6}},
			gencut.PrefixAck{ActivePrefix: gencut.ActivePrefix{AdmittedAt: 9.99999e-7}}, gencut.PrefixAck{ActivePrefix: gencut.ActivePrefix{AdmittedAt: 0.1}},
			gencut.PrefixAck{ActivePrefix: gencut.ActivePrefix{AdmittedAt: -1765000000.5}}, gencut.PrefixAck{ActivePrefix: gencut.ActivePrefix{AdmittedAt: 1e16}},
		),
		"NaN admitted_at":          with(gencut.Failure(gencut.ActivePrefix{AdmittedAt: math.NaN()})),
		"infinite in inventory":    {Inventory: gencut.Inventory{ActivePrefixes: []gencut.ActivePrefix{{AdmittedAt: math.Inf(-1)}}}},
		"stop that is not JSON":    with(terminal("stop", "{")),
		"stop of two values":       with(terminal("stop", "1 2")),
		"stop that is white space": with(terminal("stop", " ")),
	} {
		t.Run(name, func(t *testing.T) { sameAsMarshalReceipt(t, rc) })
	}
	// The bench's receipt: 100 acks, half of them cut.
	ps := make([]gencut.ActivePrefix, 100)
	for i := range ps {
		ps[i] = p
		ps[i].TicketID = fmt.Sprintf("%032x", i)
		ps[i].AdmittedAt += float64(i) / 1e6
	}
	big := gencut.BuildInventory("ckpt-1", "policy_model", ps)
	rc := gencut.Receipt{CheckpointID: "ckpt-1", CutID: "cut", InventoryDigest: big.InventoryDigest, Inventory: big, BackendSnapshotID: "snap"}
	for i, q := range big.ActivePrefixes {
		if i%2 == 0 {
			rc.Prefixes = append(rc.Prefixes, gencut.DurablePrefix(q, "__generation_cut__/w000001-a1/"+q.TicketID, i+1, digest, 100))
		} else {
			rc.Prefixes = append(rc.Prefixes, gencut.Failure(q))
		}
	}
	sameAsMarshalReceipt(t, rc)
	// EncodeReceipt leaves its argument as it was.
	a := gencut.PrefixAck{ActivePrefix: p, Disposition: gencut.DispositionDurableFailure}
	acks := []gencut.PrefixAck{a}
	if _, err := gencut.EncodeReceipt(gencut.Receipt{Prefixes: acks}); err != nil || acks[0].StagingKeys != nil || acks[0].TerminalStopReason != nil {
		t.Fatalf("EncodeReceipt changed its receipt's acks: %+v, %v", acks[0], err)
	}
}

// FuzzEncodeReceipt: whatever the strings, numbers and raw stop reason,
// and whichever optional fields are set, EncodeReceipt writes what
// codec.Marshal writes, and fails where it fails.
func FuzzEncodeReceipt(f *testing.F) {
	f.Add("ckpt-1", "0123abcd", "0123456789abcdef0123456789abcdef", "w000001", 1, "durable_prefix", "active_prefix", "__generation_cut__/w000001-a1/k", 10, 100, 1765000000.123456, "stop", []byte(`"</s>"`), uint16(0xffff))
	f.Add("", "", "", "", 0, "", "", "", 0, 0, 0.0, "", []byte(nil), uint16(0))
	f.Add("c<1>&", "\u2028", "t\"\\", "r\xff", -3, "x&y", "\x00\x7f", "k\x01é", -1, math.MaxInt, math.Copysign(0, -1), "\U0001F600", []byte(" 42 "), uint16(0x5555))
	f.Add("c", "u", "t", "r", 0, "d", "k", "s", 0, 0, 1e21, "l", []byte("{"), uint16(0x0aaa))
	f.Add("c", "u", "t", "r", 0, "d", "k", "s", 0, 0, 9.5e-7, "l", []byte(`["\u2028<",{"a" : 1}]`), uint16(0x0fff))
	f.Fuzz(func(t *testing.T, ckpt, cutID, ticket, rolloutID string, attempt int, disposition, kind, key string, count, limit int,
		admitted float64, reason string, stop []byte, set uint16) {
		has := func(bit int) bool { return set&(1<<bit) != 0 }
		p := gencut.ActivePrefix{TicketID: ticket, RolloutID: rolloutID, Attempt: attempt, ModelCallID: key + ticket, AdmittedAt: admitted}
		a := gencut.PrefixAck{ActivePrefix: p, Disposition: disposition}
		if has(0) {
			a.CutKind = &kind
		}
		if has(1) {
			a.FrozenBufferID = &key
		}
		if has(2) {
			a.StagingKeys = []string{}
		}
		if has(3) {
			a.StagingKeys = append(a.StagingKeys, key, kind+key, reason)
		}
		if has(4) {
			a.PrefixTokenCount = &count
		}
		if has(5) {
			a.PrefixDigest = &cutID
		}
		if has(6) {
			a.EffectiveOutputLimit = &limit
		}
		if has(7) {
			a.TerminalFinishReason = &reason
		}
		if has(8) {
			a.TerminalStopReason = stop
		}
		rc := gencut.Receipt{CheckpointID: ckpt, CutID: cutID, InventoryDigest: reason, BackendSnapshotID: kind,
			Inventory: gencut.Inventory{CheckpointID: cutID, ServerName: ckpt, InventoryDigest: key}}
		if has(9) {
			rc.Inventory.ActivePrefixes = []gencut.ActivePrefix{p, {TicketID: key, RolloutID: reason, Attempt: count, ModelCallID: kind, AdmittedAt: -admitted / 3}}
		}
		if has(10) {
			rc.Prefixes = []gencut.PrefixAck{a, gencut.Failure(p)}
		} else if has(11) {
			rc.Prefixes = []gencut.PrefixAck{}
		}
		sameAsMarshalReceipt(t, rc)
	})
}
