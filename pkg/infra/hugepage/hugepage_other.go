//go:build !linux

package hugepage

// Advise does nothing: huge pages on request are a Linux feature.
func Advise(buf []byte) {}

func adviseInterior(buf []byte) {}

// PrepareHeap does nothing (see the Linux version).
func PrepareHeap(n int64) Prepared { return Prepared{} }

// Map returns MakePages(n) and a function that does nothing: the memory
// is the Go heap's here (see the Linux version).
func Map(n int) (buf []byte, unmap func()) { return MakePages(n), func() {} }

// Prepared is the span of heap PrepareHeap advised: none here.
type Prepared struct{}

// Bytes is 0.
func (Prepared) Bytes() int64 { return 0 }

// Release does nothing.
func (Prepared) Release() {}
