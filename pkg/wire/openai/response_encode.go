package openai

import (
	"slices"
	"strconv"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// The AppendJSON methods of Response and the types it holds write the
// bytes codec.Marshal writes for them (their fields in order, by their
// tags), without goccy's reflection and with no buffer of their own: the
// agent writes a Response into every checkpoint record of a session in
// progress, 100,000 records a commit. response_encode_test.go checks the
// bytes against codec.Marshal, and fails when one of these structs gains a
// field its appender does not write.

// AppendJSON appends the response as codec.Marshal writes it. On an error
// (a raw field that is not JSON, a temperature that is not a number) it
// returns no bytes.
func (r *Response) AppendJSON(b []byte) ([]byte, error) {
	var err error
	b = appendField(b, '{', "id", r.ID)
	b = appendField(b, ',', "object", r.Object)
	b = append(b, `,"created_at":`...)
	if b, err = codec.AppendFloat(b, r.CreatedAt); err != nil {
		return nil, err
	}
	b = appendField(b, ',', "model", r.Model)
	b = append(b, `,"output":`...)
	if b, err = appendListOrNull(b, r.Output, Item.appendJSON); err != nil {
		return nil, err
	}
	b = append(b, `,"parallel_tool_calls":`...)
	b = strconv.AppendBool(b, r.ParallelToolCalls)
	b = append(b, `,"tool_choice":`...)
	if b, err = codec.AppendRawMessage(b, r.ToolChoice); err != nil {
		return nil, err
	}
	b = append(b, `,"tools":`...)
	if b, err = appendListOrNull(b, r.Tools, Tool.appendJSON); err != nil {
		return nil, err
	}
	b = append(b, `,"temperature":`...)
	if b, err = appendFloatOrNull(b, r.Temperature); err != nil {
		return nil, err
	}
	b = append(b, `,"top_p":`...)
	if b, err = appendFloatOrNull(b, r.TopP); err != nil {
		return nil, err
	}
	b = appendField(b, ',', "status", r.Status)
	b = append(b, `,"incomplete_details":`...)
	if r.IncompleteDetails == nil {
		b = append(b, "null"...)
	} else {
		b = r.IncompleteDetails.appendJSON(b)
	}
	b = append(b, `,"usage":`...)
	if r.Usage == nil {
		b = append(b, "null"...)
	} else {
		b = r.Usage.AppendJSON(b)
	}
	b = append(b, `,"error":`...)
	if b, err = codec.AppendRawMessage(b, r.Error); err != nil {
		return nil, err
	}
	b = append(b, `,"instructions":`...)
	if r.Instructions == nil {
		b = append(b, "null"...)
	} else {
		b = codec.AppendString(b, *r.Instructions)
	}
	b = append(b, `,"metadata":`...)
	b = appendStringMap(b, r.Metadata)
	b = append(b, `,"max_output_tokens":`...)
	b = appendIntOrNull(b, r.MaxOutputTokens)
	if r.TopLogprobs != nil {
		b = append(b, `,"top_logprobs":`...)
		b = strconv.AppendInt(b, int64(*r.TopLogprobs), 10)
	}
	return append(b, '}'), nil
}

// appendJSON appends the tool as codec.Marshal writes it: description,
// parameters and strict only when set (omitempty).
func (t Tool) appendJSON(b []byte) ([]byte, error) {
	b = appendField(b, '{', "type", t.Type)
	b = appendField(b, ',', "name", t.Name)
	b = appendOptional(b, "description", t.Description)
	var err error
	if len(t.Parameters) > 0 {
		b = append(b, `,"parameters":`...)
		if b, err = codec.AppendRawMessage(b, t.Parameters); err != nil {
			return nil, err
		}
	}
	if t.Strict != nil {
		b = append(b, `,"strict":`...)
		b = strconv.AppendBool(b, *t.Strict)
	}
	return append(b, '}'), nil
}

// AppendJSON appends the usage as codec.Marshal writes it.
func (u *ResponseUsage) AppendJSON(b []byte) []byte {
	b = append(b, `{"input_tokens":`...)
	b = strconv.AppendInt(b, int64(u.InputTokens), 10)
	b = append(b, `,"input_tokens_details":{"cached_tokens":`...)
	b = appendIntOrNull(b, u.InputTokensDetails.CachedTokens)
	b = append(b, `},"output_tokens":`...)
	b = strconv.AppendInt(b, int64(u.OutputTokens), 10)
	b = append(b, `,"output_tokens_details":{"reasoning_tokens":`...)
	b = appendIntOrNull(b, u.OutputTokensDetails.ReasoningTokens)
	b = append(b, `},"total_tokens":`...)
	b = strconv.AppendInt(b, int64(u.TotalTokens), 10)
	return append(b, '}')
}

// appendJSON appends the details as codec.Marshal writes them.
func (d *IncompleteDetails) appendJSON(b []byte) []byte {
	b = appendField(b, '{', "reason", d.Reason)
	return append(b, '}')
}

// appendListOrNull appends items as a JSON array, or null for a nil slice
// as the encoders write a slice without omitempty.
func appendListOrNull[T any](b []byte, items []T, appendOne func(T, []byte) ([]byte, error)) ([]byte, error) {
	if items == nil {
		return append(b, "null"...), nil
	}
	return appendList(b, items, appendOne)
}

// appendFloatOrNull appends *f, or null for nil.
func appendFloatOrNull(b []byte, f *float64) ([]byte, error) {
	if f == nil {
		return append(b, "null"...), nil
	}
	return codec.AppendFloat(b, *f)
}

// appendIntOrNull appends *n, or null for nil.
func appendIntOrNull(b []byte, n *int) []byte {
	if n == nil {
		return append(b, "null"...)
	}
	return strconv.AppendInt(b, int64(*n), 10)
}

// appendStringMap appends m as the encoders write a map[string]string: its
// keys sorted (as Go strings, before escaping), null for a nil map.
func appendStringMap(b []byte, m map[string]string) []byte {
	if m == nil {
		return append(b, "null"...)
	}
	if len(m) == 0 {
		return append(b, "{}"...)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = codec.AppendString(b, k)
		b = append(b, ':')
		b = codec.AppendString(b, m[k])
	}
	return append(b, '}')
}
