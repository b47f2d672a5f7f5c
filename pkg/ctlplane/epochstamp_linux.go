package ctlplane

import (
	"errors"
	"io/fs"
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
	return stampOfStat(st), true
}

func stampOfStat(st *syscall.Stat_t) fileStamp {
	return fileStamp{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}
}

// statStamp is the stamp of the file at path now, by one stat(2) into a
// buffer of the caller's (os.Stat allocates its FileInfo); an error wraps
// fs.ErrNotExist when there is no file.
func statStamp(path string) (fileStamp, bool, error) {
	var st syscall.Stat_t
	for {
		err := syscall.Stat(path, &st)
		switch {
		case err == nil:
			return stampOfStat(&st), true, nil
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.ENOENT):
			return fileStamp{}, false, fs.ErrNotExist
		default:
			return fileStamp{}, false, &fs.PathError{Op: "stat", Path: path, Err: err}
		}
	}
}
