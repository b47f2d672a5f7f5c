package modelproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

// tokenIDPrefix is how vLLM spells a logprob token with
// return_tokens_as_token_ids.
const tokenIDPrefix = "token_id:"

// extractTokens reads the training token fields of choices[0], in NeMo Gym's
// order of sources (VLLMModel.chat_completions in nemo-gym 0.7.0's
// responses_api_models/vllm_model/app.py; gym-servers.md §4.4):
//  1. a complete bundle already on the message;
//  2. vLLM's top-level prompt_token_ids and the choice's token_ids
//     (return_token_ids), with log-probs from logprobs.content, whose
//     "token_id:N" tokens must agree;
//  3. with neither, the "token_id:N" logprob tokens for the generation
//     (return_tokens_as_token_ids), and errNoPromptIDs: the prompt's ids
//     come from the worker's /tokenize (see completeTokens).
//
// As in Gym, source 2 is all or nothing (one of its two fields alone is
// an error, never a /tokenize), and a bundle must agree with it when both
// are there. Token ids are never rebuilt from text.
func extractTokens(c *openai.ChatCompletion) (openai.TokenFields, error) {
	if len(c.Choices) == 0 {
		return openai.TokenFields{}, errors.New("the upstream reply has no choices")
	}
	ch := &c.Choices[0]
	inline := c.PromptTokenIDs != nil
	if inline != (ch.TokenIDs != nil) {
		missing := "choices[0].token_ids"
		if !inline {
			missing = "prompt_token_ids"
		}
		return openai.TokenFields{}, fmt.Errorf("the upstream returned partial token ids: no %s (return_token_ids gives both)", missing)
	}
	if ch.Message.HasTokens() {
		tf := ch.Message.TokenFields
		if err := tf.Validate(); err != nil {
			return openai.TokenFields{}, fmt.Errorf("token fields on the upstream message: %w", err)
		}
		if inline && (!slices.Equal(tf.PromptTokenIDs, c.PromptTokenIDs) || !slices.Equal(tf.GenerationTokenIDs, ch.TokenIDs)) {
			return openai.TokenFields{}, errors.New("the token fields on the upstream message disagree with its prompt_token_ids and token_ids")
		}
		return tf, nil
	}
	if ch.Logprobs == nil {
		return openai.TokenFields{}, errors.New("the upstream returned no logprobs for the generated tokens")
	}
	entries := ch.Logprobs.Content
	logprobs := make([]float64, len(entries))
	for i, e := range entries {
		logprobs[i] = e.Logprob
	}
	gen := ch.TokenIDs
	if gen == nil {
		ids, err := logprobTokenIDs(entries)
		if err != nil {
			return openai.TokenFields{}, err
		}
		gen = ids
	} else {
		if len(gen) != len(entries) {
			return openai.TokenFields{}, fmt.Errorf("the upstream returned %d token_ids but %d logprobs", len(gen), len(entries))
		}
		for i, e := range entries {
			id, ok := parseTokenID(e.Token)
			if ok && id != gen[i] {
				return openai.TokenFields{}, fmt.Errorf("token %d: token_ids says %d but logprobs says %q", i, gen[i], e.Token)
			}
		}
	}
	tf := openai.TokenFields{PromptTokenIDs: c.PromptTokenIDs, GenerationTokenIDs: orEmpty(gen), GenerationLogProbs: logprobs}
	if !inline {
		return tf, errNoPromptIDs
	}
	return tf, nil
}

// errNoPromptIDs is a reply with the generation's ids in its log-probs and
// no inline ids (a vLLM not asked for return_token_ids, or without it):
// the prompt's ids come from the worker's /tokenize instead, as NeMo Gym's
// vllm_model gets them.
var errNoPromptIDs = errors.New("the upstream returned no prompt_token_ids (is return_token_ids supported?)")

func logprobTokenIDs(entries []openai.TokenLogprob) ([]int, error) {
	ids := make([]int, len(entries))
	for i, e := range entries {
		id, ok := parseTokenID(e.Token)
		if !ok {
			return nil, fmt.Errorf("logprob token %d is %q, not token_id:<id>, and the upstream sent no token_ids", i, e.Token)
		}
		ids[i] = id
	}
	return ids, nil
}

// parseTokenID reads "token_id:<n>".
func parseTokenID(tok string) (int, bool) {
	rest, ok := strings.CutPrefix(tok, tokenIDPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil && n >= 0
}

func orEmpty(s []int) []int {
	if s == nil {
		return []int{}
	}
	return s
}

// tokenizeFields are the upstream request's fields a /tokenize of its
// prompt takes (VLLMModel._TOKENIZE_CHAT_FIELDS in NeMo Gym's
// responses_api_models/vllm_model/app.py at 07d6b0d07b22).
var tokenizeFields = [...]string{"model", "messages", "tools", "chat_template_kwargs", "mm_processor_kwargs", "required_prefix_token_ids"}

// maxTokenizeReply bounds a /tokenize reply: the prompt's ids as JSON.
const maxTokenizeReply = 64 << 20

// completeTokens is extractTokens, with the prompt's ids from the
// worker's /tokenize when the reply has the generation's but not the
// prompt's. up is the request the upstream was sent. A /tokenize that
// fails is a *tokenizeError, which fails the call (callError).
func (s *Server) completeTokens(ctx context.Context, c *openai.ChatCompletion, up []byte) (openai.TokenFields, error) {
	tf, err := extractTokens(c)
	if !errors.Is(err, errNoPromptIDs) || !s.cfg.ReturnTokenIDs {
		return tf, err
	}
	prompt, terr := s.tokenize(ctx, up)
	if terr != nil {
		return openai.TokenFields{}, &tokenizeError{err: terr}
	}
	tf.PromptTokenIDs = prompt
	return tf, nil
}

// tokenizeError is a /tokenize fallback that failed. It fails the call, as
// it fails NeMo Gym's vllm_model's (create_tokenize raises out of
// chat_completions, answered 500): unlike a reply whose token fields are
// unusable, which is answered and recorded as a capture failure, here the
// worker failed a request the call needs, after the generation ran.
type tokenizeError struct{ err error }

func (e *tokenizeError) Error() string {
	return "the upstream returned no prompt_token_ids and its /tokenize failed: " + e.err.Error()
}

func (e *tokenizeError) Unwrap() error { return e.err }

// callError is the error a token error fails the call with: a failed
// /tokenize, as an upstream error that is not to be retried (the
// generation ran); nil for any other, a capture failure only.
func callError(terr error) error {
	var te *tokenizeError
	if !errors.As(terr, &te) {
		return nil
	}
	return apierror.New(apierror.UpstreamError, "%s", te.Error())
}

// tokenize posts the request's prompt fields to <worker root>/tokenize
// (vLLM's tokenize route) and returns its tokens.
func (s *Server) tokenize(ctx context.Context, up []byte) (codec.Ints, error) {
	var f map[string]codec.RawMessage
	if err := codec.Unmarshal(up, &f); err != nil {
		return nil, err
	}
	body := make(map[string]codec.RawMessage, len(tokenizeFields))
	for _, k := range tokenizeFields {
		if v, ok := f[k]; ok {
			body[k] = v
		}
	}
	b, err := encodeObject(body)
	if err != nil {
		return nil, err
	}
	client, err := s.upstream.client(ctx)
	if err != nil {
		return nil, err
	}
	i, _ := s.acquire("", nil)
	defer s.releaseWorker(i)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.workers[i].root+"/tokenize", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if s.cfg.Upstream.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+s.cfg.Upstream.APIKey)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenizeReply))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, (&upstreamStatus{status: resp.StatusCode, body: rb})
	}
	var out struct {
		Tokens codec.Ints `json:"tokens"`
	}
	if err := codec.Unmarshal(rb, &out); err != nil || out.Tokens == nil {
		return nil, fmt.Errorf("the /tokenize reply has no tokens list")
	}
	return out.Tokens, nil
}
