package vllmcut

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
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
	req, err := gencut.ParseLegacyRequest(body)
	if err != nil {
		return nil, err
	}
	listed := make([]listedCall, len(req.Active))
	for i, a := range req.Active {
		listed[i] = listedCall{id: a.ModelCallID, captureKey: a.CaptureKey}
	}
	res := s.cut(r.Context(), listed)
	rc := gencut.LegacyReceipt{CheckpointID: req.CheckpointID, CutID: newCutID(), Prefixes: make([]gencut.LegacyPrefix, len(res))}
	cut := 0
	for i, o := range res {
		p := gencut.LegacyPrefix{ModelCallID: listed[i].id, CaptureKey: listed[i].captureKey, Disposition: gencut.DispositionDurableFailure, Reason: o.reason}
		if o.staged != nil {
			p = gencut.LegacyPrefix{ModelCallID: listed[i].id, CaptureKey: listed[i].captureKey, Disposition: gencut.DispositionDurablePrefix,
				StagingKey: o.staged.key, PrefixTokenCount: len(o.staged.tokenIDs), PrefixDigest: PrefixDigest(o.staged.tokenIDs)}
			cut++
		}
		rc.Prefixes[i] = p
	}
	s.log.InfoContext(r.Context(), "generation cut", "checkpoint_id", req.CheckpointID, "server_name", req.ServerName,
		"cut_id", rc.CutID, "listed", len(listed), "cut", cut)
	return codec.RawMessage(gencut.EncodeLegacyReceipt(rc)), nil
}

// handleUpstreamCut is NeMo Gym's wire (gencut.Inventory in,
// gencut.Receipt out; nemo_gym/_checkpoint/generation_cut.py): the calls
// named by rollout id, attempt and model call id, every one answered once
// with the identity it was listed with, as GenerationCutReceipt.validate_for
// requires.
func (s *Server) handleUpstreamCut(r *http.Request) (any, error) {
	if err := s.authorized(r); err != nil {
		return nil, err
	}
	body, err := httpserver.ReadBody(r)
	if err != nil {
		return nil, err
	}
	inv, err := gencut.ParseInventory(body)
	if err != nil {
		return nil, err
	}
	listed := make([]listedCall, len(inv.ActivePrefixes))
	for i, p := range inv.ActivePrefixes {
		listed[i] = listedCall{id: p.ModelCallID, captureKey: p.CaptureKey()}
	}
	res := s.cut(r.Context(), listed)
	rc := gencut.Receipt{
		CheckpointID: inv.CheckpointID, CutID: newCutID(), InventoryDigest: inv.InventoryDigest, Inventory: inv,
		BackendSnapshotID: "vllmcut-" + newCutID(), Prefixes: make([]gencut.PrefixAck, len(res)),
	}
	for i, o := range res {
		st := o.staged
		if st == nil {
			rc.Prefixes[i] = gencut.Failure(inv.ActivePrefixes[i])
			continue
		}
		// The call's own limit; a call that set none is bounded by the
		// context, which the sidecar does not know: the prefix is the
		// least it can claim.
		n, limit := len(st.tokenIDs), st.limit
		if limit < 1 {
			limit = max(n, 1)
		}
		rc.Prefixes[i] = gencut.DurablePrefix(inv.ActivePrefixes[i], st.key, n, PrefixDigest(st.tokenIDs), limit)
	}
	b, err := gencut.EncodeReceipt(rc)
	if err != nil {
		return nil, err
	}
	return codec.RawMessage(b), nil
}
