package codec

import (
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Ints is a JSON array of integers (token ids) that decodes itself with a
// direct scan. Token arrays are most of the bytes of capture rows and agent
// checkpoint records, and the generic decoders grow such slices through
// reflection one element at a time.
type Ints []int

// Floats is a JSON array of numbers (log-probabilities), decoded the same way.
type Floats []float64

var (
	errNotArray = errors.New("expected a JSON array of numbers")
	zero        = []byte("0")
)

// UnmarshalJSON accepts null (nil) or an array of JSON integers that fit an
// int, as encoding/json does for []int.
func (v *Ints) UnmarshalJSON(b []byte) error {
	return decodeNumbers(b, func(n int) { *v = make(Ints, 0, n) }, func(tok []byte) error {
		i, err := parseInt(tok)
		if err != nil {
			return err
		}
		*v = append(*v, i)
		return nil
	}, func() { *v = nil })
}

// UnmarshalJSON accepts null (nil) or an array of JSON numbers.
func (v *Floats) UnmarshalJSON(b []byte) error {
	return decodeNumbers(b, func(n int) { *v = make(Floats, 0, n) }, func(tok []byte) error {
		f, err := parseFloat(tok)
		if err != nil {
			return err
		}
		*v = append(*v, f)
		return nil
	}, func() { *v = nil })
}

// parseFloat reads a JSON number that must fit a float64.
func parseFloat(tok []byte) (float64, error) {
	f, err := strconv.ParseFloat(string(tok), 64)
	if err != nil || math.IsInf(f, 0) {
		return 0, fmt.Errorf("number %s does not fit a float64", tok)
	}
	return f, nil
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// decodeNumbers scans a JSON array of numbers, calling alloc (unless nil)
// with a capacity estimate, then each for every number token (validated
// against the JSON number grammar; "0" for a null element).
func decodeNumbers(b []byte, alloc func(int), each func([]byte) error, null func()) error {
	i := 0
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	if i+4 <= len(b) && string(b[i:i+4]) == "null" {
		for j := i + 4; j < len(b); j++ {
			if !isSpace(b[j]) {
				return errNotArray
			}
		}
		null()
		return nil
	}
	if i >= len(b) || b[i] != '[' {
		return errNotArray
	}
	i++
	if alloc != nil {
		commas := 0
		for _, c := range b[i:] {
			if c == ',' {
				commas++
			}
		}
		alloc(commas + 1)
	}
	first := true
	for {
		for i < len(b) && isSpace(b[i]) {
			i++
		}
		if i >= len(b) {
			return errNotArray
		}
		if b[i] == ']' {
			if !first && b[i-1] == ',' {
				return errNotArray
			}
			i++
			break
		}
		if !first {
			if b[i] != ',' {
				return errNotArray
			}
			i++
			for i < len(b) && isSpace(b[i]) {
				i++
			}
		}
		end := scanNumber(b, i)
		switch {
		case end > i:
			if err := each(b[i:end]); err != nil {
				return err
			}
		case i+4 <= len(b) && string(b[i:i+4]) == "null":
			// encoding/json leaves the zero value for a null element.
			end = i + 4
			if err := each(zero); err != nil {
				return err
			}
		default:
			return errNotArray
		}
		i = end
		first = false
	}
	for ; i < len(b); i++ {
		if !isSpace(b[i]) {
			return errNotArray
		}
	}
	return nil
}

// scanNumber returns the end of the JSON number starting at i, or i if
// there is none: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
func scanNumber(b []byte, i int) int {
	start := i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		return start
	}
	if i < len(b) && b[i] == '.' {
		j := i + 1
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
		if j == i+1 {
			return start
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		j := i + 1
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		k := j
		for k < len(b) && b[k] >= '0' && b[k] <= '9' {
			k++
		}
		if k == j {
			return start
		}
		i = k
	}
	return i
}

// parseInt reads a JSON number that must be an integer fitting an int.
func parseInt(tok []byte) (int, error) {
	neg := tok[0] == '-'
	digits := tok
	if neg {
		digits = tok[1:]
	}
	var n uint64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("number %s is not an integer", tok)
		}
		if n > (math.MaxUint64-9)/10 {
			return 0, fmt.Errorf("number %s overflows an int", tok)
		}
		n = n*10 + uint64(c-'0')
	}
	if neg {
		if n > 1<<63 {
			return 0, fmt.Errorf("number %s overflows an int", tok)
		}
		return int(-int64(n)), nil
	}
	if n > math.MaxInt64 {
		return 0, fmt.Errorf("number %s overflows an int", tok)
	}
	return int(n), nil
}
