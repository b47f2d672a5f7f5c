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
