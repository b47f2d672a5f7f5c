package modelproxy

import (
	"bytes"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

// spliceChatReply is rewriteChatReply done on the reply's bytes: the
// fields it removes are cut out, the ones it adds appended to
// choices[0].message, and every other byte is copied as the upstream wrote
// it, where the map form decodes every member and encodes it again, most
// of a proxied call's CPU. ok is false for a reply it does not read (a key
// with an escape, a choice that is not an object, no choices array): the
// caller then takes the map form, which decides what such a reply is.
// The reply was decoded whole before (chatOnce), so it is valid JSON.
func spliceChatReply(body []byte, tf openai.TokenFields, withTokens, keepLogprobs bool) (out []byte, ok bool) {
	out = make([]byte, 0, len(body)+tokenFieldsSize(tf, withTokens))
	sawChoices := false
	out, ok = spliceObject(out, body, func(out []byte, key, value []byte) ([]byte, bool, bool) {
		switch string(key) {
		case "prompt_token_ids":
			return out, false, true
		case "choices":
			sawChoices = true
			out, ok := spliceChoices(out, value, tf, withTokens, keepLogprobs)
			return out, true, ok
		}
		return append(out, value...), true, true
	}, nil)
	return out, ok && sawChoices
}

// tokenFieldsSize guesses the bytes the token fields add.
func tokenFieldsSize(tf openai.TokenFields, withTokens bool) int {
	if !withTokens {
		return 0
	}
	return 128 + 8*(len(tf.PromptTokenIDs)+len(tf.GenerationTokenIDs)) + 24*len(tf.GenerationLogProbs)
}

// spliceObject copies the object at the start of b to out member by
// member: member writes a member's value (after out's `"key":`) and
// returns keep false to leave the member out (what it wrote is then
// dropped); tail appends members after the last one, each with a leading
// comma when needed (it is told whether any member was written).
func spliceObject(out, b []byte, member func(out, key, value []byte) (o []byte, keep, ok bool), tail func(out []byte, first bool) ([]byte, bool)) ([]byte, bool) {
	rest := codec.SkipSpace(b)
	if len(rest) == 0 || rest[0] != '{' {
		return nil, false
	}
	rest = codec.SkipSpace(rest[1:])
	out = append(out, '{')
	first := true
	if len(rest) == 0 || rest[0] != '}' {
		for {
			key, r, ok := codec.CutString(rest)
			if !ok {
				return nil, false
			}
			r = codec.SkipSpace(r)
			if len(r) == 0 || r[0] != ':' {
				return nil, false
			}
			value, r, ok := codec.CutValue(r[1:])
			if !ok {
				return nil, false
			}
			mark := len(out)
			if !first {
				out = append(out, ',')
			}
			out = append(out, '"')
			out = append(out, key...)
			out = append(out, '"', ':')
			o, keep, ok := member(out, key, value)
			if !ok {
				return nil, false
			}
			if keep {
				out, first = o, false
			} else {
				out = out[:mark]
			}
			r = codec.SkipSpace(r)
			if len(r) == 0 {
				return nil, false
			}
			if r[0] == '}' {
				break
			}
			if r[0] != ',' {
				return nil, false
			}
			rest = codec.SkipSpace(r[1:])
		}
	}
	if tail != nil {
		var ok bool
		if out, ok = tail(out, first); !ok {
			return nil, false
		}
	}
	return append(out, '}'), true
}

// spliceChoices copies the choices array, each choice without token_ids
// (and logprobs unless kept); the first one's routed_experts moves to its
// message, which gets the token fields when withTokens.
func spliceChoices(out, value []byte, tf openai.TokenFields, withTokens, keepLogprobs bool) ([]byte, bool) {
	rest := codec.SkipSpace(value)
	if len(rest) == 0 || rest[0] != '[' {
		return nil, false
	}
	rest = codec.SkipSpace(rest[1:])
	out = append(out, '[')
	if len(rest) > 0 && rest[0] == ']' {
		return append(out, ']'), true
	}
	for i := 0; ; i++ {
		choice, r, ok := codec.CutValue(rest)
		if !ok {
			return nil, false
		}
		if i > 0 {
			out = append(out, ',')
		}
		switch {
		case string(choice) == "null":
			out = append(out, "null"...)
		case i == 0:
			if out, ok = spliceFirstChoice(out, choice, tf, withTokens, keepLogprobs); !ok {
				return nil, false
			}
		default:
			if out, ok = spliceObject(out, choice, func(out, key, value []byte) ([]byte, bool, bool) {
				if string(key) == "token_ids" || (!keepLogprobs && string(key) == "logprobs") {
					return out, false, true
				}
				return append(out, value...), true, true
			}, nil); !ok {
				return nil, false
			}
		}
		r = codec.SkipSpace(r)
		if len(r) == 0 {
			return nil, false
		}
		if r[0] == ']' {
			return append(out, ']'), true
		}
		if r[0] != ',' {
			return nil, false
		}
		rest = codec.SkipSpace(r[1:])
	}
}

// spliceFirstChoice copies choices[0] as spliceChoices says. Its members
// are read once: routed_experts may come after the message it moves to.
func spliceFirstChoice(out, choice []byte, tf openai.TokenFields, withTokens, keepLogprobs bool) ([]byte, bool) {
	var held [8][2][]byte
	members := held[:0]
	var routed, message []byte
	if _, ok := spliceObject(nil, choice, func(out, key, value []byte) ([]byte, bool, bool) {
		switch string(key) {
		case "routed_experts":
			if v := bytes.TrimSpace(value); len(v) > 0 && string(v) != "null" {
				routed = v
			}
		case "message":
			message = value
		}
		members = append(members, [2][]byte{key, value})
		return out, false, true
	}, nil); !ok {
		return nil, false
	}
	rewrite := withTokens || routed != nil
	if rewrite && message == nil {
		return nil, false // the map form says what a choice without a message is
	}
	out = append(out, '{')
	first := true
	for _, m := range members {
		key, value := m[0], m[1]
		switch {
		case string(key) == "token_ids" || (!keepLogprobs && string(key) == "logprobs"):
			continue
		case string(key) == "routed_experts" && routed != nil:
			continue
		}
		if !first {
			out = append(out, ',')
		}
		first = false
		out = append(out, '"')
		out = append(out, key...)
		out = append(out, '"', ':')
		if string(key) == "message" && rewrite {
			var ok bool
			if out, ok = spliceMessage(out, value, tf, withTokens, routed); !ok {
				return nil, false
			}
			continue
		}
		out = append(out, value...)
	}
	return append(out, '}'), true
}

// spliceMessage copies a message with the token fields (when withTokens)
// and routed_experts (when not nil) set, replacing any it had.
func spliceMessage(out, msg []byte, tf openai.TokenFields, withTokens bool, routed []byte) ([]byte, bool) {
	return spliceObject(out, msg, func(out, key, value []byte) ([]byte, bool, bool) {
		switch string(key) {
		case "prompt_token_ids", "generation_token_ids", "generation_log_probs":
			if withTokens {
				return out, false, true
			}
		case "routed_experts":
			if routed != nil {
				return out, false, true
			}
		}
		return append(out, value...), true, true
	}, func(out []byte, first bool) ([]byte, bool) {
		field := func(name string) {
			if !first {
				out = append(out, ',')
			}
			first = false
			out = append(out, '"')
			out = append(out, name...)
			out = append(out, '"', ':')
		}
		if withTokens {
			field("prompt_token_ids")
			out = appendIntsOrNull(out, tf.PromptTokenIDs)
			field("generation_token_ids")
			out = appendIntsOrNull(out, tf.GenerationTokenIDs)
			field("generation_log_probs")
			if tf.GenerationLogProbs == nil {
				out = append(out, "null"...)
			} else {
				var err error
				if out, err = codec.AppendFloats(out, tf.GenerationLogProbs); err != nil {
					return nil, false
				}
			}
		}
		if routed != nil {
			field("routed_experts")
			out = append(out, routed...)
		}
		return out, true
	})
}

// appendIntsOrNull appends v as a JSON array, null for nil, as
// codec.Marshal writes it.
func appendIntsOrNull(out []byte, v []int) []byte {
	if v == nil {
		return append(out, "null"...)
	}
	return codec.AppendInts(out, v)
}
