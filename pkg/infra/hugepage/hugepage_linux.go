//go:build linux

package hugepage

import (
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

// Advise asks the kernel to back buf's 2 MiB-aligned interior with huge
// pages when it is first written; a buffer under two huge pages is left as
// it is. It must be called before the buffer is written to matter.
func Advise(buf []byte) {
	if len(buf) < 2*Size {
		return
	}
	adviseInterior(buf)
}

// adviseInterior advises buf's whole huge pages, if it has any.
func adviseInterior(buf []byte) {
	base := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	if p := interior(buf); p.end > p.start {
		_ = syscall.Madvise(buf[p.start-base:p.end-base], syscall.MADV_HUGEPAGE)
	}
}

// interior is the span of buf's whole huge pages: from its first 2 MiB
// boundary to its last.
func interior(buf []byte) Prepared {
	base := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	return Prepared{start: (base + Size - 1) &^ (Size - 1), end: (base + uintptr(len(buf))) &^ (Size - 1)}
}

// PrepareHeap readies the Go heap for a burst of about n bytes of
// allocations of any size (a restore installing its records): it grows
// the heap by n bytes of address space advised as huge pages and leaves
// them free, so the allocations that follow, which the runtime places in
// the lowest free pages first, fault in 2 MiB at a time rather than 4 KiB.
// Call Release on what it returns once the burst is over. Nothing is
// advised for n under two huge pages, or where advice would change nothing
// (THP "never", or "always", where the heap gets huge pages without it).
//
// The pages are grown untouched (a large allocation from fresh address
// space is not zeroed by the runtime), so the resident memory does not
// change until they are used. It costs a collection, to free the
// allocation that grew the heap: call it where the heap has little to
// mark, as in a process that has just started, and while collections are
// held otherwise, or the runtime may hand the pages back to the kernel
// first (harmlessly: they are then faulted in as huge pages again on use).
// Pages of the span are zeroed by the runtime when allocated, as any
// recycled memory is: a large buffer that is about to be filled whole is
// better allocated before (MakeBuffer), from fresh memory.
func PrepareHeap(n int64) Prepared {
	if n < 2*Size || thpMode() != "madvise" {
		return Prepared{}
	}
	p := growAdvised(int(n))
	// The allocation is unreachable once growAdvised returns.
	runtime.GC()
	return p
}

// Map returns n bytes of fresh anonymous memory mapped outside the Go
// heap, whole huge pages advised as such (see MakePages), and the function
// that unmaps them. For a large scratch buffer a burst of work fills and
// then drops (a commit's write chunks): memory from the heap would count
// toward the collector's next cycle, so a commit in a process with a large
// heap could start a collection that marks all of it, and memory the
// runtime recycles is zeroed first. Nothing may use buf once unmap is
// called; unmap runs once however often it is called. Where the mapping
// fails, buf is MakePages' and unmap does nothing.
func Map(n int) (buf []byte, unmap func()) {
	if n <= 0 {
		return nil, func() {}
	}
	whole := (n + Size - 1) &^ (Size - 1)
	mem, err := syscall.Mmap(-1, 0, whole+Size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return MakePages(n), func() {}
	}
	skip := (Size - int(uintptr(unsafe.Pointer(unsafe.SliceData(mem))))%Size) % Size
	buf = mem[skip : skip+whole : skip+whole]
	_ = syscall.Madvise(buf, syscall.MADV_HUGEPAGE)
	var once sync.Once
	return buf[:n], func() { once.Do(func() { _ = syscall.Munmap(mem) }) }
}

// Prepared is the span of heap PrepareHeap advised.
type Prepared struct{ start, end uintptr }

// Bytes is how many bytes were advised.
func (p Prepared) Bytes() int64 { return int64(p.end - p.start) }

// Release withdraws the advice once the burst it was for is over. The
// pages already backed by huge pages stay so. Without it the span stays
// advised for as long as the process runs: the kernel's khugepaged may
// gather its free and partly used pages into huge pages, bringing back
// memory the runtime returned, and every page the runtime returns and
// reuses there faults in 2 MiB again.
func (p Prepared) Release() {
	if p.end > p.start {
		_, _, _ = syscall.Syscall(syscall.SYS_MADVISE, p.start, p.end-p.start, syscall.MADV_NOHUGEPAGE)
	}
}

// growAdvised allocates n bytes from fresh heap, advises them and drops
// them; not inlined, so no frame of its caller keeps them alive.
//
//go:noinline
func growAdvised(n int) Prepared {
	buf := make([]byte, n)
	Advise(buf)
	return interior(buf)
}

// thpMode is the system's THP mode: "always", "madvise", "never", or ""
// where the kernel has no THP. Read once: it belongs to the machine, as
// the runtime's settings belong to the process.
var thpMode = sync.OnceValue(func() string {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil {
		return ""
	}
	return selectedMode(string(b))
})

// selectedMode returns the bracketed choice of a THP setting file, such as
// "madvise" from "always [madvise] never".
func selectedMode(setting string) string {
	_, rest, ok := strings.Cut(setting, "[")
	if !ok {
		return ""
	}
	mode, _, ok := strings.Cut(rest, "]")
	if !ok {
		return ""
	}
	return mode
}
