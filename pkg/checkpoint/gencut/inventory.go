package gencut

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// NeMo Gym's generation-cut wire (nemo_gym/_checkpoint/generation_cut.py
// @ 807db7d5bd6d, the same at 012b7b66933a), what POST Path carries: the
// model server sends each worker a GenerationCutInventory of the calls it
// serves there and takes back a GenerationCutReceipt answering every one.
// Every model forbids unknown fields. model.py (PolicyGate._cut) builds the
// inventory, one prefix per undelivered call, and checks the receipt with
// validate_for; a receipt that does not validate fails the whole worker's
// cut, which only costs regeneration.

// Cut kinds of a durable_prefix ack.
const (
	CutKindActivePrefix       = "active_prefix"
	CutKindTerminalCompletion = "terminal_completion"
)

// ActivePrefix is GenerationCutPrefix: one admitted call whose generated
// prefix needs a durable cut.
type ActivePrefix struct {
	TicketID    string  `json:"ticket_id"`
	RolloutID   string  `json:"rollout_id"`
	Attempt     int     `json:"attempt"`
	ModelCallID string  `json:"model_call_id"`
	AdmittedAt  float64 `json:"admitted_at"`
}

// CaptureKey names the call's attempt.
func (p ActivePrefix) CaptureKey() string {
	return rollout.EpisodeID{RolloutID: p.RolloutID, Attempt: p.Attempt}.CaptureKey()
}

// Inventory is GenerationCutInventory: the calls one worker must cut,
// bound to one checkpoint by digest.
type Inventory struct {
	CheckpointID    string         `json:"checkpoint_id"`
	ServerName      string         `json:"server_name"`
	ActivePrefixes  []ActivePrefix `json:"active_prefixes"`
	InventoryDigest string         `json:"inventory_digest"`

	// body is the request body BuildInventory wrote: the JSON it hashed,
	// with the digest added in place of its closing brace, so that Body
	// need not encode or copy the same fields a second time. It is never
	// written again, so copies of the inventory share it.
	body []byte
}

// Body is the inventory's request body: BuildInventory's canonical JSON
// with the digest added, or, for an inventory made otherwise, its
// encoding.
func (inv Inventory) Body() ([]byte, error) {
	if inv.body == nil {
		return codec.Marshal(inv)
	}
	return inv.body, nil
}

// PrefixAck is GenerationCutPrefixAck: a worker's durable outcome for one
// call. A durable_prefix carries the cut kind, the frozen buffer, the
// staging keys (at least one, each once), the prefix's token count and
// digest and the call's effective output limit; a durable_failure carries
// none of them.
type PrefixAck struct {
	ActivePrefix
	Disposition          string           `json:"disposition"`
	CutKind              *string          `json:"cut_kind"`
	FrozenBufferID       *string          `json:"frozen_buffer_id"`
	StagingKeys          []string         `json:"staging_keys"`
	PrefixTokenCount     *int             `json:"prefix_token_count"`
	PrefixDigest         *string          `json:"prefix_digest"`
	EffectiveOutputLimit *int             `json:"effective_output_limit"`
	TerminalFinishReason *string          `json:"terminal_finish_reason"`
	TerminalStopReason   codec.RawMessage `json:"terminal_stop_reason"`
}

// Receipt is GenerationCutReceipt: a worker's final durable receipt for
// every call of its inventory, which it echoes.
type Receipt struct {
	CheckpointID      string      `json:"checkpoint_id"`
	CutID             string      `json:"cut_id"`
	InventoryDigest   string      `json:"inventory_digest"`
	Inventory         Inventory   `json:"inventory"`
	BackendSnapshotID string      `json:"backend_snapshot_id"`
	Prefixes          []PrefixAck `json:"prefixes"`
}

// isHexDigest reports whether s is 64 lowercase hex digits (a SHA-256),
// as Gym's pattern ^[0-9a-f]{64}$ asks; it runs once per listed call.
func isHexDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// BuildInventory is GenerationCutInventory.build: the prefixes sorted by
// ticket id, and the SHA-256 of the checkpoint id, server name and
// prefixes as Python's json.dumps(sort_keys=True, separators=(",", ":"))
// writes them.
func BuildInventory(checkpointID, serverName string, prefixes []ActivePrefix) Inventory {
	sorted := slices.Clone(prefixes)
	if sorted == nil {
		sorted = []ActivePrefix{}
	}
	slices.SortFunc(sorted, func(a, b ActivePrefix) int { return strings.Compare(a.TicketID, b.TicketID) })
	// Sized for the JSON when no string needs an escape: a buffer grown
	// while it is written would be copied over and over.
	size := 64 + len(checkpointID) + len(serverName) + len(`,"inventory_digest":""`) + hex.EncodedLen(sha256.Size)
	for i := range sorted {
		p := &sorted[i]
		size += len(`{"admitted_at":,"attempt":,"model_call_id":"","rollout_id":"","ticket_id":""},`) + maxFloatBytes + maxIntBytes +
			len(p.ModelCallID) + len(p.RolloutID) + len(p.TicketID)
	}
	b := make([]byte, 0, size)
	b = append(b, `{"active_prefixes":[`...)
	for i, p := range sorted {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"admitted_at":`...)
		b = appendPyFloat(b, p.AdmittedAt)
		b = append(b, `,"attempt":`...)
		b = strconv.AppendInt(b, int64(p.Attempt), 10)
		b = append(b, `,"model_call_id":`...)
		b = appendPyString(b, p.ModelCallID)
		b = append(b, `,"rollout_id":`...)
		b = appendPyString(b, p.RolloutID)
		b = append(b, `,"ticket_id":`...)
		b = appendPyString(b, p.TicketID)
		b = append(b, '}')
	}
	b = append(b, `],"checkpoint_id":`...)
	b = appendPyString(b, checkpointID)
	b = append(b, `,"server_name":`...)
	b = appendPyString(b, serverName)
	b = append(b, '}')
	sum := sha256.Sum256(b)
	digest := hex.EncodeToString(sum[:])
	b = append(b[:len(b)-1], `,"inventory_digest":`...)
	b = appendPyString(b, digest)
	b = append(b, '}')
	return Inventory{CheckpointID: checkpointID, ServerName: serverName, ActivePrefixes: sorted, InventoryDigest: digest, body: b}
}

// appendPyString appends s as Python's json.dumps writes it
// (ensure_ascii): what is not printable ASCII (DEL included) as \uXXXX
// escapes, surrogate pairs past the basic plane. Runs of printable ASCII,
// all of nearly every id, are copied whole without decoding a rune.
func appendPyString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	u := func(b []byte, r rune) []byte {
		return append(b, '\\', 'u', hexDigits[r>>12&0xf], hexDigits[r>>8&0xf], hexDigits[r>>4&0xf], hexDigits[r&0xf])
	}
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c >= 0x20 && c <= 0x7e && c != '"' && c != '\\' {
			i++
			continue
		}
		b = append(b, s[start:i]...)
		r, size := rune(s[i]), 1
		if r >= utf8.RuneSelf {
			// Each byte of invalid UTF-8 is written as \ufffd.
			r, size = utf8.DecodeRuneInString(s[i:])
		}
		i += size
		start = i
		switch {
		case r == '"' || r == '\\':
			b = append(b, '\\', byte(r))
		case r == '\n':
			b = append(b, `\n`...)
		case r == '\r':
			b = append(b, `\r`...)
		case r == '\t':
			b = append(b, `\t`...)
		case r == '\b':
			b = append(b, `\b`...)
		case r == '\f':
			b = append(b, `\f`...)
		case r <= 0xffff:
			b = u(b, r)
		default:
			r -= 0x10000
			b = u(u(b, 0xd800+(r>>10)), 0xdc00+(r&0x3ff))
		}
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendPyFloat appends f as Python's float repr writes it: the shortest
// digits that read back as f, fixed notation from 1e-4 up to 1e16 (".0"
// on a whole number), exponent notation with at least two exponent digits
// outside it. It allocates nothing: an inventory has one per call.
func appendPyFloat(b []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(b, "NaN"...)
	case math.IsInf(f, 1):
		return append(b, "Infinity"...)
	case math.IsInf(f, -1):
		return append(b, "-Infinity"...)
	case f == 0:
		if math.Signbit(f) {
			return append(b, "-0.0"...)
		}
		return append(b, "0.0"...)
	}
	if f < 0 {
		b, f = append(b, '-'), -f
	}
	// The shortest digits, d[.ddd]e±XX, split into the digits and the
	// exponent.
	var buf [32]byte
	e := strconv.AppendFloat(buf[:0], f, 'e', -1, 64)
	at := bytes.IndexByte(e, 'e')
	exp := 0
	for _, c := range e[at+2:] {
		exp = exp*10 + int(c-'0')
	}
	if e[at+1] == '-' {
		exp = -exp
	}
	digits := e[:at]
	if len(digits) > 1 {
		digits = append(digits[:1], digits[2:]...) // drop the point
	}
	if exp < -4 || exp >= 16 {
		b = append(b, digits[0])
		if len(digits) > 1 {
			b = append(b, '.')
			b = append(b, digits[1:]...)
		}
		b = append(b, 'e')
		if exp < 0 {
			b, exp = append(b, '-'), -exp
		} else {
			b = append(b, '+')
		}
		if exp < 10 {
			b = append(b, '0')
		}
		return strconv.AppendInt(b, int64(exp), 10)
	}
	if exp < 0 {
		b = append(b, "0."...)
		b = appendZeros(b, -exp-1)
		return append(b, digits...)
	}
	if len(digits) <= exp+1 {
		b = append(b, digits...)
		b = appendZeros(b, exp+1-len(digits))
		return append(b, ".0"...)
	}
	b = append(b, digits[:exp+1]...)
	b = append(b, '.')
	return append(b, digits[exp+1:]...)
}

func appendZeros(b []byte, n int) []byte {
	for range n {
		b = append(b, '0')
	}
	return b
}

// ParseInventory decodes and validates an inventory (the worker's side),
// as GenerationCutInventory.model_validate does: unknown fields refused,
// a checkpoint id and server name, a 64-hex-digit digest, each prefix with
// a ticket id, a rollout id, an attempt >= 0 and a model call id. It also
// refuses a ticket listed twice (no receipt could answer each once) and
// more than MaxActive prefixes. Its error is an *apierror.Error answered
// with 422, as FastAPI answers a body its model refuses. The digest is not
// recomputed: the worker echoes the inventory, and the model server checks.
func ParseInventory(body []byte) (Inventory, error) {
	// Room for the prefixes the body names: decoded into a slice that
	// grows, 100,000 of them are copied at every step. Each names its
	// ticket once, and only a key can be the string "ticket_id" followed
	// by a quote (a string's quotes are escaped).
	inv := Inventory{ActivePrefixes: make([]ActivePrefix, 0, min(bytes.Count(body, []byte(`"ticket_id"`)), MaxActive+1))}
	invalid := func(format string, args ...any) error {
		return apierror.New(apierror.InvalidRequest, format, args...).WithStatus(http.StatusUnprocessableEntity)
	}
	if err := codec.UnmarshalStrictFast(body, &inv); err != nil {
		return inv, invalid("%s", codec.DescribeError(err))
	}
	if inv.CheckpointID == "" || inv.ServerName == "" {
		return inv, invalid("checkpoint_id and server_name must not be empty")
	}
	if !isHexDigest(inv.InventoryDigest) {
		return inv, invalid("inventory_digest must be 64 lowercase hex digits")
	}
	if len(inv.ActivePrefixes) > MaxActive {
		return inv, invalid("at most %d active prefixes per inventory, got %d", MaxActive, len(inv.ActivePrefixes))
	}
	if inv.ActivePrefixes == nil {
		inv.ActivePrefixes = []ActivePrefix{}
	}
	// A ticket listed twice: next to itself in prefixes sorted by ticket
	// id, as GenerationCutInventory.build sorts them, else found in a set.
	sorted := slices.IsSortedFunc(inv.ActivePrefixes, func(a, b ActivePrefix) int { return strings.Compare(a.TicketID, b.TicketID) })
	var seen map[string]bool
	if !sorted {
		seen = make(map[string]bool, len(inv.ActivePrefixes))
	}
	for i, p := range inv.ActivePrefixes {
		switch {
		case p.TicketID == "" || p.ModelCallID == "":
			return inv, invalid("active_prefixes[%d]: ticket_id and model_call_id must not be empty", i)
		case !ValidCallID(p.ModelCallID):
			return inv, invalid("active_prefixes[%d]: model_call_id must be 1 to 256 visible characters", i)
		case (rollout.EpisodeID{RolloutID: p.RolloutID, Attempt: p.Attempt}).Validate() != nil:
			return inv, invalid("active_prefixes[%d]: rollout_id must match ^[A-Za-z0-9][A-Za-z0-9._-]*$ and attempt be >= 0", i)
		case sorted && i > 0 && inv.ActivePrefixes[i-1].TicketID == p.TicketID, !sorted && seen[p.TicketID]:
			return inv, invalid("active_prefixes[%d]: ticket_id %q is listed twice", i, p.TicketID)
		case math.IsNaN(p.AdmittedAt) || math.IsInf(p.AdmittedAt, 0):
			return inv, invalid("active_prefixes[%d]: admitted_at must be a finite number", i)
		}
		if !sorted {
			seen[p.TicketID] = true
		}
	}
	return inv, nil
}

// Failure is GenerationCutPrefixAck.failure: a call the worker did not cut.
func Failure(p ActivePrefix) PrefixAck {
	return PrefixAck{ActivePrefix: p, Disposition: DispositionDurableFailure, StagingKeys: []string{}}
}

// DurablePrefix is the ack of a call whose prefix is staged under key:
// its one staging key, which is also its frozen buffer.
func DurablePrefix(p ActivePrefix, key string, tokens int, digest string, outputLimit int) PrefixAck {
	kind := CutKindActivePrefix
	return PrefixAck{
		ActivePrefix: p, Disposition: DispositionDurablePrefix, CutKind: &kind, FrozenBufferID: &key,
		StagingKeys: []string{key}, PrefixTokenCount: &tokens, PrefixDigest: &digest, EffectiveOutputLimit: &outputLimit,
	}
}

// ErrInvalidReceipt reports a receipt that is not an exact, complete
// answer to its inventory.
var ErrInvalidReceipt = errors.New("invalid generation-cut receipt")

// DecodeReceiptFor decodes a worker's receipt and checks it as model.py
// does: GenerationCutReceipt.model_validate (unknown fields refused, each
// ack's evidence consistent with its disposition) and validate_for(inv)
// (the inventory echoed exactly, its digest, every ticket answered once
// with the identity it was listed with).
func DecodeReceiptFor(body []byte, inv Inventory) (*Receipt, error) {
	rc, scanned := scanReceipt(body, &inv)
	if !scanned {
		rc = receiptFor(inv)
		if err := codec.UnmarshalStrictFast(body, &rc); err != nil {
			return nil, fmt.Errorf("%w: %s", ErrInvalidReceipt, codec.DescribeError(err))
		}
	}
	if rc.CheckpointID == "" || rc.CutID == "" || rc.BackendSnapshotID == "" || !isHexDigest(rc.InventoryDigest) {
		return nil, fmt.Errorf("%w: checkpoint_id, cut_id and backend_snapshot_id must be set and inventory_digest be 64 hex digits", ErrInvalidReceipt)
	}
	for i := range rc.Prefixes {
		if err := validAck(&rc.Prefixes[i]); err != nil {
			return nil, fmt.Errorf("%w: prefixes[%d]: %v", ErrInvalidReceipt, i, err)
		}
	}
	if !sameInventory(rc.Inventory, inv) || rc.InventoryDigest != inv.InventoryDigest {
		return nil, fmt.Errorf("%w: it answers a different inventory", ErrInvalidReceipt)
	}
	// Each ack finds its prefix by search: BuildInventory sorts the
	// prefixes by ticket id; an inventory made otherwise is sorted here.
	listed := inv.ActivePrefixes
	byTicket := func(a, b ActivePrefix) int { return strings.Compare(a.TicketID, b.TicketID) }
	if !slices.IsSortedFunc(listed, byTicket) {
		listed = slices.Clone(listed)
		slices.SortFunc(listed, byTicket)
	}
	acked := make([]bool, len(listed))
	for i := range rc.Prefixes {
		a := &rc.Prefixes[i]
		j, ok := slices.BinarySearchFunc(listed, a.TicketID, func(p ActivePrefix, id string) int { return strings.Compare(p.TicketID, id) })
		if !ok || acked[j] {
			return nil, fmt.Errorf("%w: it must cover every call in the inventory exactly once", ErrInvalidReceipt)
		}
		acked[j] = true
		if a.ActivePrefix != listed[j] {
			return nil, fmt.Errorf("%w: identity differs for ticket %q", ErrInvalidReceipt, a.TicketID)
		}
	}
	if len(rc.Prefixes) != len(listed) {
		return nil, fmt.Errorf("%w: it must cover every call in the inventory exactly once", ErrInvalidReceipt)
	}
	return &rc, nil
}

// receiptFor is the Receipt a receipt answering inv is decoded into: room
// for the calls listed, in the acks and in the echoed inventory (decoded
// into a slice that grows, 100,000 calls are copied at every step).
func receiptFor(inv Inventory) Receipt {
	n := min(len(inv.ActivePrefixes), MaxActive)
	return Receipt{Inventory: Inventory{ActivePrefixes: make([]ActivePrefix, 0, n)}, Prefixes: make([]PrefixAck, 0, n)}
}

func sameInventory(a, b Inventory) bool {
	return a.CheckpointID == b.CheckpointID && a.ServerName == b.ServerName && a.InventoryDigest == b.InventoryDigest &&
		slices.Equal(a.ActivePrefixes, b.ActivePrefixes)
}

// validAck is GenerationCutPrefixAck's validation.
func validAck(a *PrefixAck) error {
	switch {
	case a.TicketID == "" || a.ModelCallID == "":
		return errors.New("ticket_id and model_call_id must not be empty")
	case (rollout.EpisodeID{RolloutID: a.RolloutID, Attempt: a.Attempt}).Validate() != nil:
		return errors.New("rollout_id or attempt is not an episode's")
	}
	evidence := a.CutKind != nil || a.FrozenBufferID != nil || a.PrefixTokenCount != nil || a.PrefixDigest != nil
	switch a.Disposition {
	case DispositionDurablePrefix:
		if a.CutKind == nil || a.FrozenBufferID == nil || a.PrefixTokenCount == nil || a.PrefixDigest == nil ||
			len(a.StagingKeys) == 0 || a.EffectiveOutputLimit == nil {
			return errors.New("durable_prefix requires cut_kind, frozen_buffer_id, staging_keys, prefix_token_count, prefix_digest, and effective_output_limit")
		}
	case DispositionDurableFailure:
		if evidence || len(a.StagingKeys) > 0 || a.EffectiveOutputLimit != nil {
			return errors.New("durable_failure cannot carry prefix evidence")
		}
	default:
		return fmt.Errorf("disposition %q is neither durable_prefix nor durable_failure", a.Disposition)
	}
	if a.CutKind != nil && *a.CutKind != CutKindActivePrefix && *a.CutKind != CutKindTerminalCompletion {
		return fmt.Errorf("cut_kind %q is neither active_prefix nor terminal_completion", *a.CutKind)
	}
	if a.FrozenBufferID != nil && *a.FrozenBufferID == "" {
		return errors.New("frozen_buffer_id must not be empty")
	}
	if a.PrefixTokenCount != nil && *a.PrefixTokenCount < 0 {
		return errors.New("prefix_token_count must be >= 0")
	}
	if a.PrefixDigest != nil && !isHexDigest(*a.PrefixDigest) {
		return errors.New("prefix_digest must be 64 lowercase hex digits")
	}
	if a.EffectiveOutputLimit != nil && *a.EffectiveOutputLimit < 1 {
		return errors.New("effective_output_limit must be >= 1")
	}
	if r := a.TerminalFinishReason; r != nil && *r != "stop" && *r != "length" {
		return fmt.Errorf("terminal_finish_reason %q is neither stop nor length", *r)
	}
	if stop := strings.TrimSpace(string(a.TerminalStopReason)); stop != "" && stop != "null" {
		if a.TerminalFinishReason == nil {
			return errors.New("terminal_stop_reason requires terminal_finish_reason")
		}
		var s string
		if _, err := strconv.ParseInt(stop, 10, 64); err != nil && codec.Unmarshal([]byte(stop), &s) != nil {
			return errors.New("terminal_stop_reason must be a string or an integer")
		}
	}
	if len(a.StagingKeys) > 1 {
		seen := make(map[string]bool, len(a.StagingKeys))
		for _, k := range a.StagingKeys {
			if seen[k] {
				return errors.New("generation-cut staging_keys must be unique")
			}
			seen[k] = true
		}
	}
	return nil
}
