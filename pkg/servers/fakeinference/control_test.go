package fakeinference_test

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
)

func hiRequest() map[string]any { return map[string]any{"messages": []any{userMsg("hi")}} }

func capture(key string) map[string]string {
	return map[string]string{fakeinference.HeaderCaptureKey: key}
}

func TestHold_AfterCalls(t *testing.T) {
	f := start(t, nil)
	ctx := context.Background()
	if rep, err := f.ctl.HoldAfterCalls(ctx, 1); err != nil || rep.Held != 0 || *rep.Hold.AfterCalls != 1 {
		t.Fatalf("hold: %+v %v", rep, err)
	}
	if r := f.chat(hiRequest(), nil); r.status != 200 {
		t.Fatalf("the first call is not held: %d", r.status)
	}
	second := f.chatAsync(ctx, hiRequest(), nil)
	third := f.chatAsync(ctx, hiRequest(), nil)
	got := f.waitCount("two held calls", func(c fakeinference.CallCount) bool { return c.Held == 2 })
	if want := (fakeinference.CallCount{Received: 3, Returned: 1, Held: 2}); got != want {
		t.Errorf("call_count = %+v, want %+v", got, want)
	}
	if n, err := f.ctl.Release(ctx); err != nil || n != 2 {
		t.Fatalf("release = %d %v, want 2", n, err)
	}
	for _, ch := range []<-chan reply{second, third} {
		if r := recv(t, ch); r.status != 200 {
			t.Errorf("released call: %d %s", r.status, r.body)
		}
	}
	// The release removed the hold.
	if r := f.chat(hiRequest(), nil); r.status != 200 {
		t.Errorf("a call after the release: %d", r.status)
	}
	if got, want := f.count(), (fakeinference.CallCount{Received: 4, Returned: 4}); got != want {
		t.Errorf("call_count = %+v, want %+v", got, want)
	}
	held := 0
	for _, c := range f.calls() {
		if c.Held {
			held++
		}
	}
	if held != 2 {
		t.Errorf("%d calls say they were held, want 2", held)
	}
}

// A hold placed twice before a release keeps the calls the first one held:
// one release frees them all (seed 001: the previous code stranded them).
func TestHold_SecondHoldKeepsTheFirstOnesCalls(t *testing.T) {
	f := start(t, nil)
	ctx := context.Background()
	if _, err := f.ctl.HoldAfterCalls(ctx, 0); err != nil {
		t.Fatal(err)
	}
	first := f.chatAsync(ctx, hiRequest(), nil)
	f.waitCount("the first call held", func(c fakeinference.CallCount) bool { return c.Held == 1 })
	rep, err := f.ctl.HoldAfterCalls(ctx, 1)
	if err != nil || rep.Held != 1 {
		t.Fatalf("second hold: %+v %v", rep, err)
	}
	second := f.chatAsync(ctx, hiRequest(), nil)
	f.waitCount("the second call held", func(c fakeinference.CallCount) bool { return c.Held == 2 })
	if n, err := f.ctl.Release(ctx); err != nil || n != 2 {
		t.Fatalf("release = %d %v, want 2", n, err)
	}
	for _, ch := range []<-chan reply{first, second} {
		if r := recv(t, ch); r.status != 200 {
			t.Errorf("released call: %d", r.status)
		}
	}
}

func TestHold_PerRollout(t *testing.T) {
	f := start(t, nil)
	ctx := context.Background()
	if _, err := f.ctl.HoldAfterCallsPerRollout(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"r1", "r2"} {
		if r := f.chat(hiRequest(), capture(key)); r.status != 200 {
			t.Fatalf("first call of %s: %d", key, r.status)
		}
	}
	if r := f.chat(hiRequest(), nil); r.status != 200 {
		t.Fatalf("an unattributed call is never held: %d", r.status)
	}
	second := f.chatAsync(ctx, hiRequest(), capture("r1"))
	// Attempts of a rollout count together: r1-a1 is r1's third call.
	attempt := f.chatAsync(ctx, hiRequest(), capture("r1-a1"))
	f.waitCount("two held calls", func(c fakeinference.CallCount) bool { return c.Held == 2 })
	if got, want := f.count(), (fakeinference.CallCount{Received: 5, Returned: 3, Held: 2}); got != want {
		t.Errorf("call_count = %+v, want %+v", got, want)
	}
	if n, err := f.ctl.Release(ctx); err != nil || n != 2 {
		t.Fatalf("release = %d %v", n, err)
	}
	recv(t, second)
	recv(t, attempt)
	found := false
	for _, c := range f.calls() {
		if c.CaptureKey == nil || *c.CaptureKey != "r1-a1" {
			continue
		}
		found = true
		if *c.RolloutID != "r1" || *c.Attempt != 1 || !c.Held || c.Status != fakeinference.StatusReturned {
			t.Errorf("the attempt's call log entry: %+v", c)
		}
	}
	if !found {
		t.Error("no call of r1-a1 in the log")
	}
}

// release {"calls": k} frees the k oldest and keeps the hold.
func TestRelease_OldestCalls(t *testing.T) {
	f := start(t, nil)
	ctx := context.Background()
	if _, err := f.ctl.HoldAfterCalls(ctx, 0); err != nil {
		t.Fatal(err)
	}
	var held []<-chan reply
	for i := 0; i < 3; i++ {
		held = append(held, f.chatAsync(ctx, hiRequest(), map[string]string{fakeinference.HeaderModelCallID: "m" + string(rune('0'+i))}))
		f.waitCount("held", func(c fakeinference.CallCount) bool { return c.Held == i+1 })
	}
	if n, err := f.ctl.ReleaseCalls(ctx, 2); err != nil || n != 2 {
		t.Fatalf("release 2 = %d %v", n, err)
	}
	recv(t, held[0])
	recv(t, held[1])
	later := f.chatAsync(ctx, hiRequest(), nil)
	f.waitCount("the hold kept", func(c fakeinference.CallCount) bool { return c.Held == 2 && c.Returned == 2 })
	for _, c := range f.calls() {
		if want := map[string]string{"m0": "returned", "m1": "returned", "m2": "held"}[c.CallID]; want != "" && c.Status != want {
			t.Errorf("%s is %s, want %s", c.CallID, c.Status, want)
		}
	}
	if n, err := f.ctl.ReleaseCalls(ctx, 5); err != nil || n != 2 {
		t.Fatalf("release 5 with 2 held = %d %v", n, err)
	}
	recv(t, held[2])
	recv(t, later)
	if n, err := f.ctl.Release(ctx); err != nil || n != 0 {
		t.Errorf("release with nothing held = %d %v", n, err)
	}
}

// A held call its client abandons leaves the gate and counts as failed.
func TestHold_CancelledHeldCall(t *testing.T) {
	f := start(t, nil)
	ctx := context.Background()
	if _, err := f.ctl.HoldAfterCalls(ctx, 0); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	abandoned := f.chatAsync(cctx, hiRequest(), nil)
	kept := f.chatAsync(ctx, hiRequest(), nil)
	f.waitCount("two held", func(c fakeinference.CallCount) bool { return c.Held == 2 })
	cancel()
	recv(t, abandoned)
	got := f.waitCount("one left", func(c fakeinference.CallCount) bool { return c.Held == 1 })
	if want := (fakeinference.CallCount{Received: 2, Failed: 1, Held: 1}); got != want {
		t.Errorf("call_count = %+v, want %+v", got, want)
	}
	if n, err := f.ctl.Release(ctx); err != nil || n != 1 {
		t.Errorf("release = %d %v, want 1", n, err)
	}
	if r := recv(t, kept); r.status != 200 {
		t.Errorf("kept call: %d", r.status)
	}
}

func TestHold_BadBodies(t *testing.T) {
	f := start(t, nil)
	for _, tt := range []struct {
		path, body string
		status     int
	}{
		{"/_ctl/hold", `{}`, 400},
		{"/_ctl/hold", `{"after_calls": 1, "after_calls_per_rollout": 1}`, 400},
		{"/_ctl/hold", `{"after_calls": -1}`, 400},
		{"/_ctl/hold", `{"after_call": 1}`, 422},
		{"/_ctl/hold", ``, 400},
		{"/_ctl/release", `{"calls": 0}`, 400},
		{"/_ctl/release", `{"call": 1}`, 422},
		{"/_ctl/release", `nope`, 422},
	} {
		r := f.post(context.Background(), tt.path, tt.body, nil)
		e := apierror.Parse(r.status, r.body)
		if r.status != tt.status || e == nil || e.Code != apierror.InvalidRequest {
			t.Errorf("POST %s %s = %d %s, want %d invalid_request", tt.path, tt.body, r.status, r.body, tt.status)
		}
	}
}

var timeField = regexp.MustCompile(`"(received_at|finished_at)":"[^"]+"`)

func TestCalls_Log(t *testing.T) {
	f := start(t, nil)
	hdr := map[string]string{fakeinference.HeaderCaptureKey: "w-1-a2", fakeinference.HeaderModelCallID: "mc-1"}
	if r := f.chat(weatherRequest(), hdr); r.status != 200 {
		t.Fatal(r.status)
	}
	if r := f.chat(with(hiRequest(), "stream", true), map[string]string{fakeinference.HeaderCaptureKey: "not a key!"}); r.status != 200 {
		t.Fatal(r.status)
	}
	r := f.get("/_ctl/calls")
	got := timeField.ReplaceAllString(strings.TrimSpace(string(r.body)), `"$1":"T"`)
	want := `{"calls":[` +
		`{"index":0,"call_id":"mc-1","capture_key":"w-1-a2","rollout_id":"w-1","attempt":2,"n_messages":1,"stream":false,"prompt_tokens":86,"completion_tokens":29,"finish_reason":"tool_calls","status":"returned","held":false,"continued_from":null,"reused_prefix_tokens":0,"received_at":"T","finished_at":"T",` +
		`"request":{"model":"fake-model","tools":["get_weather"],"tool_choice":"","max_tokens":null,"temperature":null,"top_p":null,"logprobs":false,"top_logprobs":null,"return_token_ids":false,"return_tokens_as_token_ids":false,"include_usage":false}},` +
		`{"index":1,"call_id":"call-2","capture_key":null,"rollout_id":null,"attempt":null,"n_messages":1,"stream":true,"prompt_tokens":6,"completion_tokens":14,"finish_reason":"stop","status":"returned","held":false,"continued_from":null,"reused_prefix_tokens":0,"received_at":"T","finished_at":"T",` +
		`"request":{"model":"","tools":[],"tool_choice":"","max_tokens":null,"temperature":null,"top_p":null,"logprobs":false,"top_logprobs":null,"return_token_ids":false,"return_tokens_as_token_ids":false,"include_usage":false}}]}`
	if got != want {
		t.Errorf("GET /_ctl/calls =\n%s\nwant\n%s", got, want)
	}
	if r := f.get("/_ctl/call_count"); strings.TrimSpace(string(r.body)) != `{"received":2,"returned":2,"failed":0,"cut":0,"held":0,"in_flight":0}` {
		t.Errorf("GET /_ctl/call_count = %s", r.body)
	}
}

func TestReset(t *testing.T) {
	f := start(t, nil)
	ctx := context.Background()
	f.chat(hiRequest(), nil)
	if _, err := f.ctl.HoldAfterCalls(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ctl.SetScript(ctx, &fakeinference.Script{FinalText: "x"}); err != nil {
		t.Fatal(err)
	}
	held := f.chatAsync(ctx, hiRequest(), nil)
	f.waitCount("held", func(c fakeinference.CallCount) bool { return c.Held == 1 })
	if err := f.ctl.Reset(ctx); !apierror.HasCode(err, apierror.InvalidPhase) {
		t.Errorf("reset with a held call: %v, want invalid_phase", err)
	}
	if _, err := f.ctl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	recv(t, held)
	if err := f.ctl.Reset(ctx); err != nil {
		t.Fatalf("reset: %v", err)
	}
	if got := f.count(); got != (fakeinference.CallCount{}) {
		t.Errorf("counts after reset: %+v", got)
	}
	if got := f.calls(); len(got) != 0 {
		t.Errorf("calls after reset: %+v", got)
	}
	r := f.get("/_ctl/script")
	var sc fakeinference.ScriptReply
	mustJSON(t, r.body, &sc)
	if sc.Script != nil {
		t.Errorf("script after reset: %s", r.body)
	}
	// Thresholds count from the reset.
	if _, err := f.ctl.HoldAfterCalls(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if r := f.chat(hiRequest(), nil); r.status != 200 {
		t.Errorf("first call after the reset: %d", r.status)
	}
	if _, err := f.ctl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(f.count())
	if string(b) != `{"received":1,"returned":1,"failed":0,"cut":0,"held":0,"in_flight":0}` {
		t.Errorf("counts: %s", b)
	}
}
