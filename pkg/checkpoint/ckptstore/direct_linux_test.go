//go:build linux

package ckptstore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/gymfleet/gymfleet/pkg/infra/hugepage"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// directFile creates a file in a temp dir and turns direct I/O on, or skips
// where the test's filesystem does not take it (the records are then
// written through the cache, which the other tests cover).
func directFile(t *testing.T) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "records"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := setDirect(f, true); err != nil {
		t.Skipf("the filesystem of %s refuses direct I/O: %v", f.Name(), err)
	}
	return f
}

// residentPages counts the pages of path in the page cache (mincore).
func residentPages(t *testing.T, path string) (resident, total int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() == 0 {
		return 0, 0
	}
	m, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(m)
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	if _, _, errno := syscall.Syscall(syscall.SYS_MINCORE, uintptr(unsafe.Pointer(unsafe.SliceData(m))), uintptr(len(m)), uintptr(unsafe.Pointer(unsafe.SliceData(vec)))); errno != 0 {
		t.Fatal(errno)
	}
	for _, v := range vec {
		resident += int(v & 1)
	}
	return resident, len(vec)
}

// TestDirectWriter_WritesEveryByte: whatever the sizes of the writes,
// the file holds the bytes in order: whole chunks written direct, the
// tail through the cache.
func TestDirectWriter_WritesEveryByte(t *testing.T) {
	for _, size := range []int{0, 1, directAlign, directChunk - 1, directChunk, 2*directChunk + 12345, 3 * directChunk} {
		f := directFile(t)
		want := make([]byte, size)
		rng := rand.New(rand.NewPCG(uint64(size), 7))
		for i := range want {
			want[i] = byte(rng.Uint32())
		}
		w := newDirectWriter(f)
		for rest := want; len(rest) > 0; {
			n := min(len(rest), 1+rng.IntN(300<<10))
			if got, err := w.Write(rest[:n]); got != n || err != nil {
				t.Fatalf("size %d: Write(%d bytes) = %d, %v", size, n, got, err)
			}
			rest = rest[n:]
		}
		if err := w.finish(); err != nil {
			t.Fatalf("size %d: finish: %v", size, err)
		}
		got, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("size %d: the file holds %d bytes, not the %d written", size, len(got), len(want))
		}
	}
}

// alignedBuffer returns n bytes starting at a multiple of directAlign.
func alignedBuffer(n int) []byte {
	b := make([]byte, n+directAlign)
	skip := (directAlign - int(uintptr(unsafe.Pointer(unsafe.SliceData(b)))%directAlign)) % directAlign
	return b[skip : skip+n : skip+n]
}

// The direct writer's chunks are whole huge pages each, aligned for direct
// I/O, and do not overlap; for a tail of less than a block, a block each.
func TestWriteChunks(t *testing.T) {
	for _, first := range []int{directAlign, directChunk, 1, directAlign - 1} {
		c := writeChunks(first)
		size := directChunk
		if first < directAlign {
			size = directAlign
		}
		for i, b := range c {
			at := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
			if len(b) != size || cap(b) != size || !isAligned(b) || (size == directChunk && at%hugepage.Size != 0) {
				t.Fatalf("first copy of %d: chunk %d: %d bytes (cap %d) at %#x; want %d, aligned", first, i, len(b), cap(b), at, size)
			}
		}
		c[0] = append(c[0], 1) // over its capacity: a new array, not the next chunk
		if c[1][0] != 0 {
			t.Fatal("appending to the first chunk wrote into the second")
		}
	}
}

// TestDirectWriter_AlignedChunksAreWrittenInPlace: chunks handed over in
// aligned buffers, as the store's sink hands them, with a last one not a
// whole number of blocks, and a writer that copies only that tail: the
// file holds every byte in order.
func TestDirectWriter_AlignedChunksAreWrittenInPlace(t *testing.T) {
	for _, sizes := range [][]int{{64 << 10, directChunk, directChunk, 12345}, {directAlign, 1}, {3 * directAlign}, {100}, {directChunk, directAlign - 1, directAlign}} {
		f := directFile(t)
		w := newDirectWriter(f)
		var want []byte
		for k, n := range sizes {
			chunk := alignedBuffer(n)
			for i := range chunk {
				chunk[i] = byte(k*31 + i*7)
			}
			want = append(want, chunk...)
			if got, err := w.Write(chunk); got != n || err != nil {
				t.Fatalf("%v: Write(%d bytes) = %d, %v", sizes, n, got, err)
			}
		}
		if err := w.finish(); err != nil {
			t.Fatalf("%v: finish: %v", sizes, err)
		}
		got, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%v: the file holds %d bytes, not the %d written", sizes, len(got), len(want))
		}
	}
}

// TestDirectWriter_AChunkTheFilesystemRefusesGoesThroughTheCache: a write
// refused with EINVAL (here: a buffer direct I/O cannot take) is written
// through the cache, and so is everything after it.
func TestDirectWriter_AChunkTheFilesystemRefusesGoesThroughTheCache(t *testing.T) {
	f := directFile(t)
	b := alignedBuffer(2 * directAlign)
	misaligned := b[1 : 1+directAlign]
	for i := range misaligned {
		misaligned[i] = byte(i)
	}
	if err := writeChunk(f, misaligned); err != nil {
		t.Fatalf("a refused direct write was not written through the cache: %v", err)
	}
	if _, err := f.Write([]byte("tail")); err != nil {
		t.Fatalf("a write after the fallback failed (direct I/O still on?): %v", err)
	}
	got, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, append(append([]byte{}, misaligned...), "tail"...)) {
		t.Fatalf("the file holds %d bytes, not the chunk and the tail", len(got))
	}
}

// TestStore_RecordsBypassThePageCache: a commit's records file is written
// past the page cache, save its last partial chunk, and reading it back
// for a restore leaves it out of the cache too, with every record intact.
func TestStore_RecordsBypassThePageCache(t *testing.T) {
	directFile(t) // skips where the temp dir's filesystem refuses direct I/O
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	target := Target{Dir: dir, Kind: "agent", Instance: "a", CheckpointID: "c1"}
	const n = 4000
	payload := `{"y":"` + strings.Repeat("y", 4000) + `"}`
	w, err := s.Write(ctx, target, nil, func(add func(Record) error) (map[string]any, error) {
		for i := range n {
			if err := add(Record{EpisodeID: rollout.EpisodeID{RolloutID: "r" + string(rune('a'+i%26)), Attempt: i}, Data: []byte(payload)}); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if w.Bytes < 3*directChunk {
		t.Fatalf("wrote %d bytes, want several chunks", w.Bytes)
	}
	path := filepath.Join(target.ParticipantDir(), w.Manifest.RecordsFile)
	tail := int(w.Bytes%directChunk)/os.Getpagesize() + 1
	if resident, total := residentPages(t, path); resident > tail {
		t.Errorf("%d of the records file's %d pages are in the page cache after the commit, want at most the tail's %d", resident, total, tail)
	}
	// Evict the tail too, so that what the read leaves is the read's.
	if err := dropCache(path); err != nil {
		t.Fatal(err)
	}
	_, recs, size, err := s.Read(ctx, target, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != n || size != w.Bytes {
		t.Fatalf("read back %d records, %d bytes; want %d, %d", len(recs), size, n, w.Bytes)
	}
	for i, r := range recs {
		if r.EpisodeID.Attempt != i || !strings.HasSuffix(string(r.Data), ","+payload[1:]) {
			t.Fatalf("record %d read back as %s attempt %d, %d bytes", i, r.EpisodeID.RolloutID, r.EpisodeID.Attempt, len(r.Data))
		}
	}
	if resident, total := residentPages(t, path); resident != 0 {
		t.Errorf("%d of the records file's %d pages are in the page cache after the read, want none", resident, total)
	}
}

// dropCache asks the kernel to drop path's clean pages from the cache.
func dropCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	const fadvDontNeed = 4 // POSIX_FADV_DONTNEED
	if _, _, errno := syscall.Syscall6(syscall.SYS_FADVISE64, f.Fd(), 0, 0, fadvDontNeed, 0, 0); errno != 0 {
		return errno
	}
	return nil
}

// TestReadDirect_AFileThatChangedIsRefused: a direct read yields exactly
// the size the caller stat'ed; a file found shorter or longer is an error.
func TestReadDirect_AFileThatChangedIsRefused(t *testing.T) {
	f := directFile(t)
	size := 3*directReadChunk + 5000
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if err := setDirect(f, false); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		size int
		want error
	}{
		{"as stat'ed", size, nil},
		{"shorter than stat'ed", size + directReadChunk, io.ErrUnexpectedEOF},
		{"shorter within the last block", size + 10, io.ErrUnexpectedEOF},
		{"longer than stat'ed", size - 10, errChanged},
	} {
		t.Run(c.name, func(t *testing.T) {
			// follow sees the bytes in order: all of them, or a prefix
			// of them when a read fails.
			var followed []byte
			buf, ok, err := readDirect(f, c.size, func(b []byte) { followed = append(followed, b...) })
			if !ok {
				t.Fatal("the file was not read direct")
			}
			if !bytes.HasPrefix(data, followed) || (err == nil && len(followed) != len(data)) {
				t.Fatalf("follow had %d bytes that are not the file's first (of %d; read error %v)", len(followed), len(data), err)
			}
			switch {
			case c.want == nil && err != nil:
				t.Fatal(err)
			case c.want == nil && !bytes.Equal(buf, data):
				t.Fatalf("read %d bytes that differ from the %d written", len(buf), len(data))
			case c.want == errChanged && (err == nil || !strings.Contains(err.Error(), "changed while it was read")):
				t.Fatalf("got %v, want the file reported changed", err)
			case c.want != nil && c.want != errChanged && !errors.Is(err, c.want):
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
	if buf, ok, err := readDirect(f, directReadMin-1, nil); ok || buf != nil || err != nil {
		t.Errorf("a file under directReadMin was read direct (ok %v, err %v)", ok, err)
	}
}

var errChanged = errors.New("changed")
