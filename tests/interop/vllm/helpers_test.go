package vllm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
	"github.com/gymfleet/gymfleet/tests/fleettest"
)

// weatherToolChat is the weather tool in Chat Completions form. The city is
// bounded: random weights under a grammar would otherwise write strings
// until max_tokens.
const weatherToolChat = `{"type":"function","function":{"name":"get_weather","description":"Get the weather of a city.","strict":true,` +
	`"parameters":{"type":"object","properties":{"city":{"type":"string","maxLength":12}},"required":["city"],"additionalProperties":false}}}`

// weatherToolResponses is the same tool in Responses form.
var weatherToolResponses = map[string]any{
	"type": "function", "name": "get_weather", "description": "Get the weather of a city.", "strict": true,
	"parameters": map[string]any{
		"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string", "maxLength": 12}},
		"required": []string{"city"}, "additionalProperties": false,
	},
}

// startModelServer starts our model server in this process in front of the
// sidecar, capturing token ids; mutate may change its configuration.
func startModelServer(t *testing.T, mutate func(*modelproxy.Config)) string {
	t.Helper()
	cfg := modelproxy.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Upstream.BaseURL = env.sidecar.url + "/v1"
	cfg.Upstream.Model = ServedModel
	cfg.ReturnTokenIDs = true
	cfg.Capture.Dir = t.TempDir()
	if mutate != nil {
		mutate(&cfg)
	}
	m, err := modelproxy.New(cfg, modelproxy.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	return fleettest.Serve(t, "policy_model", m)
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// call posts body and decodes a 200 reply into a map.
func call(t *testing.T, url string, body any) map[string]any {
	t.Helper()
	b, err := postJSON(ctxFor(t, 2*time.Minute), url, nil, mustJSON(t, body))
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s: %v: %s", url, err, b)
	}
	return out
}

// sse posts a streaming request and returns its events' data, in order
// (without [DONE], which it requires at the end).
func sse(t *testing.T, url string, body any) []map[string]any {
	t.Helper()
	events, done, err := sseEvents(ctxFor(t, 2*time.Minute), url, body, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !done && strings.HasSuffix(url, "/chat/completions") {
		t.Fatalf("the chat stream did not end with data: [DONE]")
	}
	return events
}

// sseEvents reads a stream; each event is handed to onEvent as it comes
// (nil: none). done says whether data: [DONE] ended it.
func sseEvents(ctx context.Context, url string, body any, onEvent func(map[string]any)) ([]map[string]any, bool, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return nil, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := plainClient.Do(req)
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(resp.Body)
		return nil, false, fmt.Errorf("POST %s: %d %s", url, resp.StatusCode, buf.String())
	}
	var out []map[string]any
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			return out, true, nil
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return out, false, fmt.Errorf("event %q: %w", data, err)
		}
		out = append(out, ev)
		if onEvent != nil {
			onEvent(ev)
		}
	}
	return out, false, sc.Err()
}

// ledger is the capture ledger's rows of a capture key.
func ledger(t *testing.T, modelURL, key string) []map[string]any {
	t.Helper()
	var m struct {
		Rows []map[string]any `json:"records"`
	}
	st, err := getJSON(ctxFor(t, 30*time.Second), modelURL+"/capture/rollouts/"+key+"/manifest", &m)
	if err != nil {
		t.Fatal(err)
	}
	if st != http.StatusOK {
		t.Fatalf("the ledger of %s answered %d", key, st)
	}
	return m.Rows
}

// manifestStatus is the status of a capture key's manifest, and its body.
func manifest(t *testing.T, modelURL, key string) (int, map[string]any) {
	t.Helper()
	var m map[string]any
	st, err := getJSON(ctxFor(t, 30*time.Second), modelURL+"/capture/rollouts/"+key+"/manifest", &m)
	if err != nil {
		t.Fatal(err)
	}
	return st, m
}

// ints reads a JSON array of numbers.
func ints(v any) []int {
	a, _ := v.([]any)
	out := make([]int, 0, len(a))
	for _, x := range a {
		f, _ := x.(float64)
		out = append(out, int(f))
	}
	return out
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func path(v any, keys ...any) any {
	for _, k := range keys {
		switch k := k.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			a, _ := v.([]any)
			if k < 0 || k >= len(a) {
				return nil
			}
			v = a[k]
		}
	}
	return v
}

// tokenize is vLLM's own rendering of a chat request's prompt.
func tokenize(t *testing.T, body map[string]any) []int {
	t.Helper()
	out := call(t, env.vllm.url+"/tokenize", body)
	return ints(out["tokens"])
}

// metrics reads vLLM's Prometheus counters and gauges, summed over labels
// except those named in by (e.g. "finished_reason").
type metrics map[string]float64

func readMetrics(t *testing.T) metrics {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctxFor(t, 30*time.Second), http.MethodGet, env.vllm.url+"/metrics", nil)
	resp, err := plainClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := metrics{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || !strings.HasPrefix(line, "vllm:") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		name, labels := line[:i], ""
		if j := strings.IndexByte(name, '{'); j >= 0 {
			name, labels = name[:j], name[j:]
		}
		out[name] += v
		if k := strings.Index(labels, `finished_reason="`); k >= 0 {
			reason := labels[k+len(`finished_reason="`):]
			reason = reason[:strings.IndexByte(reason, '"')]
			out[name+"/"+reason] += v
		}
	}
	return out
}

// finished is vLLM's count of requests it has finished, every reason.
func (m metrics) finished() int { return int(m["vllm:request_success_total"]) }

// idle waits until vLLM runs and queues nothing.
func waitIdle(t *testing.T) metrics {
	t.Helper()
	var m metrics
	waitFor(t, "vLLM idle", 2*time.Minute, func() bool {
		m = readMetrics(t)
		return m["vllm:num_requests_running"] == 0 && m["vllm:num_requests_waiting"] == 0
	})
	return m
}
