// Package httpbody reads an HTTP body whole into a buffer sized from the
// length its sender declared, for servers reading requests and clients
// reading replies alike.
//
// io.ReadAll grows its buffer by a quarter from 512 bytes: a large body
// (a restore naming every episode, a generation-cut receipt) costs several
// times its size in allocations and copies, every byte of it fresh memory
// that the runtime later hands back to the system.
package httpbody

import "io"

// trustedFraction: once this fraction of the declared length has arrived,
// the buffer grows straight to the declared length. Growing by doubling to
// a declared length of tens of megabytes allocates nearly twice the body
// and copies it again at every step; trusting it only after an eighth of
// it arrived keeps what a sender that declares more than it sends can
// make the reader hold to eight times what it sent.
const trustedFraction = 8

// Read reads body to its end into a buffer sized from declared, the length
// the sender declared (-1 if none): at most presizeMax bytes of it are
// allocated before they arrive, and the buffer doubles as bytes arrive
// beyond it, growing straight to the declared length once an eighth of it
// has arrived. Without a declared length it doubles from 512 bytes.
func Read(body io.Reader, declared, presizeMax int64) ([]byte, error) {
	size := int64(512)
	if declared >= 0 {
		// One byte past the declared length sees the end without growing.
		size = min(declared, presizeMax) + 1
	}
	b := make([]byte, 0, size)
	for {
		if len(b) == cap(b) {
			b = append(make([]byte, 0, grown(int64(len(b)), declared)), b...)
		}
		n, err := body.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// grown is the capacity of a full buffer of n bytes once it grows: the
// declared length and the byte past it, when n is an eighth of that or
// more, else twice n.
func grown(n, declared int64) int64 {
	if end := declared + 1; declared >= 0 && end > n && end <= trustedFraction*n {
		return end
	}
	return 2 * n
}
