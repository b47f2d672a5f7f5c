package modelproxy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/openai"
)

// tokenIDPrefix is how vLLM spells a logprob token with
// return_tokens_as_token_ids.
const tokenIDPrefix = "token_id:"

// extractTokens reads the training token fields of choices[0], in NeMo Gym's
// order of sources (gym-servers.md §4.4):
//  1. a complete bundle already on the message;
//  2. vLLM's top-level prompt_token_ids and the choice's token_ids, with
//     log-probs from logprobs.content, whose "token_id:N" tokens must agree;
//  3. the "token_id:N" logprob tokens alone for the generation, with the
//     top-level prompt_token_ids.
//
// Token ids are never rebuilt from text: without prompt ids from the
// upstream there are no token fields.
func extractTokens(c *openai.ChatCompletion) (openai.TokenFields, error) {
	if len(c.Choices) == 0 {
		return openai.TokenFields{}, errors.New("the upstream reply has no choices")
	}
	ch := &c.Choices[0]
	if ch.Message.HasTokens() {
		tf := ch.Message.TokenFields
		if err := tf.Validate(); err != nil {
			return openai.TokenFields{}, fmt.Errorf("token fields on the upstream message: %w", err)
		}
		return tf, nil
	}
	if c.PromptTokenIDs == nil {
		return openai.TokenFields{}, errors.New("the upstream returned no prompt_token_ids (is return_token_ids supported?)")
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
	return openai.TokenFields{PromptTokenIDs: c.PromptTokenIDs, GenerationTokenIDs: orEmpty(gen), GenerationLogProbs: logprobs}, nil
}

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
