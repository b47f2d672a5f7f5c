package ctlplane

import (
	"os"
	"syscall"
)

// stampOf identifies one version of the epoch file. A raise replaces the
// file by a rename, so it changes the inode; size and both times catch a
// file rewritten in place by hand.
func stampOf(fi os.FileInfo) (fileStamp, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileStamp{}, false
	}
	return fileStamp{
		dev: st.Dev, ino: st.Ino, size: st.Size,
		mtime: fi.ModTime().UnixNano(), ctime: st.Ctim.Nano(),
	}, true
}
