package codec

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// maxNesting is how deeply arrays and objects may nest: Unmarshal (like
// encoding/json) refuses a value nested deeper.
const maxNesting = 10000

// Canonicalizer writes a JSON value exactly as MarshalStable writes what
// Unmarshal decodes from it into an any: object members sorted by their
// decoded names in byte order, the last of a repeated name kept, numbers
// as float64s, strings decoded and escaped again, no whitespace. It gets
// there without the maps, slices and strings in between, which, for the
// task digest of every /run, were a quarter of an environment server's CPU
// when 50,000 rollouts started at once. It refuses what Unmarshal refuses,
// a number beyond a float64's range included, and never panics.
// FuzzCanonicalizer checks it against Unmarshal and MarshalStable.
//
// The value is read in two passes: the first checks it and lays out its
// nodes in input order, with the canonical bytes of its strings, numbers
// and names; the second writes the nodes with each object's members in
// sorted order. Both passes are linear, however deeply objects nest.
//
// UseNumber and RefuseReplacement make it write instead what a
// json.Decoder with UseNumber decodes and MarshalStable writes, for the
// strings it writes exactly.
//
// The zero value is ready to use. A Canonicalizer keeps its buffers from
// one Append to the next; it is not safe for concurrent use.
type Canonicalizer struct {
	// numbersAsWritten: UseNumber.
	numbersAsWritten bool
	// refuseReplacement: RefuseReplacement.
	refuseReplacement bool

	in    []byte
	pos   int
	nodes []canonicalNode
	// text holds the canonical and decoded bytes that are not c.in's as
	// they are: strings with an escape, numbers written differently.
	text []byte
	// names counts the member names of the value, which bounds how many
	// members are ever on the stack below.
	names int
	// members is a stack of the node indexes of the member names of the
	// objects being written.
	members []int
}

type canonicalKind uint8

const (
	leafNode   canonicalKind = iota // a string, number, true, false or null
	nameNode                        // an object member's name, followed by its value's nodes
	objectNode                      // followed by its members' nodes
	arrayNode                       // followed by its elements' nodes
)

// canonicalNode is one value or member name of the value being written.
type canonicalNode struct {
	kind canonicalKind
	// inInput reports that a leaf's or a name's bytes are c.in's, not
	// c.text's: most strings and names need no change.
	inInput bool
	// from and to delimit a leaf's or a name's canonical bytes.
	from, to int
	// end is, for an object or an array, the index of the node after its
	// last one; for a name in c.text, where its decoded bytes start, which
	// end at from. (The decoded bytes of a name in c.in are between its
	// quotes.)
	end int
}

// bytesPerNode is how many bytes of a value are presumed to make a node,
// to allocate the nodes at once: a weather row's responses_create_params
// has a node every 12.6 bytes.
const bytesPerNode = 12

// UseNumber makes c write each number as the input writes it, as
// MarshalStable writes the Number a json.Decoder with UseNumber decodes it
// to: the number's syntax is checked, its value is not, so a number beyond
// a float64's range is written too.
func (c *Canonicalizer) UseNumber() { c.numbersAsWritten = true }

// ErrReplacement is how Append refuses, after RefuseReplacement, a string
// that decoding would change to U+FFFD.
var ErrReplacement = errors.New("json: string with invalid UTF-8 or a lone surrogate escape")

// RefuseReplacement makes Append refuse with ErrReplacement a value with
// a string (or a member name) that decoding changes to U+FFFD in places:
// invalid UTF-8, or a surrogate escape that is not half of a pair. A caller
// that must write what another decoder writes need not then rely on the
// two replacing alike.
func (c *Canonicalizer) RefuseReplacement() { c.refuseReplacement = true }

// Append appends the canonical form of the JSON value raw to dst. On an
// error, dst is returned as it was.
func (c *Canonicalizer) Append(dst, raw []byte) ([]byte, error) {
	c.in, c.pos, c.names = raw, 0, 0
	c.nodes = slices.Grow(c.nodes[:0], len(raw)/bytesPerNode+1)
	c.text = c.text[:0]
	err := c.parseValue(0)
	if err == nil {
		c.skipSpace()
		if c.pos < len(c.in) {
			err = c.syntaxError("after top-level value")
		}
	}
	if err == nil {
		c.members = slices.Grow(c.members[:0], c.names)
		dst, _ = c.write(dst, 0)
	}
	// The caller's bytes are not kept past the call.
	c.in = nil
	return dst, err
}

func (c *Canonicalizer) skipSpace() {
	for c.pos < len(c.in) && isSpace(c.in[c.pos]) {
		c.pos++
	}
}

func (c *Canonicalizer) syntaxError(where string) error {
	if c.pos >= len(c.in) {
		return errors.New("json: unexpected end of JSON input")
	}
	return fmt.Errorf("json: invalid character %q %s (offset %d)", c.in[c.pos], where, c.pos)
}

// parseValue lays out the value at c.pos, which is inside depth arrays
// and objects.
func (c *Canonicalizer) parseValue(depth int) error {
	c.skipSpace()
	if c.pos == len(c.in) {
		return c.syntaxError("")
	}
	switch b := c.in[c.pos]; {
	case b == '{':
		return c.parseObject(depth + 1)
	case b == '[':
		return c.parseArray(depth + 1)
	case b == '"':
		n, err := c.parseString(leafNode)
		if err != nil {
			return err
		}
		c.nodes = append(c.nodes, n)
		return nil
	case b == 't':
		return c.parseLiteral("true")
	case b == 'f':
		return c.parseLiteral("false")
	case b == 'n':
		return c.parseLiteral("null")
	case b == '-' || isDecimalDigit(b):
		return c.parseNumber()
	}
	return c.syntaxError("looking for beginning of value")
}

func (c *Canonicalizer) parseObject(depth int) error {
	if depth > maxNesting {
		return c.syntaxError("exceeded max depth")
	}
	at := len(c.nodes)
	c.nodes = append(c.nodes, canonicalNode{kind: objectNode})
	c.pos++ // {
	c.skipSpace()
	if c.pos < len(c.in) && c.in[c.pos] == '}' {
		c.pos++
		c.nodes[at].end = len(c.nodes)
		return nil
	}
	for {
		c.skipSpace()
		if c.pos == len(c.in) || c.in[c.pos] != '"' {
			return c.syntaxError("looking for beginning of object key string")
		}
		name, err := c.parseString(nameNode)
		if err != nil {
			return err
		}
		c.nodes = append(c.nodes, name)
		c.names++
		c.skipSpace()
		if c.pos == len(c.in) || c.in[c.pos] != ':' {
			return c.syntaxError("after object key")
		}
		c.pos++
		if err := c.parseValue(depth); err != nil {
			return err
		}
		c.skipSpace()
		if c.pos == len(c.in) {
			return c.syntaxError("")
		}
		switch c.in[c.pos] {
		case ',':
			c.pos++
		case '}':
			c.pos++
			c.nodes[at].end = len(c.nodes)
			return nil
		default:
			return c.syntaxError("after object key:value pair")
		}
	}
}

func (c *Canonicalizer) parseArray(depth int) error {
	if depth > maxNesting {
		return c.syntaxError("exceeded max depth")
	}
	at := len(c.nodes)
	c.nodes = append(c.nodes, canonicalNode{kind: arrayNode})
	c.pos++ // [
	c.skipSpace()
	if c.pos < len(c.in) && c.in[c.pos] == ']' {
		c.pos++
		c.nodes[at].end = len(c.nodes)
		return nil
	}
	for {
		if err := c.parseValue(depth); err != nil {
			return err
		}
		c.skipSpace()
		if c.pos == len(c.in) {
			return c.syntaxError("")
		}
		switch c.in[c.pos] {
		case ',':
			c.pos++
		case ']':
			c.pos++
			c.nodes[at].end = len(c.nodes)
			return nil
		default:
			return c.syntaxError("after array element")
		}
	}
}

func (c *Canonicalizer) parseLiteral(word string) error {
	end := c.pos + len(word)
	if end > len(c.in) || string(c.in[c.pos:end]) != word {
		return c.syntaxError("in literal " + word)
	}
	c.nodes = append(c.nodes, canonicalNode{kind: leafNode, inInput: true, from: c.pos, to: end})
	c.pos = end
	return nil
}

func isDecimalDigit(b byte) bool { return '0' <= b && b <= '9' }

func (c *Canonicalizer) skipDigits() {
	for c.pos < len(c.in) && isDecimalDigit(c.in[c.pos]) {
		c.pos++
	}
}

// maxExactDigits is how many digits an integer may have to be read as a
// float64 exactly (below 2^53) and written by AppendFloat as it is read.
const maxExactDigits = 15

// parseNumber lays out the number at c.pos as the float64 it decodes to,
// written as AppendFloat writes it.
func (c *Canonicalizer) parseNumber() error {
	start := c.pos
	if c.in[c.pos] == '-' {
		c.pos++
	}
	digits := c.pos
	switch {
	case c.pos < len(c.in) && c.in[c.pos] == '0':
		c.pos++
	case c.pos < len(c.in) && isDecimalDigit(c.in[c.pos]):
		c.skipDigits()
	default:
		return c.syntaxError("in numeric literal")
	}
	integer := c.numbersAsWritten || c.pos-digits <= maxExactDigits
	if c.pos < len(c.in) && c.in[c.pos] == '.' {
		integer = c.numbersAsWritten
		c.pos++
		if c.pos == len(c.in) || !isDecimalDigit(c.in[c.pos]) {
			return c.syntaxError("after decimal point in numeric literal")
		}
		c.skipDigits()
	}
	if c.pos < len(c.in) && (c.in[c.pos] == 'e' || c.in[c.pos] == 'E') {
		integer = c.numbersAsWritten
		c.pos++
		if c.pos < len(c.in) && (c.in[c.pos] == '+' || c.in[c.pos] == '-') {
			c.pos++
		}
		if c.pos == len(c.in) || !isDecimalDigit(c.in[c.pos]) {
			return c.syntaxError("in exponent of numeric literal")
		}
		c.skipDigits()
	}
	// integer: written as it is read, a float64 exactly or, with
	// UseNumber, any number.
	if integer {
		c.nodes = append(c.nodes, canonicalNode{kind: leafNode, inInput: true, from: start, to: c.pos})
		return nil
	}
	literal := c.in[start:c.pos]
	f, err := strconv.ParseFloat(string(literal), 64)
	if err != nil {
		// Only a number beyond a float64's range gets here, which
		// Unmarshal refuses too.
		return fmt.Errorf("json: cannot unmarshal number %s into a float64", literal)
	}
	from := len(c.text)
	if c.text, err = AppendFloat(c.text, f); err != nil {
		return err
	}
	if bytes.Equal(c.text[from:], literal) {
		c.text = c.text[:from]
		c.nodes = append(c.nodes, canonicalNode{kind: leafNode, inInput: true, from: start, to: c.pos})
		return nil
	}
	c.nodes = append(c.nodes, canonicalNode{kind: leafNode, from: from, to: len(c.text)})
	return nil
}

// parseString reads the string at c.pos into a node of kind, a leaf or a
// name, with its canonical bytes and, for a name, its decoded bytes.
func (c *Canonicalizer) parseString(kind canonicalKind) (canonicalNode, error) {
	start := c.pos + 1
	// asIs: nothing in the string that AppendString would write otherwise
	// than it reads, as far as the loop can tell byte by byte. The escapes
	// \" \\ \b \f \n \r \t are what AppendString writes for the bytes they
	// stand for; \/ and \u are not.
	asIs, escaped, nonASCII := true, false, false
	i := start
	for {
		for i < len(c.in) && isPlainStringByte(c.in[i]) {
			i++
		}
		if i == len(c.in) {
			c.pos = i
			return canonicalNode{}, c.syntaxError("")
		}
		b := c.in[i]
		if b == '"' {
			break
		}
		switch {
		case b == '\\':
			escaped = true
			n, err := c.escapeLen(i)
			if err != nil {
				return canonicalNode{}, err
			}
			if e := c.in[i+1]; e == '/' || e == 'u' {
				asIs = false
			}
			i += n
		case b < 0x20:
			c.pos = i
			return canonicalNode{}, c.syntaxError("in string literal")
		case b >= utf8.RuneSelf:
			nonASCII = true
			i++
		default: // < > &
			asIs = false
			i++
		}
	}
	c.pos = i + 1
	raw := c.in[start:i]
	// A name's decoded bytes are needed too, which are its bytes only
	// without an escape.
	if asIs && !(kind == nameNode && escaped) && (!nonASCII || writtenAsIs(raw)) {
		return canonicalNode{kind: kind, inInput: true, from: start - 1, to: i + 1}, nil
	}
	// The decoded bytes are no longer than raw, and their canonical ones
	// most often as long.
	c.text = slices.Grow(c.text, 2*len(raw)+len(`""`))
	decoded := len(c.text)
	var replaced bool
	c.text, replaced = appendUnquoted(c.text, raw)
	if replaced && c.refuseReplacement {
		c.pos = start - 1
		return canonicalNode{}, ErrReplacement
	}
	from := len(c.text)
	c.text = AppendString(c.text, string(c.text[decoded:from]))
	return canonicalNode{kind: kind, from: from, to: len(c.text), end: decoded}, nil
}

// escapeLen returns the length of the valid escape at c.in[i], a backslash.
func (c *Canonicalizer) escapeLen(i int) (int, error) {
	c.pos = i + 1
	if c.pos == len(c.in) {
		return 0, c.syntaxError("")
	}
	switch c.in[c.pos] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, nil
	case 'u':
		for c.pos = i + 2; c.pos < i+6; c.pos++ {
			if c.pos == len(c.in) {
				return 0, c.syntaxError("")
			}
			if !isHex(c.in[c.pos]) {
				return 0, c.syntaxError(`in \u hexadecimal character escape`)
			}
		}
		return 6, nil
	}
	return 0, c.syntaxError("in string escape code")
}

// isPlainStringByte reports that b, in a string, is ASCII that
// AppendString writes as it is.
func isPlainStringByte(b byte) bool {
	return 0x20 <= b && b < utf8.RuneSelf && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&'
}

func isHex(b byte) bool {
	return isDecimalDigit(b) || 'a' <= b && b <= 'f' || 'A' <= b && b <= 'F'
}

// writtenAsIs reports that AppendString writes s, which has no escape nor
// HTML character, as it is: s is valid UTF-8 without U+2028 or U+2029.
func writtenAsIs(s []byte) bool {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			return false
		}
		i += size
	}
	return true
}

// appendUnquoted appends the decoded bytes of s, the valid contents of a
// JSON string, as Unmarshal decodes them: a surrogate escape that is not
// half of a pair, and every byte of invalid UTF-8, is U+FFFD. replaced
// reports that one was.
func appendUnquoted(dst, s []byte) (_ []byte, replaced bool) {
	for i := 0; i < len(s); {
		b := s[i]
		switch {
		case b == '\\':
			if s[i+1] == 'u' {
				r := hexRune(s[i+2 : i+6])
				i += 6
				if utf16.IsSurrogate(r) && i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
					if pair := utf16.DecodeRune(r, hexRune(s[i+2:i+6])); pair != utf8.RuneError {
						r = pair
						i += 6
					}
				}
				// A lone surrogate is written as utf8.RuneError.
				replaced = replaced || utf16.IsSurrogate(r)
				dst = utf8.AppendRune(dst, r)
				continue
			}
			dst = append(dst, unescaped(s[i+1]))
			i += 2
		case b < utf8.RuneSelf:
			dst = append(dst, b)
			i++
		default:
			r, size := utf8.DecodeRune(s[i:])
			replaced = replaced || r == utf8.RuneError && size == 1
			dst = utf8.AppendRune(dst, r)
			i += size
		}
	}
	return dst, replaced
}

// unescaped returns the byte the escape \b stands for (not \u).
func unescaped(b byte) byte {
	switch b {
	case 'b':
		return '\b'
	case 'f':
		return '\f'
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 't':
		return '\t'
	}
	return b // " \ /
}

// hexRune returns the rune of the four valid hex digits of h.
func hexRune(h []byte) rune {
	var r rune
	for _, b := range h {
		switch {
		case b <= '9':
			b -= '0'
		case b <= 'F':
			b -= 'A' - 10
		default:
			b -= 'a' - 10
		}
		r = r<<4 | rune(b)
	}
	return r
}

// write appends the value whose first node is c.nodes[i], and returns the
// index of the node after its last one.
func (c *Canonicalizer) write(dst []byte, i int) ([]byte, int) {
	n := &c.nodes[i]
	switch n.kind {
	case objectNode:
		return c.writeObject(dst, i), n.end
	case arrayNode:
		dst = append(dst, '[')
		for j := i + 1; j < n.end; {
			if j > i+1 {
				dst = append(dst, ',')
			}
			dst, j = c.write(dst, j)
		}
		return append(dst, ']'), n.end
	}
	return append(dst, c.bytes(n)...), i + 1
}

// writeObject appends the object c.nodes[i] with its members sorted by
// name; of members with the same name, the last one's value is written,
// as a map decoded in input order keeps it.
func (c *Canonicalizer) writeObject(dst []byte, i int) []byte {
	end := c.nodes[i].end
	base := len(c.members)
	for j := i + 1; j < end; j = c.next(j + 1) {
		c.members = append(c.members, j)
	}
	top := len(c.members)
	slices.SortStableFunc(c.members[base:top], func(a, b int) int {
		return bytes.Compare(c.name(a), c.name(b))
	})
	dst = append(dst, '{')
	first := true
	// The members of the objects nested in this one are pushed above top
	// and popped again as they are written.
	for k := base; k < top; k++ {
		j := c.members[k]
		if k+1 < top && bytes.Equal(c.name(j), c.name(c.members[k+1])) {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, c.bytes(&c.nodes[j])...)
		dst = append(dst, ':')
		dst, _ = c.write(dst, j+1)
	}
	c.members = c.members[:base]
	return append(dst, '}')
}

// next returns the index of the node after the value whose first node is
// c.nodes[j].
func (c *Canonicalizer) next(j int) int {
	if k := c.nodes[j].kind; k == objectNode || k == arrayNode {
		return c.nodes[j].end
	}
	return j + 1
}

// bytes returns the canonical bytes of a leaf or a name.
func (c *Canonicalizer) bytes(n *canonicalNode) []byte {
	if n.inInput {
		return c.in[n.from:n.to]
	}
	return c.text[n.from:n.to]
}

// name returns the decoded bytes of the name c.nodes[j].
func (c *Canonicalizer) name(j int) []byte {
	n := &c.nodes[j]
	if n.inInput {
		return c.in[n.from+1 : n.to-1]
	}
	return c.text[n.end:n.from]
}
