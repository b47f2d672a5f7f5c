package fakeinference

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// The generation-cut contract is pkg/checkpoint/gencut's; these names are the worker's
// view of it.
const (
	DispositionDurablePrefix  = gencut.DispositionDurablePrefix
	DispositionDurableFailure = gencut.DispositionDurableFailure
	MaxCutRequestActive       = gencut.MaxActive
	StagingKeyPrefix          = gencut.StagingKeyPrefix
)

// Reasons of durable_failure entries.
const (
	ReasonUnknownCall = "unknown_call"
	ReasonCaptureKey  = "capture_key_mismatch"
	ReasonHeld        = "held"
	ReasonStreaming   = "streaming"
	ReasonNoTokens    = "no_tokens"
	ReasonFinished    = "finished"
)

// StagingKey is where a cut call's prefix is staged.
func StagingKey(captureKey, modelCallID string) string {
	return gencut.StagingKey(captureKey, modelCallID)
}

// Wire types of POST /ng-control/v1/generation-cut (and /_ckpt/generation-cut).
type (
	CutRequest = gencut.Request
	ActiveCall = gencut.ActiveCall
	CutReceipt = gencut.Receipt
	CutPrefix  = gencut.Prefix
)

// ParseCutRequest decodes and validates a generation-cut body; its error is
// an *apierror.Error answered with 422.
func ParseCutRequest(body []byte) (CutRequest, error) { return gencut.ParseRequest(body) }

// stagedPrefix is one entry of the token store.
type stagedPrefix struct {
	key          string
	sourceCallID string
	captureKey   string
	promptDigest string
	tokens       []genToken
}

// StagedPrefix is a prefix a generation cut staged, as the token store holds it.
type StagedPrefix struct {
	StagingKey   string    `json:"staging_key"`
	ModelCallID  string    `json:"model_call_id"`
	CaptureKey   string    `json:"capture_key"`
	PromptDigest string    `json:"prompt_digest"`
	TokenIDs     []int     `json:"token_ids"`
	Logprobs     []float64 `json:"logprobs"`
	PrefixDigest string    `json:"prefix_digest"`
}

// Staged returns the staged prefix under key. Staged prefixes are kept (a
// restore may continue the same cut again) until POST /_ctl/reset.
func (s *Server) Staged(key string) (StagedPrefix, bool) {
	s.mu.Lock()
	st, ok := s.staged[key]
	s.mu.Unlock()
	if !ok {
		return StagedPrefix{}, false
	}
	out := StagedPrefix{
		StagingKey: st.key, ModelCallID: st.sourceCallID, CaptureKey: st.captureKey, PromptDigest: st.promptDigest,
		TokenIDs: tokenIDs(st.tokens), Logprobs: make([]float64, len(st.tokens)),
	}
	for i, g := range st.tokens {
		out.Logprobs[i] = g.logprob()
	}
	out.PrefixDigest = PrefixDigest(out.TokenIDs)
	return out, true
}

// lookupStaged finds the prefix a continuation names and checks it was cut
// from a call with the same prompt.
func (s *Server) lookupStaged(key, promptDigest string) (*stagedPrefix, *RequestError) {
	s.mu.Lock()
	st, ok := s.staged[key]
	s.mu.Unlock()
	if !ok {
		return nil, badRequest("", "generation cut %s is not staged", key)
	}
	if st.promptDigest != promptDigest {
		return nil, badRequest("", "generation cut %s was staged for a different prompt", key)
	}
	return st, nil
}

func (s *Server) authorized(r *http.Request) error {
	if s.cfg.ControlAuthToken == "" {
		return apierror.New(apierror.Unauthorized, "generation cuts are disabled: this server has no control_auth_token")
	}
	if !httpserver.BearerMatches(r, s.cfg.ControlAuthToken) {
		return apierror.New(apierror.Unauthorized, "missing or invalid bearer token")
	}
	return nil
}

// handleGenerationCut stops each listed call that is generating and has
// produced a token, stages its prefix, and answers the receipt. A call that
// cannot be cut is left untouched: a failed cut only costs regeneration.
func (s *Server) handleGenerationCut(r *http.Request) (any, error) {
	if err := s.authorized(r); err != nil {
		return nil, err
	}
	body, err := httpserver.ReadBody(r)
	if err != nil {
		return nil, err
	}
	req, err := ParseCutRequest(body)
	if err != nil {
		return nil, err
	}
	var idb [8]byte
	_, _ = rand.Read(idb[:])
	rep := CutReceipt{CheckpointID: req.CheckpointID, CutID: hex.EncodeToString(idb[:]), Prefixes: make([]CutPrefix, 0, len(req.Active))}
	round := []string{}

	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for _, a := range req.Active {
		p := CutPrefix{ModelCallID: a.ModelCallID, CaptureKey: a.CaptureKey, Disposition: DispositionDurableFailure}
		c, reason := s.cuttableLocked(a, now)
		if c == nil {
			p.Reason = reason
			rep.Prefixes = append(rep.Prefixes, p)
			continue
		}
		k := c.produced(now)
		key := StagingKey(a.CaptureKey, c.id)
		prefix := append([]genToken(nil), c.tokens[:k]...)
		s.staged[key] = &stagedPrefix{key: key, sourceCallID: c.id, captureKey: a.CaptureKey, promptDigest: c.promptDigest, tokens: prefix}
		c.cut = &cutResult{key: key, tokens: prefix}
		s.finishLocked(c, StatusCut, "abort", k)
		close(c.cutCh)
		p.Disposition, p.StagingKey, p.PrefixTokenCount, p.PrefixDigest = DispositionDurablePrefix, key, k, PrefixDigest(tokenIDs(prefix))
		rep.Prefixes = append(rep.Prefixes, p)
		round = append(round, c.id)
	}
	if len(req.Active) > 0 {
		s.cuts = append(s.cuts, round)
	}
	s.log.InfoContext(r.Context(), "generation cut", "checkpoint_id", req.CheckpointID, "server_name", req.ServerName,
		"cut_id", rep.CutID, "listed", len(req.Active), "cut", len(round))
	return codec.RawMessage(gencut.EncodeReceipt(rep)), nil
}

// cuttableLocked returns the listed call if it can be cut now, or why not.
func (s *Server) cuttableLocked(a ActiveCall, now time.Time) (*call, string) {
	c := s.byID[a.ModelCallID]
	switch {
	case c == nil:
		return nil, ReasonUnknownCall
	case c.captureKey() != a.CaptureKey:
		return nil, fmt.Sprintf("%s: the call belongs to %q", ReasonCaptureKey, c.captureKey())
	case c.status == StatusHeld:
		return nil, ReasonHeld
	case c.status != StatusGenerating:
		return nil, ReasonFinished
	case c.stream:
		return nil, ReasonStreaming
	}
	switch k := c.produced(now); {
	case k == 0:
		return nil, ReasonNoTokens
	case k >= len(c.tokens):
		// Every token is out; the reply is on its way.
		return nil, ReasonFinished
	}
	return c, ""
}
