package ckptstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
)

// Scheme prefixes a checkpoint directory in an object store:
// s3://<bucket>/<prefix>.
const Scheme = "s3://"

// IsS3 reports whether dir names a location in an object store.
func IsS3(dir string) bool { return strings.HasPrefix(dir, Scheme) }

// JoinDir joins path elements onto dir, keeping an s3:// scheme intact
// (path.Join would fold its two slashes into one).
func JoinDir(dir string, elem ...string) string {
	if IsS3(dir) {
		return Scheme + path.Join(append([]string{strings.TrimPrefix(dir, Scheme)}, elem...)...)
	}
	return path.Join(append([]string{dir}, elem...)...)
}

// S3Options say how to reach the object store. Credentials and the region
// come from the standard AWS environment variables and files.
type S3Options struct {
	// Endpoint is the store's base URL; empty for AWS itself.
	Endpoint string
	// PathStyle addresses buckets as <endpoint>/<bucket> rather than as
	// <bucket>.<endpoint>: what most stores other than AWS serve.
	PathStyle bool
	// HTTPClient, when set, carries every request (tests inject faults).
	HTTPClient *http.Client
	// Credentials, when set, replace the standard chain (environment,
	// shared files, instance roles).
	Credentials aws.CredentialsProvider
	// PartSize is the size of each part of a multipart upload, and the
	// largest records object put in one request (default 16 MiB; at least
	// S3's 5 MiB minimum unless a test makes it smaller).
	PartSize int
	// CopyLimit is the largest object copied to its digest's name in one
	// CopyObject request; a larger one is copied in ranges of at most
	// CopyLimit bytes (UploadPartCopy). Default and ceiling: S3's 5 GiB.
	// Tests lower it to take the ranged path with small records.
	CopyLimit int64
}

const (
	defaultPartSize = 16 << 20
	// maxCopyObject is the most one CopyObject (or one UploadPartCopy)
	// request takes in S3.
	maxCopyObject = 5 << 30
)

// S3 is a Backend in an S3 bucket beneath one root, s3://<bucket>/<prefix>.
// Every directory it is given must lie beneath the root (BeneathS3), the
// rule a Local backend's root makes for files: a control token then
// writes and reads objects under that prefix of that bucket and nowhere
// else. A directory is a key prefix; MkdirAll has nothing to make.
//
// Records objects of more than one part are uploaded in parts under a
// dot-prefixed temporary key and copied to their digest's name on Commit:
// an object's key is fixed when its upload starts, before the digest is
// known. An object up to 5 GiB (S3's limit for one copy request) is
// copied with CopyObject, a larger one by a multipart copy of byte ranges.
// Smaller ones are put under their name at once. The copy stays, though
// the manifest could name the temporary key: the SPEC lays records out as
// records-<sha256>.jsonl, a name readers and operators find by digest. Every request carries its body's
// SHA-256 for the server to check; a read checks the whole object against
// the manifest. The manifest is put with If-None-Match: *, so of two
// racing writers exactly one creates it.
type S3 struct {
	// Root is s3://<bucket>/<prefix>, cleaned.
	Root     string
	bucket   string
	prefix   string // the root's key prefix, no slashes at either end
	client   *s3.Client
	partSize int
	// copyLimit is the largest object copied in one request.
	copyLimit int64
	http      *http.Client
}

// Close ends the idle connections to the store.
func (b *S3) Close() error {
	b.http.CloseIdleConnections()
	return nil
}

// OpenS3 returns an S3 backend confined to root.
func OpenS3(ctx context.Context, root string, o S3Options) (*S3, error) {
	bucket, prefix, err := splitS3(root)
	if err != nil {
		return nil, fmt.Errorf("checkpoint root: %w", err)
	}
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return nil, fmt.Errorf("checkpoint root %s: AWS configuration: %w", root, err)
	}
	if cfg.Region == "" {
		// A store other than AWS ignores the region, but the signer needs
		// one.
		cfg.Region = "us-east-1"
	}
	hc := o.HTTPClient
	if hc == nil {
		// A client of its own, whose idle connections Close ends.
		hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	cfg.HTTPClient = hc
	if o.Credentials != nil {
		cfg.Credentials = o.Credentials
	}
	client := s3.NewFromConfig(cfg, func(so *s3.Options) {
		if o.Endpoint != "" {
			so.BaseEndpoint = aws.String(o.Endpoint)
		}
		so.UsePathStyle = o.PathStyle
		// Records carry their own SHA-256 per request; the default CRC
		// trailer would need an aws-chunked body some stores refuse.
		so.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		so.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	part := o.PartSize
	if part <= 0 {
		part = defaultPartSize
	}
	copyLimit := o.CopyLimit
	if copyLimit <= 0 || copyLimit > maxCopyObject {
		copyLimit = maxCopyObject
	}
	b := &S3{Root: Scheme + bucket, bucket: bucket, prefix: prefix, client: client, partSize: part, copyLimit: copyLimit, http: hc}
	if prefix != "" {
		b.Root += "/" + prefix
	}
	return b, nil
}

// splitS3 splits s3://bucket/prefix, refusing empty, "." and ".."
// components: a key is not a path, and nothing would clean them away.
func splitS3(u string) (bucket, prefix string, err error) {
	rest, ok := strings.CutPrefix(u, Scheme)
	if !ok {
		return "", "", fmt.Errorf("%q is not an s3:// URL", u)
	}
	rest = strings.TrimSuffix(rest, "/")
	parts := strings.Split(rest, "/")
	for _, p := range parts {
		if p == "" || p == "." || p == ".." {
			return "", "", fmt.Errorf("%q has an empty, \".\" or \"..\" component", u)
		}
	}
	return parts[0], strings.Join(parts[1:], "/"), nil
}

// BeneathS3 returns dir's key prefix (no slash at either end) if dir lies
// beneath root: the same bucket, and the root's prefix followed by more
// components or nothing.
func BeneathS3(root, dir string) (string, error) {
	rb, rp, err := splitS3(root)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNotConfined, err)
	}
	db, dp, err := splitS3(dir)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNotConfined, err)
	}
	if db != rb || (rp != "" && dp != rp && !strings.HasPrefix(dp, rp+"/")) {
		return "", fmt.Errorf("%w: %q is outside the checkpoint root %q", ErrNotConfined, dir, root)
	}
	return dp, nil
}

// InRoot checks dir lies beneath root, each a local path (Beneath) or an
// s3:// URL (BeneathS3); a local directory is never beneath an S3 root nor
// the other way round.
func InRoot(root, dir string) error {
	if IsS3(root) {
		_, err := BeneathS3(root, dir)
		return err
	}
	_, err := Beneath(root, dir)
	return err
}

// key is the object key of name in dir, once dir is beneath the root.
func (b *S3) key(dir, name string) (string, error) {
	p, err := BeneathS3(b.Root, dir)
	if err != nil {
		return "", err
	}
	if name == "" {
		return p, nil
	}
	if p == "" {
		return name, nil
	}
	return p + "/" + name, nil
}

// MkdirAll checks dir is beneath the root: a prefix needs no creating.
func (b *S3) MkdirAll(_ context.Context, dir string) error {
	_, err := b.key(dir, "")
	return err
}

// NewRecords starts a records object in dir.
func (b *S3) NewRecords(ctx context.Context, dir string) (RecordsWriter, error) {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp, err := b.key(dir, ".records.jsonl."+hex.EncodeToString(rnd[:]))
	if err != nil {
		return nil, err
	}
	return &s3Records{b: b, ctx: ctx, dir: dir, tmp: tmp, buf: make([]byte, 0, b.partSize)}, nil
}

// s3Records buffers one part at a time. While one part uploads the next
// fills: the upload of part n overlaps the encoding of part n+1.
type s3Records struct {
	b   *S3
	ctx context.Context
	dir string
	tmp string
	buf []byte
	n   int64
	// uploadID is set once the object grew past one part.
	uploadID string
	parts    []types.CompletedPart
	// inflight is the part upload running in the background; nil when none.
	inflight chan partDone
	// spare is the buffer of the part in flight, reused once it is done.
	spare []byte
	err   error
	done  bool
}

func (w *s3Records) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	written := 0
	for len(p) > 0 {
		room := w.b.partSize - len(w.buf)
		k := min(room, len(p))
		w.buf = append(w.buf, p[:k]...)
		p = p[k:]
		written += k
		w.n += int64(k)
		if len(w.buf) == w.b.partSize {
			if err := w.flushPart(); err != nil {
				w.err = err
				return written, err
			}
		}
	}
	return written, nil
}

// flushPart starts uploading the full buffer as the next part.
func (w *s3Records) flushPart() error {
	if w.uploadID == "" {
		out, err := w.b.client.CreateMultipartUpload(w.ctx, &s3.CreateMultipartUploadInput{
			Bucket: &w.b.bucket, Key: &w.tmp, ChecksumAlgorithm: types.ChecksumAlgorithmSha256,
		})
		if err != nil {
			return fmt.Errorf("start upload of %s: %w", w.tmp, err)
		}
		w.uploadID = *out.UploadId
	}
	if err := w.wait(); err != nil {
		return err
	}
	num := int32(len(w.parts) + 1)
	data := w.buf
	sum := sha256.Sum256(data)
	checksum := base64.StdEncoding.EncodeToString(sum[:])
	w.parts = append(w.parts, types.CompletedPart{PartNumber: aws.Int32(num), ChecksumSHA256: aws.String(checksum)})
	done := make(chan partDone, 1)
	w.inflight = done
	// The goroutine is the writer's: wait, which Commit and Abort call,
	// receives its result.
	go func() {
		out, err := w.b.client.UploadPart(w.ctx, &s3.UploadPartInput{
			Bucket: &w.b.bucket, Key: &w.tmp, UploadId: &w.uploadID, PartNumber: aws.Int32(num),
			Body: bytes.NewReader(data), ContentLength: aws.Int64(int64(len(data))),
			ChecksumAlgorithm: types.ChecksumAlgorithmSha256, ChecksumSHA256: aws.String(checksum),
		})
		if err != nil {
			done <- partDone{err: fmt.Errorf("upload part %d of %s: %w", num, w.tmp, err)}
			return
		}
		done <- partDone{etag: out.ETag}
	}()
	w.buf, w.spare = w.spare[:0], data
	if w.buf == nil {
		w.buf = make([]byte, 0, w.b.partSize)
	}
	return nil
}

type partDone struct {
	etag *string
	err  error
}

// wait waits for the part in flight, if any, the last of parts.
func (w *s3Records) wait() error {
	if w.inflight == nil {
		return nil
	}
	r := <-w.inflight
	w.inflight = nil
	if r.err != nil {
		return r.err
	}
	w.parts[len(w.parts)-1].ETag = r.etag
	return nil
}

// Commit completes the upload and names the object by name.
func (w *s3Records) Commit(name string) (int64, error) {
	w.done = true
	if w.err != nil {
		w.abort()
		return 0, w.err
	}
	final, err := w.b.key(w.dir, name)
	if err != nil {
		w.abort()
		return 0, err
	}
	if w.uploadID == "" {
		// One part or less: put under the final name, with its digest for
		// the store to check.
		sum := sha256.Sum256(w.buf)
		_, err := w.b.client.PutObject(w.ctx, &s3.PutObjectInput{
			Bucket: &w.b.bucket, Key: &final, Body: bytes.NewReader(w.buf), ContentLength: aws.Int64(int64(len(w.buf))),
			ChecksumAlgorithm: types.ChecksumAlgorithmSha256, ChecksumSHA256: aws.String(base64.StdEncoding.EncodeToString(sum[:])),
		})
		if err != nil {
			return 0, fmt.Errorf("put %s: %w", final, err)
		}
		return w.n, nil
	}
	if len(w.buf) > 0 {
		if err := w.flushPart(); err != nil {
			w.abort()
			return 0, err
		}
	}
	if err := w.wait(); err != nil {
		w.abort()
		return 0, err
	}
	if _, err := w.b.client.CompleteMultipartUpload(w.ctx, &s3.CompleteMultipartUploadInput{
		Bucket: &w.b.bucket, Key: &w.tmp, UploadId: &w.uploadID,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: w.parts},
	}); err != nil {
		w.abort()
		return 0, fmt.Errorf("complete upload of %s: %w", w.tmp, err)
	}
	if err := w.b.copyObject(w.ctx, w.tmp, final, w.n); err != nil {
		return 0, err
	}
	// The temporary object is the store's to drop: no manifest names it.
	_, _ = w.b.client.DeleteObject(w.ctx, &s3.DeleteObjectInput{Bucket: &w.b.bucket, Key: &w.tmp})
	head, err := w.b.client.HeadObject(w.ctx, &s3.HeadObjectInput{Bucket: &w.b.bucket, Key: &final})
	if err != nil {
		return 0, fmt.Errorf("head %s: %w", final, err)
	}
	if got := aws.ToInt64(head.ContentLength); got != w.n {
		return 0, fmt.Errorf("%s holds %d bytes, %d were written", final, got, w.n)
	}
	return w.n, nil
}

// copyObject copies the size bytes at key from to key to: in one request
// up to the copy limit, in ranged parts above it.
func (b *S3) copyObject(ctx context.Context, from, to string, size int64) error {
	src := aws.String(b.bucket + "/" + from)
	if size <= b.copyLimit {
		if _, err := b.client.CopyObject(ctx, &s3.CopyObjectInput{Bucket: &b.bucket, Key: &to, CopySource: src}); err != nil {
			return fmt.Errorf("copy %s to %s: %w", from, to, err)
		}
		return nil
	}
	up, err := b.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: &b.bucket, Key: &to})
	if err != nil {
		return fmt.Errorf("start a multipart copy of %s to %s: %w", from, to, err)
	}
	fail := func(err error) error {
		// The caller's context may be what ended the copy.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_, _ = b.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{Bucket: &b.bucket, Key: &to, UploadId: up.UploadId})
		return err
	}
	var parts []types.CompletedPart
	for off, n := int64(0), int32(1); off < size; off, n = off+b.copyLimit, n+1 {
		end := min(off+b.copyLimit, size) - 1
		out, err := b.client.UploadPartCopy(ctx, &s3.UploadPartCopyInput{
			Bucket: &b.bucket, Key: &to, UploadId: up.UploadId, PartNumber: aws.Int32(n),
			CopySource: src, CopySourceRange: aws.String(fmt.Sprintf("bytes=%d-%d", off, end)),
		})
		if err != nil {
			return fail(fmt.Errorf("copy part %d of %s to %s: %w", n, from, to, err))
		}
		if out.CopyPartResult == nil {
			return fail(fmt.Errorf("copy part %d of %s to %s: no result", n, from, to))
		}
		parts = append(parts, types.CompletedPart{ETag: out.CopyPartResult.ETag, PartNumber: aws.Int32(n)})
	}
	if _, err := b.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
		Bucket: &b.bucket, Key: &to, UploadId: up.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
	}); err != nil {
		return fail(fmt.Errorf("complete the copy of %s to %s: %w", from, to, err))
	}
	return nil
}

// abort ends an unfinished multipart upload; the parts are then dropped by
// the store.
func (w *s3Records) abort() {
	_ = w.wait()
	if w.uploadID == "" {
		return
	}
	// The caller's context may be what ended the write.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), 30*time.Second)
	defer cancel()
	_, _ = w.b.client.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: &w.b.bucket, Key: &w.tmp, UploadId: &w.uploadID})
	w.uploadID = ""
}

func (w *s3Records) Abort() error {
	if w.done {
		return nil
	}
	w.done = true
	w.abort()
	return nil
}

// PublishManifest creates dir/manifest.json with If-None-Match: *.
func (b *S3) PublishManifest(ctx context.Context, dir string, data []byte) error {
	k, err := b.key(dir, ManifestFile)
	if err != nil {
		return err
	}
	return b.create(ctx, k, data, nil)
}

// create puts key only if it does not exist (ifMatch nil) or still has
// the ETag *ifMatch; otherwise it fails with fs.ErrExist.
func (b *S3) create(ctx context.Context, key string, data []byte, ifMatch *string) error {
	sum := sha256.Sum256(data)
	in := &s3.PutObjectInput{
		Bucket: &b.bucket, Key: &key, Body: bytes.NewReader(data), ContentLength: aws.Int64(int64(len(data))),
		ChecksumAlgorithm: types.ChecksumAlgorithmSha256, ChecksumSHA256: aws.String(base64.StdEncoding.EncodeToString(sum[:])),
	}
	if ifMatch != nil {
		in.IfMatch = ifMatch
	} else {
		in.IfNoneMatch = aws.String("*")
	}
	for attempt := 0; ; attempt++ {
		_, err := b.client.PutObject(ctx, in)
		switch status(err) {
		case 0:
			return nil
		case http.StatusPreconditionFailed:
			return fmt.Errorf("%s: %w", key, fs.ErrExist)
		case http.StatusConflict:
			// Another conditional write of the key is in flight; whichever
			// lands, the next attempt sees it.
			if attempt < 5 {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Duration(attempt+1) * 50 * time.Millisecond):
				}
				continue
			}
		}
		if ifMatch != nil && status(err) == http.StatusNotFound {
			return fmt.Errorf("%s: %w", key, fs.ErrExist)
		}
		return fmt.Errorf("put %s: %w", key, err)
	}
}

// status is the HTTP status of a failed request, 0 for none.
func status(err error) int {
	if err == nil {
		return 0
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) && re.Response != nil && re.HTTPStatusCode() != 0 {
		return re.HTTPStatusCode()
	}
	return -1
}

// notFound reports a missing object as fs.ErrNotExist.
func notFound(key string, err error) error {
	var nsk *types.NoSuchKey
	var nf *types.NotFound
	var api smithy.APIError
	if errors.As(err, &nsk) || errors.As(err, &nf) || status(err) == http.StatusNotFound ||
		(errors.As(err, &api) && api.ErrorCode() == "NoSuchKey") {
		return fmt.Errorf("%s: %w", key, fs.ErrNotExist)
	}
	return fmt.Errorf("get %s: %w", key, err)
}

// ReadManifest reads dir/manifest.json.
func (b *S3) ReadManifest(ctx context.Context, dir string) ([]byte, error) {
	k, err := b.key(dir, ManifestFile)
	if err != nil {
		return nil, err
	}
	data, _, err := b.get(ctx, k)
	return data, err
}

// get reads a small object whole, with its ETag.
func (b *S3) get(ctx context.Context, key string) ([]byte, string, error) {
	out, err := b.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &b.bucket, Key: &key})
	if err != nil {
		return nil, "", notFound(key, err)
	}
	defer out.Body.Close()
	data, err := io.ReadAll(io.LimitReader(out.Body, 64<<20))
	return data, aws.ToString(out.ETag), err
}

// OpenRecords streams a records object. Its Stat gives the size the
// response announced, so the reader allocates once; the store verifies
// the bytes against the manifest's digest.
func (b *S3) OpenRecords(ctx context.Context, dir, name string) (io.ReadCloser, error) {
	k, err := b.key(dir, name)
	if err != nil {
		return nil, err
	}
	out, err := b.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &b.bucket, Key: &k})
	if err != nil {
		return nil, notFound(k, err)
	}
	return &s3Object{ReadCloser: out.Body, name: name, size: aws.ToInt64(out.ContentLength)}, nil
}

type s3Object struct {
	io.ReadCloser
	name string
	size int64
}

func (o *s3Object) Stat() (fs.FileInfo, error) { return objectInfo{o.name, o.size}, nil }

type objectInfo struct {
	name string
	size int64
}

func (i objectInfo) Name() string       { return i.name }
func (i objectInfo) Size() int64        { return i.size }
func (i objectInfo) Mode() fs.FileMode  { return 0o444 }
func (i objectInfo) ModTime() time.Time { return time.Time{} }
func (i objectInfo) IsDir() bool        { return false }
func (i objectInfo) Sys() any           { return nil }

// List names the objects and sub-prefixes directly beneath dir; a prefix
// with nothing beneath it does not exist.
func (b *S3) List(ctx context.Context, dir string) ([]string, error) {
	p, err := b.key(dir, "")
	if err != nil {
		return nil, err
	}
	if p != "" {
		p += "/"
	}
	var names []string
	pg := s3.NewListObjectsV2Paginator(b.client, &s3.ListObjectsV2Input{Bucket: &b.bucket, Prefix: &p, Delimiter: aws.String("/")})
	for pg.HasMorePages() {
		out, err := pg.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", dir, err)
		}
		for _, o := range out.Contents {
			names = append(names, strings.TrimPrefix(aws.ToString(o.Key), p))
		}
		for _, cp := range out.CommonPrefixes {
			names = append(names, strings.TrimSuffix(strings.TrimPrefix(aws.ToString(cp.Prefix), p), "/"))
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%s: %w", dir, fs.ErrNotExist)
	}
	return names, nil
}

// Size is the size of the object name in dir.
func (b *S3) Size(ctx context.Context, dir, name string) (int64, error) {
	k, err := b.key(dir, name)
	if err != nil {
		return 0, err
	}
	out, err := b.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &b.bucket, Key: &k})
	if err != nil {
		return 0, notFound(k, err)
	}
	return aws.ToInt64(out.ContentLength), nil
}

// EnsureBucket creates the root's bucket unless it exists (for tests and
// benches; an operator's bucket is made by the operator).
func (b *S3) EnsureBucket(ctx context.Context) error {
	if _, err := b.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &b.bucket}); err == nil {
		return nil
	}
	if _, err := b.client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &b.bucket}); err != nil {
		return fmt.Errorf("create bucket %s: %w", b.bucket, err)
	}
	return nil
}

// ReadPointer reads a small pointer object (LATEST) in dir and returns it
// with a version to pass to PublishPointer; fs.ErrNotExist when missing.
func (b *S3) ReadPointer(ctx context.Context, dir, name string) ([]byte, string, error) {
	k, err := b.key(dir, name)
	if err != nil {
		return nil, "", err
	}
	return b.get(ctx, k)
}

// PublishPointer replaces dir/name with data if it still holds the
// version ReadPointer returned ("": if it does not exist), a compare and
// swap on the ETag; otherwise it fails with fs.ErrExist and changes
// nothing, so of two writers moving one pointer only one succeeds.
func (b *S3) PublishPointer(ctx context.Context, dir, name string, data []byte, version string) error {
	k, err := b.key(dir, name)
	if err != nil {
		return err
	}
	var ifMatch *string
	if version != "" {
		ifMatch = aws.String(version)
	}
	return b.create(ctx, k, data, ifMatch)
}
