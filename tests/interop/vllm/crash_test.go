package vllm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/coordination"
	"github.com/gymfleet/gymfleet/pkg/ops/fleet"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Item 3 of issue 45: our five servers as processes with the real vLLM as
// their only backend (behind the cut sidecar), checkpointed in flight, every
// fleet process SIGKILLed while vLLM runs on, restored into fresh processes.

// vfleet is one test's fleet of real processes around the suite's vLLM.
type vfleet struct {
	t       *testing.T
	cfg     *fleet.Config
	L       *fleet.Launcher
	envURL  string
	model   string
	ctl     *http.Client
	ckptDir string
}

// startFleet generates the standard topology with agents of maxSteps steps,
// points the model server at the sidecar and leaves the stand-in out.
func startFleet(t *testing.T, maxSteps int) *vfleet {
	t.Helper()
	dir := t.TempDir()
	topo := fleet.Standard(dir, env.bin, token)
	topo.Ports = env.ports
	for i := range topo.Agents {
		topo.Agents[i].MaxSteps = maxSteps
	}
	cfg, err := fleet.Generate(topo)
	if err != nil {
		t.Fatal(err)
	}
	msPath := filepath.Join(dir, "modelserver.yaml")
	b, err := os.ReadFile(msPath)
	if err != nil {
		t.Fatal(err)
	}
	var ms map[string]any
	if err := yaml.Unmarshal(b, &ms); err != nil {
		t.Fatal(err)
	}
	// vLLM is spoken to as a deployment speaks to it (README "Running for
	// real"), through the sidecar that serves the worker's cut routes.
	ms["upstream"] = map[string]any{"base_url": env.sidecar.url + "/v1", "model": ServedModel}
	if b, err = yaml.Marshal(ms); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(msPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	procs := cfg.Processes[:0]
	for _, p := range cfg.Processes {
		if p.Binary != "fakeinference" {
			procs = append(procs, p)
		}
	}
	cfg.Processes = procs
	f := &vfleet{
		t: t, cfg: cfg, L: fleet.NewLauncher(cfg, fleet.Options{StopGrace: 5 * time.Second}),
		ctl: httpclient.New(httpclient.Options{}), ckptDir: filepath.Join(dir, "checkpoints"),
	}
	f.envURL = cfg.Endpoints(fleet.KindEnvironment)[0].URL
	f.model = cfg.Endpoints(fleet.KindModel)[0].URL
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range cfg.Names() {
				t.Logf("--- log of %s ---\n%s", name, f.L.Logs(name))
			}
			t.Logf("--- log of the sidecar (tail) ---\n%s", env.sidecar.tail(80))
		}
		_ = f.L.KillAll()
	})
	f.startAll()
	return f
}

func (f *vfleet) startAll() {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, name := range f.cfg.Names() {
		if err := f.L.Start(ctx, name); err != nil {
			f.t.Fatal(err)
		}
	}
}

// crash SIGKILLs every fleet process; vLLM and the sidecar run on.
func (f *vfleet) crash() {
	f.t.Helper()
	for _, name := range f.cfg.Names() {
		if err := f.L.Kill(name); err != nil {
			f.t.Fatal(err)
		}
	}
	f.ctl.CloseIdleConnections()
	plainClient.CloseIdleConnections()
}

func (f *vfleet) coord() *coordination.Coordinator {
	f.t.Helper()
	var eps []coordination.Endpoint
	for _, p := range f.cfg.Processes {
		for _, e := range p.Endpoints {
			eps = append(eps, coordination.Endpoint{Name: e.Name, URL: e.URL})
		}
	}
	c, err := coordination.Discover(context.Background(), eps, coordination.Options{Token: token, Client: f.ctl})
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

func deadline(d time.Duration) time.Time { return time.Now().Add(d) }

func (f *vfleet) dir(id string) string { return filepath.Join(f.ckptDir, id) }

// checkpoint prepares (every stage prepared) and commits scope.
func (f *vfleet) checkpoint(c *coordination.Coordinator, id string, scope []rollout.EpisodeID) *coordination.CommitResult {
	f.t.Helper()
	ctx := context.Background()
	res, err := c.Prepare(ctx, id, deadline(2*time.Minute))
	if err != nil {
		f.t.Fatalf("prepare %s: %v", id, err)
	}
	if !res.Prepared {
		f.t.Fatalf("prepare %s not prepared; blockers %v", id, res.Blockers())
	}
	cm, err := c.Commit(ctx, id, f.dir(id), scope, deadline(time.Minute), false)
	if err != nil {
		f.t.Fatalf("commit %s: %v", id, err)
	}
	return cm
}

// run is one /run in flight.
type run struct {
	id   string
	row  map[string]any
	done chan runReply
	rep  *runReply
}

type runReply struct {
	status int
	body   map[string]any
	err    error
}

// start sends one /run once (a /run cut off by the crash is never resent
// as the same attempt).
func (f *vfleet) start(row map[string]any) *run {
	r := &run{id: row[rollout.FieldRolloutID].(string), row: row, done: make(chan runReply, 1)}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		st, b, err := post(ctx, f.envURL+"/run", nil, mustJSON(f.t, row))
		var body map[string]any
		_ = json.Unmarshal(b, &body)
		r.done <- runReply{status: st, body: body, err: err}
	}()
	return r
}

func (r *run) replied() bool {
	if r.rep != nil {
		return true
	}
	select {
	case rep := <-r.done:
		r.rep = &rep
		return true
	default:
		return false
	}
}

func (r *run) wait(t *testing.T, d time.Duration) runReply {
	t.Helper()
	if r.rep != nil {
		return *r.rep
	}
	select {
	case rep := <-r.done:
		r.rep = &rep
		return rep
	case <-time.After(d):
		t.Fatalf("/run of %s did not reply within %v", r.id, d)
		return runReply{}
	}
}

func withAttempt(row map[string]any, n int) map[string]any {
	out := make(map[string]any, len(row)+1)
	for k, v := range row {
		out[k] = v
	}
	out[rollout.FieldAttemptIndex] = n
	return out
}

// weatherRow is a weather rollout: every turn's call is forced to
// get_weather (random weights call no tool of their own accord), so the
// agent runs its max_steps turns.
func weatherRow(id string, seed int) map[string]any {
	return map[string]any{
		"responses_create_params": map[string]any{
			"input":               []any{map[string]any{"role": "user", "content": "what is the weather in paris"}},
			"tools":               []any{weatherToolResponses},
			"tool_choice":         map[string]any{"type": "function", "name": "get_weather"},
			"parallel_tool_calls": false,
			"max_output_tokens":   200,
			"temperature":         1.0,
			"metadata":            map[string]any{"extra_body": fmt.Sprintf(`{"seed": %d}`, seed)},
		},
		"city":                 "paris",
		rollout.FieldRolloutID: id,
		rollout.FieldAgentRef:  map[string]any{"type": "responses_api_agents", "name": "weather_agent"},
	}
}

// ledgerRows reads a capture key's ledger from the fleet's model server
// (nil when it has none).
func (f *vfleet) ledgerRows(key string) []map[string]any {
	f.t.Helper()
	st, m := manifest(f.t, f.model, key)
	if st == http.StatusNotFound {
		return nil
	}
	if st != http.StatusOK {
		f.t.Fatalf("the ledger of %s answered %d", key, st)
	}
	recs, _ := m["records"].([]any)
	out := make([]map[string]any, len(recs))
	for i, r := range recs {
		out[i], _ = r.(map[string]any)
	}
	return out
}

func ep(id string, attempt int) rollout.EpisodeID {
	return rollout.EpisodeID{RolloutID: id, Attempt: attempt}
}

// TestCrashSuite: weather rollouts, more at once than vLLM runs
// (--max-num-seqs 4 queues the rest), checkpointed in flight, every fleet
// process SIGKILLed, restored into fresh processes and continued.
//
// Oracles: every rollout finishes exactly once; every model call delivered
// before the crash (its ledger row at the commit) appears unchanged in the
// final ledger and the final trajectory; and vLLM's own counter of
// finished requests (vllm:request_success_total, every finished_reason)
// proves no delivered call was generated again:
//
//	N_pre  = requests vLLM finished from the start until it is idle after
//	         the crash (vLLM counts a request aborted because its client
//	         went away, as the crash does, under no finished_reason)
//	D_pre  = calls delivered before the crash (ledger rows read at the
//	         commit, over every rollout)
//	U      = N_pre - D_pre >= 0: generated but never delivered (held at
//	         the checkpoint, or cut off by the crash)
//	N_post = requests vLLM finished after the restore
//	New    = rows of the final ledgers that were not delivered before the
//	         crash (continued: final rows - rows at the commit; restarted:
//	         all final rows)
//	N_post == New: every request vLLM served after the restore is a call
//	         not delivered before, so none was generated again.
func TestCrashSuite(t *testing.T) {
	need(t)
	const rollouts, steps = 16, 3
	f := startFleet(t, steps)
	m0 := waitIdle(t)
	runs := make([]*run, rollouts)
	for i := range runs {
		runs[i] = f.start(weatherRow(fmt.Sprintf("w%02d", i), 100+i))
	}
	// Checkpoint once vLLM has finished about half the calls the rollouts
	// make and is busy with more, so rollouts are at every turn.
	waitFor(t, "vLLM busy with the rollouts", 3*time.Minute, func() bool {
		m := readMetrics(t)
		return m.finished()-m0.finished() >= rollouts*steps/2 && m["vllm:num_requests_running"] > 0
	})
	c := f.coord()
	var scope []rollout.EpisodeID
	for _, r := range runs {
		if !r.replied() {
			scope = append(scope, ep(r.id, 0))
		}
	}
	cm := f.checkpoint(c, "c1", scope)
	continued := map[string]bool{}
	for _, k := range cm.ExportedBy("env") {
		continued[k] = true
	}
	if len(continued) == 0 {
		t.Fatal("no rollout was continued: the checkpoint came too late to test anything")
	}
	// What was delivered before the crash: every ledger at the commit
	// (admission is closed until resume, so nothing more is delivered).
	delivered := map[string][]map[string]any{}
	dPre := 0
	for _, r := range runs {
		rows := f.ledgerRows(r.id)
		delivered[r.id] = rows
		dPre += len(rows)
	}
	f.crash()
	m1 := waitIdle(t)

	finished := map[string]int{}
	var contIDs, restarts []rollout.EpisodeID
	for _, r := range runs {
		rep := r.wait(t, time.Minute)
		switch {
		case rep.err == nil && rep.status == http.StatusOK:
			if continued[r.id] {
				t.Fatalf("%s replied and was exported: it would be written twice", r.id)
			}
			finished[r.id]++
		case continued[r.id]:
			contIDs = append(contIDs, ep(r.id, 0))
		default:
			restarts = append(restarts, ep(r.id, 0))
		}
	}
	f.startAll()
	c = f.coord()
	if _, err := c.Restore(context.Background(), "c1", f.dir("c1"), contIDs, deadline(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := c.Resume(context.Background(), "c1", deadline(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if len(restarts) > 0 {
		if err := c.Retire(context.Background(), "", restarts, deadline(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	var second []*run
	for _, r := range runs {
		if finished[r.id] == 0 {
			second = append(second, f.start(withAttempt(r.row, 1)))
		}
	}
	final := map[string]map[string]any{}
	for _, r := range second {
		rep := r.wait(t, 5*time.Minute)
		if rep.err != nil || rep.status != http.StatusOK {
			t.Fatalf("/run of %s attempt 1: %d %v %v", r.id, rep.status, rep.err, rep.body)
		}
		finished[r.id]++
		final[r.id] = rep.body
	}
	for _, r := range runs {
		if finished[r.id] != 1 {
			t.Fatalf("%s finished %d times, want exactly once", r.id, finished[r.id])
		}
	}
	m2 := waitIdle(t)

	newRows := 0
	for _, id := range append(append([]rollout.EpisodeID{}, contIDs...), restarts...) {
		rows := f.ledgerRows(id.Next().CaptureKey())
		// A rollout ends at max_steps, or earlier when a reply is cut
		// short by max_output_tokens (the agent stops on an incomplete
		// response): its trajectory holds exactly its ledger's calls.
		if n := trainableItems(final[id.RolloutID]); len(rows) == 0 || len(rows) > steps || n != len(rows) {
			t.Fatalf("%s: %d ledger rows and %d trainable items in the trajectory, want the same 1 to %d", id.Next(), len(rows), n, steps)
		}
		for k := 1; k < len(rows); k++ {
			if rows[k]["parent_call_id"] != rows[k-1]["call_id"] {
				t.Fatalf("%s: broken lineage at row %d", id.Next(), k)
			}
		}
		kept := 0
		if continued[id.RolloutID] {
			kept = len(delivered[id.RolloutID])
			for k, d := range delivered[id.RolloutID] {
				for _, field := range []string{"call_id", "prompt_token_ids", "generation_token_ids", "generation_log_probs", "request_digest"} {
					if !jsonEqual(rows[k][field], d[field]) {
						t.Fatalf("%s: delivered call %d changed its %s across the crash", id.RolloutID, k, field)
					}
				}
			}
			checkTrajectory(t, id.RolloutID, final[id.RolloutID], delivered[id.RolloutID])
		}
		newRows += len(rows) - kept
		checkContiguous(t, id.RolloutID, final[id.RolloutID])
	}
	nPre, nPost := m1.finished()-m0.finished(), m2.finished()-m1.finished()
	u := nPre - dPre
	counts := map[string]any{
		"rollouts": rollouts, "steps": steps, "in_scope": len(scope), "continued": len(contIDs), "restarted": len(restarts),
		"finished_before_checkpoint": rollouts - len(second),
		"N_pre":                      nPre, "D_pre": dPre, "U": u, "N_post": nPost, "New": newRows,
		"request_success_total": map[string]float64{"m0": m0["vllm:request_success_total"], "m1": m1["vllm:request_success_total"], "m2": m2["vllm:request_success_total"]},
	}
	env.record("crash_suite", counts)
	t.Logf("vLLM counts: %v", counts)
	if u < 0 {
		t.Fatalf("vLLM finished %d requests before the crash but %d calls were delivered: the ledger holds calls vLLM never served", nPre, dPre)
	}
	if nPost != newRows {
		t.Fatalf("vLLM finished %d requests after the restore, but the final ledgers have %d calls not delivered before the crash: a delivered call was generated again (or one went uncaptured)", nPost, newRows)
	}
}

// checkContiguous is NeMo RL's contiguity assert over a final trajectory:
// each turn's prompt_token_ids start with the previous turn's prompt and
// generation (across the crash too: the restored turns' ids are spliced in
// for the history the replacement renders).
func checkContiguous(t *testing.T, id string, reply map[string]any) {
	t.Helper()
	items, _ := path(reply, "response", "output").([]any)
	var seen []int
	for i, it := range items {
		gen := ints(path(it, "generation_token_ids"))
		if len(gen) == 0 {
			continue
		}
		prompt := ints(path(it, "prompt_token_ids"))
		if len(prompt) < len(seen) || !equalInts(prompt[:len(seen)], seen) {
			t.Fatalf("%s: output[%d]'s prompt_token_ids do not start with the %d tokens of the turns before: NeMo RL would reject the trajectory", id, i, len(seen))
		}
		seen = append(prompt, gen...)
	}
}

// trainableItems counts a /run reply's output items with token ids.
func trainableItems(reply map[string]any) int {
	n := 0
	items, _ := path(reply, "response", "output").([]any)
	for _, it := range items {
		if len(ints(path(it, "generation_token_ids"))) > 0 {
			n++
		}
	}
	return n
}

// checkTrajectory: the calls delivered before the crash are the first
// trainable items of the rollout's final trajectory, token for token.
func checkTrajectory(t *testing.T, id string, reply map[string]any, delivered []map[string]any) {
	t.Helper()
	items, _ := path(reply, "response", "output").([]any)
	var trainable []any
	for _, it := range items {
		if len(ints(path(it, "generation_token_ids"))) > 0 {
			trainable = append(trainable, it)
		}
	}
	if len(trainable) < len(delivered) {
		t.Fatalf("%s: the final trajectory has %d trainable items, fewer than the %d calls delivered before the crash", id, len(trainable), len(delivered))
	}
	for k, d := range delivered {
		it := trainable[k]
		if !equalInts(ints(path(it, "prompt_token_ids")), ints(d["prompt_token_ids"])) || !equalInts(ints(path(it, "generation_token_ids")), ints(d["generation_token_ids"])) {
			t.Fatalf("%s: delivered call %d is not unchanged in the final trajectory", id, k)
		}
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// TestGenerationCut: a generation cut on the real vLLM worker. One rollout
// whose single call is long (ignore_eos, many tokens) is checkpointed while
// vLLM generates it: the model server asks the sidecar for a cut, the
// sidecar aborts the request in vLLM and stages the tokens so far; after
// the crash and restore, the re-issued call continues from prompt + prefix.
// The final call's token ids are the staged prefix followed by the
// continuation, contiguous, and vLLM's counters show the continuation
// generated only the rest: its prompt was the prompt plus the prefix.
func TestGenerationCut(t *testing.T) {
	need(t)
	const maxTokens = 700
	f := startFleet(t, 2)
	row := map[string]any{
		"responses_create_params": map[string]any{
			"input":             []any{map[string]any{"role": "user", "content": "say something about numbers and letters"}},
			"max_output_tokens": maxTokens,
			"temperature":       1.0,
			"metadata":          map[string]any{"extra_body": `{"seed": 45, "ignore_eos": true}`},
		},
		"city":                 "paris",
		rollout.FieldRolloutID: "cut-1",
		rollout.FieldAgentRef:  map[string]any{"type": "responses_api_agents", "name": "weather_agent"},
	}
	m0 := waitIdle(t)
	first := f.start(row)
	waitFor(t, "vLLM generating the call", 2*time.Minute, func() bool {
		m := readMetrics(t)
		return m["vllm:num_requests_running"] == 1 && m["vllm:generation_tokens_total"]-m0["vllm:generation_tokens_total"] >= 20
	})
	c := f.coord()
	f.checkpoint(c, "c1", []rollout.EpisodeID{ep("cut-1", 0)})
	if first.replied() {
		t.Fatalf("the rollout replied during the checkpoint: %v", first.rep)
	}
	f.crash()
	m1 := waitIdle(t)
	// vLLM counts an aborted request in no finished_reason: the cut call
	// shows only as the tokens it generated.
	if got := m1.finished() - m0.finished(); got != 0 {
		t.Fatalf("vLLM finished %d requests before the restore, want 0: the cut call was not aborted", got)
	}
	f.startAll()
	c = f.coord()
	if _, err := c.Restore(context.Background(), "c1", f.dir("c1"), []rollout.EpisodeID{ep("cut-1", 0)}, deadline(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := c.Resume(context.Background(), "c1", deadline(time.Minute)); err != nil {
		t.Fatal(err)
	}
	rep := f.start(withAttempt(row, 1)).wait(t, 5*time.Minute)
	if rep.err != nil || rep.status != http.StatusOK {
		t.Fatalf("/run attempt 1: %d %v %v", rep.status, rep.err, rep.body)
	}
	m2 := waitIdle(t)

	rows := f.ledgerRows("cut-1-a1")
	if len(rows) != 1 {
		t.Fatalf("%d ledger rows for the continued attempt, want 1", len(rows))
	}
	key, _ := rows[0]["continued_from"].(string)
	if key == "" {
		t.Fatalf("the continued call names no staging key: %v", rows[0])
	}
	var st struct {
		PromptIDs []int `json:"prompt_token_ids"`
		TokenIDs  []int `json:"token_ids"`
	}
	if code, err := getJSON(ctxFor(t, 30*time.Second), env.sidecar.url+"/_vllmcut/staged/"+key, &st); err != nil || code != http.StatusOK {
		t.Fatalf("the sidecar's token store has no %s: %d %v", key, code, err)
	}
	gen, prompt := ints(rows[0]["generation_token_ids"]), ints(rows[0]["prompt_token_ids"])
	n := len(st.TokenIDs)
	if n == 0 || n >= maxTokens {
		t.Fatalf("the staged prefix has %d tokens: the cut did not land mid-way", n)
	}
	if len(gen) != maxTokens || !equalInts(gen[:n], st.TokenIDs) || !equalInts(prompt, st.PromptIDs) {
		t.Fatalf("the captured call is not the staged prefix (%d tokens) followed by the continuation: %d tokens, prefix equal %v, prompt equal %v",
			n, len(gen), len(gen) >= n && equalInts(gen[:n], st.TokenIDs), equalInts(prompt, st.PromptIDs))
	}
	if lp, _ := rows[0]["generation_log_probs"].([]any); len(lp) != maxTokens {
		t.Fatalf("%d log-probs for %d tokens", len(lp), maxTokens)
	}
	items, _ := path(rep.body, "response", "output").([]any)
	var out []int
	for _, it := range items {
		out = append(out, ints(path(it, "generation_token_ids"))...)
	}
	if !equalInts(out, gen) {
		t.Fatalf("the trajectory's generation_token_ids differ from the ledger's")
	}
	dPrompt := m2["vllm:prompt_tokens_total"] - m1["vllm:prompt_tokens_total"]
	dGen := m2["vllm:generation_tokens_total"] - m1["vllm:generation_tokens_total"]
	dReq := m2.finished() - m1.finished()
	if got := m1["vllm:generation_tokens_total"] - m0["vllm:generation_tokens_total"]; int(got) < n {
		t.Fatalf("vLLM generated %v tokens before the cut, fewer than the %d staged", got, n)
	}
	counts := map[string]any{"prefix_tokens": n, "prompt_tokens": len(prompt), "continuation_requests": dReq,
		"continuation_prompt_tokens": dPrompt, "continuation_generated_tokens": dGen}
	env.record("generation_cut", counts)
	t.Logf("cut: %v", counts)
	if dReq != 1 || int(dPrompt) != len(prompt)+n || int(dGen) != maxTokens-n {
		t.Fatalf("vLLM after the restore: %d requests, %v prompt and %v generated tokens; want 1, %d (prompt + prefix) and %d (the rest)",
			dReq, dPrompt, dGen, len(prompt)+n, maxTokens-n)
	}
}

// TestUpstreamCutRoute: the sidecar answers NeMo Gym's generation-cut
// inventory with upstream's receipt (GenerationCutReceipt.validate_for:
// the inventory echoed, every call answered once with its identity, a
// durable_prefix with its evidence).
func TestUpstreamCutRoute(t *testing.T) {
	need(t)
	h := http.Header{"X-Ng-Model-Call-Id": {"upcall-1"}, "X-Ng-Capture-Key": {"up-1-a2"}}
	body := chatBody("count numbers", map[string]any{"max_tokens": 600, "ignore_eos": true, "return_token_ids": true})
	type result struct {
		status int
		body   []byte
		err    error
	}
	done := make(chan result, 1)
	m0 := waitIdle(t)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		st, b, err := post(ctxFor(t, 2*time.Minute), env.sidecar.url+"/v1/chat/completions", h, mustJSON(t, body))
		done <- result{st, b, err}
	}()
	defer wg.Wait()
	waitFor(t, "vLLM generating", time.Minute, func() bool {
		m := readMetrics(t)
		return m["vllm:num_requests_running"] >= 1 && m["vllm:generation_tokens_total"]-m0["vllm:generation_tokens_total"] >= 10
	})
	inv := map[string]any{
		"checkpoint_id": "ck-up", "server_name": "policy_model",
		"active_prefixes": []any{
			map[string]any{"ticket_id": "t1", "rollout_id": "up-1", "attempt": 2, "model_call_id": "upcall-1", "admitted_at": 1.5},
			map[string]any{"ticket_id": "t2", "rollout_id": "up-2", "attempt": 0, "model_call_id": "nobody", "admitted_at": 2.5},
		},
		"inventory_digest": "0000000000000000000000000000000000000000000000000000000000000000",
	}
	rb, err := postJSON(ctxFor(t, time.Minute), env.sidecar.url+"/ng-control/v1/generation-cut", http.Header{"Authorization": {"Bearer " + token}}, mustJSON(t, inv))
	if err != nil {
		t.Fatal(err)
	}
	var rc map[string]any
	if err := json.Unmarshal(rb, &rc); err != nil {
		t.Fatal(err)
	}
	if !jsonEqual(rc["inventory"], inv) || rc["inventory_digest"] != inv["inventory_digest"] || rc["checkpoint_id"] != "ck-up" || rc["backend_snapshot_id"] == "" {
		t.Fatalf("the receipt does not echo the inventory: %s", rb)
	}
	acks, _ := rc["prefixes"].([]any)
	if len(acks) != 2 {
		t.Fatalf("%d acks for 2 calls: %s", len(acks), rb)
	}
	a, b := acks[0].(map[string]any), acks[1].(map[string]any)
	if a["ticket_id"] != "t1" || a["rollout_id"] != "up-1" || a["attempt"] != 2.0 || a["model_call_id"] != "upcall-1" || a["admitted_at"] != 1.5 {
		t.Fatalf("ack 0 does not carry its call's identity: %v", a)
	}
	if a["disposition"] != "durable_prefix" || a["cut_kind"] != "active_prefix" || a["frozen_buffer_id"] == nil ||
		len(a["staging_keys"].([]any)) != 1 || a["prefix_token_count"].(float64) < 1 || a["effective_output_limit"] != 600.0 {
		t.Fatalf("ack 0 is not a durable_prefix with its evidence: %v\n--- sidecar log (tail) ---\n%s", a, env.sidecar.tail(20))
	}
	if b["disposition"] != "durable_failure" || b["prefix_digest"] != nil || len(b["staging_keys"].([]any)) != 0 {
		t.Fatalf("ack 1 (an unknown call) is not a bare durable_failure: %v", b)
	}
	r := <-done
	if r.err != nil || r.status != http.StatusOK || path(mustMap(t, r.body), "choices", 0, "finish_reason") != "abort" {
		t.Fatalf("the cut call's reply: %d %v %.300s", r.status, r.err, r.body)
	}
}

func mustMap(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestCutSplicedCall: a call whose history carries its last turn's token
// ids goes through vLLM's render, generate and derender routes (the
// splice); a cut aborts it there too, and its continuation renders and
// splices the same prompt again before continuing the prefix.
func TestCutSplicedCall(t *testing.T) {
	need(t)
	first := direct(t, chatBody("say something", map[string]any{"max_tokens": 8}))
	history := []any{
		map[string]any{"role": "user", "content": "say something"},
		map[string]any{"role": "assistant", "content": path(first, "choices", 0, "message", "content"),
			"prompt_token_ids": first["prompt_token_ids"], "generation_token_ids": path(first, "choices", 0, "token_ids"),
			"generation_log_probs": make([]float64, len(ints(path(first, "choices", 0, "token_ids"))))},
		map[string]any{"role": "user", "content": "and more"},
	}
	body := map[string]any{"model": ServedModel, "messages": history, "max_tokens": 600, "ignore_eos": true, "return_token_ids": true, "seed": 5}
	h := http.Header{"X-Ng-Model-Call-Id": {"splice-call-1"}, "X-Ng-Capture-Key": {"splice-1"}}
	type result struct {
		status int
		header http.Header
		body   []byte
		err    error
	}
	done := make(chan result, 1)
	m0 := waitIdle(t)
	go func() {
		req, _ := http.NewRequestWithContext(ctxFor(t, 2*time.Minute), http.MethodPost, env.sidecar.url+"/v1/chat/completions", bytesReader(mustJSON(t, body)))
		req.Header = h.Clone()
		req.Header.Set("Content-Type", "application/json")
		resp, err := plainClient.Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		done <- result{resp.StatusCode, resp.Header, b, err}
	}()
	waitFor(t, "vLLM generating", time.Minute, func() bool {
		m := readMetrics(t)
		return m["vllm:num_requests_running"] >= 1 && m["vllm:generation_tokens_total"]-m0["vllm:generation_tokens_total"] >= 10
	})
	rb, err := postJSON(ctxFor(t, time.Minute), env.sidecar.url+"/_ckpt/generation-cut", http.Header{"Authorization": {"Bearer " + token}},
		[]byte(`{"checkpoint_id":"ck-splice","server_name":"policy_model","active":[{"model_call_id":"splice-call-1","capture_key":"splice-1"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rb), `"durable_prefix"`) {
		t.Fatalf("the spliced call was not cut: %s", rb)
	}
	r := <-done
	if r.err != nil || r.status != http.StatusOK || r.header.Get("X-Ng-Generation-Cut") == "" {
		t.Fatalf("the cut call's reply: %d %v %.300s", r.status, r.err, r.body)
	}
	cut := mustMap(t, r.body)
	prompt, prefix := ints(cut["prompt_token_ids"]), ints(path(cut, "choices", 0, "token_ids"))
	seen := append(ints(first["prompt_token_ids"]), ints(path(first, "choices", 0, "token_ids"))...)
	if len(prompt) < len(seen) || !equalInts(prompt[:len(seen)], seen) {
		t.Fatalf("the spliced prompt does not start with the last turn's ids")
	}
	h.Set("X-Ng-Continue-Cut", r.header.Get("X-Ng-Generation-Cut"))
	h.Set("X-Ng-Model-Call-Id", "splice-call-2")
	st, b, err := post(ctxFor(t, 2*time.Minute), env.sidecar.url+"/v1/chat/completions", h, mustJSON(t, body))
	if err != nil || st != http.StatusOK {
		t.Fatalf("continuation: %d %v %.300s", st, err, b)
	}
	cont := mustMap(t, b)
	ids := ints(path(cont, "choices", 0, "token_ids"))
	if len(ids) != 600 || !equalInts(ids[:len(prefix)], prefix) || !equalInts(ints(cont["prompt_token_ids"]), prompt) {
		t.Fatalf("the continuation is not the spliced prompt's prefix (%d) and the rest: %d tokens", len(prefix), len(ids))
	}
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
