//go:build !linux

package ctlplane

import "os"

// stampOf is not implemented here: every check reads the epoch file.
func stampOf(os.FileInfo) (fileStamp, bool) { return fileStamp{}, false }

// statStamp only reports whether the file exists.
func statStamp(path string) (fileStamp, bool, error) {
	_, err := os.Stat(path)
	return fileStamp{}, false, err
}
