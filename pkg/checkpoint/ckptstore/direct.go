package ckptstore

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"github.com/gymfleet/gymfleet/pkg/infra/hugepage"
)

// Records files are written and read with direct I/O (O_DIRECT) where the
// filesystem takes it: past the page cache, between the device and our
// own buffers.
//
// Why: a commit fsyncs every byte it writes, so the page cache only adds a
// copy, and on the VMs the scale bench runs on a copy into page cache is
// dear. Their balloon device reports free guest memory to the host, which
// drops it, so every page the cache takes is faulted in by the host first
// (docs/scale-log.md). A restore then reads
// what the commit never put in the cache; reading it direct, in parallel,
// keeps it out of the cache too.
const (
	// directAlign is the alignment direct I/O needs of buffers, file
	// offsets and lengths: the largest logical block size in use.
	directAlign = 4096
	// directChunk is the size of one direct write. Two are in use per
	// records file: one being filled while the other is written.
	directChunk = 4 << 20
	// directReadChunk is the size of one direct read, directReaders how
	// many run at once: a device reads more at once than in sequence.
	directReadChunk = 8 << 20
	directReaders   = 4
	// directReadMin is the smallest records file read direct; smaller
	// ones are few and cheap through the cache.
	directReadMin = 1 << 20
)

// isAligned reports whether b starts at a multiple of directAlign.
func isAligned(b []byte) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))%directAlign == 0
}

// directWriter writes a records file opened with direct I/O: bytes are
// gathered into aligned chunks, each written by a goroutine while the next
// is filled. Whole blocks handed over in a buffer that is aligned already
// (the store's chunks) are written from it, with nothing buffered. The
// tail, not a whole number of blocks, is written through the cache by
// finish. The first error is kept and returned by every later call;
// finish and abort wait for the chunk being written.
type directWriter struct {
	f *os.File
	// bufs are allocated when first needed: a writer handed aligned
	// chunks copies only its last, partial one.
	bufs [2][]byte
	fill int // the buffer being filled
	n    int // bytes in it
	// inflight receives the result of the chunk being written; nil when
	// none is.
	inflight chan error
	err      error
}

func newDirectWriter(f *os.File) *directWriter {
	return &directWriter{f: f}
}

// writeChunks returns a direct writer's two chunks for a first copy of
// n bytes: directChunk each, cut from one buffer of whole huge pages
// (fresh memory, which faults once per 4 KiB page otherwise,
// pkg/infra/hugepage), or a block each for a tail of less than a block,
// which is all a writer handed aligned chunks copies.
func writeChunks(n int) [2][]byte {
	if n < directAlign {
		b := alignedBlocks(2)
		return [2][]byte{b[:directAlign:directAlign], b[directAlign:]}
	}
	b := hugepage.MakePages(2 * directChunk)
	return [2][]byte{b[:directChunk:directChunk], b[directChunk : 2*directChunk : 2*directChunk]}
}

// alignedBlocks returns n blocks of directAlign bytes that start at a
// multiple of directAlign.
func alignedBlocks(n int) []byte {
	b := make([]byte, (n+1)*directAlign)
	skip := (directAlign - int(uintptr(unsafe.Pointer(unsafe.SliceData(b))))%directAlign) % directAlign
	return b[skip : skip+n*directAlign : skip+n*directAlign]
}

func (w *directWriter) Write(b []byte) (int, error) {
	written := 0
	if w.n == 0 && len(b) >= directAlign && isAligned(b) {
		// Whole blocks in an aligned buffer go to the file from where
		// they are, once the chunk before them is written.
		whole := len(b) &^ (directAlign - 1)
		if err := w.wait(); err != nil {
			return 0, err
		}
		if err := writeChunk(w.f, b[:whole]); err != nil {
			w.err = err
			return 0, err
		}
		written, b = whole, b[whole:]
	}
	for len(b) > 0 {
		if w.err != nil {
			return written, w.err
		}
		if w.bufs[0] == nil {
			w.bufs = writeChunks(len(b))
		}
		c := copy(w.bufs[w.fill][w.n:], b)
		w.n += c
		b = b[c:]
		written += c
		if w.n == len(w.bufs[w.fill]) {
			w.startChunk()
		}
	}
	return written, w.err
}

// startChunk hands the full buffer to a writer goroutine once the previous
// chunk is written, and goes on filling the other.
func (w *directWriter) startChunk() {
	if w.wait() != nil {
		return
	}
	chunk := w.bufs[w.fill]
	done := make(chan error, 1)
	w.inflight = done
	go func() { done <- writeChunk(w.f, chunk) }()
	w.fill ^= 1
	w.n = 0
}

// writeChunk writes one aligned chunk. A filesystem that accepted direct
// I/O when the file was set up but refuses this write (EINVAL, nothing
// written) gets it, and every later write, through the cache.
func writeChunk(f *os.File, chunk []byte) error {
	n, err := f.Write(chunk)
	if errors.Is(err, syscall.EINVAL) {
		if serr := setDirect(f, false); serr != nil {
			return fmt.Errorf("%w (and direct I/O could not be turned off: %v)", err, serr)
		}
		_, err = f.Write(chunk[n:])
	}
	return err
}

// wait waits for the chunk being written and returns the first error.
func (w *directWriter) wait() error {
	if w.inflight != nil {
		if err := <-w.inflight; err != nil && w.err == nil {
			w.err = err
		}
		w.inflight = nil
	}
	return w.err
}

// finish writes what is buffered; the file then holds every byte written.
func (w *directWriter) finish() error {
	if err := w.wait(); err != nil {
		return err
	}
	if w.n == 0 {
		return nil
	}
	// Direct I/O writes whole blocks only.
	if err := setDirect(w.f, false); err != nil {
		w.err = fmt.Errorf("turning direct I/O off for the last %d bytes: %w", w.n, err)
		return w.err
	}
	if _, err := w.f.Write(w.bufs[w.fill][:w.n]); err != nil {
		w.err = err
		return err
	}
	w.n = 0
	return nil
}

// abort waits for the chunk being written, if any.
func (w *directWriter) abort() { _ = w.wait() }
