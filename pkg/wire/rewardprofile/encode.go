package rewardprofile

import (
	"bytes"
	"math"
	"strconv"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// outObj is a reply object in Gym's key order. Values are int64, float64,
// string, value (a verify reply's, as sent), *outObj or []any.
type outObj struct {
	keys []string
	vals []any
}

func (o *outObj) add(k string, v any) {
	o.keys = append(o.keys, k)
	o.vals = append(o.vals, v)
}

// set replaces k's value in its place, or adds it: a Python dict's
// assignment.
func (o *outObj) set(k string, v any) {
	for i, have := range o.keys {
		if have == k {
			o.vals[i] = v
			return
		}
	}
	o.add(k, v)
}

func (m *metrics) appendJSON(dst []byte) ([]byte, error) {
	dst = append(dst, `{"group_level_metrics":[`...)
	var err error
	for i, g := range m.groups {
		if i > 0 {
			dst = append(dst, ',')
		}
		if dst, err = appendValue(dst, g); err != nil {
			return nil, err
		}
	}
	dst = append(dst, `],"agent_metrics":`...)
	if dst, err = appendValue(dst, m.agent); err != nil {
		return nil, err
	}
	dst = append(dst, `,"key_metrics":`...)
	if dst, err = appendValue(dst, m.key); err != nil {
		return nil, err
	}
	dst = append(dst, `,"perf_summary":`...)
	if m.perf == nil {
		dst = append(dst, "null"...)
	} else if dst, err = appendValue(dst, m.perf); err != nil {
		return nil, err
	}
	dst = append(dst, `,"repeat_level_metrics":[`...)
	for i, e := range m.repeats {
		if i > 0 {
			dst = append(dst, ',')
		}
		if dst, err = appendValue(dst, e); err != nil {
			return nil, err
		}
	}
	return append(dst, "]}"...), nil
}

func appendValue(dst []byte, v any) ([]byte, error) {
	var err error
	switch v := v.(type) {
	case int64:
		return strconv.AppendInt(dst, v, 10), nil
	case float64:
		if math.IsInf(v, 0) || math.IsNaN(v) {
			// Python's json refuses them too (Gym answers 500).
			return nil, errorf("a metric overflows a float64: %v", v)
		}
		return appendGymFloat(dst, v), nil
	case string:
		return codec.AppendString(dst, v), nil
	case value:
		switch v.kind {
		case kindInt:
			return strconv.AppendInt(dst, v.i, 10), nil
		case kindFloat:
			return appendGymFloat(dst, v.f), nil
		}
		var buf bytes.Buffer
		if err := codec.Compact(&buf, v.raw); err != nil {
			return nil, err
		}
		return append(dst, buf.Bytes()...), nil
	case *outObj:
		dst = append(dst, '{')
		for i, k := range v.keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(codec.AppendString(dst, k), ':')
			if dst, err = appendValue(dst, v.vals[i]); err != nil {
				return nil, err
			}
		}
		return append(dst, '}'), nil
	case []any:
		dst = append(dst, '[')
		for i, e := range v {
			if i > 0 {
				dst = append(dst, ',')
			}
			if dst, err = appendValue(dst, e); err != nil {
				return nil, err
			}
		}
		return append(dst, ']'), nil
	}
	return dst, errorf("rewardprofile: cannot encode %T", v)
}

// appendGymFloat writes f as Gym's reply writes it: FastAPI serializes the
// AggregateMetrics model through pydantic-core (nemo-gym 0.7.0 with
// pydantic-core 2.50), which writes the shortest digits that read back, in
// positional notation with at least one fractional digit when the decimal
// exponent is from -5 to 15, else d.ddde+X / d.ddde-X (no zero padding;
// Python's repr starts the exponent form at 1e-5 and pads it). So 1.0 stays
// 1.0 and a reader comparing our reply with Gym's sees the same text. f is
// finite.
func appendGymFloat(dst []byte, f float64) []byte {
	if f == 0 {
		if math.Signbit(f) {
			return append(dst, "-0.0"...)
		}
		return append(dst, "0.0"...)
	}
	// 'e' with the shortest digits: [-]d[.ddd]e±XX.
	e := strconv.AppendFloat(nil, f, 'e', -1, 64)
	neg := e[0] == '-'
	if neg {
		e = e[1:]
	}
	mant, expPart, _ := bytes.Cut(e, []byte("e"))
	exp, _ := strconv.Atoi(string(expPart))
	digits := make([]byte, 0, len(mant))
	for _, c := range mant {
		if c != '.' {
			digits = append(digits, c)
		}
	}
	if neg {
		dst = append(dst, '-')
	}
	if exp < -5 || exp >= 16 {
		dst = append(dst, digits[0])
		if len(digits) > 1 {
			dst = append(append(dst, '.'), digits[1:]...)
		}
		dst = append(dst, 'e')
		if exp < 0 {
			dst = append(dst, '-')
			exp = -exp
		} else {
			dst = append(dst, '+')
		}
		return strconv.AppendInt(dst, int64(exp), 10)
	}
	point := exp + 1 // digits before the decimal point
	switch {
	case point <= 0:
		dst = append(dst, "0."...)
		for range -point {
			dst = append(dst, '0')
		}
		return append(dst, digits...)
	case point >= len(digits):
		dst = append(dst, digits...)
		for range point - len(digits) {
			dst = append(dst, '0')
		}
		return append(dst, ".0"...)
	default:
		dst = append(dst, digits[:point]...)
		return append(append(dst, '.'), digits[point:]...)
	}
}
