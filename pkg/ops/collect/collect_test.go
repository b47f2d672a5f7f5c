package collect_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/ops/collect"
)

// fakeEnv is an httptest /run: it answers the verify-shaped reply with
// reward 1.0 (0.0 when the row says "wrong") and observations, and fails
// rows that say "fail". Until gate opens, requests wait, so a test can see
// how many run at once.
type fakeEnv struct {
	srv      *httptest.Server
	cur, max atomic.Int64
	calls    atomic.Int64
	gateOnce sync.Once
	gate     chan struct{}
	openAt   int64
	mu       sync.Mutex
	bodies   []map[string]any
}

func newFakeEnv(t *testing.T, openAt int64) *fakeEnv {
	f := &fakeEnv{gate: make(chan struct{}), openAt: openAt}
	if openAt <= 0 {
		f.gateOnce.Do(func() { close(f.gate) })
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /run", func(w http.ResponseWriter, r *http.Request) {
		f.calls.Add(1)
		n := f.cur.Add(1)
		defer f.cur.Add(-1)
		for {
			m := f.max.Load()
			if n <= m || f.max.CompareAndSwap(m, n) {
				break
			}
		}
		if n >= f.openAt {
			f.gateOnce.Do(func() { close(f.gate) })
		}
		select {
		case <-f.gate:
		case <-r.Context().Done():
			return
		}
		var row map[string]any
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &row); err != nil {
			http.Error(w, "bad body", 400)
			return
		}
		f.mu.Lock()
		f.bodies = append(f.bodies, row)
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if row["fail"] == true {
			w.WriteHeader(http.StatusBadGateway)
			_, _ = io.WriteString(w, `{"error":{"code":"upstream_error","detail":"agent exploded"}}`)
			return
		}
		reward := 1.0
		if row["wrong"] == true {
			reward = 0
		}
		_ = json.NewEncoder(w).Encode(map[string]any{
			"responses_create_params": row["responses_create_params"],
			"response":                map[string]any{"id": "resp"},
			"reward":                  reward,
			"episode_id":              map[string]any{"rollout_id": fmt.Sprintf("%v-%v", row["_ng_task_index"], row["_ng_rollout_index"]), "attempt": 0},
			"observations":            map[string]any{"model_calls": 2},
		})
	})
	// Environment servers speak HTTP/2 without TLS, as the collector does.
	f.srv = httptest.NewUnstartedServer(mux)
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	f.srv.Config.Protocols = &p
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

func writeInput(t *testing.T, lines []string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rows.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func readJSONL(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("output line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

func TestCollector_ConcurrencyBoundAndExactlyOnce(t *testing.T) {
	const concurrency, n = 4, 40
	env := newFakeEnv(t, concurrency)
	var lines []string
	for i := 0; i < n; i++ {
		agent := "weather_agent"
		if i%2 == 1 {
			agent = "counter_agent"
		}
		extra := ""
		switch {
		case i%10 == 3:
			extra = `,"fail":true`
		case i%10 == 7:
			extra = `,"wrong":true`
		}
		lines = append(lines, fmt.Sprintf(`{"responses_create_params":{"input":"q%d"},"id":%d,"agent_ref":{"type":"responses_api_agents","name":%q}%s}`, i, i, agent, extra))
	}
	lines = append(lines[:5], append([]string{"this is not json"}, lines[5:]...)...)
	input := writeInput(t, lines)
	output := filepath.Join(t.TempDir(), "results.jsonl")

	// A bad line stops the run before anything is sent...
	strict, err := collect.New(collect.Options{EnvURL: env.srv.URL, Concurrency: concurrency})
	if err != nil {
		t.Fatal(err)
	}
	var bad *collect.BadInputError
	if _, err := strict.CollectFile(t.Context(), input, output); !errors.As(err, &bad) || len(bad.Issues) != 1 || bad.Issues[0].Line != 6 || !strings.Contains(err.Error(), "line 6: not a JSON object") {
		t.Fatalf("a bad line without SkipBadLines: %v", err)
	}
	if env.calls.Load() != 0 {
		t.Fatalf("%d rows were sent from an input with a bad line", env.calls.Load())
	}
	// ...unless the bad lines are skipped.
	var progress bytes.Buffer
	c, err := collect.New(collect.Options{EnvURL: env.srv.URL, Concurrency: concurrency, Progress: &progress, SkipBadLines: true})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := c.CollectFile(t.Context(), input, output)
	if err != nil {
		t.Fatal(err)
	}
	if got := env.max.Load(); got != concurrency {
		t.Errorf("max rows in flight = %d, want exactly %d", got, concurrency)
	}
	if got := env.calls.Load(); got != n {
		t.Errorf("/run calls = %d, want %d (one per row, no retries)", got, n)
	}

	out := readJSONL(t, output)
	fails := readJSONL(t, collect.FailuresPath(output))
	if collect.FailuresPath(output) != strings.TrimSuffix(output, ".jsonl")+"_failures.jsonl" {
		t.Errorf("FailuresPath = %s", collect.FailuresPath(output))
	}
	if len(out) != 36 || len(fails) != 4 {
		t.Fatalf("output %d rows, failures %d rows; want 36 and 4", len(out), len(fails))
	}
	seen := map[float64]int{}
	for _, r := range append(out, fails...) {
		seen[r["id"].(float64)]++
	}
	for i := 0; i < n; i++ {
		if seen[float64(i)] != 1 {
			t.Errorf("row id %d written %d times", i, seen[float64(i)])
		}
	}
	for _, r := range fails {
		if r["_ng_failure_class"] != "upstream_error" || r["_ng_failure_detail"] != "agent exploded" || r["_ng_failure_status"] != float64(502) {
			t.Errorf("failure row = %v", r)
		}
	}

	if sum.Rows != n || sum.Succeeded != 36 || sum.Failed != 4 || sum.NotStarted != 0 || sum.Interrupted != 0 {
		t.Errorf("summary counts = %+v", sum)
	}
	if len(sum.Skipped) != 1 || sum.Skipped[0].Line != 6 {
		t.Errorf("skipped = %v, want line 6", sum.Skipped)
	}
	if sum.Rewards.Count != 36 || len(sum.Rewards.Distribution) != 2 || sum.Rewards.Distribution[0] != (collect.RewardCount{Reward: 0, Count: 4}) {
		t.Errorf("rewards = %+v", sum.Rewards)
	}
	if sum.ModelCalls != 72 || sum.AllRewardsOne() {
		t.Errorf("model calls %d, all ones %v", sum.ModelCalls, sum.AllRewardsOne())
	}
	if len(sum.Tasks) != 2 || sum.Tasks[0].Task != "counter_agent" || sum.Tasks[0].Rows != 20 {
		t.Errorf("tasks = %+v", sum.Tasks)
	}
	var text, table bytes.Buffer
	sum.WriteText(&text)
	sum.WriteTable(&table)
	for _, want := range []string{"rows: 40  succeeded: 36  failed: 4", "reward: mean 0.8889 over 36 rows", "0×4", "1×32", "model calls: 72 (2.00 per rollout)", "upstream_error×4", "skipped line 6: not a JSON object", "rollouts/s"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("summary text lacks %q:\n%s", want, text.String())
		}
	}
	if !strings.Contains(table.String(), "weather_agent") || !strings.Contains(table.String(), "p95 latency") {
		t.Errorf("table:\n%s", table.String())
	}
	if !strings.Contains(progress.String(), "in flight") || !strings.Contains(progress.String(), "failed 4") {
		t.Errorf("progress output lacks the counts: %q", progress.String())
	}
}

func TestCollector_OutputRowShape(t *testing.T) {
	env := newFakeEnv(t, 0)
	rows, _, err := collect.ReadRows(strings.NewReader(`{"responses_create_params":{"input":"q"},"city":"Paris","agent_ref":{"name":"weather_agent"}}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	c, err := collect.New(collect.Options{EnvURL: env.srv.URL + "/"})
	if err != nil {
		t.Fatal(err)
	}
	var out, fails bytes.Buffer
	if _, err := c.Run(t.Context(), rows, &out, &fails); err != nil {
		t.Fatal(err)
	}
	want := `{"_ng_attempt_index":0,"_ng_rollout_id":"0-0","_ng_rollout_index":0,"_ng_task_index":0,"agent_ref":{"name":"weather_agent"},"city":"Paris","episode_id":{"attempt":0,"rollout_id":"0-0"},"observations":{"model_calls":2},"response":{"id":"resp"},"responses_create_params":{"input":"q"},"reward":1}`
	var got any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v: %q", err, out.String())
	}
	b, _ := json.Marshal(got)
	if string(b) != want {
		t.Errorf("output row:\n got  %s\n want %s", b, want)
	}
	if !strings.HasSuffix(out.String(), "}\n") || strings.Count(out.String(), "\n") != 1 {
		t.Errorf("not one JSON line: %q", out.String())
	}
	env.mu.Lock()
	sent := env.bodies[0]
	env.mu.Unlock()
	if sent["_ng_task_index"] != float64(0) || sent["_ng_rollout_index"] != float64(0) || sent["city"] != "Paris" {
		t.Errorf("/run body = %v", sent)
	}
	if fails.Len() != 0 {
		t.Errorf("failures: %s", fails.String())
	}
}

func TestCollector_InterruptWritesNothingHalfDone(t *testing.T) {
	env := newFakeEnv(t, 1<<30) // never opens: every request waits
	var lines []string
	for i := 0; i < 10; i++ {
		lines = append(lines, fmt.Sprintf(`{"responses_create_params":{"input":"q%d"}}`, i))
	}
	rows, _, _ := collect.ReadRows(strings.NewReader(strings.Join(lines, "\n")), 0)
	c, _ := collect.New(collect.Options{EnvURL: env.srv.URL, Concurrency: 3})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	var sum *collect.Summary
	var runErr error
	var out, fails bytes.Buffer
	go func() {
		defer close(done)
		sum, runErr = c.Run(ctx, rows, &out, &fails)
	}()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for env.cur.Load() < 3 {
		select {
		case <-done:
			t.Fatal("Run ended early")
		case <-deadline:
			t.Fatal("three rows never got in flight")
		case <-tick.C:
		}
	}
	cancel()
	<-done
	if runErr == nil || sum.Interrupted != 3 || sum.NotStarted != 7 || out.Len() != 0 || fails.Len() != 0 {
		t.Errorf("err %v, summary %+v, out %q, fails %q", runErr, sum, out.String(), fails.String())
	}
}

func TestCollector_UnreachableEnvFailsRows(t *testing.T) {
	env := newFakeEnv(t, 0)
	url := env.srv.URL
	env.srv.Close()
	rows, _, _ := collect.ReadRows(strings.NewReader(`{"responses_create_params":{}}`), 0)
	c, _ := collect.New(collect.Options{EnvURL: url})
	var out, fails bytes.Buffer
	sum, err := c.Run(t.Context(), rows, &out, &fails)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Failed != 1 || !strings.Contains(fails.String(), `"_ng_failure_status":0`) {
		t.Errorf("summary %+v, failures %s", sum, fails.String())
	}
}

// Ensure a collection against a fleet that is down fails at once, naming
// the cause, before its output is touched.
func TestCollector_DownFleetFailsFast(t *testing.T) {
	env := newFakeEnv(t, 0)
	url := env.srv.URL
	env.srv.Close()
	dir := t.TempDir()
	input, output := filepath.Join(dir, "in.jsonl"), filepath.Join(dir, "out.jsonl")
	if err := os.WriteFile(input, []byte(`{"responses_create_params":{}}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(output, []byte("kept\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := collect.New(collect.Options{EnvURL: url})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.CollectFile(t.Context(), input, output)
	if err == nil || !strings.Contains(err.Error(), "does not answer") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("CollectFile = %v, want the environment named with the cause", err)
	}
	if b, _ := os.ReadFile(output); string(b) != "kept\n" {
		t.Errorf("the output was touched: %q", b)
	}
}

func TestNew_Validates(t *testing.T) {
	for _, o := range []collect.Options{{EnvURL: "localhost:1"}, {EnvURL: "http://x", Concurrency: -1}} {
		if _, err := collect.New(o); err == nil {
			t.Errorf("New(%+v) succeeded", o)
		}
	}
}

// Ensure plain progress (a Progress that is no terminal) is whole lines
// without carriage returns, the last one counting every row.
func TestCollector_PlainProgress(t *testing.T) {
	env := newFakeEnv(t, 0)
	var in strings.Builder
	for range 20 {
		in.WriteString(`{"responses_create_params":{"input":"q"}}` + "\n")
	}
	rows, _, err := collect.ReadRows(strings.NewReader(in.String()), 0)
	if err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	c, err := collect.New(collect.Options{EnvURL: env.srv.URL, Concurrency: 4, Progress: &progress, PlainProgress: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Run(t.Context(), rows, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	text := progress.String()
	if strings.ContainsAny(text, "\r\x1b") || !strings.HasSuffix(text, "\n") {
		t.Errorf("progress is not plain lines: %q", text)
	}
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) < 10 || !strings.HasPrefix(lines[len(lines)-1], "collecting: 20/20 rollouts finished, 0 in flight, 0 failed") {
		t.Errorf("progress lines: %q", lines)
	}
}
