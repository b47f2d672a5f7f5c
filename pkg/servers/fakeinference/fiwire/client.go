package fiwire

import (
	"context"
	"net/http"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
)

// Control drives a fake inference server's /_ctl/ and generation-cut routes,
// for tests and the e2e suite. Errors are apierror values (the server's
// envelope) or transport errors. Nothing is retried.
type Control struct {
	base string
	hc   *http.Client
}

// NewControl returns a Control for the server at baseURL (http://host:port);
// hc nil means a fresh HTTP/1.1 client.
func NewControl(baseURL string, hc *http.Client) *Control {
	if hc == nil {
		hc = httpclient.New(httpclient.Options{})
	}
	return &Control{base: strings.TrimRight(baseURL, "/"), hc: hc}
}

// Hold places a hold (see HoldRequest).
func (c *Control) Hold(ctx context.Context, req HoldRequest) (HoldReply, error) {
	var out HoldReply
	_, err := httpclient.PostJSON(ctx, c.hc, c.base+"/_ctl/hold", nil, req, &out)
	return out, err
}

// HoldAfterCalls holds every call after the first n.
func (c *Control) HoldAfterCalls(ctx context.Context, n int) (HoldReply, error) {
	return c.Hold(ctx, HoldRequest{AfterCalls: &n})
}

// HoldAfterCallsPerRollout holds each rollout's calls after its first n.
func (c *Control) HoldAfterCallsPerRollout(ctx context.Context, n int) (HoldReply, error) {
	return c.Hold(ctx, HoldRequest{AfterCallsPerRollout: &n})
}

// Release releases every held call and removes the hold.
func (c *Control) Release(ctx context.Context) (int, error) {
	var out ReleaseReply
	_, err := httpclient.PostJSON(ctx, c.hc, c.base+"/_ctl/release", nil, nil, &out)
	return out.Released, err
}

// ReleaseCalls releases the k oldest held calls and keeps the hold.
func (c *Control) ReleaseCalls(ctx context.Context, k int) (int, error) {
	var out ReleaseReply
	_, err := httpclient.PostJSON(ctx, c.hc, c.base+"/_ctl/release", nil, ReleaseRequest{Calls: &k}, &out)
	return out.Released, err
}

// CallCount reads the counters.
func (c *Control) CallCount(ctx context.Context) (CallCount, error) {
	var out CallCount
	_, err := httpclient.GetJSON(ctx, c.hc, c.base+"/_ctl/call_count", nil, &out)
	return out, err
}

// Calls reads the call log.
func (c *Control) Calls(ctx context.Context) ([]CallInfo, error) {
	var out CallsReply
	_, err := httpclient.GetJSON(ctx, c.hc, c.base+"/_ctl/calls", nil, &out)
	return out.Calls, err
}

// SetScript sets the script of every call without its own; nil clears it.
func (c *Control) SetScript(ctx context.Context, s *Script) (*Script, error) {
	if s == nil {
		s = &Script{}
	}
	var out ScriptReply
	_, err := httpclient.PostJSON(ctx, c.hc, c.base+"/_ctl/script", nil, s, &out)
	return out.Script, err
}

// Cuts reads the call ids cut per generation-cut request.
func (c *Control) Cuts(ctx context.Context) ([][]string, error) {
	var out CutsReply
	_, err := httpclient.GetJSON(ctx, c.hc, c.base+"/_ctl/cuts", nil, &out)
	return out.Rounds, err
}

// Reset clears calls, counters, hold, script, cuts and staged prefixes.
func (c *Control) Reset(ctx context.Context) error {
	_, err := httpclient.PostJSON(ctx, c.hc, c.base+"/_ctl/reset", nil, nil, nil)
	return err
}

// CutInventory posts NeMo Gym's generation-cut inventory, as a model
// server does, and returns the receipt's bytes.
func (c *Control) CutInventory(ctx context.Context, token string, inv gencut.Inventory) ([]byte, error) {
	h := http.Header{"Authorization": {"Bearer " + token}}
	rep, err := httpclient.Do(ctx, c.hc, http.MethodPost, c.base+gencut.Path, h, inv)
	if err != nil {
		return nil, err
	}
	return rep.Body, rep.Err("generation cut")
}

// GenerationCut asks the server to cut calls in our former request shape,
// as a model server of an earlier release does.
func (c *Control) GenerationCut(ctx context.Context, token string, req gencut.LegacyRequest) (gencut.LegacyReceipt, error) {
	var out gencut.LegacyReceipt
	h := http.Header{"Authorization": {"Bearer " + token}}
	_, err := httpclient.PostJSON(ctx, c.hc, c.base+gencut.Path, h, req, &out)
	return out, err
}
