package modelproxy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
)

// A round of gencut.MaxActive calls, every one cut, with the fleet's ids
// (random 32-hex-digit call ids, bench rollout ids, attempt 1): its
// receipt is within the bound postCut takes, as is the receipt of a
// round of one call with ids and staging keys of the longest allowed.
func TestReceiptLimit(t *testing.T) {
	answer := func(ps []gencut.ActivePrefix, key func(gencut.ActivePrefix) string) (gencut.Inventory, []byte) {
		inv := gencut.BuildInventory("ckpt-1", "policy_model", ps)
		rc := gencut.Receipt{CheckpointID: "ckpt-1", CutID: "0123456789abcdef", InventoryDigest: inv.InventoryDigest, Inventory: inv, BackendSnapshotID: "store"}
		for _, p := range inv.ActivePrefixes {
			rc.Prefixes = append(rc.Prefixes, gencut.DurablePrefix(p, key(p), 100, inv.InventoryDigest, 1000))
		}
		b, err := gencut.EncodeReceipt(rc)
		if err != nil {
			t.Fatal(err)
		}
		return inv, b
	}
	ps := make([]gencut.ActivePrefix, gencut.MaxActive)
	for i := range ps {
		sum := sha256.Sum256(fmt.Appendf(nil, "call-%d", i))
		id := hex.EncodeToString(sum[:16])
		ps[i] = gencut.ActivePrefix{TicketID: id, RolloutID: fmt.Sprintf("w%06d", i), Attempt: 1, ModelCallID: id, AdmittedAt: 1765000000 + float64(i)/1e6}
	}
	inv, b := answer(ps, func(p gencut.ActivePrefix) string { return gencut.StagingKey(p.CaptureKey(), p.ModelCallID) })
	if len(b) > receiptLimit(inv) {
		t.Errorf("a receipt of %d calls, all cut, takes %d bytes; postCut takes %d", len(ps), len(b), receiptLimit(inv))
	}
	long := func(c byte, n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = c
		}
		return string(b)
	}
	one := []gencut.ActivePrefix{{TicketID: long('t', 256), RolloutID: long('r', 256), Attempt: 1, ModelCallID: long('m', 256), AdmittedAt: 1765000000.123456}}
	inv, b = answer(one, func(gencut.ActivePrefix) string { return long('k', gencut.MaxStagingKey) })
	if len(b) > receiptLimit(inv) {
		t.Errorf("a receipt of one call with the longest ids takes %d bytes; postCut takes %d", len(b), receiptLimit(inv))
	}
}
