package gencut

import (
	"bytes"
	"strconv"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// A receipt of a round of 100,000 calls is tens of megabytes whose every
// string but the acks' evidence repeats one of the inventory the model
// server sent, and a decoder makes each a string of its own: over a
// million allocations in a prepare. scanReceipt reads a receipt written
// in the form workers write it (EncodeReceipt's, and Gym's pydantic
// models' dumped compactly: every field, in the models' order, no white
// space, strings of printable ASCII without escapes) and takes each
// string that repeats one of the inventory from it. Anything else, valid
// or not, it leaves to the decoder: what it accepts is decoded as
// codec.UnmarshalStrictFast decodes it, to the same value
// (FuzzScanReceipt checks it).

// receiptScanner reads one receipt in the form scanReceipt reads.
type receiptScanner struct {
	b []byte
	i int
	// ok turns false, for good, when the input leaves the form.
	ok bool
	// inv is the inventory whose strings the receipt's repeat.
	inv *Inventory
	// nullStop is the terminal_stop_reason of every ack whose is null, as
	// the decoder writes a JSON null into a RawMessage: one for them all.
	nullStop codec.RawMessage
}

// scanReceipt reads body into a Receipt, or reports that body is not in
// the form it reads (ok false): then the decoder must read it.
func scanReceipt(body []byte, inv *Inventory) (rc Receipt, ok bool) {
	s := receiptScanner{b: body, ok: true, inv: inv, nullStop: codec.RawMessage("null")[:4:4]}
	rc = receiptFor(*inv)
	s.lit(`{"checkpoint_id":`)
	rc.CheckpointID = s.str(inv.CheckpointID)
	s.lit(`,"cut_id":`)
	rc.CutID = s.str("")
	s.lit(`,"inventory_digest":`)
	rc.InventoryDigest = s.str(inv.InventoryDigest)
	s.lit(`,"inventory":{"checkpoint_id":`)
	rc.Inventory.CheckpointID = s.str(inv.CheckpointID)
	s.lit(`,"server_name":`)
	rc.Inventory.ServerName = s.str(inv.ServerName)
	s.lit(`,"active_prefixes":[`)
	for s.ok && !s.next(']') {
		if len(rc.Inventory.ActivePrefixes) > 0 {
			s.lit(",")
		}
		var listed *ActivePrefix
		if i := len(rc.Inventory.ActivePrefixes); i < len(inv.ActivePrefixes) {
			listed = &inv.ActivePrefixes[i]
		}
		s.lit("{")
		p := s.prefix(listed)
		s.lit("}")
		rc.Inventory.ActivePrefixes = append(rc.Inventory.ActivePrefixes, p)
	}
	s.lit(`,"inventory_digest":`)
	rc.Inventory.InventoryDigest = s.str(inv.InventoryDigest)
	s.lit(`},"backend_snapshot_id":`)
	rc.BackendSnapshotID = s.str("")
	s.lit(`,"prefixes":[`)
	for s.ok && !s.next(']') {
		if len(rc.Prefixes) > 0 {
			s.lit(",")
		}
		s.lit("{")
		a := s.ack(len(rc.Prefixes))
		s.lit("}")
		rc.Prefixes = append(rc.Prefixes, a)
	}
	s.lit("}")
	// White space may end a JSON body (a reply's newline).
	for s.ok && s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			s.ok = false
		}
	}
	return rc, s.ok
}

// prefix reads an ActivePrefix's fields, reusing listed's strings.
func (s *receiptScanner) prefix(listed *ActivePrefix) ActivePrefix {
	var p ActivePrefix
	if listed == nil {
		listed = &ActivePrefix{}
	}
	s.lit(`"ticket_id":`)
	p.TicketID = s.str(listed.TicketID)
	s.lit(`,"rollout_id":`)
	p.RolloutID = s.str(listed.RolloutID)
	s.lit(`,"attempt":`)
	p.Attempt = s.integer()
	s.lit(`,"model_call_id":`)
	p.ModelCallID = s.str(listed.ModelCallID)
	s.lit(`,"admitted_at":`)
	p.AdmittedAt = s.number()
	return p
}

// ack reads the i-th ack's fields. Its identity reuses the strings of the
// call it answers: the i-th listed when the tickets agree (a worker
// answers in the inventory's order), else the one its ticket finds.
func (s *receiptScanner) ack(i int) PrefixAck {
	var a PrefixAck
	listed := s.listedFor(i)
	a.ActivePrefix = s.prefix(listed)
	s.lit(`,"disposition":`)
	a.Disposition = s.str(DispositionDurableFailure, DispositionDurablePrefix)
	s.lit(`,"cut_kind":`)
	a.CutKind = s.optionalStr(CutKindActivePrefix, CutKindTerminalCompletion)
	s.lit(`,"frozen_buffer_id":`)
	a.FrozenBufferID = s.optionalStr()
	s.lit(`,"staging_keys":[`)
	a.StagingKeys = []string{}
	for s.ok && !s.next(']') {
		if len(a.StagingKeys) > 0 {
			s.lit(",")
		}
		// The frozen buffer is the staging key, as DurablePrefix writes
		// them.
		frozen := ""
		if a.FrozenBufferID != nil {
			frozen = *a.FrozenBufferID
		}
		a.StagingKeys = append(a.StagingKeys, s.str(frozen))
	}
	s.lit(`,"prefix_token_count":`)
	a.PrefixTokenCount = s.optionalInteger()
	s.lit(`,"prefix_digest":`)
	a.PrefixDigest = s.optionalStr()
	s.lit(`,"effective_output_limit":`)
	a.EffectiveOutputLimit = s.optionalInteger()
	s.lit(`,"terminal_finish_reason":`)
	a.TerminalFinishReason = s.optionalStr("stop", "length")
	s.lit(`,"terminal_stop_reason":`)
	a.TerminalStopReason = s.stopReason()
	return a
}

// listedFor is the listed call whose ticket the ack at i names (nil if
// none is found), found without reading the ack: the i-th listed when
// the ticket that follows is its, else by search in the sorted inventory.
func (s *receiptScanner) listedFor(i int) *ActivePrefix {
	const key = `"ticket_id":"`
	if !s.ok || !bytes.HasPrefix(s.b[s.i:], []byte(key)) {
		return nil
	}
	rest := s.b[s.i+len(key):]
	end := bytes.IndexByte(rest, '"')
	if end < 0 {
		return nil
	}
	ticket := rest[:end]
	listed := s.inv.ActivePrefixes
	if i < len(listed) && string(ticket) == listed[i].TicketID {
		return &listed[i]
	}
	j, found := searchTicket(listed, ticket)
	if !found {
		return nil
	}
	return &listed[j]
}

// searchTicket finds ticket in prefixes sorted by ticket id (as
// BuildInventory sorts them; unsorted, it may not find it).
func searchTicket(prefixes []ActivePrefix, ticket []byte) (int, bool) {
	lo, hi := 0, len(prefixes)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if strings.Compare(prefixes[m].TicketID, string(ticket)) < 0 {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < len(prefixes) && prefixes[lo].TicketID == string(ticket)
}

// lit reads the bytes l.
func (s *receiptScanner) lit(l string) {
	if s.ok && len(s.b)-s.i >= len(l) && string(s.b[s.i:s.i+len(l)]) == l {
		s.i += len(l)
		return
	}
	s.ok = false
}

// next reads c if it comes next.
func (s *receiptScanner) next(c byte) bool {
	if s.ok && s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// str reads a string of printable ASCII without escapes: the first of
// known it equals, or a string of its own.
func (s *receiptScanner) str(known ...string) string {
	if !s.ok || s.i >= len(s.b) || s.b[s.i] != '"' {
		s.ok = false
		return ""
	}
	j := s.i + 1
	for ; j < len(s.b); j++ {
		c := s.b[j]
		if c == '"' {
			break
		}
		if c < 0x20 || c > 0x7e || c == '\\' {
			s.ok = false
			return ""
		}
	}
	if j == len(s.b) {
		s.ok = false
		return ""
	}
	v := s.b[s.i+1 : j]
	s.i = j + 1
	for _, k := range known {
		if string(v) == k {
			return k
		}
	}
	return string(v)
}

// optionalStr reads null (nil) or what str reads.
func (s *receiptScanner) optionalStr(known ...string) *string {
	if s.null() {
		return nil
	}
	v := s.str(known...)
	return &v
}

// null reads a JSON null if one comes next.
func (s *receiptScanner) null() bool {
	if s.ok && len(s.b)-s.i >= 4 && string(s.b[s.i:s.i+4]) == "null" {
		s.i += 4
		return true
	}
	return false
}

// digits reads a run of decimal digits and returns how many.
func (s *receiptScanner) digits() int {
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i - start
}

// integerText reads a JSON number with no fraction or exponent:
// -?(0|[1-9][0-9]*).
func (s *receiptScanner) integerText() []byte {
	if !s.ok {
		return nil
	}
	start := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	if n := s.digits(); n == 0 || (n > 1 && s.b[s.i-n] == '0') {
		s.ok = false
		return nil
	}
	return s.b[start:s.i]
}

// integer reads an integer an int holds.
func (s *receiptScanner) integer() int {
	t := s.integerText()
	if !s.ok {
		return 0
	}
	n, err := strconv.ParseInt(string(t), 10, strconv.IntSize)
	if err != nil {
		s.ok = false
		return 0
	}
	return int(n)
}

// optionalInteger reads null (nil) or an integer.
func (s *receiptScanner) optionalInteger() *int {
	if s.null() {
		return nil
	}
	n := s.integer()
	return &n
}

// number reads a JSON number a float64 holds.
func (s *receiptScanner) number() float64 {
	start := s.i
	s.integerText()
	if !s.ok {
		return 0
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if s.digits() == 0 {
			s.ok = false
			return 0
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if s.digits() == 0 {
			s.ok = false
			return 0
		}
	}
	f, err := strconv.ParseFloat(string(s.b[start:s.i]), 64)
	if err != nil {
		s.ok = false
		return 0
	}
	return f
}

// stopReason reads a terminal_stop_reason: null, a string of printable
// ASCII (escapes allowed: kept as JSON, it is not decoded) or an integer,
// kept as its JSON.
func (s *receiptScanner) stopReason() codec.RawMessage {
	if s.null() {
		return s.nullStop
	}
	start := s.i
	if s.ok && s.i < len(s.b) && s.b[s.i] == '"' {
		s.escapedText()
	} else {
		s.integerText()
	}
	if !s.ok {
		return nil
	}
	return append(codec.RawMessage(nil), s.b[start:s.i]...)
}

// escapedText reads a JSON string of printable ASCII and escapes.
func (s *receiptScanner) escapedText() {
	s.i++ // the opening quote
	for s.ok && s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return
		case c < 0x20 || c > 0x7e:
			s.ok = false
		case c != '\\':
			s.i++
		case s.i+1 < len(s.b) && strings.IndexByte(`"\\/bfnrt`, s.b[s.i+1]) >= 0:
			s.i += 2
		case s.i+5 < len(s.b) && s.b[s.i+1] == 'u' && isHex(s.b[s.i+2]) && isHex(s.b[s.i+3]) && isHex(s.b[s.i+4]) && isHex(s.b[s.i+5]):
			s.i += 6
		default:
			s.ok = false
		}
	}
	s.ok = false
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }
