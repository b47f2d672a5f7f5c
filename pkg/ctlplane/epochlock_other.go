//go:build !unix

package ctlplane

import "os"

// Without flock the lock excludes only within this process: the epoch
// file still fences every check, but a check and its publication are not
// atomic against another process's raise.
func flockTry(*os.File, bool) (bool, error) { return true, nil }

func flockRelease(*os.File) error { return nil }
