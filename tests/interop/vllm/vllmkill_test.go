package vllm

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// TestVLLMKilledMidStream: vLLM SIGKILLed while it streams a call through
// our model server: the client's stream fails (no finish_reason, never a
// clean end), and the ledger holds nothing delivered for it. vLLM started
// again: calls through the same model server succeed again. It runs last
// (files run in name order) and leaves a fresh vLLM behind.
func TestVLLMKilledMidStream(t *testing.T) {
	need(t)
	if env.vllm.cmd == nil {
		t.Fatal("this scenario kills and restarts vLLM: it needs the suite's own (unset GYMFLEET_VLLM_URL)")
	}
	m := startModelServer(t, nil)
	body := chatBody("count to a thousand", map[string]any{"stream": true, "max_tokens": 900, "ignore_eos": true})
	got := 0
	killed := make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	events, done, err := sseEvents(ctx, m+"/ng-rollout/kill-1/v1/chat/completions", body, func(ev map[string]any) {
		if _, ok := path(ev, "choices", 0, "delta", "content").(string); ok {
			got++
		}
		select {
		case <-killed:
		default:
			if got >= 5 {
				env.vllm.kill()
				close(killed)
			}
		}
	})
	select {
	case <-killed:
	default:
		t.Fatalf("the stream ended before vLLM was killed: %d content events, err %v", got, err)
	}
	for _, ev := range events {
		if f, ok := path(ev, "choices", 0, "finish_reason").(string); ok && f != "" {
			t.Fatalf("the stream of a killed vLLM finished with %q", f)
		}
	}
	t.Logf("after the kill: %d events, [DONE] %v, error %v", len(events), done, err)
	var sawError bool
	for _, ev := range events {
		if ev["error"] != nil {
			sawError = true
		}
	}
	if err == nil && !sawError {
		t.Fatal("the stream of a killed vLLM ended cleanly: no error event and no broken stream")
	}
	if st, man := manifest(t, m, "kill-1"); st == http.StatusOK {
		if recs, _ := man["records"].([]any); len(recs) != 0 {
			t.Fatalf("the ledger holds a delivered call of the killed stream: %v", recs)
		}
	}

	begin := time.Now()
	if err := env.vllm.restart(); err != nil {
		t.Fatal(err)
	}
	env.record("vllm_restart_seconds", round1(time.Since(begin).Seconds()))
	waitFor(t, "the model server's upstream to answer again", 2*time.Minute, func() bool {
		st, _, err := post(ctxFor(t, time.Minute), m+"/ng-rollout/kill-2/v1/chat/completions", nil, mustJSON(t, chatBody("hello again", nil)))
		return err == nil && st == http.StatusOK
	})
	rows := ledger(t, m, "kill-2")
	if len(rows) != 1 || len(ints(rows[0]["generation_token_ids"])) == 0 {
		t.Fatalf("the call after the restart has ledger rows %v", rows)
	}
}
