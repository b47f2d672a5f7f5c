package gencut

import (
	"fmt"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// BenchmarkCutRound is the CPU of a prepare's generation-cut round at
// 16,000 calls on one worker, piece by piece: the model server's
// inventory and its check of the receipt, the worker's parse and receipt.
func BenchmarkCutRound(b *testing.B) {
	const n = 16000
	ps := make([]ActivePrefix, n)
	for i := range ps {
		id := fmt.Sprintf("call-%08d", i)
		ps[i] = ActivePrefix{TicketID: id, RolloutID: fmt.Sprintf("w%d", i), Attempt: 1, ModelCallID: id, AdmittedAt: 1765000000.123456}
	}
	inv := BuildInventory("ckpt-1", "policy_model", ps)
	rc := Receipt{CheckpointID: "ckpt-1", CutID: "0123456789abcdef", InventoryDigest: inv.InventoryDigest, Inventory: inv, BackendSnapshotID: "snap"}
	for i, p := range inv.ActivePrefixes {
		if i%2 == 0 {
			rc.Prefixes = append(rc.Prefixes, DurablePrefix(p, "stage-"+p.TicketID, 10, inv.InventoryDigest, 100))
		} else {
			rc.Prefixes = append(rc.Prefixes, Failure(p))
		}
	}
	receipt, err := EncodeReceipt(rc)
	if err != nil {
		b.Fatal(err)
	}
	invBody, err := codec.Marshal(inv)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("BuildInventory", func(b *testing.B) {
		for b.Loop() {
			BuildInventory("ckpt-1", "policy_model", ps)
		}
	})
	b.Run("ParseInventory", func(b *testing.B) {
		for b.Loop() {
			if _, err := ParseInventory(invBody); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("EncodeReceipt", func(b *testing.B) {
		for b.Loop() {
			if _, err := EncodeReceipt(rc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("DecodeReceiptFor", func(b *testing.B) {
		for b.Loop() {
			if _, err := DecodeReceiptFor(receipt, inv); err != nil {
				b.Fatal(err)
			}
		}
	})
}
