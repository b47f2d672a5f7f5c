package codec

import (
	"encoding/binary"
	"math/bits"
)

// Valid reports whether data is one valid JSON value: exactly what
// encoding/json.Valid accepts (FuzzValid checks it), a value nested at
// most maxNesting deep, strings of any bytes but control characters (no
// UTF-8 check, as encoding/json's), surrounded by JSON whitespace only.
//
// It is a scanner of its own rather than a decoder's: every checkpoint
// record is checked as it is written, and every request body the model
// server proxies, so it reads its input in place (goccy's validator first
// copies its input into a buffer of its own) and keeps nothing but a bit
// per level of nesting, on its own stack (on the heap past 256 levels).
func Valid(data []byte) bool { return valid(data) }

func valid(b []byte) bool {
	// objects holds a bit per open container, set for an object.
	var shallow [4]uint64
	objects := shallow[:]
	var (
		depth int
		c     byte
		w, m  uint64
		// inObject: the innermost open container is an object; inKey:
		// the string being read is a member's name.
		inObject, inKey bool
	)
	n := len(b)
	i := 0
	// The scanner is one function of labels, its state in registers: at
	// value a value must start at i (after white space), at key a
	// member's name must, at next a value ended before i. Each loop is a
	// label too: a goto may not enter a block.
value:
	for i < n && b[i] <= ' ' {
		if !isSpace(b[i]) {
			return false
		}
		i++
	}
	if i >= n {
		return false
	}
	c = b[i]
	if c == '"' {
		i++
		goto str
	}
	if c-'0' < 10 || c == '-' {
		goto number
	}
	switch c {
	case '{', '[':
		if depth == maxNesting {
			return false
		}
		if depth>>6 == len(objects) {
			objects = append(objects, 0)
		}
		inObject = c == '{'
		if inObject {
			objects[depth>>6] |= 1 << (depth & 63)
		} else {
			objects[depth>>6] &^= 1 << (depth & 63)
		}
		depth++
		i++
		for i < n && b[i] <= ' ' && isSpace(b[i]) {
			i++
		}
		if i < n && b[i] == c+2 { // '}' and ']' are '{' and '[' plus 2
			i++
			goto closed
		}
		if c == '{' {
			goto key
		}
		goto value
	case 't':
		if n-i < 4 || string(b[i:i+4]) != "true" {
			return false
		}
		i += 4
	case 'f':
		if n-i < 5 || string(b[i:i+5]) != "false" {
			return false
		}
		i += 5
	case 'n':
		if n-i < 4 || string(b[i:i+4]) != "null" {
			return false
		}
		i += 4
	default:
		return false
	}
	goto next

	// A string's contents from i, eight bytes at a time up to the first
	// that is a quote, a backslash or a control character (the lowest
	// byte the test flags is such a byte: a borrow only carries upwards).
str:
	if n-i >= 8 {
		w = binary.LittleEndian.Uint64(b[i:])
		m = zeroBytes(w^('"'*ones)) | zeroBytes(w^('\\'*ones)) | (w-0x20*ones)&^w&highs
		if m == 0 {
			i += 8
			goto str
		}
		i += bits.TrailingZeros64(m) >> 3
	}
	if i >= n {
		return false
	}
	switch c = b[i]; {
	case c == '"':
		i++
		if inKey {
			goto colon
		}
		goto next
	case c == '\\':
		if i+1 >= n {
			return false
		}
		switch b[i+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i += 2
		case 'u':
			if n-i < 6 || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
				return false
			}
			i += 6
		default:
			return false
		}
	case c < 0x20:
		return false
	default:
		i++
	}
	goto str

	// A number, and in an array every number that follows after a comma,
	// as checkpoints hold token ids and log-probabilities:
	// -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
number:
	if b[i] == '-' {
		i++
		if i >= n {
			return false
		}
	}
	c = b[i]
	i++
	if c-'1' < 9 {
		for i < n && b[i]-'0' < 10 {
			i++
		}
	} else if c != '0' {
		return false
	}
	if i >= n {
		goto next
	}
	c = b[i]
	if c == '.' || c|0x20 == 'e' {
		if i = numberTailEnd(b, i); i < 0 {
			return false
		}
		if i >= n {
			goto next
		}
		c = b[i]
	}
	if c == ',' && !inObject && i+1 < n && (b[i+1]-'0' < 10 || b[i+1] == '-') && depth > 0 {
		i++
		goto number
	}

next:
	for i < n && b[i] <= ' ' {
		if !isSpace(b[i]) {
			return false
		}
		i++
	}
	if depth == 0 {
		// Only white space may follow the top-level value.
		return i == n
	}
	if i >= n {
		return false
	}
	switch c = b[i]; {
	case c == ',':
		i++
		if inObject {
			goto key
		}
		goto value
	case c == '}' && inObject, c == ']' && !inObject:
		i++
		goto closed
	}
	return false

closed:
	depth--
	if depth > 0 {
		inObject = isObject(objects, depth)
	}
	goto next

key:
	for i < n && b[i] <= ' ' && isSpace(b[i]) {
		i++
	}
	if i >= n || b[i] != '"' {
		return false
	}
	i++
	inKey = true
	goto str

colon:
	inKey = false
	for i < n && b[i] <= ' ' && isSpace(b[i]) {
		i++
	}
	if i >= n || b[i] != ':' {
		return false
	}
	i++
	goto value
}

// isObject reports whether the innermost of depth open containers, whose
// kinds are the bits of objects, is an object.
func isObject(objects []uint64, depth int) bool {
	top := depth - 1
	return objects[top>>6]&(uint64(1)<<(top&63)) != 0
}

// numberTailEnd returns the end of a number's fraction and exponent,
// which start at b[i], or -1.
func numberTailEnd(b []byte, i int) int {
	if b[i] == '.' {
		i++
		start := i
		for i < len(b) && b[i]-'0' < 10 {
			i++
		}
		if i == start {
			return -1
		}
	}
	if i < len(b) && b[i]|0x20 == 'e' {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		start := i
		for i < len(b) && b[i]-'0' < 10 {
			i++
		}
		if i == start {
			return -1
		}
	}
	return i
}

// Bytes broadcast to every byte of a word, for the searches eight bytes at
// a time.
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// zeroBytes flags, in the high bit of each of w's eight bytes (read
// little-endian), the bytes that are zero. A byte can be flagged wrongly
// only above one flagged rightly (a borrow carries upwards), so the
// lowest flag is always right, and a word without flags has no zero byte.
func zeroBytes(w uint64) uint64 { return (w - ones) &^ w & highs }
