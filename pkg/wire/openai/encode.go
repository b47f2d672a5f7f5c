package openai

import "github.com/gymfleet/gymfleet/pkg/wire/codec"

// The MarshalJSON methods of the item family (Input, Item, MessageContent,
// ContentPart) write their wire shapes with codec's Append functions rather
// than by calling codec.Marshal on a wire struct: each such call nests
// goccy's encoder (a 3 KB frame and its callers) once more, and a request
// of items of parts nested it five times, which grew every goroutine that
// encoded one (each of 100,000 rollouts' handlers) to a 32 KB stack.
// encode_test.go checks the bytes against the wire structs encoded by
// encoding/json.

// MarshalJSON writes a string or a list: Items, then Then.
func (in Input) MarshalJSON() ([]byte, error) {
	if !in.IsItems {
		return codec.AppendString(nil, in.Text), nil
	}
	b := append(make([]byte, 0, 256*(len(in.Items)+len(in.Then))+2), '[')
	n := 0
	for _, list := range [2][]Item{in.Items, in.Then} {
		for _, it := range list {
			if n > 0 {
				b = append(b, ',')
			}
			n++
			var err error
			if b, err = it.appendJSON(b); err != nil {
				return nil, err
			}
		}
	}
	return append(b, ']'), nil
}

// MarshalJSON writes the item in its type's wire shape.
func (it Item) MarshalJSON() ([]byte, error) {
	return it.appendJSON(make([]byte, 0, 256))
}

// AppendJSON appends the item as MarshalJSON writes it, for an encoder of
// a larger value that writes into a buffer of its own (the agent's
// checkpoint records). On an error it returns no bytes.
func (it Item) AppendJSON(b []byte) ([]byte, error) { return it.appendJSON(b) }

func (it Item) appendJSON(b []byte) ([]byte, error) {
	if it.encoded != nil {
		return append(b, it.encoded...), nil
	}
	var err error
	switch it.Type {
	case ItemFunctionCall:
		b = appendField(b, '{', "type", it.Type)
		b = appendOptional(b, "id", it.ID)
		b = appendField(b, ',', "call_id", it.CallID)
		b = appendField(b, ',', "name", it.Name)
		b = appendField(b, ',', "arguments", it.Arguments)
		b = appendOptional(b, "status", it.Status)
		b, err = it.TokenFields.appendJSON(b)
	case ItemFunctionCallOutput:
		out := it.Output
		if out == nil {
			out = TextContent("")
		}
		b = appendField(b, '{', "type", it.Type)
		b = appendOptional(b, "id", it.ID)
		b = appendField(b, ',', "call_id", it.CallID)
		b = append(b, `,"output":`...)
		if b, err = out.appendJSON(b); err != nil {
			return nil, err
		}
		b = appendOptional(b, "status", it.Status)
	case ItemReasoning:
		b = append(b, '{')
		if it.ID != "" {
			b = appendField(b, 0, "id", it.ID)
			b = append(b, ',')
		}
		b = appendField(b, 0, "type", it.Type)
		b = append(b, `,"summary":[`...)
		for i, s := range it.Summary {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendField(b, '{', "type", s.Type)
			b = appendField(b, ',', "text", s.Text)
			b = append(b, '}')
		}
		b = append(b, `],"encrypted_content":`...)
		if it.EncryptedContent == nil {
			b = append(b, "null"...)
		} else {
			b = codec.AppendString(b, *it.EncryptedContent)
		}
		// The reference writes a reasoning item's content, always null here.
		b = append(b, `,"content":null`...)
		b, err = it.TokenFields.appendJSON(b)
	default:
		typ := it.Type
		if typ == "" {
			typ = ItemMessage
		}
		c := it.Content
		if c == nil {
			c = TextContent("")
		}
		b = append(b, '{')
		if it.ID != "" {
			b = appendField(b, 0, "id", it.ID)
			b = append(b, ',')
		}
		b = appendField(b, 0, "type", typ)
		b = appendField(b, ',', "role", it.Role)
		b = appendOptional(b, "status", it.Status)
		b = append(b, `,"content":`...)
		if b, err = c.appendJSON(b); err != nil {
			return nil, err
		}
		b, err = it.TokenFields.appendJSON(b)
	}
	if err != nil {
		return nil, err
	}
	if len(it.RoutedExperts) > 0 {
		b = append(b, `,"routed_experts":`...)
		if b, err = codec.AppendRaw(b, it.RoutedExperts); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

// appendJSON appends the token fields that are set, each after a comma.
func (t TokenFields) appendJSON(b []byte) ([]byte, error) {
	if len(t.PromptTokenIDs) > 0 {
		b = append(b, `,"prompt_token_ids":`...)
		b = codec.AppendInts(b, t.PromptTokenIDs)
	}
	if len(t.GenerationTokenIDs) > 0 {
		b = append(b, `,"generation_token_ids":`...)
		b = codec.AppendInts(b, t.GenerationTokenIDs)
	}
	if len(t.GenerationLogProbs) > 0 {
		b = append(b, `,"generation_log_probs":`...)
		return codec.AppendFloats(b, t.GenerationLogProbs)
	}
	return b, nil
}

// MarshalJSON writes a string or a list.
func (c MessageContent) MarshalJSON() ([]byte, error) {
	return c.appendJSON(make([]byte, 0, len(c.Text)+64*len(c.Parts)+16))
}

func (c MessageContent) appendJSON(b []byte) ([]byte, error) {
	if !c.IsParts {
		return codec.AppendString(b, c.Text), nil
	}
	return appendList(b, c.Parts, ContentPart.appendJSON)
}

// MarshalJSON writes output_text parts with annotations and logprobs always
// present (OpenAI clients read them, [] and null by default), and every
// other part with only the fields it sets; a media part carries no text
// (vLLM's media part types do not declare it).
func (p ContentPart) MarshalJSON() ([]byte, error) {
	return p.appendJSON(make([]byte, 0, len(p.Text)+64))
}

func (p ContentPart) appendJSON(b []byte) ([]byte, error) {
	var err error
	b = appendField(b, '{', "type", p.Type)
	if p.Type == "output_text" {
		b = appendField(b, ',', "text", p.Text)
		b = append(b, `,"annotations":`...)
		if len(p.Annotations) == 0 {
			b = append(b, "[]"...)
		} else if b, err = appendAny(b, p.Annotations); err != nil {
			return nil, err
		}
		b = append(b, `,"logprobs":`...)
		if len(p.Logprobs) == 0 {
			b = append(b, "null"...)
		} else if b, err = codec.AppendRaw(b, p.Logprobs); err != nil {
			return nil, err
		}
		return append(b, '}'), nil
	}
	if p.Text != "" || p.Type == "text" || p.Type == "input_text" {
		b = appendField(b, ',', "text", p.Text)
	}
	if len(p.Annotations) > 0 {
		b = append(b, `,"annotations":`...)
		if b, err = appendAny(b, p.Annotations); err != nil {
			return nil, err
		}
	}
	if b, err = appendOptionalRaw(b, "logprobs", p.Logprobs); err != nil {
		return nil, err
	}
	if b, err = appendOptionalRaw(b, "image_url", p.ImageURL); err != nil {
		return nil, err
	}
	b = appendOptional(b, "detail", p.Detail)
	if b, err = appendOptionalRaw(b, "video_url", p.VideoURL); err != nil {
		return nil, err
	}
	return append(b, '}'), nil
}

// appendList appends items as a JSON array ([] for none).
func appendList[T any](b []byte, items []T, appendOne func(T, []byte) ([]byte, error)) ([]byte, error) {
	b = append(b, '[')
	for i, it := range items {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = appendOne(it, b); err != nil {
			return nil, err
		}
	}
	return append(b, ']'), nil
}

// appendField appends sep (none when 0), then "name":"value".
func appendField(b []byte, sep byte, name, value string) []byte {
	if sep != 0 {
		b = append(b, sep)
	}
	b = append(b, '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	return codec.AppendString(b, value)
}

// appendOptional appends ,"name":"value" unless value is empty (omitempty).
func appendOptional(b []byte, name, value string) []byte {
	if value == "" {
		return b
	}
	return appendField(b, ',', name, value)
}

// appendOptionalRaw appends ,"name":raw unless raw is empty (omitempty).
func appendOptionalRaw(b []byte, name string, raw codec.RawMessage) ([]byte, error) {
	if len(raw) == 0 {
		return b, nil
	}
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	return codec.AppendRaw(b, raw)
}

// appendAny appends v encoded by codec.Marshal: free-form values
// (annotations) that are rare and shallow.
func appendAny(b []byte, v any) ([]byte, error) {
	enc, err := codec.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, enc...), nil
}
