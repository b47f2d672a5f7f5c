//go:build !linux

package ckptstore

// makeLarge returns a buffer of n bytes for a records file read whole (see
// the Linux version for why it is not a plain make there).
func makeLarge(n int) []byte { return make([]byte, n) }
