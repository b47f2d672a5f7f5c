// Package hugepage backs memory that is about to be written in bulk with
// transparent huge pages, where the kernel offers them on request.
//
// The first write to a fresh 4 KiB page is a fault, and a fault is dear
// where the kernel runs under a hypervisor that shadows page tables
// (docs/scale-log.md has the figures). A restore runs in fresh processes
// and allocates hundreds of MB in each, so the faults are a large part of
// the CPU a restore costs. With THP in "madvise" mode
// (the common default) memory advised as huge pages faults once per 2 MiB.
//
// Advice only changes how pages are backed, never what they hold: where
// the kernel refuses it (THP off, another OS) the memory is ordinary.
package hugepage

import "unsafe"

// Size is the size of a transparent huge page on the platforms Go supports
// on Linux with 4 KiB base pages.
const Size = 2 << 20

// MakeBuffer returns a zeroed buffer of n bytes, its 2 MiB-aligned
// interior advised as huge pages (see Advise). For a buffer read or written
// whole soon after, such as a records file.
func MakeBuffer(n int) []byte {
	buf := make([]byte, n)
	Advise(buf)
	return buf
}

// MakePages returns a zeroed buffer of n bytes that is whole huge pages:
// it starts at a 2 MiB boundary, its capacity is n rounded up to a
// multiple of Size, and all of it is advised (see Advise), so every byte
// of it faults 2 MiB at a time. For a buffer reused while collections are
// held (a commit's write chunks and encoding room), which MakeBuffer would
// leave partly in 4 KiB pages. It costs up to one huge page of address
// space besides, never touched.
func MakePages(n int) []byte {
	whole := (n + Size - 1) &^ (Size - 1)
	buf := make([]byte, whole+Size)
	skip := (Size - int(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))%Size) % Size
	buf = buf[skip : skip+whole : skip+whole]
	adviseInterior(buf)
	return buf[:n]
}
