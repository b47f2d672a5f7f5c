package ckptstore_test

import (
	"context"
	"errors"
	"io/fs"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
)

func TestBeneathS3(t *testing.T) {
	const root = "s3://bucket/ckpt/fleet-a"
	for _, c := range []struct {
		dir, want string
		ok        bool
	}{
		{"s3://bucket/ckpt/fleet-a", "ckpt/fleet-a", true},
		{"s3://bucket/ckpt/fleet-a/", "ckpt/fleet-a", true},
		{"s3://bucket/ckpt/fleet-a/c1/gym", "ckpt/fleet-a/c1/gym", true},
		{"s3://bucket/ckpt/fleet-ab", "", false},  // a sibling sharing the prefix's letters
		{"s3://bucket/ckpt", "", false},           // above the root
		{"s3://other/ckpt/fleet-a/c1", "", false}, // another bucket
		{"s3://bucket/ckpt/fleet-a/../fleet-b", "", false},
		{"s3://bucket/ckpt/fleet-a/./c1", "", false},
		{"s3://bucket/ckpt/fleet-a//c1", "", false},
		{"/tmp/ckpt/fleet-a", "", false},
		{"S3://bucket/ckpt/fleet-a", "", false},
	} {
		got, err := ckptstore.BeneathS3(root, c.dir)
		if c.ok != (err == nil) || got != c.want {
			t.Errorf("BeneathS3(%q, %q) = %q, %v; want %q, ok %v", root, c.dir, got, err, c.want, c.ok)
		}
		if err != nil && !errors.Is(err, ckptstore.ErrNotConfined) {
			t.Errorf("BeneathS3(%q): %v is not ErrNotConfined", c.dir, err)
		}
	}
	// A root of a whole bucket holds every key of it.
	if got, err := ckptstore.BeneathS3("s3://bucket", "s3://bucket/a/b"); err != nil || got != "a/b" {
		t.Errorf("a bucket root: %q, %v", got, err)
	}
}

// TestS3_CommitConfinedToTheRoot: an S3 store writes and reads beneath its
// root prefix only, and answers any other directory as a local store
// answers one outside its root.
func TestS3_CommitConfinedToTheRoot(t *testing.T) {
	k := kits(t)[1]
	s := k.store(t)
	inside := k.dir(t)
	root := inside[:len(inside)-len("/"+t.Name()+"-1")]
	ctx := context.Background()
	for _, dir := range []string{
		"s3://" + testBucket + "/elsewhere",
		"s3://another-bucket/x",
		root + "-sibling/c1",
		"/tmp/c1",
	} {
		_, err := s.Write(ctx, target(dir), nil, records(1, "x"))
		wantCode(t, "a commit to "+dir, err, apierror.InvalidRequest)
		if _, _, _, err := s.Read(ctx, target(dir), nil); !apierror.HasCode(err, apierror.InvalidCheckpointState) {
			t.Fatalf("a restore from %s: %v", dir, err)
		}
	}
	if _, err := s.Write(ctx, target(inside), nil, records(1, "x")); err != nil {
		t.Fatalf("a commit beneath the root: %v", err)
	}
}

// TestS3_Pointer: a pointer (LATEST) is created once and then moved only
// by a writer that read its current version: of two writers that read the
// same version, one moves it and the other is told fs.ErrExist.
func TestS3_Pointer(t *testing.T) {
	for _, k := range kits(t)[1:] {
		t.Run(k.name, func(t *testing.T) {
			ctx := context.Background()
			b := k.store(t).Backend().(*ckptstore.S3)
			dir := k.dir(t)
			if _, _, err := b.ReadPointer(ctx, dir, "LATEST"); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("a missing pointer: %v", err)
			}
			if err := b.PublishPointer(ctx, dir, "LATEST", []byte("c1\n"), ""); err != nil {
				t.Fatal(err)
			}
			if err := b.PublishPointer(ctx, dir, "LATEST", []byte("c9\n"), ""); !errors.Is(err, fs.ErrExist) {
				t.Fatalf("a second create: %v, want fs.ErrExist", err)
			}
			data, v1, err := b.ReadPointer(ctx, dir, "LATEST")
			if err != nil || string(data) != "c1\n" {
				t.Fatalf("read %q, %v", data, err)
			}
			if err := b.PublishPointer(ctx, dir, "LATEST", []byte("c2\n"), v1); err != nil {
				t.Fatalf("a move from the version read: %v", err)
			}
			if err := b.PublishPointer(ctx, dir, "LATEST", []byte("c3\n"), v1); !errors.Is(err, fs.ErrExist) {
				t.Fatalf("a move from a stale version: %v, want fs.ErrExist", err)
			}
			if data, _, err := b.ReadPointer(ctx, dir, "LATEST"); err != nil || string(data) != "c2\n" {
				t.Fatalf("after the race the pointer holds %q, %v; want c2", data, err)
			}
		})
	}
}
