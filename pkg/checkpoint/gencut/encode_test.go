package gencut_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// The encoders write what codec.Marshal and encoding/json write, whatever
// the strings hold (escapes, HTML characters, invalid UTF-8) and whichever
// optional fields are set.
func FuzzEncodeRequest(f *testing.F) {
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

func FuzzEncodeReceipt(f *testing.F) {
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
