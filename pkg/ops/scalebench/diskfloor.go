package scalebench

import (
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// DiskFloor is what this disk needs to write a checkpoint's bytes: the
// same files' sizes written and fsynced one after the other by one
// process, then their directory synced, measured in the same run as the
// commit. A commit (or restore) can do no better than this without writing
// less; its multiple of the floor is its cost beyond the bytes.
type DiskFloor struct {
	Seconds float64 `json:"seconds"`
	Bytes   int64   `json:"bytes"`
	Files   int     `json:"files"`
}

// floorChunk is the size of each write of the floor, as a buffered
// records writer writes.
const floorChunk = 1 << 20

// measureDiskFloor writes the committed records files' sizes into a
// directory beside the checkpoint, on the same file system, and removes
// them. A checkpoint in an object store has no disk floor.
func (b *bench) measureDiskFloor() error {
	if b.s3 != nil || len(b.recordFileSizes) == 0 {
		return nil
	}
	dir := filepath.Join(b.opts.Dir, "disk-floor")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// Bytes that are not all zeros, so no layer can make them cheaper
	// than a checkpoint's.
	chunk := make([]byte, floorChunk)
	for i := range chunk {
		chunk[i] = byte('a' + i%26)
	}
	floor := DiskFloor{Files: len(b.recordFileSizes)}
	start := time.Now()
	for i, size := range b.recordFileSizes {
		if err := writeSynced(filepath.Join(dir, fmt.Sprintf("records-%d", i)), size, chunk); err != nil {
			return err
		}
		floor.Bytes += size
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	d.Close()
	if err != nil {
		return err
	}
	floor.Seconds = seconds(time.Since(start))
	b.res.DiskFloor = &floor
	b.logf("disk floor: %s written and synced in %.3fs", fmtBytes(floor.Bytes), floor.Seconds)
	return nil
}

// writeSynced writes size bytes of chunk's pattern to a new file at path
// and fsyncs it.
func writeSynced(path string, size int64, chunk []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	for left := size; left > 0; {
		n := min(left, int64(len(chunk)))
		if _, err := f.Write(chunk[:n]); err != nil {
			f.Close()
			return err
		}
		left -= n
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// OverFloor is seconds as a multiple of the run's disk floor; 0 when the
// run has none.
func (r *Result) OverFloor(secs float64) float64 {
	if r.DiskFloor == nil || r.DiskFloor.Seconds <= 0 {
		return 0
	}
	return secs / r.DiskFloor.Seconds
}
