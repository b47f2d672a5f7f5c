//go:build !linux

package hugepage

// Advise does nothing: huge pages on request are a Linux feature.
func Advise(buf []byte) {}

func adviseInterior(buf []byte) {}

// PrepareHeap does nothing (see the Linux version).
func PrepareHeap(n int64) Prepared { return Prepared{} }

// Prepared is the span of heap PrepareHeap advised: none here.
type Prepared struct{}

// Bytes is 0.
func (Prepared) Bytes() int64 { return 0 }

// Release does nothing.
func (Prepared) Release() {}
