package vllm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
	"github.com/gymfleet/gymfleet/tests/interop/interoptest"
)

// TestGymVLLMModel: issue 46's mixed fleet in front of the real vLLM. Gym's
// own vllm_model (nemo-gym 0.7.0, from the gym environment), configured as
// NeMo RL's training runs configure it (vllm_model_for_training.yaml: token
// ids returned, the reasoning parser on), and our model server are both put
// in front of this vLLM, and each request is sent to both: Responses (the
// route Gym's agents call; streamed too), and Chat Completions. They must
// give the client the same thing, field by field, token ids and log
// probabilities exactly (interoptest.CompareResponses,
// CompareChatCompletions), and send vLLM the same request.
//
// Both servers reach vLLM through a recorder of their own, so the test also
// sees what each asked vLLM and what vLLM answered, and checks that the
// token ids each returns are the ones vLLM gave it: Gym asks for the
// generated ids as "token_id:N" log-prob tokens and for the prompt's from
// /tokenize; ours asks for both inline with return_token_ids.
//
// Two generations of one request are byte-identical here but for what vLLM
// makes at random for each: the completion's id, a tool call's id (its
// form is compared) and created. The requests run one at a time, each
// greedy or sampled with a seed, so the batch and the sampler are the same
// for both; vLLM's prefix cache serves the second generation's prompt from
// the first one's blocks, which gives the same logits.
func TestGymVLLMModel(t *testing.T) {
	need(t)
	needGym(t)
	gymRec, ourRec := newRecorder(t, env.vllm.url), newRecorder(t, env.vllm.url)
	ports, err := env.ports.Take(1)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := env.gym.VLLMModelConfig("gym_policy", ports[0], gymRec.url+"/v1", ServedModel)
	if err != nil {
		t.Fatal(err)
	}
	g := env.gym.StartServer(t, "gym_policy", "responses_api_models/vllm_model", ports[0], doc)
	ours := startModelServer(t, func(c *modelproxy.Config) { c.Upstream.BaseURL = ourRec.url + "/v1" })
	interoptest.WaitGymServers(t, g)

	// The developer and user turns of the demo's weather row, as Gym's
	// datasets write them, with the suite's weather tool (strict, as
	// Gym's rows declare their tools; the city bounded: random weights
	// under a grammar would write it until max_tokens).
	row := []any{
		map[string]any{"role": "developer", "content": "You are a weather assistant. Look the weather up with the get_weather tool, then answer with what the tool returned."},
		map[string]any{"role": "user", "content": "What is the weather in Paris? Call get_weather with {\"city\": \"Paris\"}."},
	}
	var chatTool map[string]any
	_ = json.Unmarshal([]byte(weatherToolChat), &chatTool)
	// A forced call is sampled with a seed whose call vLLM parses: greedy
	// decoding of the random weights fills the arguments with white space,
	// which the grammar allows, until max_tokens.
	seed1 := map[string]any{"extra_body": `{"seed": 1}`}
	long := strings.Repeat("paris london tokyo berlin ", 400)
	requests := []gymVLLMRequest{
		{name: "responses/plain", route: "/v1/responses", body: map[string]any{"input": "Say hello.", "temperature": 0.0, "max_output_tokens": 24}},
		{name: "responses/plain streamed", route: "/v1/responses", stream: true, body: map[string]any{"input": "Say hello.", "temperature": 0.0, "max_output_tokens": 24, "stream": true}},
		{name: "responses/forced tool call streamed", route: "/v1/responses", stream: true, body: map[string]any{
			"input": row, "tools": []any{weatherToolResponses}, "tool_choice": "required", "parallel_tool_calls": false,
			"temperature": 1.0, "max_output_tokens": 200, "metadata": seed1, "stream": true,
		}, expect: madeCall},
		{name: "responses/seeded sample, thinking on", route: "/v1/responses", body: map[string]any{
			"input": "tell me about berlin", "temperature": 1.0, "max_output_tokens": 16,
			"metadata": map[string]any{"extra_body": `{"seed": 11}`, "chat_template_kwargs": `{"enable_thinking": true}`},
		}},
		{name: "responses/forced tool call", route: "/v1/responses", body: map[string]any{
			"input": row, "tools": []any{weatherToolResponses}, "tool_choice": "required", "parallel_tool_calls": false,
			"temperature": 1.0, "max_output_tokens": 200, "metadata": seed1,
		}, expect: madeCall, next: func(t *testing.T, reply map[string]any) gymVLLMRequest {
			// The second turn as Gym's simple agent makes it: the
			// reply's items (token fields included) and the tool's
			// output appended.
			input := append([]any{}, row...)
			var callID any
			for _, it := range reply["output"].([]any) {
				input = append(input, it)
				if path(it, "type") == "function_call" {
					callID = path(it, "call_id")
				}
			}
			if callID == nil {
				t.Fatalf("Gym's vllm_model made no function_call: %v", interoptest.Short(reply["output"]))
			}
			input = append(input, map[string]any{"type": "function_call_output", "call_id": callID,
				"output": `{"city": "Paris", "weather_description": "The weather in Paris is cold."}`})
			return gymVLLMRequest{name: "responses/after the tool", route: "/v1/responses",
				body: map[string]any{"input": input, "tools": []any{weatherToolResponses}, "temperature": 0.0, "max_output_tokens": 32}}
		}},
		{name: "responses/reasoning in the history", route: "/v1/responses", body: map[string]any{"input": []any{
			map[string]any{"role": "user", "content": "what is the weather in paris"},
			map[string]any{"type": "reasoning", "id": "rs_1", "summary": []any{map[string]any{"type": "summary_text", "text": "the user wants paris"}}},
			map[string]any{"role": "assistant", "content": "It is cold."},
			map[string]any{"role": "user", "content": "and tomorrow?"},
		}, "temperature": 0.0, "max_output_tokens": 16}},
		{name: "responses/prompt past the context", route: "/v1/responses", body: map[string]any{"input": long, "temperature": 0.0}, expect: overflowed},
		{name: "chat/plain", route: "/v1/chat/completions", body: map[string]any{
			"messages": []any{map[string]any{"role": "user", "content": "Say hello."}}, "temperature": 0.0, "max_tokens": 24}},
		{name: "chat/forced tool call", route: "/v1/chat/completions", body: map[string]any{
			"messages": row, "tools": []any{chatTool}, "tool_choice": "required", "parallel_tool_calls": false,
			"temperature": 1.0, "max_tokens": 200, "metadata": seed1}, expect: madeCall},
		{name: "chat/reasoning in the history", route: "/v1/chat/completions", body: map[string]any{
			"messages": []any{
				map[string]any{"role": "user", "content": "what is the weather in paris"},
				map[string]any{"role": "assistant", "content": "<think>the user wants paris</think>It is cold."},
				map[string]any{"role": "user", "content": "and tomorrow?"},
			}, "temperature": 0.0, "max_tokens": 16}},
		// Gym's default drops a chat request's own chat_template_kwargs
		// (forward_request_chat_template_kwargs false): only the
		// configured ones and the metadata's reach the template.
		{name: "chat/own chat_template_kwargs", route: "/v1/chat/completions", body: map[string]any{
			"messages": []any{map[string]any{"role": "user", "content": "tell me about berlin"}}, "temperature": 0.0, "max_tokens": 8,
			"chat_template_kwargs": map[string]any{"enable_thinking": true}}},
		{name: "chat/prompt past the context", route: "/v1/chat/completions", body: map[string]any{
			"messages": []any{map[string]any{"role": "user", "content": long}}, "temperature": 0.0}, expect: overflowed},
	}
	for len(requests) > 0 {
		r := requests[0]
		requests = requests[1:]
		t.Run(r.name, func(t *testing.T) {
			gymRec.reset()
			ourRec.reset()
			gym, mine := r.send(t, g.URL()), r.send(t, ours)
			opts := interoptest.CompareOptions{FreshCallIDs: true, StreamedArguments: r.stream}
			var diffs []string
			if r.route == "/v1/responses" {
				diffs = interoptest.CompareResponses(gym, mine, opts)
			} else {
				diffs = interoptest.CompareChatCompletions(gym, mine, opts)
			}
			for _, d := range diffs {
				t.Errorf("reply: %s", d)
			}
			if r.expect != nil {
				r.expect(t, gym)
			}
			compareUpstream(t, gymRec.chats(), ourRec.chats(), r.stream)
			checkGymTokens(t, tokenFieldsOf(t, r.route, gym), gymRec)
			if !r.stream {
				checkOurTokens(t, tokenFieldsOf(t, r.route, mine), ourRec)
			}
			if r.next != nil {
				requests = append([]gymVLLMRequest{r.next(t, gym)}, requests...)
			}
		})
	}
}

// gymVLLMRequest is one request TestGymVLLMModel sends both servers.
type gymVLLMRequest struct {
	name, route string
	body        map[string]any
	// stream: the reply is an SSE stream; its final response is compared.
	stream bool
	// expect checks what the request is there for in Gym's reply (a tool
	// call, an overflow), so that two replies agreeing on less fail.
	expect func(t *testing.T, reply map[string]any)
	// next builds a later turn from Gym's reply to this one.
	next func(t *testing.T, reply map[string]any) gymVLLMRequest
}

// madeCall: a Responses reply has a function_call item, or a chat reply a
// tool call.
func madeCall(t *testing.T, reply map[string]any) {
	t.Helper()
	for _, it := range asList(reply["output"]) {
		if path(it, "type") == "function_call" {
			return
		}
	}
	if len(asList(path(reply, "choices", 0, "message", "tool_calls"))) > 0 {
		return
	}
	t.Fatalf("Gym's vllm_model made no tool call: %v", interoptest.Short(reply))
}

// overflowed: a Responses reply is incomplete, or a chat reply ends
// length, with no text.
func overflowed(t *testing.T, reply map[string]any) {
	t.Helper()
	if reply["status"] == "incomplete" || (path(reply, "choices", 0, "finish_reason") == "length" && path(reply, "choices", 0, "message", "content") == nil) {
		return
	}
	t.Fatalf("Gym's vllm_model did not answer the overflow as one: %v", interoptest.Short(reply))
}

func asList(v any) []any { l, _ := v.([]any); return l }

// send posts the request to a server and returns its reply (a stream's
// final response).
func (r gymVLLMRequest) send(t *testing.T, base string) map[string]any {
	t.Helper()
	if !r.stream {
		return call(t, base+r.route, r.body)
	}
	events := sse(t, base+r.route, r.body)
	if len(events) == 0 {
		t.Fatalf("%s streamed no event", base)
	}
	last := events[len(events)-1]
	resp, _ := last["response"].(map[string]any)
	// Gym's vllm_model replays a whole response as a stream and always
	// ends it with response.completed (synthesize_responses_sse,
	// nemo_gym/responses_streaming.py); ours streams as OpenAI does and
	// ends a response that stopped early with response.incomplete.
	terminal := map[any]bool{"response.completed": true, "response.incomplete": resp != nil && resp["status"] == "incomplete"}
	if resp == nil || !terminal[last["type"]] {
		t.Fatalf("%s's stream ended with %v", base, interoptest.Short(last))
	}
	return resp
}

// tokenFields are the token ids and log-probs a reply carries for
// training: on a Responses reply its last output item's, on a chat reply
// its message's. Empty for a reply with none (a context overflow).
type tokenFields struct {
	prompt, generation []int
	logProbs           []any
}

func tokenFieldsOf(t *testing.T, route string, reply map[string]any) tokenFields {
	t.Helper()
	var holder any
	if route == "/v1/responses" {
		items, _ := reply["output"].([]any)
		if len(items) > 0 {
			holder = items[len(items)-1]
		}
	} else {
		holder = path(reply, "choices", 0, "message")
	}
	lp, _ := path(holder, "generation_log_probs").([]any)
	return tokenFields{prompt: ints(path(holder, "prompt_token_ids")), generation: ints(path(holder, "generation_token_ids")), logProbs: lp}
}

// checkGymTokens: the ids and log-probs Gym's vllm_model returned are
// those vLLM gave it: the generated ones as the "token_id:N" tokens of the
// chat reply's log-probs, the prompt's from vLLM's /tokenize.
func checkGymTokens(t *testing.T, got tokenFields, rec *recorder) {
	t.Helper()
	chats, tokenizes := rec.chats(), rec.on("/tokenize")
	if len(chats) != 1 {
		t.Fatalf("Gym's vllm_model made %d chat calls to vLLM, want 1", len(chats))
	}
	if chats[0].status != http.StatusOK {
		if len(got.generation) != 0 || len(tokenizes) != 0 {
			t.Fatalf("vLLM refused Gym's call (%d) and Gym still returned token ids %v or asked /tokenize", chats[0].status, got.generation)
		}
		return
	}
	var reply map[string]any
	if err := json.Unmarshal(chats[0].response, &reply); err != nil {
		t.Fatal(err)
	}
	var gen []int
	var lps []any
	entries, _ := path(reply, "choices", 0, "logprobs", "content").([]any)
	for _, e := range entries {
		id, ok := strings.CutPrefix(toString(path(e, "token")), "token_id:")
		n, err := strconv.Atoi(id)
		if !ok || err != nil {
			t.Fatalf("vLLM answered Gym's return_tokens_as_token_ids with the log-prob token %v", path(e, "token"))
		}
		gen, lps = append(gen, n), append(lps, path(e, "logprob"))
	}
	if len(tokenizes) != 1 {
		t.Fatalf("Gym's vllm_model asked vLLM's /tokenize %d times, want 1", len(tokenizes))
	}
	var tok map[string]any
	if err := json.Unmarshal(tokenizes[0].response, &tok); err != nil {
		t.Fatal(err)
	}
	if len(gen) == 0 || !equalInts(got.generation, gen) || !reflect.DeepEqual(got.logProbs, lps) {
		t.Fatalf("Gym's vllm_model returned generation ids %v and log-probs %v; vLLM gave it %v and %v", got.generation, got.logProbs, gen, lps)
	}
	if !equalInts(got.prompt, ints(tok["tokens"])) {
		t.Fatalf("Gym's vllm_model returned prompt ids %v; vLLM's /tokenize gave it %v", got.prompt, ints(tok["tokens"]))
	}
}

// checkOurTokens: the ids and log-probs our model server returned are
// those vLLM gave it inline (return_token_ids) and in its log-probs.
func checkOurTokens(t *testing.T, got tokenFields, rec *recorder) {
	t.Helper()
	chats := rec.chats()
	if len(chats) != 1 {
		t.Fatalf("our model server made %d chat calls to vLLM, want 1", len(chats))
	}
	if chats[0].status != http.StatusOK {
		if len(got.generation) != 0 {
			t.Fatalf("vLLM refused our call (%d) and we still returned token ids %v", chats[0].status, got.generation)
		}
		return
	}
	var reply map[string]any
	if err := json.Unmarshal(chats[0].response, &reply); err != nil {
		t.Fatal(err)
	}
	var lps []any
	entries, _ := path(reply, "choices", 0, "logprobs", "content").([]any)
	for _, e := range entries {
		lps = append(lps, path(e, "logprob"))
	}
	prompt, gen := ints(reply["prompt_token_ids"]), ints(path(reply, "choices", 0, "token_ids"))
	if len(gen) == 0 || !equalInts(got.generation, gen) || !equalInts(got.prompt, prompt) || !reflect.DeepEqual(got.logProbs, lps) {
		t.Fatalf("our model server returned prompt ids %v, generation ids %v, log-probs %v; vLLM gave it %v, %v, %v",
			got.prompt, got.generation, got.logProbs, prompt, gen, lps)
	}
}

// compareUpstream compares the chat requests the two servers sent vLLM,
// but for how each asks for the prompt's token ids (return_token_ids:
// ours asks for them inline, Gym's training config asks /tokenize) and,
// for a streamed call, for the streaming itself: Gym's vllm_model makes the
// whole response and replays it as a stream, ours streams. Gym's streaming
// path also hoists the leading system and developer messages into
// instructions (sanitize_streaming_responses_body,
// nemo_gym/responses_streaming.py), which its non-streaming path and ours
// do not: a developer message reaches vLLM as "system" from Gym's stream
// alone. vLLM 0.32 renders a developer message as system for a chat
// template that has no developer role, as the tiny model's has none
// (renderers/hf.py _convert_developer_to_system), so the prompts are the
// same, as the token ids compared show; the roles are compared as one.
func compareUpstream(t *testing.T, gym, ours []exchange, streamed bool) {
	t.Helper()
	if len(gym) != len(ours) {
		t.Errorf("upstream: Gym's vllm_model sent vLLM %d chat requests, ours %d", len(gym), len(ours))
		return
	}
	for i := range gym {
		g, o := gym[i].request, ours[i].request
		transport := []string{"return_token_ids"}
		if streamed {
			transport = append(transport, "stream", "stream_options")
		}
		for _, k := range transport {
			delete(g, k)
			delete(o, k)
		}
		if streamed {
			developerAsSystem(g["messages"])
			developerAsSystem(o["messages"])
		}
		for _, k := range keysOf(g, o) {
			if !reflect.DeepEqual(g[k], o[k]) {
				t.Errorf("upstream request %d: %s: Gym's vllm_model sent %s, ours %s", i, k, interoptest.Short(jsonText(g[k])), interoptest.Short(jsonText(o[k])))
			}
		}
	}
}

// developerAsSystem renames developer messages system.
func developerAsSystem(messages any) {
	list, _ := messages.([]any)
	for _, m := range list {
		if msg, ok := m.(map[string]any); ok && msg["role"] == "developer" {
			msg["role"] = "system"
		}
	}
}

func keysOf(ms ...map[string]any) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range ms {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	return out
}

func jsonText(v any) string {
	if v == nil {
		return "(absent)"
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// recorder is a reverse proxy to vLLM that keeps every POST it forwards:
// the request's body and the reply's. With stripTokenIDs it is also a
// vLLM without return_token_ids to its caller (newStripper); refusal, when
// set, answers /tokenize itself.
type recorder struct {
	url string
	// stripTokenIDs: chat replies reach the caller with prompt_token_ids
	// and each choice's token_ids null, as vLLM writes them when not asked
	// for return_token_ids; the exchange keeps vLLM's own reply.
	stripTokenIDs bool

	mu        sync.Mutex
	exchanges []exchange
	refusal   *cannedReply
}

type exchange struct {
	path    string
	header  http.Header
	request map[string]any
	status  int
	// response is the reply as vLLM (or a refusal) gave it.
	response []byte
}

// cannedReply is a reply the recorder gives instead of vLLM.
type cannedReply struct {
	status int
	body   string
}

func newRecorder(t *testing.T, target string) *recorder {
	t.Helper()
	return startRecorder(t, target, false)
}

// newStripper is a recorder that takes the inline token ids out of chat
// replies (recorder.stripTokenIDs).
func newStripper(t *testing.T, target string) *recorder {
	t.Helper()
	return startRecorder(t, target, true)
}

func startRecorder(t *testing.T, target string, strip bool) *recorder {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{stripTokenIDs: strip}
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.Method != http.MethodPost {
			return nil
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		relayed := b
		if rec.stripTokenIDs && resp.Request.URL.Path == "/v1/chat/completions" && resp.StatusCode == http.StatusOK {
			if relayed, err = withoutTokenIDs(b, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")); err != nil {
				return err
			}
			resp.Header.Del("Content-Length")
			resp.ContentLength = -1
		}
		resp.Body = io.NopCloser(bytes.NewReader(relayed))
		var req map[string]any
		if body, ok := resp.Request.Context().Value(requestBodyKey{}).([]byte); ok {
			_ = json.Unmarshal(body, &req)
		}
		rec.add(exchange{path: resp.Request.URL.Path, header: resp.Request.Header.Clone(), request: req, status: resp.StatusCode, response: b})
		return nil
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
			r = r.WithContext(withRequestBody(r.Context(), b))
			rec.mu.Lock()
			refusal := rec.refusal
			rec.mu.Unlock()
			if refusal != nil && r.URL.Path == "/tokenize" {
				var req map[string]any
				_ = json.Unmarshal(b, &req)
				rec.add(exchange{path: r.URL.Path, header: r.Header.Clone(), request: req, status: refusal.status, response: []byte(refusal.body)})
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(refusal.status)
				_, _ = io.WriteString(w, refusal.body)
				return
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	rec.url = srv.URL
	return rec
}

func (r *recorder) add(e exchange) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exchanges = append(r.exchanges, e)
}

// refuseTokenize has the recorder answer /tokenize with c (nil: vLLM does).
func (r *recorder) refuseTokenize(c *cannedReply) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refusal = c
}

// withoutTokenIDs is a chat reply (a JSON body, or an SSE stream's events)
// with prompt_token_ids and each choice's token_ids null, the rest as vLLM
// wrote it (numbers keep their text).
func withoutTokenIDs(body []byte, stream bool) ([]byte, error) {
	strip := func(data []byte) ([]byte, error) {
		var m map[string]any
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		if err := dec.Decode(&m); err != nil {
			return nil, fmt.Errorf("a chat reply that is not a JSON object: %w: %.200s", err, data)
		}
		if _, ok := m["prompt_token_ids"]; ok {
			m["prompt_token_ids"] = nil
		}
		for _, c := range asList(m["choices"]) {
			if ch, ok := c.(map[string]any); ok {
				if _, ok := ch["token_ids"]; ok {
					ch["token_ids"] = nil
				}
			}
		}
		return json.Marshal(m)
	}
	if !stream {
		return strip(body)
	}
	var out bytes.Buffer
	for _, line := range strings.SplitAfter(string(body), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || strings.TrimSpace(data) == "[DONE]" {
			out.WriteString(line)
			continue
		}
		b, err := strip([]byte(strings.TrimSpace(data)))
		if err != nil {
			return nil, err
		}
		out.WriteString("data: ")
		out.Write(b)
		out.WriteString("\n")
	}
	return out.Bytes(), nil
}

func (r *recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exchanges = nil
}

// chats are the recorded chat completion exchanges, in order.
func (r *recorder) chats() []exchange {
	return r.on("/v1/chat/completions")
}

func (r *recorder) on(path string) []exchange {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []exchange
	for _, e := range r.exchanges {
		if e.path == path {
			out = append(out, e)
		}
	}
	return out
}

type requestBodyKey struct{}

func withRequestBody(ctx context.Context, b []byte) context.Context {
	return context.WithValue(ctx, requestBodyKey{}, b)
}
