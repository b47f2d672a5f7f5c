//go:build linux

package ckptstore

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/gymfleet/gymfleet/pkg/infra/hugepage"
)

// setDirect turns direct I/O (O_DIRECT) on or off for f. It fails where the
// filesystem does not take it, and f is then unchanged.
func setDirect(f *os.File, on bool) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var opErr error
	err = rc.Control(func(fd uintptr) {
		flags, _, errno := syscall.Syscall(syscall.SYS_FCNTL, fd, syscall.F_GETFL, 0)
		if errno != 0 {
			opErr = errno
			return
		}
		if on {
			flags |= syscall.O_DIRECT
		} else {
			flags &^= syscall.O_DIRECT
		}
		if _, _, errno := syscall.Syscall(syscall.SYS_FCNTL, fd, syscall.F_SETFL, flags); errno != 0 {
			opErr = errno
		}
	})
	if err != nil {
		return err
	}
	return opErr
}

// readDirect reads the size bytes of f into a new buffer with direct I/O,
// directReaders chunks at a time. ok is false, with nothing read and f as
// it was, where f does not take direct I/O or is too small to be worth it.
// follow, if not nil, is called with the buffer's bytes in order, a read
// chunk at a time, from a goroutine of its own as soon as each chunk and
// those before it are read (a restore hashes the file while it reads it);
// readDirect returns once follow has had every byte, or once a read
// failed, after which follow is not called again.
func readDirect(f *os.File, size int, follow func([]byte)) (buf []byte, ok bool, err error) {
	if size < directReadMin {
		return nil, false, nil
	}
	padded := (size + directAlign - 1) &^ (directAlign - 1)
	buf = hugepage.MakeBuffer(padded)
	if !isAligned(buf) || setDirect(f, true) != nil {
		return nil, false, nil
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, true, err
	}
	chunks := (padded + directReadChunk - 1) / directReadChunk
	errs := make([]error, chunks)
	// read[i] is closed once chunk i is read (errs[i] set first).
	read := make([]chan struct{}, chunks)
	for i := range read {
		read[i] = make(chan struct{})
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(directReaders, chunks) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= chunks {
					return
				}
				start := i * directReadChunk
				end := min(start+directReadChunk, padded)
				if err := rc.Control(func(fd uintptr) {
					errs[i] = readChunk(int(fd), buf[start:end], start, min(end, size)-start)
				}); err != nil {
					errs[i] = err
				}
				close(read[i])
			}
		})
	}
	if follow != nil {
		wg.Go(func() {
			for i := range chunks {
				<-read[i]
				if errs[i] != nil {
					return
				}
				start := i * directReadChunk
				follow(buf[start:min(start+directReadChunk, size)])
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, true, err
	}
	return buf[:size], true, nil
}

// readChunk fills chunk from offset off of fd, which must yield exactly
// want bytes: the chunk holding the end of the file reads short.
func readChunk(fd int, chunk []byte, off, want int) error {
	got := 0
	for got < len(chunk) {
		n, err := syscall.Pread(fd, chunk[got:], int64(off+got))
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("read at offset %d: %w", off+got, err)
		}
		got += n
		// A read ending off a block boundary, or reading nothing, ended at
		// the end of the file.
		if n == 0 || got%directAlign != 0 {
			break
		}
	}
	switch {
	case got < want:
		return fmt.Errorf("read %d bytes at offset %d, want %d: %w", got, off, want, io.ErrUnexpectedEOF)
	case got > want:
		return errRecordsChanged
	}
	return nil
}
