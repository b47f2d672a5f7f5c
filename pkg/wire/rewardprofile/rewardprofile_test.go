package rewardprofile_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rewardprofile"
)

func compute(t *testing.T, body string) map[string]any {
	t.Helper()
	vrs, err := rewardprofile.DecodeRequest([]byte(body))
	if err != nil {
		t.Fatalf("DecodeRequest: %v", err)
	}
	out, err := rewardprofile.Compute(vrs)
	if err != nil {
		t.Fatalf("Compute: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("reply %s: %v", out, err)
	}
	return m
}

// The results of test_profile_from_data (tests/unit_tests/test_reward_profile.py
// at NeMo Gym 07d6b0d07b22), sent as verify replies: three tasks of two
// rollouts, an int reward, a bool and a usage count.
const gymProfileCase = `{"verify_responses":[
 {"_ng_task_index":0,"_ng_rollout_index":0,"response":{"usage":{"abc usage":1}},"reward":0,"bool":true},
 {"_ng_task_index":0,"_ng_rollout_index":1,"response":{"usage":{"abc usage":1}},"reward":1,"bool":false},
 {"_ng_task_index":1,"_ng_rollout_index":0,"response":{"usage":{"abc usage":1}},"reward":0,"bool":true},
 {"_ng_task_index":1,"_ng_rollout_index":1,"response":{"usage":{"abc usage":1}},"reward":1,"bool":false},
 {"_ng_task_index":2,"_ng_rollout_index":0,"response":{"usage":{"abc usage":1}},"reward":0,"bool":true},
 {"_ng_task_index":2,"_ng_rollout_index":1,"response":{"usage":{"abc usage":1}},"reward":1,"bool":false}]}`

func TestCompute_GymProfileFromData(t *testing.T) {
	m := compute(t, gymProfileCase)
	// The test's expected group and agent metrics (histograms are dropped
	// by prepare_for_serialization; True and False compare equal to 1 and 0).
	wantStats := map[string]any{
		"mean/bool": 0.5, "mean/reward": 0.5, "mean/abc usage": 1.0,
		"max/bool": 1.0, "max/reward": 1.0, "max/abc usage": 1.0,
		"min/bool": 0.0, "min/reward": 0.0, "min/abc usage": 1.0,
		"median/bool": 0.5, "median/reward": 0.5, "median/abc usage": 1.0,
		"std/bool": 0.7071067811865476, "std/reward": 0.7071067811865476, "std/abc usage": 0.0,
	}
	groups := m["group_level_metrics"].([]any)
	if len(groups) != 3 {
		t.Fatalf("group_level_metrics has %d groups, want 3", len(groups))
	}
	for i, g := range groups {
		g := g.(map[string]any)
		for k, want := range wantStats {
			if g[k] != want {
				t.Errorf("group %d %s = %v, want %v", i, k, g[k], want)
			}
		}
		if g["_ng_task_index"] != float64(i) || g["num_rollouts"] != 2.0 || g["expected_num_rollouts"] != 2.0 ||
			g["missing_num_rollouts"] != 0.0 || g["reward_profile_completion_pct"] != 100.0 {
			t.Errorf("group %d bookkeeping: %v", i, g)
		}
		if !reflect.DeepEqual(g["sample"], map[string]any{"agent_ref": map[string]any{"name": "agent"}}) {
			t.Errorf("group %d sample = %v", i, g["sample"])
		}
	}
	agent := m["agent_metrics"].(map[string]any)
	wantAgent := maps(wantStats, map[string]any{"std/bool": 0.5477225575051661, "std/reward": 0.5477225575051661})
	for k, want := range wantAgent {
		if agent[k] != want {
			t.Errorf("agent_metrics[%s] = %v, want %v", k, agent[k], want)
		}
	}
	// nemo-gym 0.7.0 adds the repeat count and, over the two repeats'
	// means, the across-repeats summary.
	if agent["num_repeats"] != 2.0 || agent["mean_across_repeats/mean/reward"] != 0.5 || agent["std_across_repeats/mean/reward"] != 0.7071067811865476 {
		t.Errorf("agent_metrics repeats: %v", agent)
	}
	if r := m["repeat_level_metrics"].([]any); len(r) != 2 {
		t.Errorf("repeat_level_metrics = %v, want two repeats", r)
	}
	wantKey := map[string]any{"mean/bool": 0.5, "mean/reward": 0.5, "mean/abc usage": 1.0}
	if !reflect.DeepEqual(m["key_metrics"], wantKey) {
		t.Errorf("key_metrics = %v, want %v", m["key_metrics"], wantKey)
	}
}

func maps(base, over map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		out[k] = v
	}
	return out
}

// test_profile_from_data_series: replies without a reward, one task of a
// single rollout (its std falls back to 0).
func TestCompute_GymSeries(t *testing.T) {
	m := compute(t, `{"verify_responses":[
 {"_ng_task_index":0,"_ng_rollout_index":0,"response":{"usage":{"abc usage":1}}},
 {"_ng_task_index":0,"_ng_rollout_index":1,"response":{"usage":{"abc usage":1}}},
 {"_ng_task_index":1,"_ng_rollout_index":0,"response":{"usage":{"abc usage":1}}}]}`)
	groups := m["group_level_metrics"].([]any)
	if len(groups) != 2 || groups[1].(map[string]any)["std/abc usage"] != 0.0 || groups[0].(map[string]any)["mean/abc usage"] != 1.0 {
		t.Fatalf("group_level_metrics = %v", groups)
	}
}

// test_rollout_infos_are_sorted_and_pass_rate_is_recoverable.
func TestCompute_GymRolloutInfos(t *testing.T) {
	m := compute(t, `{"verify_responses":[
 {"_ng_task_index":0,"_ng_rollout_index":1,"response":{"usage":{"input_tokens":5,"output_tokens":7,"total_tokens":12}},"reward":1.0,"verifier_score":3.5},
 {"_ng_task_index":0,"_ng_rollout_index":0,"response":{"usage":{"input_tokens":3,"output_tokens":4,"total_tokens":7}},"reward":0.0,"verifier_score":1.5}]}`)
	row := m["group_level_metrics"].([]any)[0].(map[string]any)
	want := []any{
		map[string]any{"rollout_id": "0:0", "_ng_task_index": 0.0, "_ng_rollout_index": 0.0, "reward": 0.0, "input_tokens": 3.0, "output_tokens": 4.0, "total_tokens": 7.0, "verifier_score": 1.5},
		map[string]any{"rollout_id": "0:1", "_ng_task_index": 0.0, "_ng_rollout_index": 1.0, "reward": 1.0, "input_tokens": 5.0, "output_tokens": 7.0, "total_tokens": 12.0, "verifier_score": 3.5},
	}
	if row["_ng_task_index"] != 0.0 || row["num_rollouts"] != 2.0 || !reflect.DeepEqual(row["rollout_infos"], want) {
		t.Fatalf("group = %v", row)
	}
	if row["mean/input_tokens"] != 4.0 || row["mean/verifier_score"] != 2.5 {
		t.Fatalf("means: input_tokens %v, verifier_score %v", row["mean/input_tokens"], row["mean/verifier_score"])
	}
}

func TestCompute_Empty(t *testing.T) {
	vrs, err := rewardprofile.DecodeRequest([]byte(`{"verify_responses":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	out, err := rewardprofile.Compute(vrs)
	if err != nil || string(out) != `{"group_level_metrics":[],"agent_metrics":{},"key_metrics":{},"perf_summary":null,"repeat_level_metrics":[]}` {
		t.Fatalf("Compute([]) = %s, %v", out, err)
	}
}

func TestDecodeRequest_Refuses(t *testing.T) {
	for name, body := range map[string]string{
		"empty":                ``,
		"not an object":        `[1]`,
		"malformed":            `{"verify_responses":[`,
		"no verify_responses":  `{}`,
		"null":                 `{"verify_responses":null}`,
		"not a list":           `{"verify_responses":{}}`,
		"element not a object": `{"verify_responses":[1]}`,
	} {
		if _, err := rewardprofile.DecodeRequest([]byte(body)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestCompute_Refuses(t *testing.T) {
	for name, vr := range map[string]string{
		"string task index":   `{"_ng_task_index":"0","_ng_rollout_index":0}`,
		"bool rollout index":  `{"_ng_task_index":0,"_ng_rollout_index":true}`,
		"string response":     `{"_ng_task_index":0,"_ng_rollout_index":0,"response":"x"}`,
		"usage not an object": `{"_ng_task_index":0,"_ng_rollout_index":0,"response":{"usage":"x"}}`,
	} {
		_, err := rewardprofile.Compute([]codec.RawMessage{codec.RawMessage(vr)})
		var perr *rewardprofile.Error
		if !errors.As(err, &perr) {
			t.Errorf("%s: Compute = %v, want a *rewardprofile.Error", name, err)
		}
	}
	huge := []codec.RawMessage{codec.RawMessage(`{"_ng_task_index":1,"_ng_rollout_index":0,"x":1e308}`), codec.RawMessage(`{"_ng_task_index":1,"_ng_rollout_index":1,"x":1e308}`)}
	if _, err := rewardprofile.Compute(huge); err == nil || !strings.Contains(err.Error(), "overflows") {
		t.Errorf("a mean past float64: %v", err)
	}
	dup := []codec.RawMessage{codec.RawMessage(`{"_ng_task_index":1,"_ng_rollout_index":0}`), codec.RawMessage(`{"_ng_task_index":1,"_ng_rollout_index":0}`)}
	if _, err := rewardprofile.Compute(dup); err == nil || !strings.Contains(err.Error(), "share") {
		t.Errorf("duplicate rollout keys: %v", err)
	}
}

// TestComputeMatchesGym replays testdata/gym_cases.jsonl: random verify
// replies (several tasks and repeats, repeats missing tasks, masked samples,
// ng_perf, underscored bookkeeping fields, replies without indexes) and the
// reply NeMo Gym 0.7.0's own /aggregate_metrics gave for them
// (gen_gym_cases.py). Every number must be Gym's to the bit, except the
// confidence intervals, whose t quantile scipy computes by its own
// algorithm: those agree to 1e-12.
func TestComputeMatchesGym(t *testing.T) {
	f, err := os.Open("testdata/gym_cases.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	if !sc.Scan() {
		t.Fatal("gym_cases.jsonl is empty")
	}
	var header struct {
		NemoGym string `json:"nemo_gym"`
		Cases   int    `json:"cases"`
	}
	if err := json.Unmarshal(sc.Bytes(), &header); err != nil || header.NemoGym != "0.7.0" {
		t.Fatalf("header %s: %v (want the nemo-gym version the cases came from)", sc.Bytes(), err)
	}
	n := 0
	for sc.Scan() {
		var c struct {
			VerifyResponses []codec.RawMessage `json:"verify_responses"`
			Expected        string             `json:"expected"`
		}
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatal(err)
		}
		n++
		got, err := rewardprofile.Compute(c.VerifyResponses)
		if err != nil {
			t.Fatalf("case %d: %v", n, err)
		}
		for _, d := range diffJSON(t, got, []byte(c.Expected)) {
			t.Errorf("case %d: %s", n, d)
		}
	}
	if err := sc.Err(); err != nil || n != header.Cases {
		t.Fatalf("read %d cases of %d: %v", n, header.Cases, err)
	}
}

// diffJSON lists where got and want differ: a key missing on either side,
// or a value whose JSON text differs (numbers as written, so 1 and 1.0
// differ). ci_* values may differ by a relative 1e-12.
func diffJSON(t *testing.T, got, want []byte) []string {
	t.Helper()
	decode := func(b []byte) any {
		d := json.NewDecoder(strings.NewReader(string(b)))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatalf("decode %s: %v", b, err)
		}
		return v
	}
	var out []string
	var walk func(path string, g, w any)
	walk = func(path string, g, w any) {
		switch w := w.(type) {
		case map[string]any:
			gm, ok := g.(map[string]any)
			if !ok {
				out = append(out, fmt.Sprintf("%s: got %v, want an object", path, g))
				return
			}
			for k, wv := range w {
				gv, ok := gm[k]
				if !ok {
					out = append(out, fmt.Sprintf("%s.%s: missing (want %v)", path, k, wv))
					continue
				}
				walk(path+"."+k, gv, wv)
			}
			for k := range gm {
				if _, ok := w[k]; !ok {
					out = append(out, fmt.Sprintf("%s.%s: unexpected %v", path, k, gm[k]))
				}
			}
		case []any:
			gl, ok := g.([]any)
			if !ok || len(gl) != len(w) {
				out = append(out, fmt.Sprintf("%s: got %v, want %d elements", path, g, len(w)))
				return
			}
			for i := range w {
				walk(fmt.Sprintf("%s[%d]", path, i), gl[i], w[i])
			}
		case json.Number:
			gn, ok := g.(json.Number)
			if ok && gn == w {
				return
			}
			key := path[strings.LastIndexByte(path, '.')+1:]
			if ok && strings.HasPrefix(key, "ci_") {
				gf, _ := gn.Float64()
				wf, _ := w.Float64()
				if math.Abs(gf-wf) <= 1e-12*math.Max(math.Abs(wf), 1e-300) {
					return
				}
			}
			out = append(out, fmt.Sprintf("%s: got %v, want %v", path, g, w))
		default:
			if !reflect.DeepEqual(g, w) {
				out = append(out, fmt.Sprintf("%s: got %v, want %v", path, g, w))
			}
		}
	}
	walk("$", decode(got), decode(want))
	return out
}

// TestGymFloat: floats as pydantic_core.to_json writes them (nemo-gym
// 0.7.0's environment, pydantic-core 2.50).
func TestGymFloat(t *testing.T) {
	tenth, fifth := 0.1, 0.2
	for f, want := range map[float64]string{
		tenth + fifth: "0.30000000000000004",
		1:             "1.0", 0.5: "0.5", 100: "100.0", 1e15: "1000000000000000.0", 1e16: "1e+16", 1.5e16: "1.5e+16",
		0.0001: "0.0001", 0.00001: "0.00001", 1.2345e-5: "0.000012345", 9.99e-6: "9.99e-6", 1.25e-7: "1.25e-7", -2.5: "-2.5",
		123456789.125: "123456789.125", math.Copysign(0, -1): "-0.0", 0: "0.0", 1e300: "1e+300", 2.5e-300: "2.5e-300",
		12345678901234567: "1.2345678901234568e+16",
	} {
		if got := rewardprofile.GymFloat(f); got != want {
			t.Errorf("GymFloat(%v) = %s, want %s", f, got, want)
		}
	}
}

// FuzzCompute: any request either is refused with an error or computes a
// reply that is valid JSON; never a panic.
func FuzzCompute(f *testing.F) {
	f.Add([]byte(gymProfileCase))
	f.Add([]byte(`{"verify_responses":[{"_ng_task_index":0,"_ng_rollout_index":0,"reward":1e308,"x":-1e308}]}`))
	f.Add([]byte(`{"verify_responses":[{"_ng_task_index":0,"_ng_rollout_index":0,"response":{"usage":[]},"a":{"b":1}}]}`))
	f.Add([]byte(`{"verify_responses":[{"_ng_task_index":-5,"_ng_rollout_index":99999999999999999999}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		vrs, err := rewardprofile.DecodeRequest(body)
		if err != nil {
			return
		}
		out, err := rewardprofile.Compute(vrs)
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("Compute(%s) = %s, not JSON", body, out)
		}
	})
}
