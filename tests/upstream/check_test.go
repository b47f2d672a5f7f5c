package upstream_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"
)

// selectPath selects values in v. A path is dot-separated keys, each
// optionally followed by [n] (n < 0 counts from the end), [*] (every
// element) or [?key=value] (the elements whose string field key is value).
// The empty path selects v. A missing key or index selects nothing.
func selectPath(v any, path string) ([]any, error) {
	cur := []any{v}
	if path == "" {
		return cur, nil
	}
	for _, seg := range splitPath(path) {
		key, rest, _ := strings.Cut(seg, "[")
		if rest != "" {
			rest = "[" + rest
		}
		var next []any
		for _, c := range cur {
			if key == "" {
				next = append(next, c)
				continue
			}
			m, ok := c.(map[string]any)
			if !ok {
				continue
			}
			if x, ok := m[key]; ok {
				next = append(next, x)
			}
		}
		cur = next
		for rest != "" {
			end := strings.IndexByte(rest, ']')
			if !strings.HasPrefix(rest, "[") || end < 0 {
				return nil, fmt.Errorf("bad path segment %q", seg)
			}
			idx := rest[1:end]
			rest = rest[end+1:]
			next = nil
			for _, c := range cur {
				arr, ok := c.([]any)
				if !ok {
					continue
				}
				switch {
				case idx == "*":
					next = append(next, arr...)
				case strings.HasPrefix(idx, "?"):
					k, want, _ := strings.Cut(idx[1:], "=")
					for _, e := range arr {
						if m, ok := e.(map[string]any); ok && m[k] == want {
							next = append(next, e)
						}
					}
				default:
					n, err := strconv.Atoi(idx)
					if err != nil {
						return nil, fmt.Errorf("bad index %q", idx)
					}
					if n < 0 {
						n += len(arr)
					}
					if n >= 0 && n < len(arr) {
						next = append(next, arr[n])
					}
				}
			}
			cur = next
		}
	}
	return cur, nil
}

// splitPath splits a path at the dots outside brackets, so a filter value
// may hold dots ([?event=response.failed]).
func splitPath(path string) []string {
	var segs []string
	depth, start := 0, 0
	for i := 0; i < len(path); i++ {
		switch path[i] {
		case '[':
			depth++
		case ']':
			depth--
		case '.':
			if depth == 0 {
				segs = append(segs, path[start:i])
				start = i + 1
			}
		}
	}
	return append(segs, path[start:])
}

// wildcard reports whether a path may select several values.
func wildcard(path string) bool { return strings.Contains(path, "[*]") || strings.Contains(path, "[?") }

func (r *run) check(e Expect, ex *exchange) error {
	if ex.member != nil {
		// A fan-out step's eq_ref names the same participant's reply.
		e.EqRef = strings.ReplaceAll(e.EqRef, "$name", ex.member.Name)
	}
	if ex.member != nil && len(e.Eq) > 0 {
		// "$kind" and "$instance" are the participant's.
		var want any
		if json.Unmarshal(e.Eq, &want) == nil {
			e.Eq, _ = json.Marshal(forMember(want, ex.member))
		}
	}
	switch e.Check {
	case "gym_adapter_commit":
		return checkAdapterCommit(ex)
	case "gym_status":
		return checkGymStatus(ex)
	case "gym_store":
		return checkGymStore(ex)
	case "set_cookie":
		if len(ex.cookies) == 0 {
			return errors.New("the reply sets no cookie; NeMo Gym's agent passes on only the cookies each reply sets")
		}
		return nil
	case "no_event":
		// No value at Path (by default every event's type and name) is Arg.
		paths := []string{"events[*].data.type", "events[*].event"}
		if e.Path != "" {
			paths = []string{e.Path}
		}
		for _, p := range paths {
			vals, err := selectPath(ex.reply, p)
			if err != nil {
				return err
			}
			for _, v := range vals {
				if v == e.Arg {
					return fmt.Errorf("the stream has %s %q", p, e.Arg)
				}
			}
		}
		return nil
	}
	vals, err := selectPath(ex.reply, e.Path)
	if err != nil {
		return err
	}
	if e.Check == "any_eq" {
		for _, v := range vals {
			if v == e.Arg {
				return nil
			}
		}
		return fmt.Errorf("no value is %q (%d values)", e.Arg, len(vals))
	}
	if e.Check == "not_true" {
		for _, v := range vals {
			if v == true {
				return errors.New("true, want false or absent")
			}
		}
		return nil
	}
	if e.Absent {
		if len(vals) != 0 {
			return fmt.Errorf("present (%s), want absent", short(vals[0]))
		}
		return nil
	}
	if len(vals) == 0 {
		if e.Check == "no_delivered_records" {
			return nil
		}
		return errors.New("missing")
	}
	if !wildcard(e.Path) && len(vals) != 1 {
		return fmt.Errorf("%d values, want one", len(vals))
	}
	for i, v := range vals {
		if err := r.checkValue(e, v); err != nil {
			if len(vals) > 1 {
				return fmt.Errorf("value %d: %w", i, err)
			}
			return err
		}
	}
	return nil
}

func (r *run) checkValue(e Expect, v any) error {
	if e.Type != "" {
		if err := checkType(e.Type, v); err != nil {
			return err
		}
	}
	if len(e.Eq) > 0 {
		var want any
		if err := json.Unmarshal(e.Eq, &want); err != nil {
			return fmt.Errorf("fixture eq: %v", err)
		}
		if !jsonEqual(v, want) {
			return fmt.Errorf("%s, want %s", short(v), short(want))
		}
	}
	if e.EqRef != "" {
		step, path, _ := strings.Cut(e.EqRef, ":")
		ex, ok := r.done[step]
		if !ok {
			return fmt.Errorf("eq_ref names step %q, which has not run", step)
		}
		src := ex.reply
		if p, ok := strings.CutPrefix(path, "body."); ok {
			src, path = ex.body, p
		}
		wants, err := selectPath(src, path)
		if err != nil || len(wants) != 1 {
			return fmt.Errorf("eq_ref %s selects %d values (%v)", e.EqRef, len(wants), err)
		}
		if !jsonEqual(v, wants[0]) {
			return fmt.Errorf("%s, want %s (%s)", short(v), short(wants[0]), e.EqRef)
		}
	}
	if e.NonEmpty {
		switch x := v.(type) {
		case string:
			if x == "" {
				return errors.New("empty string")
			}
		case []any:
			if len(x) == 0 {
				return errors.New("empty array")
			}
		case map[string]any:
			if len(x) == 0 {
				return errors.New("empty object")
			}
		default:
			return fmt.Errorf("%s is not a string, array or object", short(v))
		}
	}
	if e.Len != nil {
		arr, ok := v.([]any)
		if !ok || len(arr) != *e.Len {
			return fmt.Errorf("%s, want an array of length %d", short(v), *e.Len)
		}
	}
	if e.Contains != "" {
		s, ok := v.(string)
		if !ok || !strings.Contains(s, e.Contains) {
			return fmt.Errorf("%s does not contain %q", short(v), e.Contains)
		}
	}
	if len(e.In) > 0 {
		found := false
		for _, w := range e.In {
			found = found || jsonEqual(v, w)
		}
		if !found {
			return fmt.Errorf("%s is not one of %s", short(v), short(e.In))
		}
	}
	if e.NotPrefix != "" {
		if s, ok := v.(string); ok && strings.HasPrefix(s, e.NotPrefix) {
			return fmt.Errorf("%q starts with %q", s, e.NotPrefix)
		}
	}
	switch e.Check {
	case "":
	case "gym_report":
		return checkGymReport(v)
	case "nemogym_response":
		return checkNeMoGymResponse(v)
	case "nemo_rl_trainable":
		return checkNeMoRLTrainable(v)
	case "text_of":
		// Chat message content as a string, or as parts whose first is
		// the text (what Gym's vllm_model test compares).
		if str, ok := v.(string); ok {
			if str != e.Arg {
				return fmt.Errorf("%q, want %q", str, e.Arg)
			}
			return nil
		}
		parts, _ := v.([]any)
		if len(parts) == 0 {
			return fmt.Errorf("%s is neither text nor content parts", short(v))
		}
		first, _ := parts[0].(map[string]any)
		if first == nil || first["text"] != e.Arg {
			return fmt.Errorf("%s, want text %q", short(v), e.Arg)
		}
	case "no_delivered_records":
		if m, ok := v.(map[string]any); ok {
			if recs, ok := m["records"].([]any); ok && len(recs) > 0 {
				return fmt.Errorf("%d records written as delivered", len(recs))
			}
		}
	default:
		return fmt.Errorf("unknown check %q", e.Check)
	}
	return nil
}

func checkType(typ string, v any) error {
	ok := false
	switch typ {
	case "string":
		_, ok = v.(string)
	case "number":
		_, ok = v.(float64)
	case "int":
		f, isNum := v.(float64)
		ok = isNum && f == math.Trunc(f)
	case "bool":
		_, ok = v.(bool)
	case "object":
		_, ok = v.(map[string]any)
	case "array":
		_, ok = v.([]any)
	case "null":
		ok = v == nil
	case "int_array", "number_array":
		arr, isArr := v.([]any)
		ok = isArr
		for _, e := range arr {
			if err := checkType(strings.TrimSuffix(typ, "_array"), e); err != nil {
				ok = false
			}
		}
	default:
		return fmt.Errorf("unknown type %q in fixture", typ)
	}
	if !ok {
		return fmt.Errorf("%s is not %s", short(v), typ)
	}
	return nil
}

func jsonEqual(a, b any) bool {
	ab, _ := json.Marshal(a)
	bb, _ := json.Marshal(b)
	var x, y any
	_ = json.Unmarshal(ab, &x)
	_ = json.Unmarshal(bb, &y)
	return reflect.DeepEqual(x, y)
}

func short(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}

// fields checks that m has each field with its type ("any" for present).
func fields(m map[string]any, what string, spec ...string) error {
	for i := 0; i+1 < len(spec); i += 2 {
		v, ok := m[spec[i]]
		if !ok {
			return fmt.Errorf("%s has no %s", what, spec[i])
		}
		if spec[i+1] == "any" {
			continue
		}
		if err := checkType(spec[i+1], v); err != nil {
			return fmt.Errorf("%s.%s: %v", what, spec[i], err)
		}
	}
	return nil
}

// checkNeMoGymResponse checks what NeMoGymResponse.model_validate requires
// (nemo_gym/openai_utils.py: an openai Response whose output items are
// NeMo Gym's item models) and what the simple agent then reads.
func checkNeMoGymResponse(v any) error {
	m, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("%s is not an object", short(v))
	}
	if err := fields(m, "response", "id", "string", "created_at", "number", "model", "string", "object", "string",
		"output", "array", "parallel_tool_calls", "bool", "tool_choice", "any", "tools", "array"); err != nil {
		return err
	}
	if m["object"] != "response" {
		return fmt.Errorf("object %s, want \"response\"", short(m["object"]))
	}
	if d, ok := m["incomplete_details"]; ok && d != nil {
		if err := checkType("object", d); err != nil {
			return fmt.Errorf("incomplete_details: %v", err)
		}
	}
	if u, ok := m["usage"]; ok && u != nil {
		um, ok := u.(map[string]any)
		if !ok {
			return fmt.Errorf("usage %s is not an object", short(u))
		}
		if err := fields(um, "usage", "input_tokens", "int", "output_tokens", "int", "total_tokens", "int",
			"input_tokens_details", "object", "output_tokens_details", "object"); err != nil {
			return err
		}
	}
	for i, it := range m["output"].([]any) {
		item, ok := it.(map[string]any)
		what := fmt.Sprintf("output[%d]", i)
		if !ok {
			return fmt.Errorf("%s is not an object", what)
		}
		var err error
		switch item["type"] {
		case "message":
			if err = fields(item, what, "id", "string", "content", "array", "role", "string"); err == nil && item["role"] != "assistant" {
				err = fmt.Errorf("%s.role %s, want assistant", what, short(item["role"]))
			}
			for j, c := range asArray(item["content"]) {
				cm, _ := c.(map[string]any)
				cw := fmt.Sprintf("%s.content[%d]", what, j)
				switch {
				case err != nil:
				case cm == nil:
					err = fmt.Errorf("%s is not an object", cw)
				case cm["type"] == "output_text":
					err = fields(cm, cw, "text", "string", "annotations", "array")
				case cm["type"] == "refusal":
					err = fields(cm, cw, "refusal", "string")
				default:
					err = fmt.Errorf("%s has type %s", cw, short(cm["type"]))
				}
			}
		case "function_call":
			err = fields(item, what, "arguments", "string", "call_id", "string", "name", "string")
		case "function_call_output":
			err = fields(item, what, "call_id", "string", "output", "any")
		case "reasoning":
			err = fields(item, what, "id", "string", "summary", "array")
		default:
			err = fmt.Errorf("%s has type %s, which NeMoGymResponseOutputItem does not admit here", what, short(item["type"]))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func asArray(v any) []any { a, _ := v.([]any); return a }

var routedExpertsEnvelope = regexp.MustCompile(`^nrlre1:(int8|int16|int32):\d+x\d+x\d+:[A-Za-z0-9+/=]*$`)

// checkNeMoRLTrainable is NeMo RL's read of response.output
// (nemo_rl/environments/nemo_gym.py 359-367 and 830-996): every item with
// non-empty generation_token_ids is a trainable turn carrying
// prompt_token_ids and generation_log_probs; each turn's prompt extends
// the previous turns' prompt and generation token for token; routed_experts,
// when present, is the codec's envelope or a nested list; and at least one
// turn exists.
func checkNeMoRLTrainable(v any) error {
	items, ok := v.([]any)
	if !ok {
		return fmt.Errorf("%s is not an array", short(v))
	}
	var seen []any
	turns := 0
	for i, it := range items {
		item, _ := it.(map[string]any)
		gen, _ := item["generation_token_ids"].([]any)
		if len(gen) == 0 {
			continue
		}
		turns++
		what := fmt.Sprintf("output[%d]", i)
		if err := fields(item, what, "prompt_token_ids", "int_array", "generation_token_ids", "int_array", "generation_log_probs", "number_array"); err != nil {
			return err
		}
		prompt := item["prompt_token_ids"].([]any)
		if lp := item["generation_log_probs"].([]any); len(lp) != len(gen) {
			return fmt.Errorf("%s: %d generation_log_probs for %d generation_token_ids", what, len(lp), len(gen))
		}
		if len(prompt) < len(seen) || (len(seen) > 0 && !jsonEqual(seen, prompt[:len(seen)])) {
			return fmt.Errorf("%s: non-contiguous: prompt_token_ids do not start with the %d tokens of the turns before", what, len(seen))
		}
		if re, ok := item["routed_experts"]; ok && re != nil {
			switch x := re.(type) {
			case string:
				if !routedExpertsEnvelope.MatchString(x) {
					return fmt.Errorf("%s.routed_experts %q is not an nrlre1 envelope", what, short(x))
				}
			case []any:
			default:
				return fmt.Errorf("%s.routed_experts %s is neither an envelope nor a list", what, short(re))
			}
		}
		seen = append(append([]any{}, prompt...), gen...)
	}
	if turns == 0 {
		return errors.New("no output item carries generation_token_ids: NeMo RL raises 'no generation data'")
	}
	return nil
}
