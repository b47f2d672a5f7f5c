package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gymfleet/gymfleet/pkg/servers/agent"
	"github.com/gymfleet/gymfleet/pkg/transport/httpserver/h2ctest"
	"github.com/gymfleet/gymfleet/pkg/transport/sse"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// seen is one request a stand-in received.
type seen struct {
	who, path, session, body string
	proto                    int
}

func (s seen) String() string {
	line := s.who + " " + s.path
	if s.session != "" {
		line += " session=" + s.session
	}
	return line
}

// recorder keeps the requests of every stand-in in arrival order.
type recorder struct {
	mu   sync.Mutex
	seen []seen
}

func (r *recorder) add(who string, req *http.Request, body []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, seen{who: who, path: req.URL.Path, session: req.Header.Get("X-Ng-Session-Id"), body: string(body), proto: req.ProtoMajor})
}

func (r *recorder) all() []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]seen(nil), r.seen...)
}

func (r *recorder) lines() []string {
	var out []string
	for _, s := range r.all() {
		out = append(out, s.String())
	}
	return out
}

func (r *recorder) of(who string) []seen {
	var out []seen
	for _, s := range r.all() {
		if s.who == who {
			out = append(out, s)
		}
	}
	return out
}

// newH2C starts an httptest server that speaks HTTP/1.1 and HTTP/2 without
// TLS, as the fleet's servers do.
func newH2C(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	return h2ctest.Start(t, h)
}

// modelStandIn answers /v1/responses with scripted Responses objects, one
// per call, as JSON or (for stream: true) as Responses SSE.
type modelStandIn struct {
	t   *testing.T
	rec *recorder
	url string

	mu      sync.Mutex
	replies []string
	calls   int
	// status, when set, answers every call with it and an error envelope.
	status int
	// streamEmptyCompleted sends response.completed without output, so the
	// reader must use the output_item.done events.
	streamEmptyCompleted bool
	// block, when set, holds every call from blockFrom on (0: every call)
	// until it is closed or the call ends; entered gets a value when a call
	// starts waiting.
	block     chan struct{}
	entered   chan struct{}
	blockFrom int
}

func newModel(t *testing.T, rec *recorder, replies ...string) *modelStandIn {
	m := &modelStandIn{t: t, rec: rec, replies: replies}
	m.url = newH2C(t, http.HandlerFunc(m.serve)).URL
	return m
}

func (m *modelStandIn) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	m.rec.add("model", r, body)
	m.mu.Lock()
	i := m.calls
	m.calls++
	status, block, entered := m.status, m.block, m.entered
	if i < m.blockFrom {
		block = nil
	}
	m.mu.Unlock()
	if block != nil {
		if entered != nil {
			entered <- struct{}{}
		}
		select {
		case <-block:
		case <-r.Context().Done():
			return
		}
	}
	if status != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"error":{"code":"internal","detail":"scripted failure %d"}}`, i)
		return
	}
	if i >= len(m.replies) {
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, "model stand-in: no reply scripted for call %d", i)
		return
	}
	var req openai.ResponsesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		m.t.Errorf("model stand-in: request does not decode: %v", err)
	}
	if !req.Streaming() {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, m.replies[i])
		return
	}
	m.writeStream(w, m.replies[i])
}

// writeStream sends a response as the Responses SSE events of the OpenAI API.
func (m *modelStandIn) writeStream(w http.ResponseWriter, reply string) {
	var resp openai.Response
	if err := json.Unmarshal([]byte(reply), &resp); err != nil {
		m.t.Errorf("scripted reply does not decode: %v", err)
		return
	}
	sw := sse.NewWriter(w)
	seq := 0
	send := func(ev openai.StreamEvent) {
		ev.SequenceNumber = seq
		seq++
		b, err := json.Marshal(ev)
		if err != nil {
			m.t.Errorf("encoding event: %v", err)
		}
		_ = sw.Event(ev.Type, b)
	}
	start := resp
	start.Output, start.Status, start.Usage = []openai.Item{}, "in_progress", nil
	send(openai.StreamEvent{Type: openai.EventResponseCreated, Response: &start})
	for i, it := range resp.Output {
		idx, item := i, it
		send(openai.StreamEvent{Type: openai.EventOutputItemAdded, OutputIndex: &idx, Item: &item})
		send(openai.StreamEvent{Type: openai.EventOutputItemDone, OutputIndex: &idx, Item: &item})
	}
	final := resp
	if m.streamEmptyCompleted {
		final.Output = nil
	}
	typ := openai.EventResponseCompleted
	if resp.IncompleteDetails != nil {
		typ = openai.EventResponseIncomplete
	}
	send(openai.StreamEvent{Type: typ, Response: &final})
}

func (m *modelStandIn) callCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls
}

// resourcesStandIn answers seed, verify, close and scripted tools.
type resourcesStandIn struct {
	url string
	// tool answers a tool call; nil answers 404 unknown_tool.
	tool         func(name, body string) (int, string)
	seedStatus   int
	verifyStatus int
	// seedHeader is added to seed replies (checkpoint announcements).
	seedHeader http.Header
	// verifyGate, when set, holds /verify until it is closed or the call
	// ends; verifyEntered gets a value when a verify starts waiting.
	verifyGate    chan struct{}
	verifyEntered chan struct{}
}

func newResources(t *testing.T, rec *recorder) *resourcesStandIn {
	rs := &resourcesStandIn{tool: weatherTool}
	rs.url = newH2C(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec.add("resources", r, body)
		_, rest, _ := rollout.SplitPath(r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		status, reply := http.StatusOK, ""
		switch rest {
		case "/seed_session":
			for k, v := range rs.seedHeader {
				w.Header()[k] = v
			}
			status, reply = or(rs.seedStatus, 200), `{}`
		case "/verify":
			if rs.verifyGate != nil {
				if rs.verifyEntered != nil {
					rs.verifyEntered <- struct{}{}
				}
				select {
				case <-rs.verifyGate:
				case <-r.Context().Done():
					return
				}
			}
			status, reply = or(rs.verifyStatus, 200), `{"reward":1.0,"verified":true}`
		case "/close_session":
			reply = `{"closed":true}`
		default:
			status, reply = rs.tool(strings.TrimPrefix(rest, "/"), string(body))
		}
		w.WriteHeader(status)
		// Our servers end JSON replies with a newline; the agent drops it.
		io.WriteString(w, reply+"\n")
	})).URL
	return rs
}

func or(v, def int) int {
	if v != 0 {
		return v
	}
	return def
}

// weatherTool answers get_weather like the weather server, anything else 404.
func weatherTool(name, body string) (int, string) {
	if name != "get_weather" {
		return 404, `{"error":{"code":"unknown_tool","detail":"no tool ` + name + `"}}`
	}
	var in struct{ City string }
	_ = json.Unmarshal([]byte(body), &in)
	return 200, `{"city":"` + in.City + `","weather_description":"The weather in ` + in.City + ` is cold."}`
}

// testAgent is an agent listening on a loopback port, with its stand-ins.
type testAgent struct {
	t         *testing.T
	srv       *agent.Server
	url       string
	rec       *recorder
	model     *modelStandIn
	resources *resourcesStandIn
}

func startAgent(t *testing.T, model *modelStandIn, rs *resourcesStandIn, rec *recorder, mutate ...func(*agent.Config)) *testAgent {
	t.Helper()
	cfg := agent.DefaultConfig()
	cfg.ModelServerURL, cfg.ResourcesServerURL = model.url, rs.url
	for _, m := range mutate {
		m(&cfg)
	}
	srv, err := agent.New(cfg, agent.Deps{})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		http.DefaultClient.CloseIdleConnections()
	})
	return &testAgent{t: t, srv: srv, url: srv.URL(), rec: rec, model: model, resources: rs}
}

// newFixture starts stand-ins with scripted model replies and an agent on them.
func newFixture(t *testing.T, mutate func(*agent.Config), replies ...string) *testAgent {
	rec := &recorder{}
	return startAgent(t, newModel(t, rec, replies...), newResources(t, rec), rec, mutateOrNothing(mutate))
}

func mutateOrNothing(m func(*agent.Config)) func(*agent.Config) {
	if m == nil {
		return func(*agent.Config) {}
	}
	return m
}

type reply struct {
	status int
	header http.Header
	body   string
}

func (ta *testAgent) post(path string, header map[string]string, body string) reply {
	ta.t.Helper()
	// Errors are replies with status -1, not t.Fatal: some calls run on
	// goroutines other than the test's.
	req, err := http.NewRequest(http.MethodPost, ta.url+path, strings.NewReader(body))
	if err != nil {
		return reply{status: -1, body: err.Error()}
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{status: -1, body: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: strings.TrimSpace(string(b))}
}

// open opens an agent session for capture key key.
func (ta *testAgent) open(key, sessionID, resourcesSession string) reply {
	ta.t.Helper()
	return ta.post("/ng-rollout/"+key+"/v1/agent_sessions", nil,
		`{"session_id":"`+sessionID+`","resources_session_id":"`+resourcesSession+`","request":{"responses_create_params":{"input":"hi"}}}`)
}

// activate runs activation n of a session.
func (ta *testAgent) activate(key, sessionID string, n string, params string) reply {
	ta.t.Helper()
	return ta.post("/ng-rollout/"+key+"/v1/responses", map[string]string{agent.SessionHeader: sessionID, agent.ActivationHeader: n}, params)
}

func (ta *testAgent) closeSession(key, sessionID string) reply {
	ta.t.Helper()
	path := "/v1/agent_sessions/close"
	if key != "" {
		path = "/ng-rollout/" + key + path
	}
	return ta.post(path, nil, `{"session_id":"`+sessionID+`"}`)
}

func expectCode(t *testing.T, what string, got reply, status int, code string) {
	t.Helper()
	if got.status != status || !strings.Contains(got.body, `"code":"`+code+`"`) {
		t.Errorf("%s: got %d %s, want %d with code %s", what, got.status, got.body, status, code)
	}
}

func compact(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatalf("compact %q: %v", s, err)
	}
	return b.String()
}

// field returns one top-level field of a JSON object, compacted.
func field(t *testing.T, obj, name string) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(obj), &m); err != nil {
		t.Fatalf("reply is not an object: %v: %s", err, obj)
	}
	return compact(t, string(m[name]))
}

// Scripted Responses objects.

func fc(callID, name, args string) string {
	a, _ := json.Marshal(args)
	return `{"type":"function_call","id":"fc_` + callID + `","call_id":"` + callID + `","name":"` + name + `","arguments":` + string(a) + `,"status":"completed"}`
}

func fco(callID, output string) string {
	o, _ := json.Marshal(output)
	return `{"type":"function_call_output","call_id":"` + callID + `","output":` + string(o) + `}`
}

func msg(text string) string {
	return `{"id":"msg_1","type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"` + text + `","annotations":[],"logprobs":null}]}`
}

func reasoning() string {
	return `{"id":"rs_1","type":"reasoning","summary":[{"type":"summary_text","text":"thinking"}],"encrypted_content":null,"content":null}`
}

func usage(in, out int, cached string) string {
	return fmt.Sprintf(`{"input_tokens":%d,"input_tokens_details":{"cached_tokens":%s},"output_tokens":%d,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":%d}`, in, cached, out, in+out)
}

func resp(id string, usage string, items ...string) string {
	return `{"id":"` + id + `","object":"response","created_at":1,"model":"policy","output":[` + strings.Join(items, ",") + `],"parallel_tool_calls":true,"tool_choice":"auto","tools":[],"status":"completed","incomplete_details":null,"usage":` + usage + `}`
}

func items(xs ...string) string { return "[" + strings.Join(xs, ",") + "]" }

const weatherParams = `{"input":[{"role":"user","content":"Weather in Paris?"}],"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}],"temperature":0.5}`
