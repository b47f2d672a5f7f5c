package ckptstore

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// HMACField is the manifest field that carries its signature: the hex
// HMAC-SHA256, under the store's signing key, of every other field
// (manifestMAC). Code that predates it reads it as one more extra.
const HMACField = "hmac_sha256"

// MinSigningKeyBytes is the shortest signing key a store takes: HMAC-SHA256
// is as strong as its key up to the hash's 32 bytes.
const MinSigningKeyBytes = 32

// macDomain prefixes what is signed, so a manifest's MAC is never the MAC
// of anything else computed with the same key.
const macDomain = "gymfleet checkpoint manifest v1\n"

var (
	// errUnsigned and errBadMAC are the causes a keyed store logs; the
	// caller is told one answer for both.
	errUnsigned = errors.New("the manifest carries no " + HMACField)
	errBadMAC   = errors.New("the manifest's " + HMACField + " is not its HMAC under this store's signing key")
)

// Options are a store's settings besides its backend.
type Options struct {
	// SigningKey, when set, signs every manifest written and makes every
	// read refuse a manifest whose signature is missing or wrong. At least
	// MinSigningKeyBytes long.
	SigningKey []byte
	// S3 says how to reach the object store when the root is an s3:// URL.
	S3 S3Options
}

// LoadSigningKey reads a signing key from a file: its bytes, less one
// trailing newline (so `openssl rand -hex 32 > key` makes a 64-byte key).
// A key shorter than MinSigningKeyBytes is refused. The error never quotes
// the file.
func LoadSigningKey(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	defer f.Close()
	// A key file is small; a bound keeps a wrong path (a device, a log)
	// from being read whole.
	b, err := io.ReadAll(io.LimitReader(f, 64<<10+1))
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", path, err)
	}
	if len(b) > 64<<10 {
		return nil, fmt.Errorf("signing key %s is longer than 64 KiB: not a key file", path)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	b = bytes.TrimSuffix(b, []byte("\r"))
	if len(b) < MinSigningKeyBytes {
		return nil, fmt.Errorf("signing key %s holds %d bytes, fewer than the %d required", path, len(b), MinSigningKeyBytes)
	}
	return b, nil
}

// manifestMAC is the HMAC-SHA256 under key of a manifest's fields but
// HMACField: of the compact JSON object of the others, members sorted and
// values in codec's canonical form, so white space and member order in the
// file do not matter but every value does (schema_version, kind,
// instance, checkpoint_id, records_file, records_sha256, record_count and
// every extra).
func manifestMAC(key []byte, fields map[string]codec.RawMessage) ([]byte, error) {
	names := make([]string, 0, len(fields))
	for k := range fields {
		if k != HMACField {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	obj := []byte{'{'}
	for i, k := range names {
		if i > 0 {
			obj = append(obj, ',')
		}
		obj = codec.AppendString(obj, k)
		obj = append(obj, ':')
		obj = append(obj, fields[k]...)
	}
	obj = append(obj, '}')
	var c codec.Canonicalizer
	canon, err := c.Append(nil, obj)
	if err != nil {
		return nil, fmt.Errorf("manifest: %s", codec.DescribeError(err))
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(macDomain))
	mac.Write(canon)
	return mac.Sum(nil), nil
}

// checkMAC verifies a manifest's fields against the store's key; a store
// without one accepts any manifest, signed or not.
func (s *Store) checkMAC(fields map[string]codec.RawMessage) error {
	if s.key == nil {
		return nil
	}
	raw, ok := fields[HMACField]
	if !ok {
		return errUnsigned
	}
	var got string
	if err := codec.UnmarshalStrict(raw, &got); err != nil {
		return errBadMAC
	}
	gotMAC, err := hex.DecodeString(got)
	if err != nil {
		return errBadMAC
	}
	want, err := manifestMAC(s.key, fields)
	if err != nil {
		return err
	}
	if !hmac.Equal(gotMAC, want) {
		return errBadMAC
	}
	return nil
}

// sign returns the bytes of m with its signature, when the store has a key
// (m's own HMAC is ignored), and m as written.
func (s *Store) sign(m Manifest) (Manifest, []byte, error) {
	m.HMAC = ""
	data, err := m.MarshalJSON()
	if err != nil || s.key == nil {
		return m, data, err
	}
	var fields map[string]codec.RawMessage
	if err := codec.UnmarshalStrict(data, &fields); err != nil {
		return m, nil, err
	}
	mac, err := manifestMAC(s.key, fields)
	if err != nil {
		return m, nil, err
	}
	m.HMAC = hex.EncodeToString(mac)
	data, err = m.MarshalJSON()
	return m, data, err
}

// Signed reports whether the store signs manifests and verifies them.
func (s *Store) Signed() bool { return s.key != nil }
