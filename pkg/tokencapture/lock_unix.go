//go:build unix

package tokencapture

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// dirLock is an exclusive flock on <dir>/LOCK, so two processes never append
// to one ledger. The kernel drops it when the holder dies, even by SIGKILL.
type dirLock struct{ f *os.File }

func lockDir(dir string) (*dirLock, error) {
	f, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("tokencapture: lock %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("tokencapture: %s is in use by another ledger", dir)
		}
		return nil, fmt.Errorf("tokencapture: lock %s: %w", dir, err)
	}
	return &dirLock{f: f}, nil
}

func (d *dirLock) release() {
	if d != nil && d.f != nil {
		_ = d.f.Close()
		d.f = nil
	}
}
