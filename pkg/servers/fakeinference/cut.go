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
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
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

// Our former generation-cut shape, which the server still answers on
// /_ckpt/generation-cut and, told apart by its "active" list, on
// /ng-control/v1/generation-cut (NeMo Gym's GenerationCutInventory and
// GenerationCutReceipt are pkg/checkpoint/gencut's Inventory and Receipt).
type (
	CutRequest = gencut.LegacyRequest
	ActiveCall = gencut.LegacyActiveCall
	CutReceipt = gencut.LegacyReceipt
	CutPrefix  = gencut.LegacyPrefix
)

// ParseCutRequest decodes and validates a generation-cut body of our former
// shape; its error is an *apierror.Error answered with 422.
func ParseCutRequest(body []byte) (CutRequest, error) { return gencut.ParseLegacyRequest(body) }

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
// The body is NeMo Gym's GenerationCutInventory, answered with its
// GenerationCutReceipt; or our former shape (a list named "active", on
// either route), answered in that shape, for a model server of an earlier
// release.
func (s *Server) handleGenerationCut(r *http.Request) (any, error) {
	if err := s.authorized(r); err != nil {
		return nil, err
	}
	body, err := httpserver.ReadBody(r)
	if err != nil {
		return nil, err
	}
	if r.URL.Path == gencut.LegacyPath {
		return s.legacyCut(r, body)
	}
	inv, err := gencut.ParseInventory(body)
	if err != nil {
		// Our former shape at Gym's route, told apart only when it is not
		// an inventory: parsing every inventory twice costs a prepare.
		var legacy struct {
			Active codec.RawMessage `json:"active"`
		}
		if codec.Unmarshal(body, &legacy) == nil && legacy.Active != nil {
			return s.legacyCut(r, body)
		}
		return nil, err
	}
	rc := gencut.Receipt{
		CheckpointID: inv.CheckpointID, CutID: newCutID(), InventoryDigest: inv.InventoryDigest, Inventory: inv,
		BackendSnapshotID: "fakeinference-token-store", Prefixes: make([]gencut.PrefixAck, len(inv.ActivePrefixes)),
	}
	calls := make([]listedCall, len(inv.ActivePrefixes))
	for i, p := range inv.ActivePrefixes {
		calls[i] = listedCall{modelCallID: p.ModelCallID, episode: rollout.EpisodeID{RolloutID: p.RolloutID, Attempt: p.Attempt}}
	}
	for i, o := range s.cutCalls(calls) {
		if o.Disposition != DispositionDurablePrefix {
			rc.Prefixes[i] = gencut.Failure(inv.ActivePrefixes[i])
			continue
		}
		// The call's planned reply bounds what a continuation generates.
		rc.Prefixes[i] = gencut.DurablePrefix(inv.ActivePrefixes[i], o.StagingKey, o.PrefixTokenCount, o.PrefixDigest, max(o.outputLimit, 1))
	}
	s.log.InfoContext(r.Context(), "generation cut", "checkpoint_id", inv.CheckpointID, "server_name", inv.ServerName,
		"cut_id", rc.CutID, "listed", len(calls))
	b, err := gencut.EncodeReceipt(rc)
	if err != nil {
		return nil, err
	}
	return codec.RawMessage(b), nil
}

// legacyCut answers our former request shape.
func (s *Server) legacyCut(r *http.Request, body []byte) (any, error) {
	req, err := ParseCutRequest(body)
	if err != nil {
		return nil, err
	}
	rep := CutReceipt{CheckpointID: req.CheckpointID, CutID: newCutID(), Prefixes: make([]CutPrefix, 0, len(req.Active))}
	calls := make([]listedCall, len(req.Active))
	for i, a := range req.Active {
		calls[i] = listedCall{modelCallID: a.ModelCallID, legacy: true, captureKey: a.CaptureKey}
	}
	for _, o := range s.cutCalls(calls) {
		rep.Prefixes = append(rep.Prefixes, o.LegacyPrefix)
	}
	s.log.InfoContext(r.Context(), "generation cut", "checkpoint_id", req.CheckpointID, "server_name", req.ServerName,
		"cut_id", rep.CutID, "listed", len(req.Active))
	return codec.RawMessage(gencut.EncodeLegacyReceipt(rep)), nil
}

// cutOutcome is one listed call's outcome, with the call's planned output
// length when it was cut. Its capture key is set for the legacy shape's
// calls and for the calls cut.
type cutOutcome struct {
	gencut.LegacyPrefix
	outputLimit int
}

// listedCall is a call a cut round lists, and the attempt it lists it for:
// by capture key in the legacy shape, by episode in Gym's.
type listedCall struct {
	modelCallID string
	legacy      bool
	captureKey  string            // legacy
	episode     rollout.EpisodeID // not legacy
}

// listedFor reports whether c belongs to the capture key a lists it for.
// A round lists every call in flight: the call's and the listed episode
// are compared first, and their capture keys built (two strings) only
// when they differ, for two episodes one capture key names.
func (a *listedCall) listedFor(c *call) bool {
	if !a.legacy && c.episode != nil && *c.episode == a.episode {
		return true
	}
	return c.captureKey() == a.key()
}

// key is the capture key a lists the call for.
func (a *listedCall) key() string {
	if a.legacy {
		return a.captureKey
	}
	return a.episode.CaptureKey()
}

// cutCalls cuts each listed call it can, staging its prefix, and returns
// every call's outcome in order.
func (s *Server) cutCalls(active []listedCall) []cutOutcome {
	out := make([]cutOutcome, 0, len(active))
	round := []string{}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for i := range active {
		a := &active[i]
		p := cutOutcome{LegacyPrefix: CutPrefix{ModelCallID: a.modelCallID, Disposition: DispositionDurableFailure}}
		if a.legacy {
			p.CaptureKey = a.captureKey
		}
		c, reason := s.cuttableLocked(a, now)
		if c == nil {
			p.Reason = reason
			out = append(out, p)
			continue
		}
		k := c.produced(now)
		captureKey := a.key()
		key := StagingKey(captureKey, c.id)
		prefix := append([]genToken(nil), c.tokens[:k]...)
		s.staged[key] = &stagedPrefix{key: key, sourceCallID: c.id, captureKey: captureKey, promptDigest: c.promptDigest, tokens: prefix}
		c.cut = &cutResult{key: key, tokens: prefix}
		s.finishLocked(c, StatusCut, "abort", k)
		close(c.cutCh)
		p.CaptureKey, p.Disposition, p.StagingKey, p.PrefixTokenCount, p.PrefixDigest = captureKey, DispositionDurablePrefix, key, k, PrefixDigest(tokenIDs(prefix))
		p.outputLimit = len(c.tokens)
		out = append(out, p)
		round = append(round, c.id)
	}
	if len(active) > 0 {
		s.cuts = append(s.cuts, round)
	}
	return out
}

func newCutID() string {
	var idb [8]byte
	_, _ = rand.Read(idb[:])
	return hex.EncodeToString(idb[:])
}

// cuttableLocked returns the listed call if it can be cut now, or why not.
func (s *Server) cuttableLocked(a *listedCall, now time.Time) (*call, string) {
	c := s.byID[a.modelCallID]
	switch {
	case c == nil:
		return nil, ReasonUnknownCall
	case !a.listedFor(c):
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
