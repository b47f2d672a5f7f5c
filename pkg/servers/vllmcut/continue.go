package vllmcut

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// renderFields are the chat fields that shape the rendered prompt; vLLM's
// /tokenize takes them as the chat call does.
var renderFields = []string{"model", "messages", "tools", "chat_template", "chat_template_kwargs",
	"add_generation_prompt", "continue_final_message", "add_special_tokens", "documents", "mm_processor_kwargs"}

// samplingFields are the chat fields a continuation keeps as they are
// (vLLM's completions request takes each with the chat request's meaning).
var samplingFields = []string{"temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
	"ignore_eos", "repetition_penalty", "presence_penalty", "frequency_penalty", "skip_special_tokens",
	"spaces_between_special_tokens", "include_stop_str_in_output", "bad_words", "logit_bias",
	"allowed_token_ids", "priority", "user"}

// continueCut answers a call that continues the prefix staged under key:
// the same prompt (rendered again by vLLM, and spliced when the history
// carries its token ids) continued through
// /v1/completions from prompt + prefix, answered as the chat reply of the
// whole generation.
func (s *Server) continueCut(w http.ResponseWriter, r *http.Request, f chatFields, key string) {
	ctx := r.Context()
	st, ok := s.store.get(key)
	if !ok {
		writeVLLMError(w, http.StatusBadRequest, "generation cut "+key+" is not staged")
		return
	}
	if f.isTrue("stream") {
		writeVLLMError(w, http.StatusBadRequest, "a generation cut continues only without streaming")
		return
	}
	prompt, err := s.promptIDs(ctx, f)
	if err != nil {
		// vLLM refused the prompt: the same refusal the call would get.
		writeRefusal(w, err)
		return
	}
	if !slices.Equal(prompt, st.promptIDs) {
		writeVLLMError(w, http.StatusBadRequest, "generation cut "+key+" was staged for a different prompt")
		return
	}

	comp := map[string]any{
		"model":            codec.RawMessage(f["model"]),
		"prompt":           append(slices.Clone(st.promptIDs), st.tokenIDs...),
		"return_token_ids": true,
	}
	for _, k := range samplingFields {
		if f.present(k) {
			comp[k] = codec.RawMessage(f[k])
		}
	}
	if limit := maxTokens(f); limit > 0 {
		rest := limit - len(st.tokenIDs)
		if rest < 1 {
			writeVLLMError(w, http.StatusBadRequest, "generation cut "+key+" already holds max_tokens tokens")
			return
		}
		comp["max_tokens"] = rest
	}
	if n, ok := f.int("min_tokens"); ok {
		comp["min_tokens"] = max(0, n-len(st.tokenIDs))
	}
	wantLogprobs := f.isTrue("logprobs")
	topN, _ := f.int("top_logprobs")
	if wantLogprobs {
		comp["logprobs"] = topN
	}
	body, err := codec.Marshal(comp)
	if err != nil {
		writeVLLMError(w, http.StatusBadRequest, err.Error())
		return
	}

	id, captureKey := r.Header.Get(HeaderModelCallID), r.Header.Get(HeaderCaptureKey)
	up := upstreamCall{path: "/v1/completions", idPrefix: "cmpl-", body: body, finish: func(_ context.Context, _ string, reply []byte) (int, []byte, error) {
		out, err := continuedReply(st, reply, wantLogprobs, topN)
		return http.StatusOK, out, err
	}}
	if gencut.ValidCallID(id) && rollout.ValidCaptureKey(captureKey) {
		// The continuation can be cut again: it is tracked like any call.
		c := &call{id: id, captureKey: captureKey, admitted: time.Now(), limit: maxTokens(f)}
		if s.track(c) {
			defer s.untrack(c)
			s.runTracked(w, r, c, up)
			return
		}
	}
	c := &call{id: "untracked", uncuttable: ReasonUnknownCall}
	s.runTracked(w, r, c, up)
}

// completion is the part of vLLM's completions reply a continuation reads.
type completion struct {
	ID      string `json:"id"`
	Created int64  `json:"created"`
	Choices []struct {
		Text         string           `json:"text"`
		TokenIDs     []int            `json:"token_ids"`
		FinishReason string           `json:"finish_reason"`
		StopReason   codec.RawMessage `json:"stop_reason"`
		Logprobs     *struct {
			Tokens        []string           `json:"tokens"`
			TokenLogprobs []*float64         `json:"token_logprobs"`
			TopLogprobs   []codec.RawMessage `json:"top_logprobs"`
		} `json:"logprobs"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// chatLogprob is one entry of a chat reply's logprobs.content, in vLLM's
// field order (ChatCompletionLogProbsContent).
type chatLogprob struct {
	Token       string         `json:"token"`
	Logprob     float64        `json:"logprob"`
	Bytes       []int          `json:"bytes"`
	TopLogprobs []chatTopEntry `json:"top_logprobs"`
}

type chatTopEntry struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// continuedReply is the chat reply of prefix + continuation, in the shape of
// the cut reply: token ids, text and logprobs joined, the continuation's
// finish, usage counted over the whole generation.
func continuedReply(st *staged, reply []byte, wantLogprobs bool, topN int) ([]byte, error) {
	var cp completion
	if err := codec.Unmarshal(reply, &cp); err != nil || len(cp.Choices) != 1 {
		return nil, errorf("vLLM's completion reply is not one choice: %v", err)
	}
	ch := cp.Choices[0]
	var top map[string]codec.RawMessage
	if err := codec.Unmarshal(st.reply, &top); err != nil {
		return nil, err
	}
	var choices []map[string]codec.RawMessage
	if err := codec.Unmarshal(top["choices"], &choices); err != nil || len(choices) != 1 {
		return nil, errorf("the staged reply is not one choice")
	}
	choice := choices[0]
	var msg map[string]codec.RawMessage
	if err := codec.Unmarshal(choice["message"], &msg); err != nil {
		return nil, err
	}
	set := func(m map[string]codec.RawMessage, k string, v any) error {
		b, err := codec.Marshal(v)
		m[k] = b
		return err
	}
	ids := append(slices.Clone(st.tokenIDs), ch.TokenIDs...)
	finishReason := ch.FinishReason
	var errs []error
	errs = append(errs, set(msg, "content", st.content+ch.Text), set(choice, "message", msg),
		set(choice, "token_ids", ids), set(choice, "finish_reason", finishReason))
	if len(ch.StopReason) > 0 {
		choice["stop_reason"] = ch.StopReason
	}
	if wantLogprobs {
		entries := slices.Clone(st.logprobs)
		if ch.Logprobs != nil {
			for i, t := range ch.Logprobs.Tokens {
				e := chatLogprob{Token: t, Bytes: utf8Bytes(t), TopLogprobs: []chatTopEntry{}}
				if i < len(ch.Logprobs.TokenLogprobs) && ch.Logprobs.TokenLogprobs[i] != nil {
					e.Logprob = clampLogprob(*ch.Logprobs.TokenLogprobs[i])
				}
				if topN > 0 && i < len(ch.Logprobs.TopLogprobs) {
					e.TopLogprobs = topEntries(ch.Logprobs.TopLogprobs[i], topN)
				}
				b, err := codec.Marshal(e)
				errs = append(errs, err)
				entries = append(entries, b)
			}
		}
		errs = append(errs, set(choice, "logprobs", map[string]any{"content": entries}))
	}
	errs = append(errs, set(top, "choices", []any{choice}))
	if cp.ID != "" {
		errs = append(errs, set(top, "id", "chatcmpl-"+trimPrefix(cp.ID, "cmpl-")))
	}
	if cp.Created != 0 {
		errs = append(errs, set(top, "created", cp.Created))
	}
	var usage map[string]codec.RawMessage
	if codec.Unmarshal(top["usage"], &usage) == nil && usage != nil {
		errs = append(errs, set(usage, "prompt_tokens", len(st.promptIDs)), set(usage, "completion_tokens", len(ids)),
			set(usage, "total_tokens", len(st.promptIDs)+len(ids)), set(top, "usage", usage))
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return codec.Marshal(top)
}

// topEntries reads a completions top_logprobs entry ({token: logprob}, in
// vLLM's order) as chat entries.
func topEntries(raw codec.RawMessage, n int) []chatTopEntry {
	out := []chatTopEntry{}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return out
	}
	for dec.More() && len(out) < n {
		kt, err := dec.Token()
		if err != nil {
			return out
		}
		var v json.Number
		if err := dec.Decode(&v); err != nil {
			return out
		}
		lp, err := strconv.ParseFloat(string(v), 64)
		if err != nil {
			continue
		}
		k, _ := kt.(string)
		out = append(out, chatTopEntry{Token: k, Logprob: clampLogprob(lp), Bytes: utf8Bytes(k)})
	}
	return out
}

// clampLogprob is vLLM's: -inf is sent as -9999.0.
func clampLogprob(v float64) float64 {
	if math.IsInf(v, -1) || math.IsNaN(v) {
		return -9999.0
	}
	return v
}

// utf8Bytes are a token's bytes as vLLM lists them (its UTF-8 encoding).
func utf8Bytes(s string) []int {
	out := make([]int, 0, len(s))
	for _, b := range []byte(s) {
		out = append(out, int(b))
	}
	return out
}

func trimPrefix(s, p string) string {
	if len(s) >= len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}
