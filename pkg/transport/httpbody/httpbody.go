// Package httpbody reads an HTTP body whole into a buffer sized from the
// length its sender declared, for servers reading requests and clients
// reading replies alike.
//
// io.ReadAll grows its buffer by a quarter from 512 bytes: a large body
// (a restore naming every episode, a generation-cut receipt) costs several
// times its size in allocations, every byte of it fresh memory while a
// checkpoint holds the process's collections.
package httpbody

import "io"

// Read reads body to its end into a buffer sized from declared, the length
// the sender declared (-1 if none): at most presizeMax bytes of it are
// allocated before they arrive, so a sender cannot make the reader hold
// more by declaring a length it does not send, and the buffer grows by
// doubling up to the declared length as bytes arrive beyond it.
func Read(body io.Reader, declared, presizeMax int64) ([]byte, error) {
	if declared < 0 {
		return io.ReadAll(body)
	}
	// One byte past the declared length sees the end without growing.
	b := make([]byte, 0, min(declared, presizeMax)+1)
	for {
		if len(b) == cap(b) {
			grown := 2 * int64(cap(b))
			if end := declared + 1; end > int64(cap(b)) {
				grown = min(grown, end)
			}
			b = append(make([]byte, 0, grown), b...)
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
