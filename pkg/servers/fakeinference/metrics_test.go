package fakeinference_test

import (
	"context"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
)

func TestMetrics(t *testing.T) {
	f := start(t, nil)
	ctx := context.Background()
	f.chat(hiRequest(), nil)                         // 6 prompt, 14 generated tokens
	f.chat(map[string]any{"messages": []any{}}, nil) // rejected
	if _, err := f.ctl.HoldAfterCalls(ctx, 0); err != nil {
		t.Fatal(err)
	}
	held := f.chatAsync(ctx, hiRequest(), nil)
	f.waitCount("held", func(c fakeinference.CallCount) bool { return c.Held == 1 })
	body := string(f.get("/metrics").body)
	for _, want := range []string{
		`gymfleet_fakeinference_calls_total{status="returned"} 1`,
		`gymfleet_fakeinference_calls_total{status="rejected"} 1`,
		`gymfleet_fakeinference_tokens_total{kind="prompt"} 12`,
		`gymfleet_fakeinference_tokens_total{kind="generation"} 14`,
		`gymfleet_fakeinference_held_calls 1`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if _, err := f.ctl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	recv(t, held)
	if body := string(f.get("/metrics").body); !strings.Contains(body, "gymfleet_fakeinference_held_calls 0\n") {
		t.Error("held_calls is not 0 after the release")
	}
}
