package tokencapture

import (
	"fmt"
	"sync"
)

// syncer is the ledger's group-commit loop: appends kick it, and one fsync
// covers every record written before it started. Under load the fsyncs run
// back to back, each making a batch durable; idle, it waits without timers.
type syncer struct {
	kickc chan struct{}
	stopc chan struct{}
	wg    sync.WaitGroup

	// mu serialises fsyncs so synced only moves forward.
	mu     sync.Mutex
	synced uint64
}

func (s *syncer) start(l *Ledger) {
	s.kickc = make(chan struct{}, 1)
	s.stopc = make(chan struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			select {
			case <-s.stopc:
				return
			case <-s.kickc:
			}
			// A failure is sticky in the ledger; the next write reports it.
			_ = s.syncNow(l)
		}
	}()
}

// kick asks for an fsync without waiting. l.mu is held by the caller.
func (s *syncer) kick() {
	select {
	case s.kickc <- struct{}{}:
	default:
	}
}

func (s *syncer) stop() {
	close(s.stopc)
	s.wg.Wait()
}

// syncNow fsyncs the active segment if anything was written since the last
// fsync. Sealed segments were fsynced when they were sealed.
func (s *syncer) syncNow(l *Ledger) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	if l.err != nil {
		err := l.err
		l.mu.Unlock()
		return err
	}
	f, target := l.active, l.written
	l.mu.Unlock()
	if target <= s.synced {
		return nil
	}
	if err := f.Sync(); err != nil {
		// After a failed fsync the kernel may have dropped the dirty pages;
		// retrying would report success for lost data ("fsyncgate"), so the
		// ledger stops accepting writes.
		l.mu.Lock()
		if l.err == nil {
			l.err = fmt.Errorf("tokencapture: fsync: %w", err)
		}
		err = l.err
		l.mu.Unlock()
		return err
	}
	s.synced = target
	return nil
}
