package gencut_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
)

// TestBuildInventory: the digest is the one NeMo Gym's
// GenerationCutInventory.build (generation_cut.py @ 807db7d5bd6d) computed
// for the same inventories, run in a session: Python's json.dumps with
// sort_keys and compact separators, its float repr (fixed and exponent
// notation, a whole number's ".0") and its ASCII escapes.
func TestBuildInventory(t *testing.T) {
	for _, c := range []struct {
		id, server string
		prefixes   []gencut.ActivePrefix
		digest     string
	}{
		{"ck-1", "policy_model", []gencut.ActivePrefix{
			{TicketID: "t2", RolloutID: "r", Attempt: 1, ModelCallID: `m"\1`, AdmittedAt: 1796605409.063013},
			{TicketID: "t1", RolloutID: "q.x_y-z", Attempt: 0, ModelCallID: "call-0001", AdmittedAt: 1796605409.0},
		}, "d7e1c55ac9ff47401ed9807bdd841bdd5c0e6d585dd35eded9ded470ec31e4de"},
		{"ck-2", "pol\u00e9\U0001F600", []gencut.ActivePrefix{
			{TicketID: "a", RolloutID: "r", Attempt: 0, ModelCallID: "m", AdmittedAt: 1e16},
			{TicketID: "b", RolloutID: "r", Attempt: 2, ModelCallID: "n", AdmittedAt: 1.5e-05},
			{TicketID: "c", RolloutID: "s", Attempt: 3, ModelCallID: "o", AdmittedAt: 0.0001},
			{TicketID: "d", RolloutID: "s", Attempt: 3, ModelCallID: "p", AdmittedAt: 123456789012345.67},
		}, "0c6894ed202fcd4416bc11260f725ed224dacac038ea8fc72ca8c241e3b1d95a"},
		{"ck-3", "s", nil, "2bee97597dc033237eb1da9fa19b4de27e5a3867e32c2969deb17b899e3c7978"},
		// Python escapes DEL and control bytes (json.dumps as build calls
		// it, run on this payload).
		{"ck-4", "pol\x7fmodel\x00\x1f", []gencut.ActivePrefix{
			{TicketID: "t\x7f", RolloutID: "r", Attempt: 0, ModelCallID: "a\"b\\c\td\u2028<&>", AdmittedAt: 1796605409.5},
		}, "b1a380be500ae2c7c76ec413770333768acb1020cb100dd261fc1d1d51994fb3"},
	} {
		inv := gencut.BuildInventory(c.id, c.server, c.prefixes)
		if inv.InventoryDigest != c.digest {
			t.Errorf("%s: digest %s, GenerationCutInventory.build's %s", c.id, inv.InventoryDigest, c.digest)
		}
		// The body is the JSON hashed, the digest added before its
		// closing brace.
		body, err := inv.Body()
		hashed, found := strings.CutSuffix(string(body), `,"inventory_digest":"`+c.digest+`"}`)
		if sum := sha256.Sum256([]byte(hashed + "}")); err != nil || !found || hex.EncodeToString(sum[:]) != c.digest {
			t.Errorf("%s: body %s, %v", c.id, body, err)
		}
		for i := 1; i < len(inv.ActivePrefixes); i++ {
			if inv.ActivePrefixes[i-1].TicketID > inv.ActivePrefixes[i].TicketID {
				t.Errorf("%s: prefixes not sorted by ticket id: %+v", c.id, inv.ActivePrefixes)
			}
		}
	}
}

func inventory() gencut.Inventory {
	return gencut.BuildInventory("ck-1", "policy_model", []gencut.ActivePrefix{
		{TicketID: "t1", RolloutID: "r", Attempt: 1, ModelCallID: "m1", AdmittedAt: 1796605409.25},
		{TicketID: "t2", RolloutID: "q", Attempt: 0, ModelCallID: "m2", AdmittedAt: 1796605410.5},
	})
}

// TestReceiptRoundTrip: a worker's receipt, encoded and decoded against its
// inventory, validates as GenerationCutReceipt.model_validate and
// validate_for do; every way a receipt can fail them is refused.
func TestReceiptRoundTrip(t *testing.T) {
	inv := inventory()
	digest := strings.Repeat("a", 64)
	good := gencut.Receipt{
		CheckpointID: inv.CheckpointID, CutID: "cut-1", InventoryDigest: inv.InventoryDigest, Inventory: inv, BackendSnapshotID: "store",
		Prefixes: []gencut.PrefixAck{gencut.DurablePrefix(inv.ActivePrefixes[0], "k1", 3, digest, 64), gencut.Failure(inv.ActivePrefixes[1])},
	}
	b, err := gencut.EncodeReceipt(good)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"staging_keys":[]`) || !strings.Contains(string(b), `"terminal_stop_reason":null`) || !strings.Contains(string(b), `"cut_kind":null`) {
		t.Errorf("a failure ack is not written as model_dump writes it: %s", b)
	}
	rc, err := gencut.DecodeReceiptFor(b, inv)
	if err != nil || len(rc.Prefixes) != 2 || rc.Prefixes[0].StagingKeys[0] != "k1" {
		t.Fatalf("DecodeReceiptFor = %+v, %v", rc, err)
	}
	other := gencut.BuildInventory("ck-2", "policy_model", inv.ActivePrefixes)
	for name, mutate := range map[string]func(r *gencut.Receipt){
		"another inventory":          func(r *gencut.Receipt) { r.Inventory, r.InventoryDigest = other, other.InventoryDigest },
		"another digest":             func(r *gencut.Receipt) { r.InventoryDigest = digest },
		"a ticket missing":           func(r *gencut.Receipt) { r.Prefixes = r.Prefixes[:1] },
		"a ticket twice":             func(r *gencut.Receipt) { r.Prefixes[1] = r.Prefixes[0] },
		"another identity":           func(r *gencut.Receipt) { r.Prefixes[1].Attempt = 5 },
		"prefix without staging key": func(r *gencut.Receipt) { r.Prefixes[0].StagingKeys = []string{} },
		"failure with evidence":      func(r *gencut.Receipt) { r.Prefixes[1].StagingKeys = []string{"k2"} },
		"a staging key twice":        func(r *gencut.Receipt) { r.Prefixes[0].StagingKeys = []string{"k1", "k1"} },
		"no snapshot id":             func(r *gencut.Receipt) { r.BackendSnapshotID = "" },
		"bad disposition":            func(r *gencut.Receipt) { r.Prefixes[1].Disposition = "maybe" },
	} {
		r := good
		r.Prefixes = append([]gencut.PrefixAck(nil), good.Prefixes...)
		mutate(&r)
		b, err := gencut.EncodeReceipt(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := gencut.DecodeReceiptFor(b, inv); !errors.Is(err, gencut.ErrInvalidReceipt) {
			t.Errorf("%s: %v, want ErrInvalidReceipt", name, err)
		}
	}
	extra := strings.Replace(string(b), `"cut_id":`, `"reason":"x","cut_id":`, 1)
	if _, err := gencut.DecodeReceiptFor([]byte(extra), inv); !errors.Is(err, gencut.ErrInvalidReceipt) {
		t.Errorf("an unknown field: %v", err)
	}
}

// TestParseInventory: what the worker takes, and what it refuses with 422.
func TestParseInventory(t *testing.T) {
	inv := inventory()
	b, _ := gencut.EncodeReceipt(gencut.Receipt{Inventory: inv})
	body := string(b)
	body = body[strings.Index(body, `"inventory":`)+len(`"inventory":`):]
	body = body[:strings.Index(body, `,"backend_snapshot_id"`)]
	got, err := gencut.ParseInventory([]byte(body))
	if err != nil || got.InventoryDigest != inv.InventoryDigest || len(got.ActivePrefixes) != 2 || got.ActivePrefixes[0] != inv.ActivePrefixes[0] {
		t.Fatalf("ParseInventory(%s) = %+v, %v", body, got, err)
	}
	// Unsorted, and with "ticket_id" in a value: taken as they come.
	unsorted := strings.Replace(body, `"ticket_id":"t1"`, `"ticket_id":"t3"`, 1)
	unsorted = strings.Replace(unsorted, `"model_call_id":"m1"`, `"model_call_id":"ticket_id"`, 1)
	if got, err := gencut.ParseInventory([]byte(unsorted)); err != nil || len(got.ActivePrefixes) != 2 || got.ActivePrefixes[0].TicketID != "t3" ||
		got.ActivePrefixes[0].ModelCallID != "ticket_id" {
		t.Fatalf("ParseInventory(%s) = %+v, %v", unsorted, got, err)
	}
	for _, bad := range []string{
		``, `{}`,
		`{"checkpoint_id":"c","server_name":"s","active_prefixes":[],"inventory_digest":"x"}`,
		`{"checkpoint_id":"c","server_name":"s","active_prefixes":[],"inventory_digest":"` + inv.InventoryDigest + `","active":[]}`,
		`{"checkpoint_id":"c","server_name":"s","active_prefixes":[{"ticket_id":"t","rollout_id":"r/x","attempt":0,"model_call_id":"m","admitted_at":1}],"inventory_digest":"` + inv.InventoryDigest + `"}`,
		`{"checkpoint_id":"c","server_name":"s","active_prefixes":[{"ticket_id":"t","rollout_id":"r","attempt":0,"model_call_id":"m","admitted_at":1},{"ticket_id":"t","rollout_id":"q","attempt":0,"model_call_id":"n","admitted_at":1}],"inventory_digest":"` + inv.InventoryDigest + `"}`,
		// The same ticket twice, apart in an unsorted list.
		`{"checkpoint_id":"c","server_name":"s","active_prefixes":[{"ticket_id":"t","rollout_id":"r","attempt":0,"model_call_id":"m","admitted_at":1},{"ticket_id":"a","rollout_id":"r","attempt":0,"model_call_id":"o","admitted_at":1},{"ticket_id":"t","rollout_id":"q","attempt":0,"model_call_id":"n","admitted_at":1}],"inventory_digest":"` + inv.InventoryDigest + `"}`,
	} {
		if _, err := gencut.ParseInventory([]byte(bad)); !apierror.HasCode(err, apierror.InvalidRequest) {
			t.Errorf("ParseInventory(%s) = %v, want invalid_request", bad, err)
		}
	}
}

// The body BuildInventory's inventory sends is what its encoding would
// be: it parses back to the same inventory, digest included.
func TestInventoryBody(t *testing.T) {
	inv := gencut.BuildInventory("ckpt-é", "policy_model", []gencut.ActivePrefix{
		{TicketID: "c2", RolloutID: "r2", Attempt: 3, ModelCallID: "c2", AdmittedAt: 1765000000.5},
		{TicketID: "c1", RolloutID: "r1", Attempt: 1, ModelCallID: "c1", AdmittedAt: 0.1},
	})
	body, err := inv.Body()
	if err != nil {
		t.Fatal(err)
	}
	got, err := gencut.ParseInventory(body)
	if err != nil {
		t.Fatalf("ParseInventory(%s): %v", body, err)
	}
	if got.CheckpointID != inv.CheckpointID || got.ServerName != inv.ServerName || got.InventoryDigest != inv.InventoryDigest ||
		!slices.Equal(got.ActivePrefixes, inv.ActivePrefixes) {
		t.Fatalf("body %s parses to %+v, want %+v", body, got, inv)
	}
	// An inventory not built here is encoded.
	got.ActivePrefixes = got.ActivePrefixes[:1]
	body, err = got.Body()
	if err != nil {
		t.Fatal(err)
	}
	if again, err := gencut.ParseInventory(body); err != nil || len(again.ActivePrefixes) != 1 {
		t.Fatalf("ParseInventory(%s) = %+v, %v", body, again, err)
	}
}
