//go:build !linux

package ctlplane

import "os"

// stampOf is not implemented here: every check reads the epoch file.
func stampOf(os.FileInfo) (fileStamp, bool) { return fileStamp{}, false }
