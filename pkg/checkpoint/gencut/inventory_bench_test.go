package gencut

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"runtime"
	"testing"
)

// benchPrefixes are n calls as a model server lists them in a bench-scale
// prepare: random 32-hex-digit call ids as tickets, rollout ids of the
// bench's dataset, admission times in microseconds.
func benchPrefixes(n int) []ActivePrefix {
	ps := make([]ActivePrefix, n)
	for i := range ps {
		sum := sha256.Sum256(fmt.Appendf(nil, "call-%d", i))
		id := hex.EncodeToString(sum[:16])
		ps[i] = ActivePrefix{TicketID: id, RolloutID: fmt.Sprintf("w%06d", i), Attempt: 1, ModelCallID: id, AdmittedAt: 1765000000 + float64(i)/1e6}
	}
	return ps
}

// benchReceipt answers inv as a worker does: every other call cut, the
// rest failures (in bench-scale the held calls are all failures).
func benchReceipt(inv Inventory) Receipt {
	rc := Receipt{CheckpointID: "ckpt-1", CutID: "0123456789abcdef", InventoryDigest: inv.InventoryDigest, Inventory: inv, BackendSnapshotID: "snap"}
	for i, p := range inv.ActivePrefixes {
		if i%2 == 0 {
			rc.Prefixes = append(rc.Prefixes, DurablePrefix(p, "__generation_cut__/"+p.RolloutID+"-a1/"+p.ModelCallID, 10, inv.InventoryDigest, 100))
		} else {
			rc.Prefixes = append(rc.Prefixes, Failure(p))
		}
	}
	return rc
}

// coldLoop runs f as a prepare meets it: after two collections, which
// empty every sync.Pool. A codec that keeps its buffers in a pool would
// otherwise reuse, from the second iteration on, the buffer the first one
// grew, which a process that cuts once per checkpoint never has.
func coldLoop(b *testing.B, f func() error) {
	for b.Loop() {
		b.StopTimer()
		runtime.GC()
		runtime.GC()
		b.StartTimer()
		if err := f(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCutRound is the CPU of a prepare's generation-cut round at
// 100,000 calls on one worker, piece by piece: the model server's
// inventory and its check of the receipt, the worker's parse and receipt.
func BenchmarkCutRound(b *testing.B) {
	const n = 100000
	ps := benchPrefixes(n)
	inv := BuildInventory("ckpt-1", "policy_model", ps)
	rc := benchReceipt(inv)
	receipt, err := EncodeReceipt(rc)
	if err != nil {
		b.Fatal(err)
	}
	invBody, err := inv.Body()
	if err != nil {
		b.Fatal(err)
	}
	b.Run("BuildInventory", func(b *testing.B) {
		b.SetBytes(int64(len(invBody)))
		coldLoop(b, func() error { BuildInventory("ckpt-1", "policy_model", ps); return nil })
	})
	b.Run("ParseInventory", func(b *testing.B) {
		b.SetBytes(int64(len(invBody)))
		coldLoop(b, func() error { _, err := ParseInventory(invBody); return err })
	})
	b.Run("EncodeReceipt", func(b *testing.B) {
		b.SetBytes(int64(len(receipt)))
		coldLoop(b, func() error { _, err := EncodeReceipt(rc); return err })
	})
	b.Run("DecodeReceiptFor", func(b *testing.B) {
		b.SetBytes(int64(len(receipt)))
		coldLoop(b, func() error { _, err := DecodeReceiptFor(receipt, inv); return err })
	})
}
