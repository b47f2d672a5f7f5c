package modelproxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/servers/fakeinference"
	"github.com/gymfleet/gymfleet/pkg/servers/modelproxy"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// cutToken is the bearer of the worker's generation-cut route.
const cutToken = "cut-token"

// worker is one fake inference server on 127.0.0.1:0.
type worker struct {
	url string
	ctl *fakeinference.Control
}

// startWorker serves a fake inference worker generating tps tokens per
// second (0: instantly) that accepts generation cuts.
func startWorker(t *testing.T, tps float64) *worker {
	t.Helper()
	cfg := fakeinference.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.TokensPerSecond = tps
	cfg.MinCallSeconds = 0
	cfg.ControlAuthToken = cutToken
	srv, err := fakeinference.New(cfg, fakeinference.Deps{})
	if err != nil {
		t.Fatalf("fakeinference.New: %v", err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	hc := httpclient.New(httpclient.Options{})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("fakeinference Close: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("fakeinference Serve: %v", err)
		}
		hc.CloseIdleConnections()
	})
	return &worker{url: srv.URL(), ctl: fakeinference.NewControl(srv.URL(), hc)}
}

// calls reads the worker's call log.
func (w *worker) calls(t *testing.T) []fakeinference.CallInfo {
	t.Helper()
	calls, err := w.ctl.Calls(context.Background())
	if err != nil {
		t.Fatalf("worker calls: %v", err)
	}
	return calls
}

// callsOf returns the worker's calls of one capture key, in arrival order.
func (w *worker) callsOf(t *testing.T, key string) []fakeinference.CallInfo {
	t.Helper()
	var out []fakeinference.CallInfo
	for _, c := range w.calls(t) {
		if c.CaptureKey != nil && *c.CaptureKey == key {
			out = append(out, c)
		}
	}
	return out
}

// model is one model server on 127.0.0.1:0; stop closes it once, which is
// also how a test "crashes" it.
type model struct {
	t      *testing.T
	srv    *modelproxy.Server
	url    string
	data   *http.Client
	ctl    *http.Client
	served chan error
	once   sync.Once
}

// startModel serves a model server in front of upstream (a worker URL)
// with its ledger in dir and checkpointing configured by ck.
func startModel(t *testing.T, upstream, dir string, ck ctlplane.Config, mutate func(*modelproxy.Config)) *model {
	t.Helper()
	cfg := modelproxy.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Upstream.BaseURL = upstream + "/v1"
	cfg.Upstream.H2C = true
	cfg.Capture.Dir = dir
	cfg.Checkpoint = ck
	cfg.GenerationCuts.ControlAuthToken = cutToken
	if mutate != nil {
		mutate(&cfg)
	}
	srv, err := modelproxy.New(cfg, modelproxy.Deps{})
	if err != nil {
		t.Fatalf("modelproxy.New: %v", err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	m := &model{t: t, srv: srv, url: srv.URL(), served: make(chan error, 1),
		data: httpclient.New(httpclient.Options{H2C: true}), ctl: httpclient.New(httpclient.Options{})}
	go func() { m.served <- srv.Serve() }()
	t.Cleanup(m.stop)
	return m
}

// stop closes the server (a crash, for the tests that start another on the
// same ledger: nothing is resumed) and waits for it.
func (m *model) stop() {
	m.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.srv.Close(ctx); err != nil {
			m.t.Errorf("model Close: %v", err)
		}
		if err := <-m.served; err != nil {
			m.t.Errorf("model Serve: %v", err)
		}
		m.data.CloseIdleConnections()
		m.ctl.CloseIdleConnections()
	})
}

// result is a data call's outcome.
type result struct {
	status int
	body   []byte
	err    error
}

// call sends a model call under /ng-rollout/<key>/ (no prefix when key is
// empty).
func (m *model) call(key, path, body string) result {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url := m.url + path
	if key != "" {
		url = m.url + "/ng-rollout/" + key + path
	}
	rep, err := httpclient.Do(ctx, m.data, http.MethodPost, url, nil, []byte(body))
	if err != nil {
		return result{err: err}
	}
	return result{status: rep.Status, body: rep.Body}
}

// callAsync sends the call on a goroutine the returned channel's reader
// owns (every test reads it before it ends).
func (m *model) callAsync(key, path, body string) <-chan result {
	ch := make(chan result, 1)
	go func() { ch <- m.call(key, path, body) }()
	return ch
}

// mustCall sends a call that must succeed.
func (m *model) mustCall(t *testing.T, key, path, body string) []byte {
	t.Helper()
	r := m.call(key, path, body)
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("call of %s: %d %s %v", key, r.status, r.body, r.err)
	}
	return r.body
}

// op sends a checkpoint control call.
func (m *model) op(t *testing.T, name string, body any) (int, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	method := http.MethodPost
	if name == "status" {
		method, body = http.MethodGet, nil
	}
	h := http.Header{"Authorization": {"Bearer " + ctlplanetest.Token}}
	rep, err := httpclient.Do(ctx, m.ctl, method, m.url+ctlplane.RoutePrefix+"/"+name, h, body)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var out map[string]any
	if err := json.Unmarshal(rep.Body, &out); err != nil {
		t.Fatalf("%s reply %s: %v", name, rep.Body, err)
	}
	return rep.Status, out
}

// mustOp sends a control call that must answer 200.
func (m *model) mustOp(t *testing.T, name string, body any) map[string]any {
	t.Helper()
	status, out := m.op(t, name, body)
	if status != http.StatusOK {
		t.Fatalf("%s %v: %d %v", name, body, status, out)
	}
	return out
}

func (m *model) status(t *testing.T) map[string]any {
	t.Helper()
	return m.mustOp(t, "status", nil)
}

// report is the status's readiness report.
func (m *model) report(t *testing.T) map[string]any {
	t.Helper()
	rep, _ := m.status(t)["report"].(map[string]any)
	return rep
}

// get reads a route of the server.
func (m *model) get(t *testing.T, path string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rep, err := httpclient.Do(ctx, m.ctl, http.MethodGet, m.url+path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return rep.Status, rep.Body
}

// ledger reads a capture key's manifest: its status and rows.
func (m *model) ledger(t *testing.T, key string) (int, modelproxy.Manifest) {
	t.Helper()
	status, body := m.get(t, "/capture/rollouts/"+key+"/manifest")
	var man modelproxy.Manifest
	if status == http.StatusOK {
		if err := json.Unmarshal(body, &man); err != nil {
			t.Fatalf("manifest of %s: %v", key, err)
		}
	}
	return status, man
}

// rowIDs lists the call ids of a key's ledger, which must be readable.
func (m *model) rowIDs(t *testing.T, key string) []string {
	t.Helper()
	status, man := m.ledger(t, key)
	if status != http.StatusOK {
		t.Fatalf("manifest of %s: %d", key, status)
	}
	ids := []string{}
	for _, r := range man.Records {
		ids = append(ids, r.CallID)
	}
	return ids
}

func future(d time.Duration) float64 {
	return float64(time.Now().Add(d).UnixNano()) / 1e9
}

func ckReq(id string) map[string]any {
	return map[string]any{"checkpoint_id": id, "deadline_ts": future(30 * time.Second)}
}

func scopeOf(keys ...string) []rollout.EpisodeID {
	out := []rollout.EpisodeID{}
	for _, k := range keys {
		id, err := rollout.ParseCaptureKey(k)
		if err != nil {
			panic(err)
		}
		out = append(out, id)
	}
	return out
}

func commitReq(id, dir string, keys ...string) map[string]any {
	return map[string]any{"checkpoint_id": id, "deadline_ts": future(30 * time.Second), "checkpoint_dir": dir, "episode_ids": scopeOf(keys...), "stop": false}
}

func restoreReq(id, dir string, keys ...string) map[string]any {
	return map[string]any{"checkpoint_id": id, "deadline_ts": future(30 * time.Second), "checkpoint_dir": dir, "episode_ids": scopeOf(keys...)}
}

// records reads the model records a commit wrote, by capture key.
func records(t *testing.T, dir, id string) map[string]*modelproxy.ModelRecord {
	t.Helper()
	_, recs, _, err := ctlplanetest.Store(t, dir).Read(context.Background(),
		ckptstore.Target{Dir: dir, Kind: ctlplane.KindModel, Instance: modelproxy.DefaultName, CheckpointID: id}, nil)
	if err != nil {
		t.Fatalf("reading checkpoint %s: %v", id, err)
	}
	out := map[string]*modelproxy.ModelRecord{}
	for _, r := range recs {
		m, err := modelproxy.DecodeModelRecord(r.Data)
		if err != nil {
			t.Fatalf("record of %s: %v", r.EpisodeID, err)
		}
		out[r.EpisodeID.CaptureKey()] = m
	}
	return out
}

// waitFor polls cond until it holds or 15 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// notYet asserts a call has not been answered.
func notYet(t *testing.T, what string, ch <-chan result) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s answered while it should be held: %d %s %v", what, r.status, r.body, r.err)
	default:
	}
}

// await reads a call's outcome.
func await(t *testing.T, what string, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(60 * time.Second):
		t.Fatalf("%s never answered", what)
		return result{}
	}
}

// chatRequest is a one-turn chat whose answer the worker scripts: final is
// the reply text (its length sets how long the generation takes).
func chatRequest(user, final string) string {
	script, _ := json.Marshal(map[string]any{"final_text": final})
	b, _ := json.Marshal(map[string]any{
		"model":    "m",
		"messages": []map[string]any{{"role": "user", "content": user}},
		"metadata": map[string]string{"fake_script": string(script)},
	})
	return string(b)
}

// words is a reply text of n words.
func words(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "word%d", i)
	}
	return b.String()
}

// message is choices[0].message of a chat reply.
type message struct {
	Content            string    `json:"content"`
	PromptTokenIDs     []int     `json:"prompt_token_ids"`
	GenerationTokenIDs []int     `json:"generation_token_ids"`
	GenerationLogProbs []float64 `json:"generation_log_probs"`
}

func replyMessage(t *testing.T, body []byte) (message, string) {
	t.Helper()
	var c struct {
		Choices []struct {
			Message      message `json:"message"`
			FinishReason string  `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &c); err != nil || len(c.Choices) != 1 {
		t.Fatalf("not a chat completion: %s (%v)", body, err)
	}
	return c.Choices[0].Message, c.Choices[0].FinishReason
}

// errorCode reads an error envelope's code.
func errorCode(body []byte) string {
	if e := apierror.Parse(http.StatusConflict, body); e != nil {
		return string(e.Code)
	}
	return ""
}

// sseEvents reads SSE data lines from a body.
func sseData(body []byte) []string {
	var out []string
	for _, line := range bytes.Split(body, []byte("\n")) {
		if d, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
			out = append(out, string(d))
		}
	}
	return out
}

// streamCall opens a streaming call and returns the response, whose body
// the caller reads and closes.
func (m *model) streamCall(t *testing.T, key, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, m.url+"/ng-rollout/"+key+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := m.data.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("stream of %s: %d %s", key, resp.StatusCode, b)
	}
	return resp
}

// writeCheckpoint writes a model checkpoint by hand: one record per capture
// key, in key order.
func writeCheckpoint(t *testing.T, dir, id string, recs map[string][]byte) {
	t.Helper()
	keys := make([]string, 0, len(recs))
	for k := range recs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	target := ckptstore.Target{Dir: dir, Kind: ctlplane.KindModel, Instance: modelproxy.DefaultName, CheckpointID: id}
	_, err := ctlplanetest.Store(t, dir).Write(context.Background(), target, &ckptstore.WriteStop{}, func(add func(ckptstore.Record) error) (map[string]any, error) {
		for _, k := range keys {
			if err := add(ckptstore.Record{EpisodeID: scopeOf(k)[0], Data: recs[k]}); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})
	if err != nil {
		t.Fatalf("writing checkpoint %s: %v", id, err)
	}
}
