package openai

import "strings"

// ChatAccumulator rebuilds the non-streaming reply from a stream of chunks,
// vLLM's token-id extensions included: prompt_token_ids (first chunk), each
// chunk's token_ids and logprobs entries. Only choice 0 is kept (token
// capture needs n = 1).
type ChatAccumulator struct {
	c            ChatCompletion
	started      bool
	content      strings.Builder
	hasContent   bool
	reasoning    strings.Builder
	toolCalls    []ToolCall
	finish       string
	role         string
	logprobs     []TokenLogprob
	hasLogprobs  bool
	tokenIDs     []int
	hasTokenIDs  bool
	promptTokens []int
	routed       []byte
}

// Add folds one chunk in.
func (a *ChatAccumulator) Add(ch *ChatChunk) {
	if !a.started {
		a.started = true
		a.c.ID, a.c.Created, a.c.Model = ch.ID, ch.Created, ch.Model
	}
	if ch.PromptTokenIDs != nil && a.promptTokens == nil {
		a.promptTokens = ch.PromptTokenIDs
	}
	if ch.Usage != nil {
		u := *ch.Usage
		a.c.Usage = &u
	}
	for i := range ch.Choices {
		cc := &ch.Choices[i]
		if cc.Index != 0 {
			continue
		}
		d := &cc.Delta
		if d.Role != "" {
			a.role = d.Role
		}
		if d.Content != nil {
			a.hasContent = true
			a.content.WriteString(*d.Content)
		}
		if d.ReasoningContent != nil {
			a.reasoning.WriteString(*d.ReasoningContent)
		} else if d.Reasoning != nil {
			a.reasoning.WriteString(*d.Reasoning)
		}
		for _, tc := range d.ToolCalls {
			a.addToolCall(tc)
		}
		if cc.FinishReason != nil && *cc.FinishReason != "" {
			a.finish = *cc.FinishReason
		}
		if cc.Logprobs != nil {
			a.hasLogprobs = true
			a.logprobs = append(a.logprobs, cc.Logprobs.Content...)
		}
		if re := cc.RoutedExperts; len(re) > 0 && string(re) != "null" {
			a.routed = re
		}
		if cc.TokenIDs != nil {
			a.hasTokenIDs = true
			a.tokenIDs = append(a.tokenIDs, cc.TokenIDs...)
		}
	}
}

// ToolCallIndex is the position a tool-call delta updates: its index, or
// for a delta without one, the last call unless the delta starts a new one
// (it names an id).
func ToolCallIndex(tc ToolCall, have int) int {
	if tc.Index != nil && *tc.Index >= 0 {
		return *tc.Index
	}
	if tc.ID != "" || have == 0 {
		return have
	}
	return have - 1
}

func (a *ChatAccumulator) addToolCall(tc ToolCall) {
	i := ToolCallIndex(tc, len(a.toolCalls))
	if i > len(a.toolCalls)+1024 {
		return // a nonsense index; never allocate for it
	}
	for len(a.toolCalls) <= i {
		a.toolCalls = append(a.toolCalls, ToolCall{Type: "function"})
	}
	dst := &a.toolCalls[i]
	if tc.ID != "" {
		dst.ID = tc.ID
	}
	if tc.Type != "" {
		dst.Type = tc.Type
	}
	// Servers send the name once; some repeat it on every delta, so it is
	// set, not appended.
	if tc.Function.Name != "" && dst.Function.Name == "" {
		dst.Function.Name = tc.Function.Name
	}
	dst.Function.Arguments += tc.Function.Arguments
}

// Completion returns the reply accumulated so far.
func (a *ChatAccumulator) Completion() *ChatCompletion {
	c := a.c
	c.Object = "chat.completion"
	role := a.role
	if role == "" {
		role = "assistant"
	}
	msg := ChatMessage{Role: role}
	if a.hasContent {
		msg.Content = TextContent(a.content.String())
	}
	if a.reasoning.Len() > 0 {
		r := a.reasoning.String()
		msg.ReasoningContent = &r
	}
	if len(a.toolCalls) > 0 {
		msg.ToolCalls = append([]ToolCall(nil), a.toolCalls...)
	}
	choice := ChatChoice{Index: 0, Message: msg, FinishReason: a.finish}
	if a.hasLogprobs {
		choice.Logprobs = &ChoiceLogprobs{Content: append([]TokenLogprob{}, a.logprobs...)}
	}
	if a.hasTokenIDs {
		choice.TokenIDs = append([]int{}, a.tokenIDs...)
	}
	choice.RoutedExperts = a.routed
	c.Choices = []ChatChoice{choice}
	if a.promptTokens != nil {
		c.PromptTokenIDs = append([]int{}, a.promptTokens...)
	}
	return &c
}
