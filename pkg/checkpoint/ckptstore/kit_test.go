package ckptstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/infra/atomicfile"
)

// kit is one backend as the conformance tests see it: stores over it,
// fresh checkpoint directories beneath their root, and the raw objects of
// a directory, which a test reads and tampers with behind the store.
type kit struct {
	name string
	// store is a store over the backend; dir a fresh directory beneath
	// its root.
	store func(t *testing.T) *ckptstore.Store
	// backend is a backend for a store with options.
	backend func(t *testing.T) ckptstore.Backend
	dir     func(t *testing.T) string
	// crashing is a store whose manifest publication never happens, as if
	// its process were killed between the records and the manifest.
	crashing func(t *testing.T) *ckptstore.Store
	// Raw access to the objects (files) of dir, bypassing the store.
	read   func(t *testing.T, dir, name string) []byte
	write  func(t *testing.T, dir, name string, data []byte)
	remove func(t *testing.T, dir, name string)
	list   func(t *testing.T, dir string) []string
	// move moves every object beneath from to beneath to.
	move func(t *testing.T, from, to string)
}

// kits are the backends every conformance test runs on: the local
// filesystem, an in-process fake S3, and the S3 server GYMFLEET_S3_ENDPOINT
// names when it is set (make test-s3 starts one).
func kits(t *testing.T) []kit {
	out := []kit{localKit()}
	fake := httptest.NewServer(gofakes3.New(s3mem.New(), gofakes3.WithAutoBucket(true)).Server())
	t.Cleanup(fake.Close)
	out = append(out, s3Kit(t, "s3fake", fake.URL, credentials.NewStaticCredentialsProvider("fake", "fake", "")))
	if ep := os.Getenv("GYMFLEET_S3_ENDPOINT"); ep != "" {
		out = append(out, s3Kit(t, "s3server", ep, nil))
	}
	return out
}

// forEachKit runs test once per backend, as a subtest named after it.
func forEachKit(t *testing.T, test func(t *testing.T, k kit)) {
	for _, k := range kits(t) {
		t.Run(k.name, func(t *testing.T) { test(t, k) })
	}
}

func localKit() kit {
	return kit{
		name:    "local",
		store:   func(t *testing.T) *ckptstore.Store { return tempStore(t) },
		backend: func(t *testing.T) ckptstore.Backend { return tempLocal(t, nil) },
		dir:     func(t *testing.T) string { return t.TempDir() },
		crashing: func(t *testing.T) *ckptstore.Store {
			return ckptstore.New(tempLocal(t, func(base atomicfile.FS) atomicfile.FS { return &crashFS{FS: base, failLink: true} }))
		},
		read: func(t *testing.T, dir, name string) []byte {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		write: func(t *testing.T, dir, name string, data []byte) {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		},
		remove: func(t *testing.T, dir, name string) {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		},
		list: func(t *testing.T, dir string) []string {
			des, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, de := range des {
				names = append(names, de.Name())
			}
			return names
		},
		move: func(t *testing.T, from, to string) {
			if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(from, to); err != nil {
				t.Fatal(err)
			}
		},
	}
}

// testBucket is the bucket the S3 kits use.
const testBucket = "gymfleet-ckptstore-test"

// s3Kit is a kit on the S3 server at endpoint; creds nil takes the
// standard chain (the environment make test-s3 sets).
func s3Kit(t *testing.T, name, endpoint string, creds aws.CredentialsProvider) kit {
	ctx := context.Background()
	cfg := aws.Config{Region: "us-east-1", Credentials: creds}
	if creds == nil {
		cfg.Credentials = credentials.NewStaticCredentialsProvider(os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY"), "")
	}
	raw := s3.NewFromConfig(cfg, func(o *s3.Options) {
		o.BaseEndpoint = aws.String(endpoint)
		o.UsePathStyle = true
	})
	if _, err := raw.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(testBucket)}); err != nil {
		if _, err := raw.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(testBucket)}); err != nil {
			t.Fatalf("%s: create bucket: %v", name, err)
		}
	}
	// Every test works under a prefix of its own, the root of its stores.
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	root := "s3://" + testBucket + "/run-" + hex.EncodeToString(rnd[:])
	// A small part size makes a few records a multipart upload.
	openBackend := func(t *testing.T, hc *http.Client) *ckptstore.S3 {
		b, err := ckptstore.OpenS3(ctx, root, ckptstore.S3Options{
			Endpoint: endpoint, PathStyle: true, Credentials: creds, HTTPClient: hc, PartSize: 5 << 20,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	open := func(t *testing.T, hc *http.Client) *ckptstore.Store { return ckptstore.New(openBackend(t, hc)) }
	key := func(t *testing.T, dir, name string) string {
		p, err := ckptstore.BeneathS3(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		if name == "" {
			return p
		}
		return p + "/" + name
	}
	listAll := func(t *testing.T, prefix string) []string {
		var keys []string
		pg := s3.NewListObjectsV2Paginator(raw, &s3.ListObjectsV2Input{Bucket: aws.String(testBucket), Prefix: aws.String(prefix)})
		for pg.HasMorePages() {
			out, err := pg.NextPage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range out.Contents {
				keys = append(keys, aws.ToString(o.Key))
			}
		}
		return keys
	}
	put := func(t *testing.T, k string, data []byte) {
		if _, err := raw.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(testBucket), Key: aws.String(k), Body: bytes.NewReader(data)}); err != nil {
			t.Fatal(err)
		}
	}
	get := func(t *testing.T, k string) []byte {
		out, err := raw.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(testBucket), Key: aws.String(k)})
		if err != nil {
			t.Fatal(err)
		}
		defer out.Body.Close()
		b, err := io.ReadAll(out.Body)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	del := func(t *testing.T, k string) {
		if _, err := raw.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(testBucket), Key: aws.String(k)}); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	return kit{
		name:    name,
		store:   func(t *testing.T) *ckptstore.Store { return open(t, nil) },
		backend: func(t *testing.T) ckptstore.Backend { return openBackend(t, nil) },
		dir: func(t *testing.T) string {
			n++
			return fmt.Sprintf("%s/%s-%d", root, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()), n)
		},
		crashing: func(t *testing.T) *ckptstore.Store {
			return open(t, &http.Client{Transport: killManifest{http.DefaultTransport}})
		},
		read:   func(t *testing.T, dir, name string) []byte { return get(t, key(t, dir, name)) },
		write:  func(t *testing.T, dir, name string, data []byte) { put(t, key(t, dir, name), data) },
		remove: func(t *testing.T, dir, name string) { del(t, key(t, dir, name)) },
		list: func(t *testing.T, dir string) []string {
			p := key(t, dir, "") + "/"
			var names []string
			for _, k := range listAll(t, p) {
				names = append(names, strings.TrimPrefix(k, p))
			}
			slices.Sort(names)
			return names
		},
		move: func(t *testing.T, from, to string) {
			fp, tp := key(t, from, ""), key(t, to, "")
			for _, k := range listAll(t, fp+"/") {
				put(t, tp+strings.TrimPrefix(k, fp), get(t, k))
				del(t, k)
			}
		},
	}
}

// killManifest fails every request that would publish a manifest before
// it leaves the process: what a process killed between its records and
// its manifest sends.
type killManifest struct{ base http.RoundTripper }

func (k killManifest) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/"+ckptstore.ManifestFile) {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, errors.New("process killed before the manifest was published")
	}
	return k.base.RoundTrip(r)
}

// TestStore_LargeRecords: records past one part are uploaded in parts
// (in an object store) and read back whole and verified.
func TestStore_LargeRecords(t *testing.T) {
	forEachKit(t, func(t *testing.T, k kit) {
		ctx := context.Background()
		s := k.store(t)
		dir := k.dir(t)
		// 12 records of 1 MiB: three parts of 5 MiB, the last short.
		w, err := s.Write(ctx, target(dir), nil, records(12, strings.Repeat("x", 1<<20)))
		if err != nil {
			t.Fatal(err)
		}
		_, recs, size, err := s.Read(ctx, target(dir), nil)
		if err != nil || len(recs) != 12 || size != w.Bytes {
			t.Fatalf("read back %d records, %d of %d bytes: %v", len(recs), size, w.Bytes, err)
		}
		// Nothing but the records and the manifest is left behind.
		if names := k.list(t, target(dir).ParticipantDir()); len(names) != 2 {
			t.Fatalf("the directory holds %v, want the records and the manifest", names)
		}
	})
}
