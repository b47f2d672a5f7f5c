package fakeinference

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference/fiwire"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

// Greeting is the final answer of a conversation that had no tool round.
const Greeting = "Hello! How can I help you?"

// AnswerPrefix starts the final answer after tool rounds; the content of the
// last tool message follows it.
const AnswerPrefix = "The answer is: "

// MetadataScriptKey is the request metadata key that carries a per-request
// Script as JSON text.
const MetadataScriptKey = "fake_script"

// Limits of scripts and of what the default policy reads from a prompt.
const (
	MaxScriptToolRounds = fiwire.MaxScriptToolRounds
	// maxDefaultRounds bounds the JSON objects read from user text.
	maxDefaultRounds = 64
	// maxScanSteps bounds the work of finding JSON objects in user text, so
	// a pathological prompt ("{{{{...") costs linear time at worst.
	maxScanSteps = 4 << 20
)

// Decision is what the fake policy answers to a conversation.
type Decision struct {
	// ToolCall is set when the policy calls a tool; ToolName and Arguments
	// (compact JSON object text) name the call.
	ToolCall  bool
	ToolName  string
	Arguments string
	// Round counts the tool rounds before this reply (assistant messages
	// with tool calls in the conversation).
	Round int
	// FinalText is the answer when ToolCall is false.
	FinalText string
}

// Decide is the fake policy. When the request offers tools (and tool_choice
// is not "none") and fewer tool rounds happened than the rounds to do, it
// calls a tool for the next round; otherwise it answers FinalText: the
// script's, or AnswerPrefix + the last tool message's content, or Greeting
// when the conversation has no tool message.
//
// Without a script the rounds are the JSON objects in the user messages, in
// order; round k passes the k-th object as arguments to the offered tool
// whose name appears closest before the object in the text (else the first
// offered tool). Tools offered but no object found: one round with {}
// arguments, calling the first offered tool the text names (else the first).
func Decide(req *openai.ChatRequest, script *Script) Decision {
	d := Decision{}
	for i := range req.Messages {
		if req.Messages[i].Role == "assistant" && len(req.Messages[i].ToolCalls) > 0 {
			d.Round++
		}
	}
	tools := offeredTools(req)
	if len(tools) > 0 {
		rounds, n := plannedRounds(req, tools, script)
		mode, forced := ToolChoiceOf(req)
		// vLLM constrains the output to a tool call when tool_choice is
		// "required" or names a function (structured outputs), whatever
		// the model would have said: the call is made even past the
		// planned rounds, and a named choice calls that function.
		if d.Round < n || mode == ToolChoiceRequired || mode == ToolChoiceFunction {
			call := ScriptToolCall{Name: tools[0], Arguments: codec.RawMessage("{}")}
			switch {
			case d.Round < len(rounds):
				call = rounds[d.Round]
			case len(rounds) > 0:
				call = rounds[len(rounds)-1]
			}
			if mode == ToolChoiceFunction && call.Name != forced {
				call = ScriptToolCall{Name: forced, Arguments: codec.RawMessage("{}")}
			}
			d.ToolCall, d.ToolName, d.Arguments = true, call.Name, string(call.Arguments)
			return d
		}
	}
	switch {
	case script != nil && script.FinalText != "":
		d.FinalText = script.FinalText
	default:
		d.FinalText = Greeting
		for i := len(req.Messages) - 1; i >= 0; i-- {
			if req.Messages[i].Role == "tool" {
				d.FinalText = AnswerPrefix + req.Messages[i].Content.String()
				break
			}
		}
	}
	return d
}

// Tool choice modes (ToolChoiceOf).
const (
	ToolChoiceAuto     = "auto"
	ToolChoiceRequired = "required"
	ToolChoiceNone     = "none"
	ToolChoiceFunction = "function"
)

// ToolChoiceOf reads a request's tool_choice: its mode ("" when absent or
// null) and, for a named function, its name. The request was validated
// (checkToolUsage), so a named choice has a name.
func ToolChoiceOf(req *openai.ChatRequest) (mode, name string) {
	tc := bytes.TrimSpace(req.ToolChoice)
	if len(tc) == 0 || string(tc) == "null" {
		return "", ""
	}
	if tc[0] == '"' {
		var s string
		_ = codec.Unmarshal(tc, &s)
		return s, ""
	}
	var named struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if codec.Unmarshal(tc, &named) != nil {
		return "", ""
	}
	return ToolChoiceFunction, named.Function.Name
}

// offeredTools lists the function tools the model may call.
func offeredTools(req *openai.ChatRequest) []string {
	if mode, _ := ToolChoiceOf(req); mode == ToolChoiceNone {
		return nil
	}
	var names []string
	for _, t := range req.Tools {
		if t.Function.Name != "" {
			names = append(names, t.Function.Name)
		}
	}
	return names
}

// plannedRounds returns the round list and the number of rounds to do.
func plannedRounds(req *openai.ChatRequest, tools []string, script *Script) ([]ScriptToolCall, int) {
	var rounds []ScriptToolCall
	if script != nil && script.ToolCalls != nil {
		rounds = script.ToolCalls
	} else {
		rounds = DefaultRounds(userText(req), tools)
	}
	n := len(rounds)
	if script != nil && script.ToolRounds != nil {
		n = *script.ToolRounds
	}
	return rounds, n
}

// userText joins the text of the user messages.
func userText(req *openai.ChatRequest) string {
	var b strings.Builder
	for i := range req.Messages {
		if req.Messages[i].Role != "user" {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(req.Messages[i].Content.String())
	}
	return b.String()
}

// DefaultRounds reads the tool rounds of the default policy from text: one
// per JSON object, calling the tool named closest before it. With no object,
// one round with {} arguments.
func DefaultRounds(text string, tools []string) []ScriptToolCall {
	if len(tools) == 0 {
		return nil
	}
	objs := JSONObjects(text, maxDefaultRounds)
	if len(objs) == 0 {
		if rounds := gymCounterRounds(text, tools); rounds != nil {
			return rounds
		}
		name := tools[0]
		best := -1
		for _, t := range tools {
			if i := firstWordIndex(text, t); i >= 0 && (best < 0 || i < best) {
				best, name = i, t
			}
		}
		return []ScriptToolCall{{Name: name, Arguments: codec.RawMessage("{}")}}
	}
	rounds := make([]ScriptToolCall, 0, len(objs))
	for _, o := range objs {
		name := tools[0]
		bestEnd := -1
		for _, t := range tools {
			if end := lastWordEnd(text[:o.Start], t); end > bestEnd {
				bestEnd, name = end, t
			}
		}
		rounds = append(rounds, ScriptToolCall{Name: name, Arguments: codec.RawMessage(o.Compact)})
	}
	return rounds
}

// Tool names of NeMo Gym's example counter
// (resources_servers/example_session_state_mgmt/app.py, Gym 07d6b0d07b22).
const (
	gymIncrementCounter = "increment_counter"
	gymGetCounterValue  = "get_counter_value"
)

// gymCounterRounds reads the natural-language prompts of Gym's counter
// dataset (example_session_state_mgmt/data/example.jsonl: "add 1 then add
// 2 then get the count") when its increment_counter tool is offered: one
// increment_counter {"count": N} per "add N", then get_counter_value when
// offered. nil when the tool is not offered or the text adds nothing.
func gymCounterRounds(text string, tools []string) []ScriptToolCall {
	if !slices.Contains(tools, gymIncrementCounter) {
		return nil
	}
	var rounds []ScriptToolCall
	words := strings.Fields(strings.ToLower(text))
	for i := 0; i+1 < len(words) && len(rounds) < maxDefaultRounds; i++ {
		if words[i] != "add" {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimRight(words[i+1], ".,;"), 10, 64)
		if err != nil {
			continue
		}
		rounds = append(rounds, ScriptToolCall{Name: gymIncrementCounter, Arguments: codec.RawMessage(`{"count":` + strconv.FormatInt(n, 10) + `}`)})
	}
	if len(rounds) > 0 && slices.Contains(tools, gymGetCounterValue) {
		rounds = append(rounds, ScriptToolCall{Name: gymGetCounterValue, Arguments: codec.RawMessage("{}")})
	}
	return rounds
}

// JSONObject is a JSON object found in text.
type JSONObject struct {
	Start, End int    // text[Start:End] is the object
	Compact    string // the object as compact JSON
}

// JSONObjects finds up to max balanced {...} spans of text that parse as
// JSON objects, in order, not overlapping.
func JSONObjects(text string, max int) []JSONObject {
	var out []JSONObject
	steps := 0
	for i := 0; i < len(text) && len(out) < max && steps < maxScanSteps; i++ {
		if text[i] != '{' {
			continue
		}
		end, n := balancedEnd(text, i, maxScanSteps-steps)
		steps += n
		if end < 0 {
			continue
		}
		raw := []byte(text[i:end])
		if !json.Valid(raw) {
			continue
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err != nil {
			continue
		}
		out = append(out, JSONObject{Start: i, End: end, Compact: buf.String()})
		i = end - 1
	}
	return out
}

// balancedEnd returns the end of the brace-balanced span starting at
// text[start] == '{' (skipping braces inside JSON strings), or -1, and the
// steps it took (at most budget).
func balancedEnd(text string, start, budget int) (int, int) {
	depth := 0
	inString, escaped := false, false
	steps := 0
	for j := start; j < len(text); j++ {
		steps++
		if steps > budget {
			return -1, steps
		}
		c := text[j]
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{':
			depth++
		case c == '}':
			depth--
			if depth == 0 {
				return j + 1, steps
			}
		}
	}
	return -1, steps
}

func isWordByte(b byte) bool {
	return b == '_' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}

// wordAt reports whether word occurs in text at i as a whole word.
func wordAt(text string, i int, word string) bool {
	if i > 0 && isWordByte(text[i-1]) {
		return false
	}
	j := i + len(word)
	return j >= len(text) || !isWordByte(text[j])
}

// lastWordEnd is the end of word's last whole-word occurrence in text, or -1.
func lastWordEnd(text, word string) int {
	for hi := len(text); hi >= 0; {
		i := strings.LastIndex(text[:hi], word)
		if i < 0 {
			return -1
		}
		if wordAt(text, i, word) {
			return i + len(word)
		}
		hi = i + len(word) - 1
	}
	return -1
}

// firstWordIndex is the start of word's first whole-word occurrence, or -1.
func firstWordIndex(text, word string) int {
	for lo := 0; lo <= len(text); {
		i := strings.Index(text[lo:], word)
		if i < 0 {
			return -1
		}
		i += lo
		if wordAt(text, i, word) {
			return i
		}
		lo = i + 1
	}
	return -1
}
