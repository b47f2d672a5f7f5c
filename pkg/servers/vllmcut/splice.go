package vllmcut

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

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
	var msgs []codec.RawMessage
	if err := codec.Unmarshal(f["messages"], &msgs); err != nil {
		return nil, nil, err
	}
	pb := map[string]any{"messages": msgs[:src.index+1], "add_generation_prompt": false}
	for _, k := range []string{"model", "tools", "chat_template", "chat_template_kwargs", "documents"} {
		if f.present(k) {
			pb[k] = codec.RawMessage(f[k])
		}
	}
	prb, err := codec.Marshal(pb)
	if err != nil {
		return nil, nil, err
	}
	status, _, reply, err = s.postVLLM(ctx, "/tokenize", nil, prb)
	if err != nil {
		return nil, nil, err
	}
	if status != http.StatusOK {
		return nil, nil, &vllmRefusal{status, reply}
	}
	var tok struct {
		Tokens []int `json:"tokens"`
	}
	if err := codec.Unmarshal(reply, &tok); err != nil || len(tok.Tokens) == 0 {
		return nil, nil, fmt.Errorf("vLLM's /tokenize of the history has no tokens: %.200s", reply)
	}
	spliced, err := splicePrefix(src.ids, tok.Tokens, full)
	if err != nil {
		return nil, nil, &vllmRefusal{http.StatusBadRequest, vllmErrorBody(http.StatusBadRequest, err.Error())}
	}
	if gen["token_ids"], err = codec.Marshal(spliced); err != nil {
		return nil, nil, err
	}
	return gen, spliced, nil
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
	wantIDs := f.isTrue("return_token_ids")
	topN, _ := f.int("top_logprobs")
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
			return s.derender(ctx, reqID, body, reply, spliced, wantIDs, topN)
		},
	}, true
}

// derender turns a generate reply into the chat reply vLLM's chat route
// gives: derendered by vLLM with the original request (its tool parser),
// then named and shaped as the chat route names and shapes its replies.
func (s *Server) derender(ctx context.Context, reqID string, chatBody, genReply []byte, prompt []int, wantIDs bool, topN int) (int, []byte, error) {
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
	for _, c := range choices {
		ch, _ := c.(map[string]any)
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
	rb, err := codec.Marshal(render)
	if err != nil {
		return nil, err
	}
	status, _, reply, err := s.postVLLM(ctx, "/tokenize", nil, rb)
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
		return nil, err
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
