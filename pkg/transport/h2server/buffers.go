package h2server

import "sync"

// bufferClasses are the capacities buffers are pooled at: request bodies
// waiting for their handler and replies waiting for their handler to
// return are held only briefly, and taking them from pools keeps the bytes
// every request and reply pass through from becoming garbage (a collection
// marks every parked handler's stack, so garbage costs more here).
var bufferClasses = [...]int{1 << 10, 4 << 10, 16 << 10, 64 << 10}

// buffers pools byte slices by capacity class. The zero value is ready.
type buffers struct {
	pools [len(bufferClasses)]sync.Pool
}

// get returns an empty slice with room for at least n bytes.
func (b *buffers) get(n int) []byte {
	for i, size := range bufferClasses {
		if n <= size {
			if p, ok := b.pools[i].Get().(*[]byte); ok {
				return (*p)[:0]
			}
			return make([]byte, 0, size)
		}
	}
	return make([]byte, 0, n)
}

// put gives back a slice get returned; others are left to the collector.
func (b *buffers) put(buf []byte) {
	for i, size := range bufferClasses {
		if cap(buf) == size {
			buf = buf[:0]
			b.pools[i].Put(&buf)
			return
		}
	}
}

// grow returns buf with room for n more bytes, moved to a larger buffer
// (and the old one given back) when it has not.
func (b *buffers) grow(buf []byte, n int) []byte {
	if cap(buf)-len(buf) >= n {
		return buf
	}
	bigger := append(b.get(len(buf)+n), buf...)
	b.put(buf)
	return bigger
}

// classCap is the capacity get(n) returns a buffer with.
func classCap(n int) int {
	for _, size := range bufferClasses {
		if n <= size {
			return size
		}
	}
	return n
}
