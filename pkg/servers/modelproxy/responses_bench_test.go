package modelproxy_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

// scaleWeatherTool is the tool of gymctl bench-scale's weather rows
// (pkg/ops/scalebench), strict as NeMo Gym's rows send it.
var scaleWeatherTool = map[string]any{
	"type": "function", "name": "get_weather", "description": "Get the current weather of a city.", "strict": true,
	"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}, "required": []string{"city"}},
}

// scaleWeatherInput is the input of a bench-scale weather row.
func scaleWeatherInput(city string) []any {
	return []any{
		map[string]any{"role": "developer", "content": "You are a weather assistant."},
		map[string]any{"role": "user", "content": fmt.Sprintf(`What is the weather in %s? Call get_weather with {"city": %q}.`, city, city)},
	}
}

// cannedWorker answers each distinct upstream request with the reply a
// zero-latency fakeinference gave it the first time, so that a benchmark
// of the model server's call pays for the model server alone.
type cannedWorker struct {
	worker  *fakeinference.Server
	mu      sync.Mutex
	replies map[[sha256.Size]byte][]byte
	// misses counts the requests the worker answered.
	misses int
}

func (c *cannedWorker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	key := sha256.Sum256(append([]byte(r.URL.Path+"\n"), body...))
	c.mu.Lock()
	reply, ok := c.replies[key]
	c.mu.Unlock()
	if !ok {
		rec := httptest.NewRecorder()
		c.worker.Handler().ServeHTTP(rec, httptest.NewRequestWithContext(r.Context(), r.Method, r.URL.String(), bytes.NewReader(body)))
		if rec.Code != http.StatusOK {
			http.Error(w, rec.Body.String(), rec.Code)
			return
		}
		reply = rec.Body.Bytes()
		c.mu.Lock()
		c.replies[key] = reply
		c.misses++
		c.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(reply)
}

// postResponses sends body to the server's /v1/responses under capture key
// key, in process, and returns the reply's body.
func postResponses(tb testing.TB, h http.Handler, key string, body []byte) []byte {
	r := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/ng-rollout/"+key+"/v1/responses", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		tb.Fatalf("%s: %d %s", key, w.Code, w.Body)
	}
	return w.Body.Bytes()
}

// weatherSecondCall is the second Responses call of a bench-scale weather
// rollout, as the agent sends it: the row's input and tools, the first
// call's output (a function call with its token ids and log-probs) and the
// tool's output, and the row's metadata if not nil. It makes the first
// call through srv.
func weatherSecondCall(tb testing.TB, srv *modelproxy.Server, metadata map[string]string) []byte {
	tb.Helper()
	params := map[string]any{"input": scaleWeatherInput("City4242"), "tools": []any{scaleWeatherTool}}
	if metadata != nil {
		params["metadata"] = metadata
	}
	first, err := codec.Marshal(params)
	if err != nil {
		tb.Fatal(err)
	}
	var resp struct {
		Output []codec.RawMessage `json:"output"`
	}
	if err := codec.Unmarshal(postResponses(tb, srv.Handler(), "first", first), &resp); err != nil {
		tb.Fatal(err)
	}
	input := scaleWeatherInput("City4242")
	var callID string
	for _, raw := range resp.Output {
		var item openai.Item
		if err := codec.Unmarshal(raw, &item); err != nil {
			tb.Fatal(err)
		}
		if item.Type == openai.ItemFunctionCall {
			if len(item.GenerationTokenIDs) == 0 {
				tb.Fatalf("the function call carries no token ids: %s", raw)
			}
			callID = item.CallID
		}
		input = append(input, raw)
	}
	if callID == "" {
		tb.Fatalf("the first call made no function call: %s", resp.Output)
	}
	input = append(input, map[string]any{"type": "function_call_output", "call_id": callID, "output": `{"city": "City4242", "temperature_c": 21, "conditions": "sunny"}`})
	params["input"] = input
	second, err := codec.Marshal(params)
	if err != nil {
		tb.Fatal(err)
	}
	return second
}

// newCannedModelServer is a model server with capture whose upstream is
// a cannedWorker, called in process.
func newCannedModelServer(tb testing.TB) (*modelproxy.Server, *cannedWorker) {
	tb.Helper()
	wcfg := fakeinference.DefaultConfig()
	wcfg.TokensPerSecond, wcfg.MinCallSeconds = 0, 0
	worker, err := fakeinference.New(wcfg, fakeinference.Deps{})
	if err != nil {
		tb.Fatal(err)
	}
	canned := &cannedWorker{worker: worker, replies: map[[sha256.Size]byte][]byte{}}
	cfg := modelproxy.DefaultConfig()
	cfg.Upstream.BaseURL = "http://worker.invalid/v1"
	cfg.Capture.Dir = tb.TempDir()
	srv, err := modelproxy.New(cfg, modelproxy.Deps{Upstream: ctlplanetest.HandlerClient(canned)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = srv.Close(context.Background()) })
	return srv, canned
}

// BenchmarkResponsesCall is the model server's whole cost of one
// Responses call with capture, in process: the second call of a
// bench-scale weather rollout (decode, conversion, request digest,
// upstream encode, reply conversion, ledger row), each under a new
// capture key; the upstream answers at once with a recorded reply. It
// reports the process's CPU time per call beside the time per call. The
// rollout's row carries no metadata, or an extra_body for the upstream
// (as NeMo RL's rows carry a seed), which the server merges into the
// upstream request.
func BenchmarkResponsesCall(b *testing.B) {
	b.Run("plain", func(b *testing.B) { benchResponsesCall(b, nil) })
	b.Run("extra_body", func(b *testing.B) {
		benchResponsesCall(b, map[string]string{"extra_body": `{"seed": 42, "top_k": 20}`})
	})
}

func benchResponsesCall(b *testing.B, metadata map[string]string) {
	srv, canned := newCannedModelServer(b)
	body := weatherSecondCall(b, srv, metadata)
	h := srv.Handler()
	postResponses(b, h, "warm", body)
	misses := canned.misses
	b.ReportAllocs()
	cpu := processCPU(b)
	i := 0
	for b.Loop() {
		postResponses(b, h, fmt.Sprintf("bench-%d", i), body)
		i++
	}
	b.StopTimer()
	// The ledger's sync runs beside the calls: CPU time per call, next to
	// the time per call, is what the call costs the process.
	b.ReportMetric(float64(processCPU(b)-cpu)/float64(i), "cpu-ns/op")
	if canned.misses != misses {
		b.Fatalf("the upstream request changed from call to call: %d requests answered by the worker", canned.misses-misses)
	}
}

// BenchmarkDigest measures the request digest of that second call: with
// the encoding of the converted request for the upstream (responses), and
// alone over the messages and tools as encoded (request, what a Chat
// Completions call takes).
func BenchmarkDigest(b *testing.B) {
	srv, _ := newCannedModelServer(b)
	body := weatherSecondCall(b, srv, nil)
	chat := modelproxy.ConvertResponses(b, srv, body)
	messages, err := codec.Marshal(chat.Messages)
	if err != nil {
		b.Fatal(err)
	}
	tools, err := codec.Marshal(chat.Tools)
	if err != nil {
		b.Fatal(err)
	}
	if !strings.Contains(string(messages), "generation_log_probs") {
		b.Fatalf("the converted history carries no token fields: %s", messages)
	}
	b.Run("responses", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := modelproxy.EncodeAndDigest(srv, chat); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("request", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(messages) + len(tools)))
		for b.Loop() {
			if _, err := modelproxy.DigestRequest(srv, messages, tools); err != nil {
				b.Fatal(err)
			}
		}
	})
}
