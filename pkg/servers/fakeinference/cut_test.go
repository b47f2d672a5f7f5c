package fakeinference_test

import (
	"bytes"
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/gencut"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

// longRequest generates about 360 tokens of scripted text: at a slow
// server's pace a cut after a few dozen tokens has seconds to land, even on
// a loaded machine.
func longRequest() map[string]any {
	text := strings.TrimSpace(strings.Repeat("lorem ipsum dolor ", 60))
	return tokenRequest(map[string]any{
		"messages": []any{userMsg("write something long")},
		"metadata": map[string]any{"fake_script": `{"final_text": "` + text + `"}`},
	})
}

func callHeaders(captureKey, callID string) map[string]string {
	return map[string]string{fakeinference.HeaderCaptureKey: captureKey, fakeinference.HeaderModelCallID: callID}
}

func (f *fixture) callInfo(id string) fakeinference.CallInfo {
	f.t.Helper()
	for _, c := range f.calls() {
		if c.CallID == id {
			return c
		}
	}
	f.t.Fatalf("no call %s in the log", id)
	return fakeinference.CallInfo{}
}

func (f *fixture) cut(active ...fakeinference.ActiveCall) fakeinference.CutReceipt {
	f.t.Helper()
	rec, err := f.ctl.GenerationCut(context.Background(), testToken, fakeinference.CutRequest{CheckpointID: "ckpt-1", ServerName: "policy_model", Active: active})
	if err != nil {
		f.t.Fatalf("generation cut: %v", err)
	}
	return rec
}

// cutMidGeneration starts longRequest as call m1 of r1 on a slow server,
// waits for minTokens tokens and cuts it.
func cutMidGeneration(t *testing.T, f *fixture, minTokens int) (fakeinference.CutPrefix, reply) {
	t.Helper()
	done := f.chatAsync(context.Background(), longRequest(), callHeaders("r1", "m1"))
	f.waitFor("m1 to produce tokens", func() bool {
		for _, c := range f.calls() {
			if c.CallID == "m1" {
				return c.Status == fakeinference.StatusGenerating && c.CompletionTokens >= minTokens
			}
		}
		return false
	})
	rec := f.cut(fakeinference.ActiveCall{ModelCallID: "m1", CaptureKey: "r1"})
	if len(rec.Prefixes) != 1 || rec.CheckpointID != "ckpt-1" || len(rec.CutID) != 16 {
		t.Fatalf("receipt %+v", rec)
	}
	return rec.Prefixes[0], recv(t, done)
}

func TestGenerationCut_AndContinue(t *testing.T) {
	slow := start(t, func(c *fakeinference.Config) { c.TokensPerSecond = 100 })
	fast := start(t, nil)
	uncut := fast.chat(longRequest(), nil)
	var whole openai.ChatCompletion
	mustJSON(t, uncut.body, &whole)
	total := len(whole.Choices[0].TokenIDs)

	p, r := cutMidGeneration(t, slow, 40)
	const key = "__generation_cut__/r1/m1"
	if p.Disposition != fakeinference.DispositionDurablePrefix || p.StagingKey != key || p.ModelCallID != "m1" || p.CaptureKey != "r1" ||
		p.Reason != "" || p.PrefixTokenCount < 40 || p.PrefixTokenCount >= total {
		t.Fatalf("prefix %+v (of %d tokens)", p, total)
	}
	k := p.PrefixTokenCount

	// The cut call's own reply: 200, abort, the prefix, and the staging key.
	var cut openai.ChatCompletion
	mustJSON(t, r.body, &cut)
	ch := cut.Choices[0]
	if r.status != 200 || r.header.Get(fakeinference.HeaderGenerationCut) != key || ch.FinishReason != "abort" ||
		!slices.Equal(ch.TokenIDs, whole.Choices[0].TokenIDs[:k]) || cut.Usage.CompletionTokens != k || len(ch.Logprobs.Content) != k {
		t.Fatalf("cut reply %d %v: %s", r.status, r.header, r.body)
	}
	if p.PrefixDigest != fakeinference.PrefixDigest(ch.TokenIDs) {
		t.Errorf("prefix_digest %s is not the digest of the prefix ids", p.PrefixDigest)
	}
	if !strings.HasPrefix(whole.Choices[0].Message.Content.String(), ch.Message.Content.String()) {
		t.Errorf("partial text %q is not a prefix of %q", ch.Message.Content.String(), whole.Choices[0].Message.Content.String())
	}
	staged, ok := slow.srv.Staged(key)
	if !ok || !slices.Equal(staged.TokenIDs, ch.TokenIDs) || staged.ModelCallID != "m1" || staged.CaptureKey != "r1" || staged.PrefixDigest != p.PrefixDigest {
		t.Errorf("staged %+v", staged)
	}
	for i, e := range ch.Logprobs.Content {
		if staged.Logprobs[i] != e.Logprob {
			t.Errorf("staged logprob %d = %v, reply says %v", i, staged.Logprobs[i], e.Logprob)
		}
	}
	info := slow.callInfo("m1")
	if info.Status != fakeinference.StatusCut || info.FinishReason == nil || *info.FinishReason != "abort" || info.CompletionTokens != k || info.FinishedAt == nil {
		t.Errorf("call log of the cut call: %+v", info)
	}
	if got, want := slow.count(), (fakeinference.CallCount{Received: 1, Cut: 1}); got != want {
		t.Errorf("call_count %+v, want %+v", got, want)
	}
	if rounds, err := slow.ctl.Cuts(context.Background()); err != nil || !reflect.DeepEqual(rounds, [][]string{{"m1"}}) {
		t.Errorf("cuts = %v %v, want [[m1]]", rounds, err)
	}

	// The continuation equals an uncut generation, twice (a restore may
	// continue the same cut again), streaming too.
	for i, id := range []string{"m2", "m3"} {
		cont := slow.chat(longRequest(), map[string]string{fakeinference.HeaderCaptureKey: "r1-a1", fakeinference.HeaderModelCallID: id, fakeinference.HeaderContinueCut: key})
		if cont.status != 200 || !bytes.Equal(normalize(cont.body), normalize(uncut.body)) {
			t.Errorf("continuation %d:\n%s\nuncut:\n%s", i, cont.body, uncut.body)
		}
		info := slow.callInfo(id)
		if info.ContinuedFrom == nil || *info.ContinuedFrom != "m1" || info.ReusedPrefixTokens != k || info.CompletionTokens != total {
			t.Errorf("call log of %s: %+v", id, info)
		}
	}
	body := with(longRequest(), "stream", true)
	contStream := slow.chat(body, map[string]string{fakeinference.HeaderContinueCut: key})
	if uncutStream := fast.chat(body, nil); !bytes.Equal(normalize(contStream.body), normalize(uncutStream.body)) {
		t.Errorf("streamed continuation differs from an uncut stream:\n%s\n%s", contStream.body, uncutStream.body)
	}
}

func TestGenerationCut_Failures(t *testing.T) {
	f := start(t, func(c *fakeinference.Config) { c.TokensPerSecond = 20 })
	ctx := context.Background()
	if r := f.chat(with(hiRequest(), "max_tokens", 1), callHeaders("r1", "f1")); r.status != 200 {
		t.Fatal(r.status)
	}
	streaming := f.chatAsync(ctx, with(hiRequest(), "stream", true), callHeaders("r1", "s1"))
	generating := f.chatAsync(ctx, hiRequest(), callHeaders("r2", "g1"))
	f.waitCount("two generating", func(c fakeinference.CallCount) bool { return c.InFlight == 2 })
	if _, err := f.ctl.HoldAfterCalls(ctx, 3); err != nil {
		t.Fatal(err)
	}
	held := f.chatAsync(ctx, hiRequest(), callHeaders("r1", "h1"))
	f.waitCount("one held", func(c fakeinference.CallCount) bool { return c.Held == 1 })

	rec := f.cut(
		fakeinference.ActiveCall{ModelCallID: "nope", CaptureKey: "r1"},
		fakeinference.ActiveCall{ModelCallID: "f1", CaptureKey: "r1"},
		fakeinference.ActiveCall{ModelCallID: "s1", CaptureKey: "r1"},
		fakeinference.ActiveCall{ModelCallID: "h1", CaptureKey: "r1"},
		fakeinference.ActiveCall{ModelCallID: "g1", CaptureKey: "r3"},
	)
	want := []fakeinference.CutPrefix{
		{ModelCallID: "nope", CaptureKey: "r1", Disposition: "durable_failure", Reason: "unknown_call"},
		{ModelCallID: "f1", CaptureKey: "r1", Disposition: "durable_failure", Reason: "finished"},
		{ModelCallID: "s1", CaptureKey: "r1", Disposition: "durable_failure", Reason: "streaming"},
		{ModelCallID: "h1", CaptureKey: "r1", Disposition: "durable_failure", Reason: "held"},
		{ModelCallID: "g1", CaptureKey: "r3", Disposition: "durable_failure", Reason: `capture_key_mismatch: the call belongs to "r2"`},
	}
	if !reflect.DeepEqual(rec.Prefixes, want) {
		t.Errorf("prefixes\n%+v\nwant\n%+v", rec.Prefixes, want)
	}
	if rounds, _ := f.ctl.Cuts(ctx); !reflect.DeepEqual(rounds, [][]string{{}}) {
		t.Errorf("cuts = %v, want one round with nothing cut", rounds)
	}
	// The calls were left untouched.
	if _, err := f.ctl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []<-chan reply{streaming, generating, held} {
		if r := recv(t, ch); r.status != 200 || r.header.Get(fakeinference.HeaderGenerationCut) != "" {
			t.Errorf("an uncut call: %d %v", r.status, r.header)
		}
	}
	if got, want := f.count(), (fakeinference.CallCount{Received: 4, Returned: 4}); got != want {
		t.Errorf("call_count %+v, want %+v", got, want)
	}
}

func TestGenerationCut_NoTokensYet(t *testing.T) {
	f := start(t, func(c *fakeinference.Config) { c.TokensPerSecond = 0.05 })
	ctx, cancel := context.WithCancel(context.Background())
	done := f.chatAsync(ctx, hiRequest(), callHeaders("r1", "m1"))
	f.waitCount("generating", func(c fakeinference.CallCount) bool { return c.InFlight == 1 })
	rec := f.cut(fakeinference.ActiveCall{ModelCallID: "m1", CaptureKey: "r1"})
	if p := rec.Prefixes[0]; p.Disposition != fakeinference.DispositionDurableFailure || p.Reason != fakeinference.ReasonNoTokens || p.StagingKey != "" {
		t.Errorf("prefix %+v", p)
	}
	cancel()
	recv(t, done)
}

func TestGenerationCut_Auth(t *testing.T) {
	f := start(t, nil)
	body := `{"checkpoint_id":"c1","server_name":"policy_model","active":[]}`
	for _, tt := range []struct {
		auth   string
		status int
	}{
		{"", 401},
		{"Bearer", 401},
		{"Bearer wrong", 401},
		{"Basic " + testToken, 401},
		{"Bearer " + testToken + "x", 401},
		{"Bearer " + testToken, 200},
		{"bearer " + testToken, 200}, // RFC 7235: the scheme is case-insensitive
	} {
		r := f.post(context.Background(), "/ng-control/v1/generation-cut", body, map[string]string{"Authorization": tt.auth})
		if r.status != tt.status {
			t.Errorf("Authorization %q: %d %s, want %d", tt.auth, r.status, r.body, tt.status)
		}
		if tt.status == 401 {
			if e := apierror.Parse(r.status, r.body); e == nil || e.Code != apierror.Unauthorized {
				t.Errorf("Authorization %q: %s is not an unauthorized envelope", tt.auth, r.body)
			}
		}
	}
	// Without a configured token the route refuses everything.
	open := start(t, func(c *fakeinference.Config) { c.ControlAuthToken = "" })
	for _, auth := range []string{"", "Bearer ", "Bearer x"} {
		r := open.post(context.Background(), "/ng-control/v1/generation-cut", body, map[string]string{"Authorization": auth})
		if r.status != 401 || !strings.Contains(string(r.body), "generation cuts are disabled") {
			t.Errorf("no token configured, Authorization %q: %d %s", auth, r.status, r.body)
		}
	}
}

func TestGenerationCut_BadBodies(t *testing.T) {
	f := start(t, nil)
	for _, body := range []string{
		``,
		`{`,
		`{"checkpoint_id":"c1","server_name":"m","active":[],"extra":1}`,
		`{"checkpoint_id":"bad id","server_name":"m","active":[]}`,
		`{"checkpoint_id":"c1","server_name":"","active":[]}`,
		`{"checkpoint_id":"c1","server_name":"m","active":[{"model_call_id":"a","capture_key":"r1"},{"model_call_id":"a","capture_key":"r2"}]}`,
		`{"checkpoint_id":"c1","server_name":"m","active":[{"model_call_id":"","capture_key":"r1"}]}`,
		`{"checkpoint_id":"c1","server_name":"m","active":[{"model_call_id":"a","capture_key":"r/1"}]}`,
		`{"checkpoint_id":"c1","server_name":"m","active":[{"model_call_id":"a","capture_key":"r1","x":1}]}`,
		`{"checkpoint_id":"c1","server_name":"m","active":[]} {}`,
	} {
		r := f.post(context.Background(), "/ng-control/v1/generation-cut", body, map[string]string{"Authorization": "Bearer " + testToken})
		if e := apierror.Parse(r.status, r.body); r.status != 422 || e == nil || e.Code != apierror.InvalidRequest {
			t.Errorf("body %s: %d %s, want 422 invalid_request", body, r.status, r.body)
		}
	}
	if rounds, _ := f.ctl.Cuts(context.Background()); len(rounds) != 0 {
		t.Errorf("refused requests made rounds: %v", rounds)
	}
}

func TestContinue_Errors(t *testing.T) {
	f := start(t, func(c *fakeinference.Config) { c.TokensPerSecond = 40 })
	p, _ := cutMidGeneration(t, f, 1)
	for _, tt := range []struct {
		name, key string
		body      map[string]any
		want      string
	}{
		{"unknown key", "__generation_cut__/r1/zzz", longRequest(), "generation cut __generation_cut__/r1/zzz is not staged"},
		{"another prompt", p.StagingKey, with(longRequest(), "messages", []any{userMsg("something else")}), "generation cut __generation_cut__/r1/m1 was staged for a different prompt"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := f.chat(tt.body, map[string]string{fakeinference.HeaderContinueCut: tt.key})
			var e fakeinference.ErrorResponse
			mustJSON(t, r.body, &e)
			if r.status != 400 || e.Error.Message != tt.want || e.Error.Type != "BadRequestError" || e.Error.Code != 400 {
				t.Errorf("got %d %s, want 400 %q", r.status, r.body, tt.want)
			}
		})
	}
	// After a reset the staged prefix is gone.
	if err := f.ctl.Reset(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := f.chat(longRequest(), map[string]string{fakeinference.HeaderContinueCut: p.StagingKey}); r.status != 400 {
		t.Errorf("continuing a cut after a reset: %d", r.status)
	}
}

// TestGenerationCut_Inventory: NeMo Gym's GenerationCutInventory, as a
// model server sends it, is answered with a GenerationCutReceipt that
// validates as Gym's validate_for requires: the call generating is cut
// (durable_prefix, its one staging key), the unknown one is not
// (durable_failure, no evidence), and the inventory is echoed.
func TestGenerationCut_Inventory(t *testing.T) {
	f := start(t, func(c *fakeinference.Config) { c.TokensPerSecond = 100 })
	done := f.chatAsync(context.Background(), longRequest(), callHeaders("r1-a2", "m1"))
	other := f.chatAsync(context.Background(), longRequest(), callHeaders("r2", "m2"))
	for _, id := range []string{"m1", "m2"} {
		f.waitFor(id+" to produce tokens", func() bool {
			for _, c := range f.calls() {
				if c.CallID == id {
					return c.Status == fakeinference.StatusGenerating && c.CompletionTokens >= 5
				}
			}
			return false
		})
	}
	inv := gencut.BuildInventory("ckpt-1", "policy_model", []gencut.ActivePrefix{
		{TicketID: "t-m1", RolloutID: "r1", Attempt: 2, ModelCallID: "m1", AdmittedAt: 1796605409.5},
		{TicketID: "t-nope", RolloutID: "r1", Attempt: 2, ModelCallID: "nope", AdmittedAt: 1796605409.75},
		// m2 is r2's call, listed for another attempt: not cut.
		{TicketID: "t-m2", RolloutID: "r2", Attempt: 1, ModelCallID: "m2", AdmittedAt: 1796605409.875},
	})
	body, err := f.ctl.CutInventory(context.Background(), testToken, inv)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := gencut.DecodeReceiptFor(body, inv)
	if err != nil {
		t.Fatalf("the receipt does not validate: %v\n%s", err, body)
	}
	acks := map[string]gencut.PrefixAck{}
	for _, a := range rc.Prefixes {
		acks[a.TicketID] = a
	}
	cut, unknown := acks["t-m1"], acks["t-nope"]
	if cut.Disposition != fakeinference.DispositionDurablePrefix || !slices.Equal(cut.StagingKeys, []string{"__generation_cut__/r1-a2/m1"}) ||
		*cut.PrefixTokenCount < 5 || *cut.CutKind != gencut.CutKindActivePrefix || *cut.EffectiveOutputLimit < *cut.PrefixTokenCount {
		t.Errorf("the cut call's ack: %+v", cut)
	}
	if unknown.Disposition != fakeinference.DispositionDurableFailure || len(unknown.StagingKeys) != 0 {
		t.Errorf("the unknown call's ack: %+v", unknown)
	}
	if a := acks["t-m2"]; a.Disposition != fakeinference.DispositionDurableFailure || len(a.StagingKeys) != 0 {
		t.Errorf("the ack of a call listed for another attempt: %+v", a)
	}
	recv(t, done) // the cut call's reply, which TestGenerationCut_AndContinue checks
	// Left generating: listed for its own attempt, it is cut.
	again := gencut.BuildInventory("ckpt-1", "policy_model", []gencut.ActivePrefix{
		{TicketID: "t-m2", RolloutID: "r2", Attempt: 0, ModelCallID: "m2", AdmittedAt: 1796605409.875},
	})
	body, err = f.ctl.CutInventory(context.Background(), testToken, again)
	if err != nil {
		t.Fatal(err)
	}
	if rc, err := gencut.DecodeReceiptFor(body, again); err != nil || rc.Prefixes[0].Disposition != fakeinference.DispositionDurablePrefix {
		t.Errorf("m2 listed for its own attempt: %v\n%s", err, body)
	}
	recv(t, other)
	if _, err := f.ctl.CutInventory(context.Background(), "wrong", inv); err == nil {
		t.Error("a wrong token is taken")
	}
}
