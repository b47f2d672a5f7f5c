package vllmcut

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"regexp"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// PrefixDigest is a receipt's prefix_digest of token ids.
func PrefixDigest(ids []int) string { return gencut.PrefixDigest(ids) }

// listedCall is one call a cut round names.
type listedCall struct {
	id, captureKey string
}

// cutResult is one listed call's outcome.
type cutResult struct {
	staged *staged
	reason string
	// limit is the call's output limit, for upstream's receipt.
	limit int
}

func (s *Server) authorized(r *http.Request) error {
	if s.cfg.ControlAuthToken == "" {
		return apierror.New(apierror.Unauthorized, "generation cuts are disabled: this worker has no control_auth_token")
	}
	if !httpserver.BearerMatches(r, s.cfg.ControlAuthToken) {
		return apierror.New(apierror.Unauthorized, "missing or invalid bearer token")
	}
	return nil
}

// cut aborts every listed call that can be cut, through vLLM's
// /inference/v1/abort_requests, and waits until each aborted call's reply
// has come back and its prefix is staged (or its outcome is otherwise
// known, or the round's wait ends). Results are in listed order.
func (s *Server) cut(ctx context.Context, listed []listedCall) []cutResult {
	out := make([]cutResult, len(listed))
	var asked []*call
	var ids []string
	s.mu.Lock()
	for i, l := range listed {
		c := s.active[l.id]
		switch {
		case c == nil:
			out[i].reason = ReasonUnknownCall
		case c.captureKey != l.captureKey:
			out[i].reason = fmt.Sprintf("%s: the call belongs to %q", ReasonCaptureKey, c.captureKey)
		case c.uncuttable != "":
			out[i].reason = c.uncuttable
		case c.cutAsked:
			out[i].reason = ReasonBusy
		default:
			c.cutAsked, c.settled = true, make(chan struct{})
			asked = append(asked, c)
			ids = append(ids, c.abortID)
		}
	}
	s.mu.Unlock()
	if len(asked) == 0 {
		return out
	}
	body, _ := codec.Marshal(map[string]any{"request_ids": ids})
	status, _, reply, err := s.postVLLM(ctx, "/inference/v1/abort_requests", nil, body)
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("vLLM answered %d: %s", status, truncate(reply, 300))
	}
	if err != nil {
		// Nothing was aborted: the calls go on as if never asked.
		s.log.WarnContext(ctx, "vLLM refused the abort; no call is cut (start vLLM with --enable-scale-out)", "err", err)
		s.mu.Lock()
		for _, c := range asked {
			c.cutAsked = false
		}
		s.mu.Unlock()
		for i := range out {
			if out[i].reason == "" {
				out[i].reason = ReasonAbort
			}
		}
		return out
	}
	wctx, cancel := s.cutContext(ctx)
	defer cancel()
	byID := map[string]*call{}
	for _, c := range asked {
		byID[c.id] = c
	}
	for i, l := range listed {
		c := byID[l.id]
		if c == nil {
			continue
		}
		select {
		case <-c.settled:
			s.mu.Lock()
			o := c.outcome
			s.mu.Unlock()
			out[i].staged, out[i].reason = o.staged, o.reason
		case <-wctx.Done():
			out[i].reason = ReasonTimeout
		}
	}
	return out
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

func newCutID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// handleCutOfEitherShape serves upstream's route, where our model server's
// request (gencut's, listing "active" calls) and upstream's inventory
// ("active_prefixes") both arrive; the body's keys tell them apart.
func (s *Server) handleCutOfEitherShape(r *http.Request) (any, error) {
	body, err := httpserver.ReadBody(r)
	if err != nil {
		return nil, err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var keys map[string]codec.RawMessage
	if codec.Unmarshal(body, &keys) == nil {
		if _, ours := keys["active"]; ours {
			return s.handleCut(r)
		}
	}
	return s.handleUpstreamCut(r)
}

// handleCut is our route (pkg/checkpoint/gencut): {checkpoint_id,
// server_name, active[{model_call_id, capture_key}]} → the receipt.
func (s *Server) handleCut(r *http.Request) (any, error) {
	if err := s.authorized(r); err != nil {
		return nil, err
	}
	body, err := httpserver.ReadBody(r)
	if err != nil {
		return nil, err
	}
	req, err := gencut.ParseRequest(body)
	if err != nil {
		return nil, err
	}
	listed := make([]listedCall, len(req.Active))
	for i, a := range req.Active {
		listed[i] = listedCall{id: a.ModelCallID, captureKey: a.CaptureKey}
	}
	res := s.cut(r.Context(), listed)
	rc := gencut.Receipt{CheckpointID: req.CheckpointID, CutID: newCutID(), Prefixes: make([]gencut.Prefix, len(res))}
	cut := 0
	for i, o := range res {
		p := gencut.Prefix{ModelCallID: listed[i].id, CaptureKey: listed[i].captureKey, Disposition: gencut.DispositionDurableFailure, Reason: o.reason}
		if o.staged != nil {
			p = gencut.Prefix{ModelCallID: listed[i].id, CaptureKey: listed[i].captureKey, Disposition: gencut.DispositionDurablePrefix,
				StagingKey: o.staged.key, PrefixTokenCount: len(o.staged.tokenIDs), PrefixDigest: PrefixDigest(o.staged.tokenIDs)}
			cut++
		}
		rc.Prefixes[i] = p
	}
	s.log.InfoContext(r.Context(), "generation cut", "checkpoint_id", req.CheckpointID, "server_name", req.ServerName,
		"cut_id", rc.CutID, "listed", len(listed), "cut", cut)
	return codec.RawMessage(gencut.EncodeReceipt(rc)), nil
}

// Upstream's wire (nemo_gym/_checkpoint/generation_cut.py, NVIDIA-NeMo/Gym
// 012b7b66): GenerationCutInventory in, GenerationCutReceipt out; every
// model forbids unknown fields.
type (
	upstreamPrefix struct {
		TicketID    string  `json:"ticket_id"`
		RolloutID   string  `json:"rollout_id"`
		Attempt     int     `json:"attempt"`
		ModelCallID string  `json:"model_call_id"`
		AdmittedAt  float64 `json:"admitted_at"`
	}
	upstreamInventory struct {
		CheckpointID    string           `json:"checkpoint_id"`
		ServerName      string           `json:"server_name"`
		ActivePrefixes  []upstreamPrefix `json:"active_prefixes"`
		InventoryDigest string           `json:"inventory_digest"`
	}
	upstreamAck struct {
		upstreamPrefix
		Disposition          string   `json:"disposition"`
		CutKind              *string  `json:"cut_kind"`
		FrozenBufferID       *string  `json:"frozen_buffer_id"`
		StagingKeys          []string `json:"staging_keys"`
		PrefixTokenCount     *int     `json:"prefix_token_count"`
		PrefixDigest         *string  `json:"prefix_digest"`
		EffectiveOutputLimit *int     `json:"effective_output_limit"`
		TerminalFinishReason *string  `json:"terminal_finish_reason"`
		TerminalStopReason   *string  `json:"terminal_stop_reason"`
	}
	upstreamReceipt struct {
		CheckpointID      string            `json:"checkpoint_id"`
		CutID             string            `json:"cut_id"`
		InventoryDigest   string            `json:"inventory_digest"`
		Inventory         upstreamInventory `json:"inventory"`
		BackendSnapshotID string            `json:"backend_snapshot_id"`
		Prefixes          []upstreamAck     `json:"prefixes"`
	}
)

var hexDigest = regexp.MustCompile(`^[0-9a-f]{64}$`)

// handleUpstreamCut is NeMo Gym's route: the calls named by rollout id,
// attempt and model call id; every one answered once, echoing its
// identity, as GenerationCutReceipt.validate_for requires.
func (s *Server) handleUpstreamCut(r *http.Request) (any, error) {
	if err := s.authorized(r); err != nil {
		return nil, err
	}
	body, err := httpserver.ReadBody(r)
	if err != nil {
		return nil, err
	}
	invalid := func(format string, args ...any) error {
		return apierror.New(apierror.InvalidRequest, format, args...).WithStatus(http.StatusUnprocessableEntity)
	}
	var inv upstreamInventory
	if err := codec.UnmarshalStrict(body, &inv); err != nil {
		return nil, invalid("%s", codec.DescribeError(err))
	}
	if inv.CheckpointID == "" || inv.ServerName == "" || !hexDigest.MatchString(inv.InventoryDigest) {
		return nil, invalid("checkpoint_id and server_name must be set and inventory_digest be 64 hex digits")
	}
	if len(inv.ActivePrefixes) > gencut.MaxActive {
		return nil, invalid("at most %d active prefixes, got %d", gencut.MaxActive, len(inv.ActivePrefixes))
	}
	listed := make([]listedCall, len(inv.ActivePrefixes))
	seen := map[string]bool{}
	for i, p := range inv.ActivePrefixes {
		ep := rollout.EpisodeID{RolloutID: p.RolloutID, Attempt: p.Attempt}
		if p.TicketID == "" || !gencut.ValidCallID(p.ModelCallID) || ep.Validate() != nil {
			return nil, invalid("active_prefixes[%d] needs a ticket_id, a model_call_id, a rollout_id and an attempt >= 0", i)
		}
		if seen[p.TicketID] {
			return nil, invalid("active_prefixes[%d]: ticket_id %q is listed twice", i, p.TicketID)
		}
		seen[p.TicketID] = true
		listed[i] = listedCall{id: p.ModelCallID, captureKey: ep.CaptureKey()}
	}
	res := s.cut(r.Context(), listed)
	rc := upstreamReceipt{
		CheckpointID: inv.CheckpointID, CutID: newCutID(), InventoryDigest: inv.InventoryDigest, Inventory: inv,
		BackendSnapshotID: "vllmcut-" + newCutID(), Prefixes: make([]upstreamAck, len(res)),
	}
	if rc.Inventory.ActivePrefixes == nil {
		rc.Inventory.ActivePrefixes = []upstreamPrefix{}
	}
	for i, o := range res {
		ack := upstreamAck{upstreamPrefix: inv.ActivePrefixes[i], Disposition: gencut.DispositionDurableFailure, StagingKeys: []string{}}
		if st := o.staged; st != nil {
			kind, n, digest := "active_prefix", len(st.tokenIDs), PrefixDigest(st.tokenIDs)
			// The call's own limit; a call that set none is bounded by the
			// context, which the sidecar does not know: the prefix is the
			// least it can claim.
			limit := st.limit
			if limit < 1 {
				limit = max(n, 1)
			}
			ack.Disposition, ack.CutKind, ack.FrozenBufferID = gencut.DispositionDurablePrefix, &kind, &st.key
			ack.StagingKeys, ack.PrefixTokenCount, ack.PrefixDigest, ack.EffectiveOutputLimit = []string{st.key}, &n, &digest, &limit
		}
		rc.Prefixes[i] = ack
	}
	return rc, nil
}
