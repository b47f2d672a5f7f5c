package ckptstore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

var (
	keyA = []byte("0123456789abcdef0123456789abcdef")
	keyB = []byte("fedcba9876543210fedcba9876543210")
)

func keyedStore(t *testing.T, k kit, key []byte) *ckptstore.Store {
	t.Helper()
	s, err := ckptstore.NewWith(k.backend(t), ckptstore.Options{SigningKey: key})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// readManifest is the bytes of dir's published manifest.
func readManifest(t *testing.T, k kit, dir string) []byte {
	return k.read(t, target(dir).ParticipantDir(), ckptstore.ManifestFile)
}

// editManifest rewrites a published manifest's fields (as a token holder
// who can write beneath the root but holds no key could).
func editManifest(t *testing.T, k kit, dir string, edit func(map[string]any)) {
	t.Helper()
	b := readManifest(t, k, dir)
	var m map[string]any
	if err := codec.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	out, err := codec.MarshalIndent(m)
	if err != nil {
		t.Fatal(err)
	}
	k.write(t, target(dir).ParticipantDir(), ckptstore.ManifestFile, out)
}

// wantUnsigned asserts the refusal of a manifest a keyed store cannot
// verify: 422, naming the signature, quoting neither signature nor digest
// nor any other file content, with the cause for the log.
func wantUnsigned(t *testing.T, k kit, err error, dir string, why string) {
	t.Helper()
	wantCode(t, "read", err, apierror.InvalidCheckpointState)
	if !strings.Contains(err.Error(), "signature") {
		t.Errorf("refusal %q does not say the signature failed", err)
	}
	if d := ckptstore.Detail(err); !strings.Contains(d, why) {
		t.Errorf("Detail %q, want it to say %q", d, why)
	}
	var m map[string]any
	_ = codec.Unmarshal(readManifest(t, k, dir), &m)
	for _, k := range []string{ckptstore.HMACField, "records_sha256"} {
		if v, ok := m[k].(string); ok && v != "" {
			noLeak(t, err, []string{v, v[:12]})
		}
	}
}

func TestSigned_RoundTrip(t *testing.T) { forEachKit(t, testSignedRoundTrip) }

func testSignedRoundTrip(t *testing.T, k kit) {
	ctx := context.Background()
	s := keyedStore(t, k, keyA)
	dir := k.dir(t)
	w, err := s.Write(ctx, target(dir), nil, records(5, "x"))
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Manifest.HMAC) != 64 {
		t.Fatalf("written manifest's HMAC %q, want 64 hex digits", w.Manifest.HMAC)
	}
	if b := readManifest(t, k, dir); !bytes.Contains(b, []byte(`"`+ckptstore.HMACField+`": "`+w.Manifest.HMAC+`"`)) {
		t.Fatalf("manifest.json does not carry the HMAC:\n%s", b)
	}
	m, recs, _, err := s.Read(ctx, target(dir), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 5 || m.HMAC != w.Manifest.HMAC || m.Extras["extra_field"] != "x" {
		t.Fatalf("read %d records, HMAC %q, extras %v", len(recs), m.HMAC, m.Extras)
	}
	if _, ok := m.Extras[ckptstore.HMACField]; ok {
		t.Errorf("the signature is read as an extra: %v", m.Extras)
	}
	// Another key's store does not take it.
	_, _, _, err = keyedStore(t, k, keyB).Read(ctx, target(dir), nil)
	wantUnsigned(t, k, err, dir, "not its HMAC")
	// Re-committing the same checkpoint with the same key finds it.
	again, err := s.Write(ctx, target(dir), nil, records(5, "x"))
	if err != nil || !again.Existing || again.Manifest.HMAC != w.Manifest.HMAC {
		t.Fatalf("re-commit: %+v, %v", again, err)
	}
	// Layout is not signed: the same fields re-indented still verify.
	editManifest(t, k, dir, func(map[string]any) {})
	if _, _, _, err := s.Read(ctx, target(dir), nil); err != nil {
		t.Fatalf("the re-indented manifest: %v", err)
	}
}

// Every field is covered: a change to any of them, or to the records with
// a digest that matches them, fails the signature.
func TestSigned_TamperedFieldsAreRefused(t *testing.T) {
	forEachKit(t, testSignedTamperedFieldsAreRefused)
}

func testSignedTamperedFieldsAreRefused(t *testing.T, k kit) {
	ctx := context.Background()
	s := keyedStore(t, k, keyA)
	for name, edit := range map[string]func(t *testing.T, dir string, m map[string]any){
		"record_count":   func(_ *testing.T, _ string, m map[string]any) { m["record_count"] = 4.0 },
		"schema_version": func(_ *testing.T, _ string, m map[string]any) { m["schema_version"] = 2.0 },
		"kind":           func(_ *testing.T, _ string, m map[string]any) { m["kind"] = "agent" },
		"instance":       func(_ *testing.T, _ string, m map[string]any) { m["instance"] = "other" },
		"checkpoint_id":  func(_ *testing.T, _ string, m map[string]any) { m["checkpoint_id"] = "c2" },
		"extra":          func(_ *testing.T, _ string, m map[string]any) { m["extra_field"] = "y" },
		"added extra":    func(_ *testing.T, _ string, m map[string]any) { m["more"] = true },
		// Records of the forger's choosing, with a digest and a count that
		// match them: an unkeyed store would install them.
		"records and digest": func(t *testing.T, dir string, m map[string]any) {
			line := `{"episode_id":{"rollout_id":"forged","attempt":0},"record":{"x":1}}` + "\n"
			sum := sha256.Sum256([]byte(line))
			digest := hex.EncodeToString(sum[:])
			name := "records-" + digest + ".jsonl"
			k.write(t, target(dir).ParticipantDir(), name, []byte(line))
			m["records_file"], m["records_sha256"], m["record_count"] = name, digest, 1.0
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := k.dir(t)
			if _, err := s.Write(ctx, target(dir), nil, records(5, "x")); err != nil {
				t.Fatal(err)
			}
			editManifest(t, k, dir, func(m map[string]any) { edit(t, dir, m) })
			_, recs, _, err := s.Read(ctx, target(dir), nil)
			if recs != nil {
				t.Errorf("records returned from a tampered manifest: %d", len(recs))
			}
			wantUnsigned(t, k, err, dir, "not its HMAC")
		})
	}
}

func TestSigned_TamperedHMACIsRefused(t *testing.T) {
	forEachKit(t, testSignedTamperedHMACIsRefused)
}

func testSignedTamperedHMACIsRefused(t *testing.T, k kit) {
	ctx := context.Background()
	s := keyedStore(t, k, keyA)
	for name, edit := range map[string]func(m map[string]any){
		"one digit": func(m map[string]any) {
			h := []byte(m[ckptstore.HMACField].(string))
			if h[10] == '0' {
				h[10] = '1'
			} else {
				h[10] = '0'
			}
			m[ckptstore.HMACField] = string(h)
		},
		"truncated":  func(m map[string]any) { m[ckptstore.HMACField] = m[ckptstore.HMACField].(string)[:62] },
		"not hex":    func(m map[string]any) { m[ckptstore.HMACField] = strings.Repeat("zz", 32) },
		"not string": func(m map[string]any) { m[ckptstore.HMACField] = 7.0 },
		"empty":      func(m map[string]any) { m[ckptstore.HMACField] = "" },
	} {
		t.Run(name, func(t *testing.T) {
			dir := k.dir(t)
			if _, err := s.Write(ctx, target(dir), nil, records(3, "x")); err != nil {
				t.Fatal(err)
			}
			editManifest(t, k, dir, edit)
			_, _, _, err := s.Read(ctx, target(dir), nil)
			if name == "not string" {
				// Not a manifest at all: the answer for unreadable ones.
				wantCode(t, "read", err, apierror.InvalidCheckpointState)
				return
			}
			wantUnsigned(t, k, err, dir, "not its HMAC")
		})
	}
}

// A keyed store refuses what an unkeyed one wrote, both to restore it and
// to take it as its own commit.
func TestSigned_UnsignedManifestRefusedByAKeyedStore(t *testing.T) {
	forEachKit(t, testSignedUnsignedManifestRefusedByAKeyedStore)
}

func testSignedUnsignedManifestRefusedByAKeyedStore(t *testing.T, k kit) {
	ctx := context.Background()
	dir := k.dir(t)
	if _, err := k.store(t).Write(ctx, target(dir), nil, records(4, "x")); err != nil {
		t.Fatal(err)
	}
	s := keyedStore(t, k, keyA)
	_, _, _, err := s.Read(ctx, target(dir), nil)
	wantUnsigned(t, k, err, dir, "carries no "+ckptstore.HMACField)
	if _, err := s.Verify(ctx, dir); apierror.CodeOf(err) != apierror.InvalidCheckpointState {
		t.Errorf("Verify of an unsigned checkpoint with a key: %v", err)
	}
	_, err = s.Write(ctx, target(dir), nil, records(4, "x"))
	wantCode(t, "re-commit over an unsigned manifest", err, apierror.CheckpointConflict)
	if ckptstore.Detail(err) == "" {
		t.Error("the conflict keeps no cause for the log")
	}
}

// A store without a key reads signed manifests as it reads any other, and
// the signature is not taken for a participant's extra.
func TestSigned_ReadByAnUnkeyedStore(t *testing.T) { forEachKit(t, testSignedReadByAnUnkeyedStore) }

func testSignedReadByAnUnkeyedStore(t *testing.T, k kit) {
	ctx := context.Background()
	dir := k.dir(t)
	w, err := keyedStore(t, k, keyA).Write(ctx, target(dir), nil, records(4, "x"))
	if err != nil {
		t.Fatal(err)
	}
	m, recs, _, err := k.store(t).Read(ctx, target(dir), nil)
	if err != nil || len(recs) != 4 || m.HMAC != w.Manifest.HMAC || len(m.Extras) != 1 {
		t.Fatalf("unkeyed read: %v, %d records, %+v", err, len(recs), m)
	}
	// And re-committing it unkeyed returns it.
	again, err := k.store(t).Write(ctx, target(dir), nil, records(4, "x"))
	if err != nil || !again.Existing {
		t.Fatalf("unkeyed re-commit: %+v, %v", again, err)
	}
}

func TestSigningKeys(t *testing.T) {
	if _, err := ckptstore.NewWith(tempLocal(t, nil), ckptstore.Options{SigningKey: keyA[:31]}); err == nil {
		t.Error("NewWith took a 31-byte key")
	}
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hexKey := strings.Repeat("ab", 32)
	for name, c := range map[string]struct {
		content string
		want    string
	}{
		"hex with newline": {hexKey + "\n", hexKey},
		"crlf":             {hexKey + "\r\n", hexKey},
		"raw 32":           {string(keyA), string(keyA)},
		"short":            {strings.Repeat("k", 31) + "\n", ""},
		"empty":            {"", ""},
	} {
		got, err := ckptstore.LoadSigningKey(write(strings.ReplaceAll(name, " ", "_"), c.content))
		if c.want == "" {
			if err == nil {
				t.Errorf("%s: LoadSigningKey took it", name)
			} else if strings.Contains(err.Error(), "kkkk") {
				t.Errorf("%s: the error quotes the key: %v", name, err)
			}
			continue
		}
		if err != nil || string(got) != c.want {
			t.Errorf("%s: LoadSigningKey = %q, %v, want %q", name, got, err, c.want)
		}
	}
	if _, err := ckptstore.LoadSigningKey(filepath.Join(dir, "missing")); err == nil {
		t.Error("LoadSigningKey of a missing file succeeded")
	}
}
