package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/servers/agent"
	"github.com/gymfleet/gymfleet/pkg/servers/resources"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// benchAgent is an agent at scale, as a commit finds it when every rollout
// is held at its second model call: one session per episode whose first
// activation ran one get_weather round and is waiting for the model's
// second reply (at a before-model-call boundary), with admission closed.
type benchAgent struct {
	srv   *agent.Server
	p     ctlplane.Participant
	stop  context.CancelFunc
	wg    sync.WaitGroup
	model *heldSecondCall
	// release closes the agent (once) and lets it be collected.
	release func()
}

const benchWeatherTool = `{"type":"function","name":"get_weather","description":"Get the current weather of a city.","strict":true,"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false}}`

// benchParams are the responses_create_params of weather rollout i.
func benchParams(i int) string {
	return fmt.Sprintf(`{"instructions":"You are a weather assistant. Use the get_weather tool, then answer in one short sentence.","input":[{"role":"user","content":"What is the weather in City-%d today?"}],"tools":[%s],"max_output_tokens":256}`, i, benchWeatherTool)
}

// heldSecondCall stands in for the model server: a first call answers a
// get_weather call with the token fields the model server adds (56 prompt
// ids, 20 generated ids and log-probs); a second call is held until its
// request ends.
type heldSecondCall struct {
	want    int64
	held    atomic.Int64
	allHeld chan struct{}
}

func (m *heldSecondCall) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if strings.Contains(string(body), `"function_call_output"`) {
		if m.held.Add(1) == m.want {
			close(m.allHeld)
		}
		<-r.Context().Done()
		http.Error(w, "the benchmark ended", http.StatusServiceUnavailable)
		return
	}
	key, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/ng-rollout/"), "/")
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, firstModelReply(key))
}

// firstModelReply is the model server's reply to a rollout's first call.
func firstModelReply(key string) string {
	var prompt, gen, logprobs []string
	for i := range 56 {
		prompt = append(prompt, strconv.Itoa(1+(i*7919)%32000))
	}
	for i := range 20 {
		gen = append(gen, strconv.Itoa(1+(i*104729)%32000))
		logprobs = append(logprobs, strconv.FormatFloat(-float64((i*37)%500)/100-0.0123, 'f', 4, 64))
	}
	n, _ := strconv.Atoi(strings.TrimPrefix(key, "rollout-"))
	city := "City-" + strconv.Itoa(n)
	return `{"id":"resp_` + key + `","object":"response","created_at":1767225600,"model":"policy","output":[` +
		`{"type":"function_call","id":"fc_` + key + `","call_id":"call_` + key + `","name":"get_weather","arguments":"{\"city\":\"` + city + `\"}","status":"completed",` +
		`"prompt_token_ids":[` + strings.Join(prompt, ",") + `],"generation_token_ids":[` + strings.Join(gen, ",") + `],"generation_log_probs":[` + strings.Join(logprobs, ",") + `]}],` +
		`"parallel_tool_calls":true,"tool_choice":"auto","tools":[` + benchWeatherTool + `],"temperature":1.0,"top_p":1.0,"status":"completed","incomplete_details":null,` +
		`"usage":{"input_tokens":56,"input_tokens_details":{"cached_tokens":0},"output_tokens":20,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":76},"error":null,"instructions":null,"metadata":{},"max_output_tokens":256}`
}

// route sends the agent's model calls to the stand-in and its tool calls to
// the weather server.
type route struct{ model, tools http.Handler }

func (rt route) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasSuffix(r.URL.Path, "/v1/responses") {
		rt.model.ServeHTTP(w, r)
		return
	}
	rt.tools.ServeHTTP(w, r)
}

// newBenchAgent builds an agent with checkpointing on; given episodes, it
// plays the scale scenario (see benchAgent), else it is a fresh process
// for a restore.
//
// The first rollout runs for real: its session is opened and its
// activation runs through the agent's router, calling a stand-in model
// (which holds the second call) and a real weather server in process. Its
// loop state, with the rollout's name replaced, is every other rollout's:
// those sessions are opened with agent.StartHeldActivation, since 100,000
// activations held on handler goroutines would dominate the setup.
func newBenchAgent(b *testing.B, ids []rollout.EpisodeID) *benchAgent {
	b.Helper()
	weather, err := resources.New(resources.DefaultConfig(), resources.Deps{})
	if err != nil {
		b.Fatal(err)
	}
	model := &heldSecondCall{want: 1, allHeld: make(chan struct{})}
	cfg := agent.DefaultConfig()
	cfg.ModelServerURL, cfg.ResourcesServerURL = "http://model.invalid", "http://weather.invalid"
	cfg.Checkpoint = ctlplanetest.Config()
	srv, err := agent.New(cfg, agent.Deps{Client: ctlplanetest.HandlerClient(route{model: model, tools: weather.Handler()})})
	if err != nil {
		b.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	a := &benchAgent{srv: srv, p: agent.CheckpointParticipant(srv), stop: stop, model: model}
	a.release = ctlplanetest.BenchOwn(b, func() {
		a.close()
		_ = weather.Close(context.Background())
	})
	if len(ids) == 0 {
		return a
	}
	sessionID := func(i int) string { return fmt.Sprintf("agent-session-%032x", i) }
	resourcesSessionID := func(i int) string { return fmt.Sprintf("resources-session-%032x", i) }
	row := func(i int) string {
		return fmt.Sprintf(`{"responses_create_params":%s,"agent_ref":{"name":"simple_agent"},"_ng_rollout_id":%q}`, benchParams(i), ids[i].RolloutID)
	}

	h := srv.Handler()
	open := fmt.Sprintf(`{"session_id":%q,"resources_session_id":%q,"request":%s}`, sessionID(0), resourcesSessionID(0), row(0))
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, rollout.Path(ids[0], "/v1/agent_sessions"), strings.NewReader(open))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		b.Fatalf("open %s: %d %s", ids[0], w.Code, w.Body)
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, rollout.Path(ids[0], "/v1/responses"), strings.NewReader(benchParams(0)))
		r.Header.Set(agent.SessionHeader, sessionID(0))
		r.Header.Set(agent.ActivationHeader, "1")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}()
	<-model.allHeld
	st, ok := agent.LoopStateAt(srv, sessionID(0))
	if !ok || st.ModelCalls != 1 || len(st.NewOutputs) != 2 || len(st.ToolRecords) != 1 {
		b.Fatalf("the first rollout is not at its second model call after one tool round: %+v", st)
	}
	template, err := json.Marshal(st)
	if err != nil {
		b.Fatal(err)
	}
	for i := 1; i < len(ids); i++ {
		var st agent.LoopState
		if err := json.Unmarshal([]byte(strings.ReplaceAll(string(template), ids[0].RolloutID, ids[i].RolloutID)), &st); err != nil {
			b.Fatal(err)
		}
		if err := agent.StartHeldActivation(ctx, srv, ids[i], sessionID(i), resourcesSessionID(i), []byte(row(i)), &st); err != nil {
			b.Fatal(err)
		}
	}
	if err := a.p.CloseAdmission(ctx); err != nil {
		b.Fatal(err)
	}
	if !a.p.Ready() {
		b.Fatalf("not ready with every session at a boundary: %+v", a.p.Report(3))
	}
	return a
}

// close ends the held activations and closes the agent.
func (a *benchAgent) close() {
	a.stop()
	a.wg.Wait()
	_ = a.srv.Close(context.Background())
}

// BenchmarkExport measures the agent's export: one session record per
// episode with its loop state, written through the checkpoint store.
func BenchmarkExport(b *testing.B) {
	for _, size := range ctlplanetest.BenchSizes() {
		b.Run(size.Name, func(b *testing.B) {
			ids := ctlplanetest.EpisodeIDs(size.Episodes)
			a := newBenchAgent(b, ids)
			ctlplanetest.BenchExport(b, a.p.Kind(), a.p.Instance(), ctlplane.NewScope(ids), size.Episodes, a.p.Export)
		})
	}
}

// BenchmarkInstall measures the agent's restore: read the records back and
// install every session, with the loop state its activation continues
// from, in a fresh agent.
func BenchmarkInstall(b *testing.B) {
	for _, size := range ctlplanetest.BenchSizes() {
		b.Run(size.Name, func(b *testing.B) {
			ids := ctlplanetest.EpisodeIDs(size.Episodes)
			scope := ctlplane.NewScope(ids)
			src := newBenchAgent(b, ids)
			target := ctlplanetest.BenchTarget(b, src.p.Kind(), src.p.Instance())
			if _, err := ctlplanetest.WriteCheckpoint(context.Background(), target, scope, src.p.Export); err != nil {
				b.Fatal(err)
			}
			// A restore runs in a fresh process: nothing of the source stays.
			src.release()
			ctlplanetest.BenchInstall(b, target, scope, size.Episodes, func() (ctlplanetest.InstallFunc, func()) {
				a := newBenchAgent(b, nil)
				if err := a.p.CloseAdmission(context.Background()); err != nil {
					b.Fatal(err)
				}
				return a.p.Install, a.release
			})
		})
	}
}
