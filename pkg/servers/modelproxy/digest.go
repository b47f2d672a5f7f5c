package modelproxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sync"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// The request digest is sha256 over the canonical JSON of the upstream
// request's messages and tools: what MarshalStable writes for
// {"messages": M, "tools": T}, M and T as a json.Decoder with UseNumber
// decodes them into an any (object members sorted by name, the last of a
// repeated name kept, numbers as written, strings decoded and escaped
// again); messages or tools empty, null or [] are null. The same
// conversation sent again, through either API, after a restore digests the
// same. Every ledger row and checkpoint records it, and a restore compares
// it, so its value never changes for any input: a checkpoint of an older
// build still matches.
//
// A codec.Canonicalizer writes those bytes straight from the raw JSON.
// What it is not sure of (invalid JSON, data after the first value, which
// a Decoder leaves unread, strings that decode with U+FFFD) is digested by
// digestDecoded, the decode and encode the digest is defined by, so its
// result and its errors stay exactly theirs. FuzzDigestRequest checks the
// two against each other.

// requestDigests computes request digests with buffers reused from call
// to call.
type requestDigests struct {
	pool sync.Pool
}

// maxPooledDigestInput is the largest request (messages and tools) whose
// digester goes back to the pool: a digester keeps buffers a few times
// its largest input, which a rare huge request should not pin.
const maxPooledDigestInput = 1 << 20

// digester is one digest's canonicalizer and buffer.
type digester struct {
	canon codec.Canonicalizer
	buf   []byte
}

func (d *requestDigests) get() *digester {
	if g, ok := d.pool.Get().(*digester); ok {
		return g
	}
	g := new(digester)
	g.canon.UseNumber()
	g.canon.RefuseReplacement()
	return g
}

func (d *requestDigests) put(g *digester, size int) {
	if size <= maxPooledDigestInput {
		d.pool.Put(g)
	}
}

// request digests a request's messages and tools, as encoded.
func (d *requestDigests) request(messages, tools []byte) (string, error) {
	g := d.get()
	defer d.put(g, len(messages)+len(tools))
	if digest, ok := g.digest(messages, tools); ok {
		return digest, nil
	}
	return digestDecoded(messages, tools)
}

// digest is the request digest written by the canonicalizer; ok is false
// if it is not sure of either value.
func (g *digester) digest(messages, tools []byte) (_ string, ok bool) {
	b := append(g.buf[:0], `{"messages":`...)
	if b, ok = g.appendValue(b, messages); !ok {
		return "", false
	}
	b = append(b, `,"tools":`...)
	start := len(b)
	if b, ok = g.appendValue(b, tools); !ok {
		return "", false
	}
	if string(b[start:]) == "[]" { // no tools, however spelled
		b = append(b[:start], "null"...)
	}
	b = append(b, '}')
	g.buf = b
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), true
}

// appendValue appends raw's canonical JSON, null if raw is only white
// space (as decoded, bytes.TrimSpace's).
func (g *digester) appendValue(b, raw []byte) ([]byte, bool) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return append(b, "null"...), true
	}
	b, err := g.canon.Append(b, raw)
	return b, err == nil
}

// digestDecoded is the request digest as defined: messages and tools
// decoded into any values and encoded by MarshalStable.
func digestDecoded(messages, tools []byte) (string, error) {
	m, err := decodeForDigest(messages)
	if err != nil {
		return "", err
	}
	t, err := decodeForDigest(tools)
	if err != nil {
		return "", err
	}
	if arr, ok := t.([]any); ok && len(arr) == 0 {
		t = nil // no tools, however spelled
	}
	b, err := codec.MarshalStable(struct {
		Messages any `json:"messages"`
		Tools    any `json:"tools"`
	}{m, t})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// decodeForDigest decodes the first JSON value of raw, numbers as
// json.Numbers; nothing but white space is nil.
func decodeForDigest(raw []byte) (any, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}
