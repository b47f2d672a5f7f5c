package logging_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/infra/logging"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// lines decodes each JSON log line, dropping the time.
func lines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		delete(m, "time")
		out = append(out, m)
	}
	return out
}

func equalJSON(t *testing.T, got map[string]any, want string) {
	t.Helper()
	var w map[string]any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	g, _ := json.Marshal(got)
	ws, _ := json.Marshal(w)
	if !bytes.Equal(g, ws) {
		t.Fatalf("log line = %s, want %s", g, ws)
	}
}

func TestNew_CaptureKeyFromContext(t *testing.T) {
	var buf bytes.Buffer
	log := logging.New(&buf, slog.LevelInfo, "model", "policy")
	ctx := rollout.WithEpisode(context.Background(), rollout.EpisodeID{RolloutID: "w", Attempt: 2})

	log.InfoContext(ctx, "call done", "status", 200)
	log.InfoContext(context.Background(), "no episode")
	log.Info("no context")
	log.DebugContext(ctx, "below the level")

	got := lines(t, &buf)
	if len(got) != 3 {
		t.Fatalf("got %d lines, want 3: %v", len(got), got)
	}
	equalJSON(t, got[0], `{"level":"INFO","msg":"call done","server":"model","instance":"policy","status":200,"capture_key":"w-a2"}`)
	equalJSON(t, got[1], `{"level":"INFO","msg":"no episode","server":"model","instance":"policy"}`)
	equalJSON(t, got[2], `{"level":"INFO","msg":"no context","server":"model","instance":"policy"}`)
}

func TestNew_WithAttrsAndGroupKeepCaptureKey(t *testing.T) {
	var buf bytes.Buffer
	base := logging.New(&buf, slog.LevelDebug, "agent", "a1")
	ctx := rollout.WithEpisode(context.Background(), rollout.EpisodeID{RolloutID: "3-0"})

	base.With("session", "s1").DebugContext(ctx, "with attrs")
	// Record attributes go inside an open group, capture_key included; a
	// grep for "capture_key":"3-0" still finds the line.
	base.WithGroup("turn").InfoContext(ctx, "grouped", "n", 1)
	base.With("session", "s1").WithGroup("turn").With("k", "v").WarnContext(ctx, "both")

	got := lines(t, &buf)
	if len(got) != 3 {
		t.Fatalf("got %d lines, want 3: %v", len(got), got)
	}
	equalJSON(t, got[0], `{"level":"DEBUG","msg":"with attrs","server":"agent","instance":"a1","session":"s1","capture_key":"3-0"}`)
	equalJSON(t, got[1], `{"level":"INFO","msg":"grouped","server":"agent","instance":"a1","turn":{"n":1,"capture_key":"3-0"}}`)
	equalJSON(t, got[2], `{"level":"WARN","msg":"both","server":"agent","instance":"a1","session":"s1","turn":{"k":"v","capture_key":"3-0"}}`)
}

func TestParseLevel(t *testing.T) {
	tests := []struct {
		in   string
		want slog.Level
	}{
		{"debug", slog.LevelDebug},
		{"info", slog.LevelInfo},
		{"warn", slog.LevelWarn},
		{"error", slog.LevelError},
		{"INFO", slog.LevelInfo},
		{" Warn\n", slog.LevelWarn},
		{"debug+2", slog.LevelDebug + 2},
	}
	for _, tt := range tests {
		got, err := logging.ParseLevel(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseLevel(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "verbose", "3", "info-", "warning"} {
		if _, err := logging.ParseLevel(bad); err == nil || !strings.Contains(err.Error(), "want debug, info, warn or error") {
			t.Errorf("ParseLevel(%q) = %v, want an error naming the levels", bad, err)
		}
	}
}

func TestDiscard(t *testing.T) {
	log := logging.Discard()
	if log.Enabled(context.Background(), slog.LevelError) {
		t.Fatal("Discard logger is enabled")
	}
	log.Error("dropped") // must not panic
}

// Ensure a line logged in a traced request names its trace and span next
// to its capture key.
func TestNew_TraceFromContext(t *testing.T) {
	var buf bytes.Buffer
	log := logging.New(&buf, slog.LevelInfo, "agent", "a")
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	ctx = rollout.WithEpisode(ctx, rollout.EpisodeID{RolloutID: "w"})
	log.InfoContext(ctx, "turn")
	got := lines(t, &buf)
	equalJSON(t, got[0], `{"level":"INFO","msg":"turn","server":"agent","instance":"a","capture_key":"w","trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","span_id":"00f067aa0ba902b7"}`)
}
