package ctlplane

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// epochLockWait bounds a wait for the epoch lock. Holders keep it for one
// file write, so a longer wait means a holder is stopped (SIGSTOP) inside
// its write; the waiter fails rather than hang its caller.
const epochLockWait = 30 * time.Second

// epochLockPoll is how often a waiter retries: flock has no timeout.
const epochLockPoll = time.Millisecond

// epochLock makes an epoch check and the durable write it admits one step
// with respect to a raise of the epoch, across every process sharing the
// epoch file. A writer holds a shared flock on "<epoch file>.lock" from its
// check until its write is durable; a raise holds it exclusively while it
// replaces the epoch file. A write that passed its check is therefore
// ordered before the raise, and one that would land after the raise sees
// the raise in its check. The lock is a file of its own because the epoch
// file is replaced by a rename at each raise, and a flock belongs to the
// replaced inode. The kernel drops a flock when its holder dies.
type epochLock struct {
	path string
	wait time.Duration
	// rw orders this process's holders: a flock belongs to the open file,
	// which every goroutine shares, so shared holds are counted here and
	// only the first and last touch the flock, and an exclusive hold waits
	// for this process's shared ones.
	rw sync.RWMutex
	// mu guards f and shared.
	mu     sync.Mutex
	f      *os.File
	shared int
	// onWait, set by tests, runs when an acquisition finds the lock held
	// by another process.
	onWait func()
}

func newEpochLock(epochPath string) *epochLock {
	if epochPath == "" {
		return nil
	}
	return &epochLock{path: epochPath + ".lock", wait: epochLockWait}
}

// take acquires the flock; l.mu is held.
func (l *epochLock) take(exclusive bool) error {
	if l.f == nil {
		if err := os.MkdirAll(filepath.Dir(l.path), 0o755); err != nil {
			return fmt.Errorf("checkpoint epoch lock: %w", err)
		}
		f, err := os.OpenFile(l.path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return fmt.Errorf("checkpoint epoch lock: %w", err)
		}
		l.f = f
	}
	ok, err := flockTry(l.f, exclusive)
	if err != nil || ok {
		return err
	}
	if l.onWait != nil {
		l.onWait()
	}
	deadline := time.Now().Add(l.wait)
	tick := time.NewTicker(epochLockPoll)
	defer tick.Stop()
	for range tick.C {
		if ok, err := flockTry(l.f, exclusive); err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			break
		}
	}
	return fmt.Errorf("checkpoint epoch lock %s: still held by another process after %s", l.path, l.wait)
}

// rlock takes the lock shared.
func (l *epochLock) rlock() error {
	l.rw.RLock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.shared == 0 {
		if err := l.take(false); err != nil {
			l.rw.RUnlock()
			return err
		}
	}
	l.shared++
	return nil
}

func (l *epochLock) runlock() {
	l.mu.Lock()
	l.shared--
	if l.shared == 0 {
		_ = flockRelease(l.f)
	}
	l.mu.Unlock()
	l.rw.RUnlock()
}

// lock takes the lock exclusively.
func (l *epochLock) lock() error {
	l.rw.Lock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.take(true); err != nil {
		l.rw.Unlock()
		return err
	}
	return nil
}

func (l *epochLock) unlock() {
	l.mu.Lock()
	_ = flockRelease(l.f)
	l.mu.Unlock()
	l.rw.Unlock()
}

// close releases the lock file; no hold may be in progress.
func (l *epochLock) close() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		_ = l.f.Close()
		l.f = nil
	}
}
