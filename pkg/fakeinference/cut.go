package fakeinference

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/gymfleet/gymfleet/pkg/apierror"
	"github.com/gymfleet/gymfleet/pkg/codec"
	"github.com/gymfleet/gymfleet/pkg/httpserver"
	"github.com/gymfleet/gymfleet/pkg/rollout"
)

// Dispositions of a generation-cut receipt entry.
const (
	DispositionDurablePrefix  = "durable_prefix"
	DispositionDurableFailure = "durable_failure"
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

// MaxCutRequestActive bounds the calls one generation-cut request may list.
const MaxCutRequestActive = 100000

// StagingKeyPrefix starts every generation-cut staging key.
const StagingKeyPrefix = "__generation_cut__/"

// StagingKey is where a cut call's prefix is staged:
// __generation_cut__/<capture_key>/<model_call_id>.
func StagingKey(captureKey, modelCallID string) string {
	return StagingKeyPrefix + captureKey + "/" + modelCallID
}

// CutRequest is the body of POST /_ckpt/generation-cut.
type CutRequest struct {
	CheckpointID string       `json:"checkpoint_id"`
	ServerName   string       `json:"server_name"`
	Active       []ActiveCall `json:"active"`
}

// ActiveCall names one call the model server wants cut.
type ActiveCall struct {
	ModelCallID string `json:"model_call_id"`
	CaptureKey  string `json:"capture_key"`
}

// CutReceipt answers a generation cut: one entry per listed call, in request
// order. Prefixes are staged before the receipt is sent.
type CutReceipt struct {
	CheckpointID string      `json:"checkpoint_id"`
	CutID        string      `json:"cut_id"`
	Prefixes     []CutPrefix `json:"prefixes"`
}

// CutPrefix is one call's outcome. A durable_prefix carries the staging
// fields; a durable_failure carries only its reason.
type CutPrefix struct {
	ModelCallID      string `json:"model_call_id"`
	CaptureKey       string `json:"capture_key"`
	Disposition      string `json:"disposition"`
	Reason           string `json:"reason,omitempty"`
	StagingKey       string `json:"staging_key,omitempty"`
	PrefixTokenCount int    `json:"prefix_token_count,omitempty"`
	PrefixDigest     string `json:"prefix_digest,omitempty"`
}

// ParseCutRequest decodes and validates a generation-cut body: unknown fields
// are refused, ids are checked, and no call is listed twice. Its error is an
// *apierror.Error answered with 422.
func ParseCutRequest(body []byte) (CutRequest, error) {
	var req CutRequest
	invalid := func(format string, args ...any) error {
		return apierror.New(apierror.InvalidRequest, format, args...).WithStatus(http.StatusUnprocessableEntity)
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return req, invalid("request body is empty; expected a JSON object")
	}
	if err := codec.UnmarshalStrict(body, &req); err != nil {
		return req, invalid("%s", codec.DescribeError(err))
	}
	if !rollout.ValidID(req.CheckpointID) {
		return req, invalid("checkpoint_id %q must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", req.CheckpointID)
	}
	if strings.TrimSpace(req.ServerName) == "" || len(req.ServerName) > 256 {
		return req, invalid("server_name must be 1 to 256 characters")
	}
	if len(req.Active) > MaxCutRequestActive {
		return req, invalid("at most %d active calls per request, got %d", MaxCutRequestActive, len(req.Active))
	}
	seen := make(map[string]bool, len(req.Active))
	for i, a := range req.Active {
		if !validCallID(a.ModelCallID) {
			return req, invalid("active[%d].model_call_id must be 1 to 256 visible characters", i)
		}
		if _, err := rollout.ParseCaptureKey(a.CaptureKey); err != nil {
			return req, invalid("active[%d].capture_key: %v", i, err)
		}
		if seen[a.ModelCallID] {
			return req, invalid("active[%d]: model_call_id %q is listed twice", i, a.ModelCallID)
		}
		seen[a.ModelCallID] = true
	}
	return req, nil
}

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
		return nil, badRequest("generation cut %s is not staged", key)
	}
	if st.promptDigest != promptDigest {
		return nil, badRequest("generation cut %s was staged for a different prompt", key)
	}
	return st, nil
}

func (s *Server) authorized(r *http.Request) error {
	if s.cfg.ControlAuthToken == "" {
		return apierror.New(apierror.Unauthorized, "generation cuts are disabled: this server has no control_auth_token")
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	// Digests first, so the comparison takes the same time whatever the
	// lengths.
	got, want := sha256.Sum256([]byte(tok)), sha256.Sum256([]byte(s.cfg.ControlAuthToken))
	if !ok || subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
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
	return rep, nil
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
