package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
)

// fakeTerminal is stdout as a terminal: each Write is one frame.
type fakeTerminal struct{ frames chan string }

func (f fakeTerminal) Write(p []byte) (int, error) {
	f.frames <- string(p)
	return len(p), nil
}

func (f fakeTerminal) next(t *testing.T) string {
	t.Helper()
	select {
	case fr := <-f.frames:
		return fr
	case <-time.After(10 * time.Second):
		t.Fatal("no frame drawn")
		return ""
	}
}

// Ensure ckpt status --watch redraws every participant's phase, lease
// left, readiness, blocker count and first blockers at every tick on a
// terminal, and ends cleanly at Ctrl-C.
func TestStatusWatch_RedrawsUntilInterrupted(t *testing.T) {
	members := []coordination.Member{
		{Name: "env", Kind: "environment", Instance: "env"},
		{Name: "policy_model", Kind: "model", Instance: "policy_model"},
	}
	lease := float64(time.Now().Add(95*time.Second).UnixNano()) / 1e9
	statuses := []map[string]map[string]any{
		{
			"env":          {"phase": "idle", "checkpoint_id": nil, "lease_expires_at": nil, "report": map[string]any{"ready": true, "blocker_count": 0.0, "blockers": []any{}}},
			"policy_model": {"phase": "idle", "checkpoint_id": nil, "lease_expires_at": nil, "report": map[string]any{"ready": true, "blocker_count": 0.0, "blockers": []any{}}},
		},
		{
			"env": {"phase": "preparing", "checkpoint_id": "c7", "lease_expires_at": lease,
				"report": map[string]any{"ready": false, "blocker_count": 5.0, "blockers": []any{"r1", "r2", "r3", "r4", "r5"}}},
			// policy_model does not answer this time.
		},
	}
	term := fakeTerminal{frames: make(chan string)}
	tick := make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	n := 0
	go func() {
		done <- watchLoop(ctx, term, true, tick, func(ctx context.Context) []byte {
			st := statuses[min(n, len(statuses)-1)]
			var err error
			if n > 0 {
				err = errors.New("policy_model: connection refused")
			}
			n++
			return statusFrame(members, st, err, time.Now())
		})
	}()

	first := term.next(t)
	if !strings.HasPrefix(first, clearScreen) {
		t.Errorf("a terminal frame does not clear the screen: %q", first)
	}
	for _, want := range []string{"SERVER", "LEASE LEFT", "FIRST BLOCKERS", "env", "policy_model", "idle"} {
		if !strings.Contains(first, want) {
			t.Errorf("first frame lacks %q:\n%s", want, first)
		}
	}
	tick <- time.Now()
	second := term.next(t)
	lines := strings.Split(second, "\n")
	var envLine, modelLine string
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "env "):
			envLine = l
		case strings.HasPrefix(l, "policy_model "):
			modelLine = l
		}
	}
	for _, want := range []string{"preparing", "c7", "1m3", "false", " 5 ", "r1,r2,r3,…"} {
		if !strings.Contains(envLine, want) {
			t.Errorf("env row lacks %q: %q", want, envLine)
		}
	}
	if !strings.Contains(modelLine, "unreachable") || !strings.Contains(second, "error: policy_model: connection refused") {
		t.Errorf("the unreachable participant is not shown:\n%s", second)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("watch ended with %v, want a clean end at Ctrl-C", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not end at Ctrl-C")
	}
}

// Ensure a watch whose stdout is no terminal writes plain frames: a time
// line and the table, no escape sequence.
func TestStatusWatch_PlainWhenNotATerminal(t *testing.T) {
	var out strings.Builder
	now := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	members := []coordination.Member{{Name: "env", Kind: "environment", Instance: "env"}}
	st := map[string]map[string]any{"env": {"phase": "idle", "report": map[string]any{"ready": true, "blocker_count": 0.0}}}
	if err := redraw(&out, false, now, statusFrame(members, st, nil, now)); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(out.String(), "\x1b\r") || !strings.HasPrefix(out.String(), "--- 2026-12-05T08:00:00Z\nSERVER") {
		t.Errorf("plain frame: %q", out.String())
	}
}
