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
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// GenerationCutPath is the worker's cut route, under its root URL.
const GenerationCutPath = gencut.Path

// Dispositions of a cut receipt entry, and of the cuts metric.
const (
	DispositionDurablePrefix  = gencut.DispositionDurablePrefix
	DispositionDurableFailure = gencut.DispositionDurableFailure
	// DispositionSkipped counts calls a round did not ask for: streaming or
	// constrained decoding (their prefix cannot be continued as is).
	DispositionSkipped = "skipped"
)

// defaultCutBudget bounds a cut round whose operation has no deadline.
const defaultCutBudget = 30 * time.Second

// receiptBytesPerCall bounds what a cut receipt may take for each call it
// answers: the call echoed in the inventory and its ack, with ids of up to
// 256 bytes and staging keys of up to gencut.MaxStagingKey. A fixed bound
// for the whole receipt would refuse the receipt of a large round (every
// call of 100,000 cut, with the fleet's ids, takes more than 64 MiB),
// which makes every call regenerate.
const receiptBytesPerCall = 4 << 10

// receiptLimit bounds the receipt answering inv, as a reply may be bounded.
func receiptLimit(inv gencut.Inventory) int {
	return min(httpclient.MaxReplyBytes, 64<<10+len(inv.ActivePrefixes)*receiptBytesPerCall)
}

// cutPrefix is a staged prefix of one call, as a checkpoint records it.
type cutPrefix struct {
	stagingKey string
	tokenCount int
	digest     string
}

func validStagingKey(k string) bool { return gencut.ValidStagingKey(k) }
func validCallID(id string) bool    { return gencut.ValidCallID(id) }

// DecodeCutReceipt decodes a worker's receipt for an inventory and checks
// it as NeMo Gym's model server does (gencut.DecodeReceiptFor).
func DecodeCutReceipt(body []byte, inv gencut.Inventory) (*gencut.Receipt, error) {
	return gencut.DecodeReceiptFor(body, inv)
}

// cutsInFlight is how many of a worker's inventories are out at once:
// NeMo RL's worker cuts one at a time, so a second keeps it busy while the
// model server writes the next and reads the last.
const cutsInFlight = 2

// cutRound asks every worker holding listed calls to cut its calls, all
// workers at once, each with inventories of its calls (NeMo Gym's
// GenerationCutInventory, model.py PolicyGate._cut: one prefix per call,
// the ticket being the model call id; more than one when the worker holds
// more than GenerationCutsConfig.InventoryCalls), and records each call's
// outcome from the receipts. It runs on the participant's goroutine; any
// failure of a request (transport, refusal, timeout, a receipt that does
// not validate) marks the calls it listed failed: a cut only saves
// regeneration, so it never fails the checkpoint.
func (p *participant) cutRound(ctx context.Context, cancel context.CancelFunc, listed []*ticket) {
	defer p.wg.Done()
	defer cancel()
	ctx, span := p.s.tracer.Start(ctx, tracing.SpanGenerationCut)
	defer span.End()
	id := p.checkpointID()
	// Each worker's list sized first: grown by appends, a list of every
	// call in flight would be copied step by step.
	perWorker := make([]int, len(p.cutURLs))
	for _, t := range listed {
		perWorker[t.worker.Load()]++
	}
	prefixes := make([][]gencut.ActivePrefix, len(p.cutURLs))
	for w, n := range perWorker {
		prefixes[w] = make([]gencut.ActivePrefix, 0, n)
	}
	for _, t := range listed {
		ep, err := rollout.ParseCaptureKey(t.captureKey)
		if err != nil {
			continue // never admitted as an episode's call: counted failed below
		}
		w := int(t.worker.Load())
		prefixes[w] = append(prefixes[w], gencut.ActivePrefix{
			TicketID: t.callID, RolloutID: ep.RolloutID, Attempt: ep.Attempt, ModelCallID: t.callID,
			AdmittedAt: float64(t.admittedAt.UnixMicro()) / 1e6,
		})
	}
	// A worker's calls go in inventories of at most size calls (one, up
	// to the bound a worker takes), each with its own digest and receipt,
	// cutsInFlight of them out at a time. A failed one loses only its own
	// calls' cuts.
	size := p.s.cfg.GenerationCuts.inventoryCalls()
	parts := 0
	for _, list := range prefixes {
		parts += (len(list) + size - 1) / size
	}
	receipts := make([]*gencut.Receipt, parts)
	next := 0
	var wg sync.WaitGroup
	for w, list := range prefixes {
		out := make(chan struct{}, cutsInFlight)
		for start := 0; start < len(list); start += size {
			part := list[start:min(start+size, len(list))]
			i := next
			next++
			wg.Go(func() {
				out <- struct{}{}
				defer func() { <-out }()
				inv := gencut.BuildInventory(id, p.s.cfg.Name, part)
				r, err := p.postCut(ctx, p.cutURLs[w], inv)
				if err != nil {
					p.log.WarnContext(ctx, "generation cut failed; the calls will regenerate", "checkpoint_id", id, "worker", p.cutURLs[w], "calls", len(part), "err", err)
					return
				}
				receipts[i] = r
			})
		}
	}
	wg.Wait()
	outcome := make(map[string]*gencut.PrefixAck, len(listed))
	for _, rc := range receipts {
		if rc == nil {
			continue
		}
		for i := range rc.Prefixes {
			it := &rc.Prefixes[i]
			outcome[it.TicketID] = it
		}
	}

	cut, failed := 0, 0
	for _, t := range listed {
		it := outcome[t.callID]
		// A continuation names one staged prefix (HeaderContinueCut): a
		// prefix staged under several keys, or of no token, regenerates.
		if it == nil || it.Disposition != DispositionDurablePrefix || len(it.StagingKeys) != 1 || !validStagingKey(it.StagingKeys[0]) || *it.PrefixTokenCount <= 0 {
			failed++
			continue
		}
		c := &cutPrefix{stagingKey: it.StagingKeys[0], tokenCount: *it.PrefixTokenCount, digest: *it.PrefixDigest}
		t.shard.mu.Lock()
		t.cut = c
		t.shard.mu.Unlock()
		cut++
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.round.cut += cut
	p.round.failed += failed
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrCheckpointID.String(id), tracing.AttrCalls.Int(len(listed)),
			attribute.Int("nemo.gym.checkpoint.cut_"+DispositionDurablePrefix, cut),
			attribute.Int("nemo.gym.checkpoint.cut_"+DispositionDurableFailure, failed))
	}
	p.metrics.cuts.WithLabelValues(DispositionDurablePrefix).Add(float64(cut))
	p.metrics.cuts.WithLabelValues(DispositionDurableFailure).Add(float64(failed))
	p.log.InfoContext(ctx, "generation cut round finished", "checkpoint_id", id, "listed", len(listed), "cut", cut, "failed", failed)
	p.cutRunning = false
	p.notifyLocked()
}

// postCut posts one inventory to a worker's cut route on the control
// client and checks the receipt against it.
func (p *participant) postCut(ctx context.Context, cutURL string, inv gencut.Inventory) (*gencut.Receipt, error) {
	body, err := inv.Body()
	if err != nil {
		return nil, err
	}
	h := http.Header{"Authorization": {"Bearer " + p.s.cfg.GenerationCuts.ControlAuthToken}}
	c, err := p.s.upstream.cutClient(ctx)
	if err != nil {
		return nil, err
	}
	rep, err := httpclient.Do(ctx, c, http.MethodPost, cutURL, h, body)
	if err != nil {
		return nil, err
	}
	if err := rep.Err("the worker's generation cut"); err != nil {
		return nil, err
	}
	if limit := receiptLimit(inv); len(rep.Body) > limit {
		return nil, fmt.Errorf("the cut receipt is %d bytes, more than %d", len(rep.Body), limit)
	}
	return DecodeCutReceipt(rep.Body, inv)
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

// validRequestDigest: a sha256 in hex, as a request digest (digest.go) is.
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
