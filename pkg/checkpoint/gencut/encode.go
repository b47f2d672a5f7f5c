package gencut

import (
	"strconv"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// A cut round lists every call in flight, megabytes of request and of
// receipt. codec.Marshal grows
// its buffer by doubling and then copies the result out; during a
// prepare, with the process's collections held, each of those buffers is
// fresh memory, and the copies and their page faults are most of the
// encoding's CPU. These encoders write the same bytes into one buffer sized for
// them.

// EncodeLegacyRequest is req's JSON, byte for byte as codec.Marshal writes it.
func EncodeLegacyRequest(req LegacyRequest) []byte {
	n := 64 + len(req.CheckpointID) + len(req.ServerName)
	for _, a := range req.Active {
		n += len(`{"model_call_id":"","capture_key":""},`) + len(a.ModelCallID) + len(a.CaptureKey)
	}
	b := make([]byte, 0, n)
	b = append(b, `{"checkpoint_id":`...)
	b = codec.AppendString(b, req.CheckpointID)
	b = append(b, `,"server_name":`...)
	b = codec.AppendString(b, req.ServerName)
	b = append(b, `,"active":`...)
	if req.Active == nil {
		return append(b, `null}`...)
	}
	b = append(b, '[')
	for i, a := range req.Active {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"model_call_id":`...)
		b = codec.AppendString(b, a.ModelCallID)
		b = append(b, `,"capture_key":`...)
		b = codec.AppendString(b, a.CaptureKey)
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// EncodeLegacyReceipt is rc's JSON, byte for byte as codec.Marshal writes it.
func EncodeLegacyReceipt(rc LegacyReceipt) []byte {
	n := 64 + len(rc.CheckpointID) + len(rc.CutID)
	for i := range rc.Prefixes {
		p := &rc.Prefixes[i]
		n += len(`{"model_call_id":"","capture_key":"","disposition":""},`) + len(p.ModelCallID) + len(p.CaptureKey) + len(p.Disposition)
		if p.Reason != "" {
			n += len(`,"reason":""`) + len(p.Reason)
		}
		if p.StagingKey != "" {
			n += len(`,"staging_key":""`) + len(p.StagingKey)
		}
		if p.PrefixTokenCount != 0 {
			n += len(`,"prefix_token_count":`) + 20
		}
		if p.PrefixDigest != "" {
			n += len(`,"prefix_digest":""`) + len(p.PrefixDigest)
		}
	}
	b := make([]byte, 0, n)
	b = append(b, `{"checkpoint_id":`...)
	b = codec.AppendString(b, rc.CheckpointID)
	b = append(b, `,"cut_id":`...)
	b = codec.AppendString(b, rc.CutID)
	b = append(b, `,"prefixes":`...)
	if rc.Prefixes == nil {
		return append(b, `null}`...)
	}
	b = append(b, '[')
	for i := range rc.Prefixes {
		p := &rc.Prefixes[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"model_call_id":`...)
		b = codec.AppendString(b, p.ModelCallID)
		b = append(b, `,"capture_key":`...)
		b = codec.AppendString(b, p.CaptureKey)
		b = append(b, `,"disposition":`...)
		b = codec.AppendString(b, p.Disposition)
		if p.Reason != "" {
			b = append(b, `,"reason":`...)
			b = codec.AppendString(b, p.Reason)
		}
		if p.StagingKey != "" {
			b = append(b, `,"staging_key":`...)
			b = codec.AppendString(b, p.StagingKey)
		}
		if p.PrefixTokenCount != 0 {
			b = append(b, `,"prefix_token_count":`...)
			b = strconv.AppendInt(b, int64(p.PrefixTokenCount), 10)
		}
		if p.PrefixDigest != "" {
			b = append(b, `,"prefix_digest":`...)
			b = codec.AppendString(b, p.PrefixDigest)
		}
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// EncodeReceipt is a worker's receipt, as model_dump(mode="json") writes
// it: every field, null where unset, an unset list as [] and an unset
// terminal_stop_reason as null. The bytes are those codec.Marshal writes
// for the receipt with its unset lists and stop reasons so filled in
// (TestEncodeReceipt and FuzzEncodeReceipt check it); as to Marshal, an
// admitted_at that is not finite, or a terminal_stop_reason that is not
// one JSON value, is an error.
func EncodeReceipt(rc Receipt) ([]byte, error) {
	b := make([]byte, 0, receiptSize(&rc))
	b = append(b, `{"checkpoint_id":`...)
	b = codec.AppendString(b, rc.CheckpointID)
	b = append(b, `,"cut_id":`...)
	b = codec.AppendString(b, rc.CutID)
	b = append(b, `,"inventory_digest":`...)
	b = codec.AppendString(b, rc.InventoryDigest)
	b = append(b, `,"inventory":{"checkpoint_id":`...)
	b = codec.AppendString(b, rc.Inventory.CheckpointID)
	b = append(b, `,"server_name":`...)
	b = codec.AppendString(b, rc.Inventory.ServerName)
	b = append(b, `,"active_prefixes":[`...)
	var err error
	for i := range rc.Inventory.ActivePrefixes {
		if i > 0 {
			b = append(b, ',')
		}
		if b, err = appendPrefixFields(append(b, '{'), &rc.Inventory.ActivePrefixes[i]); err != nil {
			return nil, err
		}
		b = append(b, '}')
	}
	b = append(b, `],"inventory_digest":`...)
	b = codec.AppendString(b, rc.Inventory.InventoryDigest)
	b = append(b, `},"backend_snapshot_id":`...)
	b = codec.AppendString(b, rc.BackendSnapshotID)
	b = append(b, `,"prefixes":[`...)
	for i := range rc.Prefixes {
		if i > 0 {
			b = append(b, ',')
		}
		if b, err = appendAck(append(b, '{'), &rc.Prefixes[i]); err != nil {
			return nil, err
		}
		b = append(b, '}')
	}
	return append(b, "]}"...), nil
}

// appendPrefixFields appends p's fields, without the braces: a prefix of
// the inventory is them alone, an ack starts with them.
func appendPrefixFields(b []byte, p *ActivePrefix) ([]byte, error) {
	b = append(b, `"ticket_id":`...)
	b = codec.AppendString(b, p.TicketID)
	b = append(b, `,"rollout_id":`...)
	b = codec.AppendString(b, p.RolloutID)
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(p.Attempt), 10)
	b = append(b, `,"model_call_id":`...)
	b = codec.AppendString(b, p.ModelCallID)
	b = append(b, `,"admitted_at":`...)
	return codec.AppendFloat(b, p.AdmittedAt)
}

// appendAck appends a's fields, without the braces.
func appendAck(b []byte, a *PrefixAck) ([]byte, error) {
	b, err := appendPrefixFields(b, &a.ActivePrefix)
	if err != nil {
		return nil, err
	}
	b = append(b, `,"disposition":`...)
	b = codec.AppendString(b, a.Disposition)
	b = append(b, `,"cut_kind":`...)
	b = appendOptionalString(b, a.CutKind)
	b = append(b, `,"frozen_buffer_id":`...)
	b = appendOptionalString(b, a.FrozenBufferID)
	b = append(b, `,"staging_keys":[`...)
	for i, k := range a.StagingKeys {
		if i > 0 {
			b = append(b, ',')
		}
		b = codec.AppendString(b, k)
	}
	b = append(b, `],"prefix_token_count":`...)
	b = appendOptionalInt(b, a.PrefixTokenCount)
	b = append(b, `,"prefix_digest":`...)
	b = appendOptionalString(b, a.PrefixDigest)
	b = append(b, `,"effective_output_limit":`...)
	b = appendOptionalInt(b, a.EffectiveOutputLimit)
	b = append(b, `,"terminal_finish_reason":`...)
	b = appendOptionalString(b, a.TerminalFinishReason)
	b = append(b, `,"terminal_stop_reason":`...)
	if len(a.TerminalStopReason) == 0 {
		return append(b, "null"...), nil
	}
	return codec.AppendRawMessage(b, a.TerminalStopReason)
}

func appendOptionalString(b []byte, s *string) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	return codec.AppendString(b, *s)
}

func appendOptionalInt(b []byte, n *int) []byte {
	if n == nil {
		return append(b, "null"...)
	}
	return strconv.AppendInt(b, int64(*n), 10)
}

// Most bytes a receipt's number can take: an int, or a float64 written
// in its shortest form (17 digits at most, after "0.00000" below 1e-5).
const (
	maxIntBytes   = len("-9223372036854775808")
	maxFloatBytes = len("-0.0000012345678901234567")
)

// prefixBytes is the most a prefix's fields take but for its strings'
// bytes, which escapes only lengthen.
const prefixBytes = len(`{"ticket_id":"","rollout_id":"","attempt":,"model_call_id":"","admitted_at":},`) + maxIntBytes + maxFloatBytes

// ackBytes is the most an ack takes beyond its prefix fields, but for its
// strings' and stop reason's bytes, with every optional field set.
const ackBytes = len(`,"disposition":"","cut_kind":"","frozen_buffer_id":"","staging_keys":[],"prefix_token_count":,"prefix_digest":"",`+
	`"effective_output_limit":,"terminal_finish_reason":"","terminal_stop_reason":`) + 2*maxIntBytes

// receiptSize is the length of rc's encoding when none of its strings
// needs an escape, and a little more: the buffer EncodeReceipt writes it
// into, so a receipt of 100,000 acks is not copied over and over as its
// buffer grows.
func receiptSize(rc *Receipt) int {
	optional := func(s *string) int {
		if s == nil {
			return 0
		}
		return len(*s)
	}
	prefix := func(p *ActivePrefix) int {
		return prefixBytes + len(p.TicketID) + len(p.RolloutID) + len(p.ModelCallID)
	}
	n := 256 + len(rc.CheckpointID) + len(rc.CutID) + len(rc.InventoryDigest) + len(rc.Inventory.CheckpointID) +
		len(rc.Inventory.ServerName) + len(rc.Inventory.InventoryDigest) + len(rc.BackendSnapshotID)
	for i := range rc.Inventory.ActivePrefixes {
		n += prefix(&rc.Inventory.ActivePrefixes[i])
	}
	for i := range rc.Prefixes {
		a := &rc.Prefixes[i]
		n += prefix(&a.ActivePrefix) + ackBytes + len(a.Disposition) + optional(a.CutKind) + optional(a.FrozenBufferID) +
			optional(a.PrefixDigest) + optional(a.TerminalFinishReason) + max(len(a.TerminalStopReason), len("null"))
		for _, k := range a.StagingKeys {
			n += len(k) + len(`"",`)
		}
	}
	return n
}
