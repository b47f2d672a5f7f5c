//go:build !linux

package ctlplane

import "os"

// stampOf reports no stamp: the inode and ctime that make one come from
// Linux's syscall.Stat_t, so elsewhere every reply check rereads the epoch
// file, which is correct, only slower.
func stampOf(os.FileInfo) (fileStamp, bool) { return fileStamp{}, false }

// statStamp only reports whether the file exists.
func statStamp(path string) (fileStamp, bool, error) {
	_, err := os.Stat(path)
	return fileStamp{}, false, err
}
