package ckptstore

import (
	"crypto/sha256"
	"hash"
	"io"
	"sync"

	"github.com/gymfleet/gymfleet/pkg/infra/hugepage"
)

// recordsSink is where Write puts a records file's bytes: each byte is
// copied once, into a chunk, and every full chunk is hashed and written
// (to the backend's records object, when there is one) by a goroutine of
// its own while the next is filled. A record's bytes used to be copied
// into its line, into a buffered writer and into the direct writer's
// chunk, and hashed on the encoding goroutine: a commit's work per byte.
//
// Chunks are aligned for direct I/O, which writes a full chunk from where
// it lies (directWriter.Write). The first chunk is small, most
// participants of a test, and many of a fleet, writing little; the others
// are whole huge pages mapped outside the Go heap (hugepage.Map) and
// unmapped by stop: a commit is a process's one large allocation, and
// from the heap it could start a collection that marks every held
// rollout's state in the middle of the commit.
type recordsSink struct {
	// w receives every byte in order; nil where the bytes are only hashed
	// (a directory that already holds the commit).
	w io.Writer
	h hash.Hash

	cur []byte
	// made is 0 before the first chunk is allocated, 1 with only the
	// first, sinkChunks once the others are.
	made int
	// unmaps return the mapped chunks; released is set once they are,
	// after which the sink takes no bytes.
	unmaps   []func()
	released bool
	// free returns chunks the goroutine is done with; full hands it
	// chunks to hash and write. Both have room for every chunk.
	free, full chan []byte
	// done is closed when the goroutine has ended; nil until it starts.
	done chan struct{}
	// err is the goroutine's first write error, read by the filler once
	// it hands a chunk over (under mu) and after done.
	mu  sync.Mutex
	err error
}

const (
	// firstChunk is the first chunk's size; sinkChunk the size of the
	// others. Both are multiples of the direct I/O block.
	firstChunk = 64 << 10
	sinkChunk  = 4 << 20
	// sinkChunks is how many chunks a sink uses at most: one filling, one
	// being hashed and written, one waiting between them.
	sinkChunks = 3
)

func newRecordsSink(w io.Writer) *recordsSink {
	return &recordsSink{w: w, h: sha256.New(), free: make(chan []byte, sinkChunks+1), full: make(chan []byte, sinkChunks)}
}

// write copies p into the chunks. It fails with the goroutine's error once
// a write to the backend has failed.
func (s *recordsSink) write(p []byte) error {
	if s.released {
		return ErrStopped
	}
	for len(p) > 0 {
		if s.cur == nil || len(s.cur) == cap(s.cur) {
			if err := s.next(); err != nil {
				return err
			}
		}
		n := copy(s.cur[len(s.cur):cap(s.cur)], p)
		s.cur = s.cur[:len(s.cur)+n]
		p = p[n:]
	}
	return nil
}

// writeByte writes one byte (a line's newline).
func (s *recordsSink) writeByte(c byte) error {
	if s.released {
		return ErrStopped
	}
	if s.cur == nil || len(s.cur) == cap(s.cur) {
		if err := s.next(); err != nil {
			return err
		}
	}
	s.cur = append(s.cur, c)
	return nil
}

// next hands the current chunk, if any, to the goroutine and takes an
// empty one: a fresh one while fewer than sinkChunks exist, else the next
// the goroutine frees.
func (s *recordsSink) next() error {
	if s.cur != nil {
		if s.done == nil {
			s.done = make(chan struct{})
			go s.drain()
		}
		s.full <- s.cur
		s.cur = nil
		if err := s.failed(); err != nil {
			return err
		}
	}
	switch {
	case s.made == 0:
		s.cur = alignedBlocks(firstChunk / directAlign)[:0]
		s.made = 1
	case s.made == 1:
		// The rest at once, from one allocation of whole huge pages.
		rest := s.mapChunks((sinkChunks - 1) * sinkChunk)
		for k := sinkChunk; k < len(rest); k += sinkChunk {
			s.free <- rest[k : k : k+sinkChunk]
		}
		s.cur = rest[:0:sinkChunk]
		s.made = sinkChunks
	default:
		s.cur = (<-s.free)[:0]
		if cap(s.cur) < sinkChunk {
			// The small first chunk, back: a commit that filled it is
			// large, and the others are in use.
			s.cur = s.mapChunks(sinkChunk)[:0]
		}
		return s.failed()
	}
	return nil
}

// mapChunks maps n bytes of chunks (hugepage.Map), which stop unmaps.
func (s *recordsSink) mapChunks(n int) []byte {
	buf, unmap := hugepage.Map(n)
	s.unmaps = append(s.unmaps, unmap)
	return buf
}

// drain hashes and writes every chunk handed over, in order, until full
// is closed. After a failed write it only frees the chunks.
func (s *recordsSink) drain() {
	defer close(s.done)
	for chunk := range s.full {
		if s.failed() == nil {
			s.h.Write(chunk)
			if s.w != nil {
				if _, err := s.w.Write(chunk); err != nil {
					s.mu.Lock()
					s.err = err
					s.mu.Unlock()
				}
			}
		}
		s.free <- chunk
	}
}

func (s *recordsSink) failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// finish hashes and writes what is left and returns the digest of every
// byte written, or the first write error.
func (s *recordsSink) finish() ([]byte, error) {
	if s.done != nil {
		close(s.full)
		<-s.done
		s.done = nil
		if err := s.failed(); err != nil {
			return nil, err
		}
	}
	if len(s.cur) > 0 {
		s.h.Write(s.cur)
		if s.w != nil {
			if _, err := s.w.Write(s.cur); err != nil {
				return nil, err
			}
		}
		s.cur = s.cur[:0]
	}
	return s.h.Sum(nil), nil
}

// stop ends the goroutine once a write failed or was stopped: it writes
// no chunk it has not started, and stop returns once it has ended, so
// the records object can be aborted. Then it unmaps the chunks: Write
// calls it last, once finish has handed every byte over (the backend's
// writer keeps none of them, as io.Writer's contract says).
func (s *recordsSink) stop() {
	if s.done != nil {
		s.mu.Lock()
		if s.err == nil {
			s.err = ErrStopped
		}
		s.mu.Unlock()
		close(s.full)
		<-s.done
		s.done = nil
	}
	s.released, s.cur = true, nil
	for _, unmap := range s.unmaps {
		unmap()
	}
	s.unmaps = nil
}
