package ckptstore_test

import (
	"bytes"
	"context"
	"encoding/xml"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
)

// partCopier serves UploadPartCopy in front of gofakes3, which answers
// only UploadPart: it reads the source range from the fake and uploads it
// as the part. Every other request goes to the fake untouched.
type partCopier struct {
	fake   http.Handler
	copies atomic.Int32 // UploadPartCopy requests served
	whole  atomic.Int32 // CopyObject requests seen
}

func (p *partCopier) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	src := r.Header.Get("X-Amz-Copy-Source")
	if r.Method != http.MethodPut || src == "" {
		p.fake.ServeHTTP(w, r)
		return
	}
	if r.URL.Query().Get("uploadId") == "" {
		p.whole.Add(1)
		p.fake.ServeHTTP(w, r)
		return
	}
	p.copies.Add(1)
	srcPath, err := url.PathUnescape(src)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	get := httptest.NewRequest(http.MethodGet, "/"+strings.TrimPrefix(srcPath, "/"), nil)
	get.Header.Set("Range", r.Header.Get("X-Amz-Copy-Source-Range"))
	got := httptest.NewRecorder()
	p.fake.ServeHTTP(got, get)
	if got.Code != http.StatusPartialContent && got.Code != http.StatusOK {
		http.Error(w, "read the copy source: "+got.Body.String(), got.Code)
		return
	}
	body := got.Body.Bytes()
	put := httptest.NewRequest(http.MethodPut, r.URL.String(), bytes.NewReader(body))
	put.ContentLength = int64(len(body))
	put.Header.Set("Content-Length", strconv.Itoa(len(body)))
	up := httptest.NewRecorder()
	p.fake.ServeHTTP(up, put)
	if up.Code != http.StatusOK {
		http.Error(w, "upload the copied part: "+up.Body.String(), up.Code)
		return
	}
	type copyPartResult struct {
		XMLName xml.Name `xml:"CopyPartResult"`
		ETag    string   `xml:"ETag"`
	}
	w.Header().Set("Content-Type", "application/xml")
	_ = xml.NewEncoder(w).Encode(copyPartResult{ETag: up.Header().Get("ETag")})
}

// TestS3_CopyPastTheLimit: a records object larger than the copy limit is
// copied to its digest's name in ranged parts, one under it in one
// CopyObject, and both read back whole and verified.
func TestS3_CopyPastTheLimit(t *testing.T) {
	for _, c := range []struct {
		name       string
		limit      int64
		wantRanged bool
	}{
		{"ranged", 5 << 20, true},
		{"whole", 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			pc := &partCopier{fake: gofakes3.New(s3mem.New(), gofakes3.WithAutoBucket(true)).Server()}
			srv := httptest.NewServer(pc)
			t.Cleanup(srv.Close)
			root := "s3://" + testBucket + "/copy"
			b, err := ckptstore.OpenS3(ctx, root, ckptstore.S3Options{
				Endpoint: srv.URL, PathStyle: true, Credentials: credentials.NewStaticCredentialsProvider("fake", "fake", ""),
				PartSize: 5 << 20, CopyLimit: c.limit,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			s := ckptstore.New(b)
			dir := root + "/c1"
			// 12 records of 1 MiB: past one 5 MiB part, so uploaded under a
			// temporary key and copied; past the lowered limit in 3 ranges.
			w, err := s.Write(ctx, target(dir), nil, records(12, strings.Repeat("x", 1<<20)))
			if err != nil {
				t.Fatal(err)
			}
			_, recs, size, err := s.Read(ctx, target(dir), nil)
			if err != nil || len(recs) != 12 || size != w.Bytes {
				t.Fatalf("read back %d records, %d of %d bytes: %v", len(recs), size, w.Bytes, err)
			}
			copies, whole := pc.copies.Load(), pc.whole.Load()
			if c.wantRanged && (copies != 3 || whole != 0) {
				t.Fatalf("%d ranged copies and %d whole copies; want 3 and 0", copies, whole)
			}
			if !c.wantRanged && (copies != 0 || whole != 1) {
				t.Fatalf("%d ranged copies and %d whole copies; want 0 and 1", copies, whole)
			}
		})
	}
}
