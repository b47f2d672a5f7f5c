package fleet

import (
	"errors"
	"fmt"
	"net"
	"sync"
)

// PortBlock hands out ports from a fixed block in turn. Kernel-chosen
// ports come from the ephemeral range, where every other process's
// listeners and outgoing connections draw too: two suites generating fleets
// side by side took each other's ports between choosing one and the server
// binding it. A block below the ephemeral range, one per concurrent user,
// is never handed to anyone else, and taking in turn never gives a port
// back to the same user until the block wraps.
type PortBlock struct {
	mu     sync.Mutex
	lo, hi int // [lo, hi)
	next   int
}

// NewPortBlock returns a block of the ports [lo, hi).
func NewPortBlock(lo, hi int) (*PortBlock, error) {
	if lo <= 0 || hi > 65536 || hi <= lo {
		return nil, fmt.Errorf("port block [%d, %d): want 0 < lo < hi <= 65536", lo, hi)
	}
	return &PortBlock{lo: lo, hi: hi, next: lo}, nil
}

// ParsePortBlock reads "lo-hi" (hi inclusive), as an environment variable
// gives it.
func ParsePortBlock(s string) (*PortBlock, error) {
	var lo, hi int
	if _, err := fmt.Sscanf(s, "%d-%d", &lo, &hi); err != nil {
		return nil, fmt.Errorf("port block %q: want lo-hi, e.g. 20000-25999", s)
	}
	return NewPortBlock(lo, hi+1)
}

// ErrPortBlockFull reports a block with fewer free ports than asked for.
var ErrPortBlockFull = errors.New("port block: not enough free ports")

// Take returns n distinct ports of the block that are free now, skipping
// any that something already listens on. Like FreePorts, each is held
// until all n are chosen.
func (b *PortBlock) Take(n int) ([]int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ports := make([]int, 0, n)
	var held []net.Listener
	defer func() {
		for _, ln := range held {
			_ = ln.Close()
		}
	}()
	for tried := 0; len(ports) < n; tried++ {
		if tried >= b.hi-b.lo {
			return nil, fmt.Errorf("%w: %d of [%d, %d)", ErrPortBlockFull, n, b.lo, b.hi)
		}
		port := b.next
		if b.next++; b.next >= b.hi {
			b.next = b.lo
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		held = append(held, ln)
		ports = append(ports, port)
	}
	return ports, nil
}
