package agent

import "strings"

// cutBoundary splits a session record as Export writes it, with the loop
// state as its last member, into the record with a null boundary and the
// boundary's bytes. The caller decodes the small rest strictly and only
// checks the loop state (most of a record's bytes: the strict decode of the
// whole record was most of an agent restore's CPU) before keeping it as it
// is. ok is false for a record of any other shape (the boundary elsewhere or
// twice, a key with escapes, malformed JSON): the caller decodes that one
// the general way, which also words its errors.
func cutBoundary(data []byte) (head, boundary []byte, ok bool) {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return nil, nil, false
	}
	i++
	for {
		i = skipSpace(data, i)
		keyStart := i
		end, escaped := skipString(data, i)
		if end < 0 || escaped {
			return nil, nil, false
		}
		key := string(data[keyStart+1 : end-1])
		i = skipSpace(data, end)
		if i >= len(data) || data[i] != ':' {
			return nil, nil, false
		}
		valueStart := skipSpace(data, i+1)
		valueEnd := skipValue(data, valueStart)
		if valueEnd < 0 {
			return nil, nil, false
		}
		i = skipSpace(data, valueEnd)
		if i >= len(data) {
			return nil, nil, false
		}
		last := data[i] == '}'
		if !last && data[i] != ',' {
			return nil, nil, false
		}
		// encoding/json matches member names without regard to case: any
		// spelling of boundary but the last member's is the general way's.
		if strings.EqualFold(key, "boundary") {
			if !last || key != "boundary" {
				return nil, nil, false
			}
			if skipSpace(data, i+1) != len(data) {
				return nil, nil, false
			}
			head = append(append(make([]byte, 0, valueStart+len("null}")), data[:valueStart]...), "null}"...)
			return head, data[valueStart:valueEnd], true
		}
		if last {
			return nil, nil, false
		}
		i++
	}
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && isJSONSpace(data[i]) {
		i++
	}
	return i
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// skipString returns the index after the JSON string starting at i, and
// whether it holds an escape; -1 if there is none.
func skipString(data []byte, i int) (end int, escaped bool) {
	if i >= len(data) || data[i] != '"' {
		return -1, false
	}
	for i++; i < len(data); i++ {
		switch data[i] {
		case '"':
			return i + 1, escaped
		case '\\':
			escaped = true
			i++
		}
	}
	return -1, false
}

// skipValue returns the index after the JSON value starting at i, or -1.
// It finds where a value ends, strings and nesting included, without
// validating it: the decoders the caller runs on what it cut do.
func skipValue(data []byte, i int) int {
	if i >= len(data) {
		return -1
	}
	switch data[i] {
	case '"':
		end, _ := skipString(data, i)
		return end
	case '{', '[':
		depth := 0
		for i < len(data) {
			switch data[i] {
			case '"':
				end, _ := skipString(data, i)
				if end < 0 {
					return -1
				}
				i = end
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return -1
	}
	end := i
	for end < len(data) && strings.IndexByte(",}] \t\r\n", data[end]) < 0 {
		end++
	}
	if end == i {
		return -1
	}
	return end
}
