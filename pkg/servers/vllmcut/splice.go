package vllmcut

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// A multi-turn call carries, on its last assistant message, the token ids of
// that turn (prompt_token_ids and generation_token_ids: our model server
// sends them as NeMo Gym's vllm_model does). vLLM renders the history again
// from text, and the model's tokens are not the tokenizer's own spelling of
// their text, so the next turn's prompt would not extend the last turn's
// prompt and generation, which NeMo RL asserts of every trajectory. NeMo RL's
// vLLM worker splices the model's own tokens in for the rendered history
// (splice_prefix_tokens in nemo_rl/models/generation/openai_server_utils.py,
// NVIDIA-NeMo/RL 7f0c02f710a9); the sidecar
// does the same from outside through vLLM 0.32's disaggregated routes:
// /v1/chat/completions/render gives the prompt ids and sampling parameters
// (structured outputs included), the ids are spliced, /inference/v1/generate
// generates from them (abortable by request id, so a cut still works), and
// /v1/chat/completions/derender parses the tokens into the chat reply
// (tool calls included), as the chat route would have.

// spliceSource is the last assistant message carrying its turn's ids.
type spliceSource struct {
	index int
	// ids are the turn's prompt followed by its generation.
	ids []int
}

// modelPrefix finds the last assistant message with both token fields.
func modelPrefix(f chatFields) (spliceSource, bool) {
	var msgs []map[string]codec.RawMessage
	if !f.present("messages") || codec.Unmarshal(f["messages"], &msgs) != nil {
		return spliceSource{}, false
	}
	for i := len(msgs) - 1; i >= 0; i-- {
		var role string
		if codec.Unmarshal(msgs[i]["role"], &role) != nil || role != "assistant" {
			continue
		}
		var prompt, gen []int
		if codec.Unmarshal(msgs[i]["prompt_token_ids"], &prompt) != nil || codec.Unmarshal(msgs[i]["generation_token_ids"], &gen) != nil ||
			len(prompt) == 0 || len(gen) == 0 {
			continue
		}
		return spliceSource{index: i, ids: append(prompt, gen...)}, true
	}
	return spliceSource{}, false
}

// vllmRefusal is an error reply of vLLM's, passed on as it came.
type vllmRefusal struct {
	status int
	body   []byte
}

func (e *vllmRefusal) Error() string {
	return fmt.Sprintf("vLLM answered %d: %s", e.status, truncate(e.body, 300))
}

// splicedRender renders the call with vLLM and splices the model's own
// tokens in for the history up to src: it returns vLLM's GenerateRequest
// with the spliced token_ids.
func (s *Server) splicedRender(ctx context.Context, f chatFields, body []byte, src spliceSource) (map[string]codec.RawMessage, []int, error) {
	status, _, reply, err := s.postVLLM(ctx, "/v1/chat/completions/render", nil, body)
	if err != nil {
		return nil, nil, err
	}
	if status != http.StatusOK {
		return nil, nil, &vllmRefusal{status, reply}
	}
	var gen map[string]codec.RawMessage
	var full []int
	if err := codec.Unmarshal(reply, &gen); err != nil || codec.Unmarshal(gen["token_ids"], &full) != nil {
		return nil, nil, fmt.Errorf("vLLM's render reply has no token_ids: %.200s", reply)
	}
	spliced, err := s.spliceHistory(ctx, f, src, full)
	if err != nil {
		return nil, nil, err
	}
	if gen["token_ids"], err = codec.Marshal(spliced); err != nil {
		return nil, nil, err
	}
	return gen, spliced, nil
}

// spliceHistory splices the model's tokens of the history up to src into
// full, vLLM's rendering of the whole call: the history up to src is
// rendered alone (vLLM's /tokenize, no generation prompt) to find where
// the model's tokens end in full.
func (s *Server) spliceHistory(ctx context.Context, f chatFields, src spliceSource, full []int) ([]int, error) {
	var msgs []codec.RawMessage
	if err := codec.Unmarshal(f["messages"], &msgs); err != nil {
		return nil, err
	}
	pb := map[string]any{"messages": msgs[:src.index+1], "add_generation_prompt": false}
	for _, k := range []string{"model", "tools", "chat_template", "chat_template_kwargs", "documents"} {
		if f.present(k) {
			pb[k] = codec.RawMessage(f[k])
		}
	}
	prefix, err := s.tokenize(ctx, pb)
	if err != nil {
		return nil, err
	}
	if len(prefix) == 0 {
		return nil, errors.New("vLLM's /tokenize of the history has no tokens")
	}
	spliced, err := splicePrefix(src.ids, prefix, full)
	if err != nil {
		return nil, &vllmRefusal{http.StatusBadRequest, vllmErrorBody(http.StatusBadRequest, err.Error())}
	}
	return spliced, nil
}

// handleTokenize is vLLM's /tokenize, with a chat history's token ids
// spliced in as the chat call splices them. NeMo RL's vLLM worker renders
// /tokenize and /v1/chat/completions through one renderer, whose
// preprocess_chat splices (NeMoRLTokenizeChatRequest, NeMoRLOnlineRenderer
// in nemo_rl/models/generation/vllm/vllm_worker_async.py, NVIDIA-NeMo/RL
// 7ea279abfbeb): NeMo Gym's /tokenize fallback, which the model server
// makes for a reply without prompt_token_ids, then gets the prompt the call
// was generated from. Anything else goes to vLLM as it came.
func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	body, err := httpserver.ReadBody(r)
	if err != nil {
		writeVLLMError(w, http.StatusBadRequest, err.Error())
		return
	}
	var f chatFields
	if codec.Unmarshal(body, &f) != nil || !f.present("messages") {
		s.passThrough(w, r, body)
		return
	}
	src, ok := modelPrefix(f)
	if !ok {
		s.passThrough(w, r, body)
		return
	}
	if f.isTrue("return_token_strs") {
		// The strings are the tokenizer's, which the sidecar does not have.
		writeVLLMError(w, http.StatusBadRequest, "return_token_strs is not served for a history carrying its token ids")
		return
	}
	ctx := r.Context()
	status, _, reply, err := s.postVLLM(ctx, "/tokenize", nil, body)
	if err != nil {
		writeRefusal(w, err)
		return
	}
	if status != http.StatusOK {
		writeRefusal(w, &vllmRefusal{status, reply})
		return
	}
	var tok map[string]codec.RawMessage
	var full []int
	if err := codec.Unmarshal(reply, &tok); err != nil || codec.Unmarshal(tok["tokens"], &full) != nil {
		writeVLLMError(w, http.StatusBadGateway, fmt.Sprintf("vLLM's /tokenize reply has no tokens: %.200s", reply))
		return
	}
	spliced, err := s.spliceHistory(ctx, f, src, full)
	if err != nil {
		writeRefusal(w, err)
		return
	}
	if tok["tokens"], err = codec.Marshal(spliced); err == nil {
		tok["count"], err = codec.Marshal(len(spliced))
	}
	if err == nil {
		reply, err = codec.Marshal(tok)
	}
	if err != nil {
		writeVLLMError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(reply)
}

// splicePrefix is NeMo RL's splice_prefix_tokens: the model's tokens up to
// its turn's terminator, then the template's rendering from the matching
// terminator on. Turns are counted by terminator, not by position. The
// terminator is the token the chat template closes the history's last
// message with (the rendered history's last token), as NeMo RL takes the
// tokenizer's EOS, which the templates it serves close messages with.
func splicePrefix(model, templatePrefix, template []int) ([]int, error) {
	if len(model) == 0 {
		return template, nil
	}
	term := templatePrefix[len(templatePrefix)-1]
	cut := len(model)
	if model[cut-1] == term {
		cut--
	}
	need := 0
	for _, t := range templatePrefix {
		if t == term {
			need++
		}
	}
	seen, start := 0, -1
	for i, t := range template {
		if t == term {
			if seen++; seen == need {
				start = i
				break
			}
		}
	}
	if start < 0 {
		return nil, fmt.Errorf("the rendered prompt has %d of the %d turn terminators (token %d) the history needs: the model's tokens cannot be spliced in", seen, need, term)
	}
	return append(slices.Clone(model[:cut]), template[start:]...), nil
}

// chatUpstream is the vLLM request of a non-streaming chat call: vLLM's
// chat route, or, for a history carrying its token ids, render, splice,
// generate and derender. A refusal is written to w and ok is false.
func (s *Server) chatUpstream(ctx context.Context, w http.ResponseWriter, f chatFields, body []byte) (upstreamCall, bool) {
	src, ok := modelPrefix(f)
	if !ok {
		return upstreamCall{path: "/v1/chat/completions", idPrefix: "chatcmpl-", body: body}, true
	}
	gen, spliced, err := s.splicedRender(ctx, f, body, src)
	if err != nil {
		writeRefusal(w, err)
		return upstreamCall{}, false
	}
	shape := replyShape{wantIDs: f.isTrue("return_token_ids"), asTokenIDs: f.isTrue("return_tokens_as_token_ids")}
	shape.topN, _ = f.int("top_logprobs")
	return upstreamCall{
		// vLLM names a generate request "generate-tokens-<request_id>".
		path: "/inference/v1/generate", idPrefix: "generate-tokens-",
		bodyFor: func(reqID string) []byte {
			g := make(map[string]codec.RawMessage, len(gen))
			for k, v := range gen {
				g[k] = v
			}
			g["request_id"], _ = codec.Marshal(reqID)
			b, _ := codec.Marshal(g)
			return b
		},
		finish: func(ctx context.Context, reqID string, reply []byte) (int, []byte, error) {
			return s.derender(ctx, reqID, body, reply, spliced, shape)
		},
	}, true
}

// replyShape is what the chat request asked of its reply's token fields.
type replyShape struct {
	// wantIDs: return_token_ids, the prompt's and the generation's ids.
	wantIDs bool
	// asTokenIDs: return_tokens_as_token_ids, log-prob tokens spelled
	// "token_id:N".
	asTokenIDs bool
	// topN is top_logprobs.
	topN int
}

// generateLogprobs are the ids of a generate reply's log-probs, per choice
// and position: the sampled token's, then its top candidates'.
type generateLogprobs struct {
	Choices []struct {
		Logprobs *struct {
			Content []struct {
				TokenID     int `json:"token_id"`
				TopLogprobs []struct {
					TokenID int `json:"token_id"`
				} `json:"top_logprobs"`
			} `json:"content"`
		} `json:"logprobs"`
	} `json:"choices"`
}

// derender turns a generate reply into the chat reply vLLM's chat route
// gives: derendered by vLLM with the original request (its tool parser),
// then named and shaped as the chat route names and shapes its replies.
// vLLM's derender spells log-prob tokens as text whatever the request
// asked; with return_tokens_as_token_ids they are spelled "token_id:N"
// again from the generate reply's ids, as the chat route spells them (and
// NeMo Gym's vllm_model reads the generated ids from them).
func (s *Server) derender(ctx context.Context, reqID string, chatBody, genReply []byte, prompt []int, shape replyShape) (int, []byte, error) {
	wantIDs, topN := shape.wantIDs, shape.topN
	var genIDs generateLogprobs
	if shape.asTokenIDs {
		if err := codec.Unmarshal(genReply, &genIDs); err != nil {
			return 0, nil, fmt.Errorf("vLLM's generate reply: %w", err)
		}
	}
	db, err := codec.Marshal(map[string]any{
		"generate_response": codec.RawMessage(genReply), "prompt_tokens": len(prompt),
		"prompt_token_ids": prompt, "chat_request": codec.RawMessage(chatBody),
	})
	if err != nil {
		return 0, nil, err
	}
	status, _, reply, err := s.postVLLM(ctx, "/v1/chat/completions/derender", nil, db)
	if err != nil {
		return 0, nil, err
	}
	if status != http.StatusOK {
		return status, reply, nil
	}
	var top map[string]any
	if err := codec.Unmarshal(reply, &top); err != nil {
		return 0, nil, err
	}
	top["id"] = "chatcmpl-" + reqID
	if wantIDs {
		top["prompt_token_ids"] = prompt
	}
	choices, _ := top["choices"].([]any)
	for ci, c := range choices {
		ch, _ := c.(map[string]any)
		if shape.asTokenIDs {
			if err := spellTokenIDs(ch, genIDs, ci); err != nil {
				return 0, nil, err
			}
		}
		if msg, ok := ch["message"].(map[string]any); ok {
			calls, _ := msg["tool_calls"].([]any)
			for _, tc := range calls {
				if m, ok := tc.(map[string]any); ok {
					if id, ok := m["id"].(string); ok && !strings.HasPrefix(id, "chatcmpl-tool-") {
						m["id"] = "chatcmpl-tool-" + id
					}
				}
			}
		}
		// The chat route lists top_logprobs only when asked for some.
		if lp, ok := ch["logprobs"].(map[string]any); ok && topN == 0 {
			entries, _ := lp["content"].([]any)
			for _, e := range entries {
				if m, ok := e.(map[string]any); ok {
					m["top_logprobs"] = []any{}
				}
			}
		}
		if !wantIDs {
			delete(ch, "token_ids")
		}
	}
	out, err := codec.Marshal(top)
	return http.StatusOK, out, err
}

// spellTokenIDs spells the log-prob tokens of choice ci "token_id:N", the
// ids from the generate reply, position by position (derender resolves
// each position's candidates in the generate reply's order).
func spellTokenIDs(ch map[string]any, gen generateLogprobs, ci int) error {
	lp, _ := ch["logprobs"].(map[string]any)
	entries, _ := lp["content"].([]any)
	if len(entries) == 0 {
		return nil
	}
	if ci >= len(gen.Choices) || gen.Choices[ci].Logprobs == nil || len(gen.Choices[ci].Logprobs.Content) != len(entries) {
		return fmt.Errorf("vLLM's derender reply has %d log-probs for choice %d, which its generate reply does not match", len(entries), ci)
	}
	for i, e := range entries {
		m, _ := e.(map[string]any)
		if m == nil {
			continue
		}
		g := gen.Choices[ci].Logprobs.Content[i]
		m["token"] = fmt.Sprintf("token_id:%d", g.TokenID)
		tops, _ := m["top_logprobs"].([]any)
		for j, t := range tops {
			if tm, ok := t.(map[string]any); ok && j < len(g.TopLogprobs) {
				tm["token"] = fmt.Sprintf("token_id:%d", g.TopLogprobs[j].TokenID)
			}
		}
	}
	return nil
}

// promptIDs is the prompt vLLM generates a call from: spliced when the
// history carries its token ids, else vLLM's rendering (/tokenize).
func (s *Server) promptIDs(ctx context.Context, f chatFields) ([]int, error) {
	if src, ok := modelPrefix(f); ok {
		body, err := codec.Marshal(f)
		if err != nil {
			return nil, err
		}
		_, spliced, err := s.splicedRender(ctx, f, body, src)
		return spliced, err
	}
	render := map[string]codec.RawMessage{}
	for _, k := range renderFields {
		if f.present(k) {
			render[k] = f[k]
		}
	}
	return s.tokenize(ctx, render)
}

// tokenize posts body to vLLM's /tokenize and returns its tokens; a
// refusal comes back as a *vllmRefusal, to be answered as vLLM sent it.
func (s *Server) tokenize(ctx context.Context, body any) ([]int, error) {
	b, err := codec.Marshal(body)
	if err != nil {
		return nil, err
	}
	status, _, reply, err := s.postVLLM(ctx, "/tokenize", nil, b)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, &vllmRefusal{status, reply}
	}
	var tok struct {
		Tokens []int `json:"tokens"`
	}
	if err := codec.Unmarshal(reply, &tok); err != nil {
		return nil, fmt.Errorf("vLLM's /tokenize reply: %w: %.200s", err, reply)
	}
	return tok.Tokens, nil
}

// writeRefusal answers a vLLM refusal as vLLM sent it, anything else as
// vLLM's 502-shaped error.
func writeRefusal(w http.ResponseWriter, err error) {
	if r, ok := err.(*vllmRefusal); ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(r.status)
		_, _ = w.Write(r.body)
		return
	}
	writeVLLMError(w, http.StatusBadGateway, "vLLM did not answer: "+err.Error())
}
