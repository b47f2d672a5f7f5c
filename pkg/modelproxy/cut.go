package modelproxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/gymfleet/gymfleet/pkg/codec"
	"github.com/gymfleet/gymfleet/pkg/httpclient"
	"github.com/gymfleet/gymfleet/pkg/openai"
	"github.com/gymfleet/gymfleet/pkg/rollout"
)

// GenerationCutPath is the worker's cut route, under its root URL.
const GenerationCutPath = "/_ckpt/generation-cut"

// Dispositions of a cut receipt entry, and of the cuts metric.
const (
	DispositionDurablePrefix  = "durable_prefix"
	DispositionDurableFailure = "durable_failure"
	// DispositionSkipped counts calls a round did not ask for: streaming or
	// constrained decoding (their prefix cannot be continued as is).
	DispositionSkipped = "skipped"
)

// defaultCutBudget bounds a cut round whose operation has no deadline.
const defaultCutBudget = 30 * time.Second

// maxReceiptBytes bounds a cut receipt (about 300 bytes per call).
const maxReceiptBytes = 64 << 20

// cutRequest is the body of POST <worker>/_ckpt/generation-cut.
type cutRequest struct {
	CheckpointID string       `json:"checkpoint_id"`
	ServerName   string       `json:"server_name"`
	Active       []activeCall `json:"active"`
}

// activeCall names one call to cut.
type activeCall struct {
	ModelCallID string `json:"model_call_id"`
	CaptureKey  string `json:"capture_key"`
}

// CutReceipt is the worker's answer to a generation cut: one entry per
// listed call. Prefixes are staged before it is sent.
type CutReceipt struct {
	CheckpointID string           `json:"checkpoint_id"`
	CutID        string           `json:"cut_id"`
	Prefixes     []CutReceiptItem `json:"prefixes"`
}

// CutReceiptItem is one call's outcome: durable_prefix with the staging
// fields, or durable_failure with a reason.
type CutReceiptItem struct {
	ModelCallID      string `json:"model_call_id"`
	CaptureKey       string `json:"capture_key"`
	Disposition      string `json:"disposition"`
	Reason           string `json:"reason,omitempty"`
	StagingKey       string `json:"staging_key,omitempty"`
	PrefixTokenCount int    `json:"prefix_token_count,omitempty"`
	PrefixDigest     string `json:"prefix_digest,omitempty"`
}

// cutPrefix is a staged prefix of one call, as a checkpoint records it.
type cutPrefix struct {
	stagingKey string
	tokenCount int
	digest     string
}

// maxStagingKey bounds a staging key.
const maxStagingKey = 1024

// validStagingKey accepts 1 to 1024 visible ASCII characters (a key rides
// in a header).
func validStagingKey(k string) bool {
	if k == "" || len(k) > maxStagingKey {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] <= ' ' || k[i] >= 0x7f {
			return false
		}
	}
	return true
}

// validCallID accepts what the server and worker use as model call ids: 1
// to 256 visible ASCII characters.
func validCallID(id string) bool {
	return id != "" && len(id) <= 256 && validStagingKey(id)
}

// DecodeCutReceipt decodes a worker's receipt and checks every entry's
// shape: a durable_prefix needs a staging key, a positive token count and a
// digest; a durable_failure carries none of them. Which entries answer which
// calls is the caller's to check.
func DecodeCutReceipt(body []byte) (*CutReceipt, error) {
	var rc CutReceipt
	if err := codec.Unmarshal(body, &rc); err != nil {
		return nil, fmt.Errorf("the cut receipt is not JSON of the expected shape: %s", codec.DescribeError(err))
	}
	for i, p := range rc.Prefixes {
		if !validCallID(p.ModelCallID) {
			return nil, fmt.Errorf("prefixes[%d].model_call_id is not a model call id", i)
		}
		switch p.Disposition {
		case DispositionDurablePrefix:
			if !validStagingKey(p.StagingKey) || p.PrefixTokenCount <= 0 || p.PrefixDigest == "" || len(p.PrefixDigest) > 256 {
				return nil, fmt.Errorf("prefixes[%d] is a durable_prefix without a staging key, a positive prefix_token_count and a prefix_digest", i)
			}
		case DispositionDurableFailure:
			if p.StagingKey != "" || p.PrefixTokenCount != 0 || p.PrefixDigest != "" {
				return nil, fmt.Errorf("prefixes[%d] is a durable_failure that carries staging fields", i)
			}
		default:
			return nil, fmt.Errorf("prefixes[%d].disposition %q is neither durable_prefix nor durable_failure", i, p.Disposition)
		}
	}
	return &rc, nil
}

// cutRound asks the worker to cut the listed calls and records each one's
// outcome. It runs on the participant's goroutine; any failure (transport,
// refusal, timeout, a malformed receipt) marks every listed call failed: a
// cut only saves regeneration, so it never fails the checkpoint.
func (p *participant) cutRound(ctx context.Context, cancel context.CancelFunc, listed []*ticket) {
	defer p.wg.Done()
	defer cancel()
	req := cutRequest{CheckpointID: p.checkpointID(), ServerName: p.s.cfg.Name, Active: make([]activeCall, len(listed))}
	for i, t := range listed {
		req.Active[i] = activeCall{ModelCallID: t.callID, CaptureKey: t.captureKey}
	}
	rc, err := p.postCut(ctx, req)
	outcome := make(map[string]*CutReceiptItem, len(listed))
	if err != nil {
		p.log.WarnContext(ctx, "generation cut failed; the calls will regenerate", "checkpoint_id", req.CheckpointID, "calls", len(listed), "err", err)
	} else {
		for i := range rc.Prefixes {
			it := &rc.Prefixes[i]
			outcome[it.ModelCallID] = it
		}
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	cut, failed := 0, 0
	for _, t := range listed {
		it := outcome[t.callID]
		if it == nil || it.CaptureKey != t.captureKey || it.Disposition != DispositionDurablePrefix {
			failed++
			continue
		}
		t.cut = &cutPrefix{stagingKey: it.StagingKey, tokenCount: it.PrefixTokenCount, digest: it.PrefixDigest}
		cut++
	}
	p.round.cut += cut
	p.round.failed += failed
	p.metrics.cuts.WithLabelValues(DispositionDurablePrefix).Add(float64(cut))
	p.metrics.cuts.WithLabelValues(DispositionDurableFailure).Add(float64(failed))
	p.log.InfoContext(ctx, "generation cut round finished", "checkpoint_id", req.CheckpointID, "listed", len(listed), "cut", cut, "failed", failed)
	p.cutRunning = false
	p.notifyLocked()
}

// postCut sends one cut request on the control client.
func (p *participant) postCut(ctx context.Context, req cutRequest) (*CutReceipt, error) {
	body, err := codec.Marshal(req)
	if err != nil {
		return nil, err
	}
	h := http.Header{"Authorization": {"Bearer " + p.s.cfg.GenerationCuts.ControlAuthToken}}
	rep, err := httpclient.Do(ctx, p.cutClient, http.MethodPost, p.cutURL, h, body)
	if err != nil {
		return nil, err
	}
	if err := rep.Err("the worker's generation cut"); err != nil {
		return nil, err
	}
	if len(rep.Body) > maxReceiptBytes {
		return nil, fmt.Errorf("the cut receipt is %d bytes, more than %d", len(rep.Body), maxReceiptBytes)
	}
	return DecodeCutReceipt(rep.Body)
}

// checkpointID names the round after the checkpoint being prepared. The
// Controller holds its lock while it closes admission, so this runs on the
// round's goroutine, after CloseAdmission returned; a checkpoint already
// gone gets a generated id.
func (p *participant) checkpointID() string {
	if p.ctl != nil {
		if _, id := p.ctl.Phase(); id != "" {
			return id
		}
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "cut-" + hex.EncodeToString(b[:])
}

// constrainedChat reports constrained decoding in a Chat Completions body: a
// forced or named tool choice, a non-text response format, or vLLM's
// guided decoding. Such a call is not cut (its prefix could not be
// continued under the same constraint) and simply regenerates.
func constrainedChat(f chatFields) bool {
	if constrainedToolChoice(f["tool_choice"]) || constrainedFormat(f["response_format"]) {
		return true
	}
	for _, k := range []string{"guided_choice", "guided_grammar", "guided_json", "guided_regex", "guided_whitespace_pattern", "structural_tag", "structured_outputs"} {
		if v := bytes.TrimSpace(f[k]); len(v) > 0 && string(v) != "null" {
			return true
		}
	}
	return false
}

// constrainedResponses is constrainedChat for a Responses call: its tool
// choice, or a text.format other than text.
func constrainedResponses(req *openai.ResponsesRequest, chat *openai.ChatRequest) bool {
	if constrainedToolChoice(chat.ToolChoice) || constrainedFormat(chat.ResponseFormat) {
		return true
	}
	var text struct {
		Format codec.RawMessage `json:"format"`
	}
	if len(bytes.TrimSpace(req.Text)) > 0 && codec.Unmarshal(req.Text, &text) == nil {
		return constrainedFormat(text.Format)
	}
	return false
}

// constrainedToolChoice: anything but absent, null, "auto" or "none".
func constrainedToolChoice(raw []byte) bool {
	switch strings.TrimSpace(string(raw)) {
	case "", "null", `"auto"`, `"none"`:
		return false
	}
	return true
}

// constrainedFormat: anything but absent, null or {"type":"text"}.
func constrainedFormat(raw []byte) bool {
	v := bytes.TrimSpace(raw)
	if len(v) == 0 || string(v) == "null" {
		return false
	}
	var f map[string]codec.RawMessage
	if codec.Unmarshal(v, &f) != nil {
		return true
	}
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	return !slices.Equal(keys, []string{"type"}) || strings.TrimSpace(string(f["type"])) != `"text"`
}

// validRequestDigest: a sha256 in hex, as requestDigest makes.
func validRequestDigest(d string) bool {
	if len(d) != 64 {
		return false
	}
	_, err := hex.DecodeString(d)
	return err == nil
}

// validSourceKey: a capture key.
func validSourceKey(k string) bool {
	_, err := rollout.ParseCaptureKey(k)
	return err == nil
}
