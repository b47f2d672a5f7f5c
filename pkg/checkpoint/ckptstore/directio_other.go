//go:build !linux

package ckptstore

import (
	"errors"
	"os"
)

// setDirect fails: direct I/O is used on Linux only.
func setDirect(*os.File, bool) error { return errors.ErrUnsupported }

// readDirect reads nothing: direct I/O is used on Linux only.
func readDirect(*os.File, int, func([]byte)) ([]byte, bool, error) { return nil, false, nil }
