package modelproxy

import (
	"github.com/gymfleet/gymfleet/pkg/infra/park"

	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Test access to the decoders and the stream splitter.

func DecodeResponsesRequest(body []byte) (*openai.ResponsesRequest, error) {
	return decodeResponsesRequest(body)
}

func DecodeChatRequest(body []byte) (map[string]codec.RawMessage, error) {
	return decodeChatRequest(body)
}

func EncodeObject(f map[string]codec.RawMessage) ([]byte, error) { return encodeObject(f) }

func ExtractTokens(c *openai.ChatCompletion) (openai.TokenFields, error) { return extractTokens(c) }

// SplitThinkStream feeds content to the stream's <think> filter in the given
// pieces and returns the visible text and the blocks, as streamed.
func SplitThinkStream(pieces []string) (visible string, blocks []string) {
	var f thinkFilter
	for _, p := range pieces {
		for _, seg := range f.feed(p) {
			if seg.think {
				blocks = append(blocks, seg.text)
			} else {
				visible += seg.text
			}
		}
	}
	return visible + f.flush(), blocks
}

// ConstrainedChat reports whether a decoded chat body uses constrained
// decoding (such calls are never cut).
func ConstrainedChat(f map[string]codec.RawMessage) bool { return constrainedChat(f) }

// ConstrainedResponses is ConstrainedChat for a Responses body.
func ConstrainedResponses(body []byte) (bool, error) {
	req, err := decodeResponsesRequest(body)
	if err != nil {
		return false, err
	}
	chat, err := openai.ResponsesToChat(req, "m")
	if err != nil {
		return false, err
	}
	return constrainedResponses(req, chat), nil
}

// CheckpointParticipant is the server's checkpoint participant
// (checkpointing on), for the benchmarks that drive Export and Install.
func CheckpointParticipant(s *Server) ctlplane.Participant { return s.ckpt }

// HeldCalls is how many calls wait at delivery for admission to reopen.
func HeldCalls(s *Server) int {
	return int(s.ckpt.held.Load())
}

// CompletedCall is a model call whose upstream reply is complete: what its
// ledger row will hold.
type CompletedCall struct {
	Model, RequestDigest string
	Tokens               openai.TokenFields
	FinishReason         string
}

// RunCompletedCall takes a call of episode id through the participant's
// call path without HTTP or conversion, the way handleResponses does once
// the upstream answered: admit, describe, deliver (held while admission is
// closed, until ctx ends), stage the ledger row, release. Benchmarks build
// state at 100,000 rollouts with it.
func RunCompletedCall(ctx context.Context, s *Server, id rollout.EpisodeID, c CompletedCall) error {
	r := httptest.NewRequestWithContext(rollout.WithEpisode(ctx, id), http.MethodPost, "/v1/responses", nil)
	w := httptest.NewRecorder()
	t, r, ok := s.admit(w, r, routeResponses)
	if !ok {
		return fmt.Errorf("call of %s refused: %d %s", id, w.Code, w.Body)
	}
	defer s.hooks.release(w, r, t)
	s.hooks.describeChat(t, c.RequestDigest, nil)
	park.Run(func(task *park.Task) {
		s.finish(task, w, r, t, reply{
			body:    []byte(`{}`),
			capture: &captured{model: c.Model, requestDigest: c.RequestDigest, tokens: c.Tokens, finishReason: c.FinishReason},
			outcome: outcomeOK,
		})
	})
	return context.Cause(r.Context())
}

// SpliceChatReply and RewriteChatReplyMaps are the two forms of the chat
// reply rewrite.
func SpliceChatReply(body []byte, tf openai.TokenFields, withTokens, keepLogprobs bool) ([]byte, bool) {
	return spliceChatReply(body, tf, withTokens, keepLogprobs)
}

func RewriteChatReplyMaps(body []byte, tf openai.TokenFields, withTokens, keepLogprobs bool) ([]byte, error) {
	return rewriteChatReplyMaps(body, tf, withTokens, keepLogprobs)
}

// ConvertResponses is the chat request a Responses body becomes before its
// digest: decoded, converted, with the extras and token parameters.
func ConvertResponses(tb testing.TB, s *Server, body []byte) *openai.ChatRequest {
	tb.Helper()
	req, err := decodeResponsesRequest(body)
	if err != nil {
		tb.Fatal(err)
	}
	chat, err := openai.ResponsesToChat(req, s.cfg.Upstream.Model)
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.applyExtras(req, chat); err != nil {
		tb.Fatal(err)
	}
	s.setTokenParams(chat, wantsLogprobs(req))
	return chat
}

// EncodeAndDigest is what a server does with a converted request before
// it calls the upstream: encode it, and take the request digest.
func EncodeAndDigest(s *Server, c *openai.ChatRequest) ([]byte, string, error) {
	up, messages, tools, err := encodeUpstream(c)
	if err != nil {
		return nil, "", err
	}
	digest, err := s.digests.request(messages, tools)
	return up, digest, err
}

// DigestRequest is a server's request digest of a request's messages and
// tools.
func DigestRequest(s *Server, messages, tools []byte) (string, error) {
	return s.digests.request(messages, tools)
}
