package gym

import (
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// TestGymEvalRun: Gym's collection CLI, `gym eval run --no-serve`, finds our
// fleet through the head `gymctl up` serves and collects Gym's own counter
// dataset and our weather rows, three repeats each, through our environment
// and agents; every row earns its reward. (Gym's weather rows name no city
// and its verifier rewards any get_weather call, where ours asks the
// answer to quote what get_weather returned: they run, and score 0 on our
// weather server; TestNeMoRLPath runs them on Gym's.) Gym then asks our environment for
// /aggregate_metrics, and our reply, posted the same stripped rows, is
// what Gym's own compute_aggregate_metrics computes from them, field by
// field (the confidence intervals to 1e-12).
func TestGymEvalRun(t *testing.T) {
	spec := standardSpec()
	spec.head = true
	f := startFleet(t, spec)
	dir := f.dir
	var rows []map[string]any
	rows = append(rows, withAgent(readJSONL(t, filepath.Join(repoRoot, "data", "weather.jsonl"))[:5], "weather_agent")...)
	rows = append(rows, withAgent(gymDataset(t, "example_session_state_mgmt"), "counter_agent")...)
	in := filepath.Join(dir, "in.jsonl")
	writeJSONL(t, in, rows)
	out := filepath.Join(dir, "out.jsonl")
	runGym(t, dir, "eval", "run", "--no-serve", "--input", in, "--output", out, "--num-repeats", "3",
		"++head_server.host=127.0.0.1", "++head_server.port="+strconv.Itoa(f.head))

	results := readJSONL(t, out)
	if len(results) != 3*len(rows) {
		t.Fatalf("%d rollouts written, want %d", len(results), 3*len(rows))
	}
	for _, r := range results {
		key := fmt.Sprintf("task %v rollout %v (%v)", r["_ng_task_index"], r["_ng_rollout_index"], r["agent_ref"])
		if r["reward"] != 1.0 {
			t.Errorf("%s: reward %v, want 1.0", key, r["reward"])
		}
		// Gym stamps the environment server that ran the row, and its type.
		if r["_ng_environment_server"] != "env" || r["_ng_result_type"] != "gymfleet_envserver" {
			t.Errorf("%s: ran on %v (%v), want env (gymfleet_envserver)", key, r["_ng_environment_server"], r["_ng_result_type"])
		}
	}
	f.noCleanupFailures(t)

	var agg struct {
		Ours, Gym      map[string]any
		CollectionFile []map[string]any `json:"collection_file"`
	}
	if err := json.Unmarshal(runPy(t, dir, "aggregate.py", out, f.env), &agg); err != nil {
		t.Fatal(err)
	}
	for _, d := range diffMetrics("", agg.Ours, agg.Gym) {
		t.Errorf("/aggregate_metrics, ours vs Gym's: %s", d)
	}
	if len(agg.CollectionFile) != 1 {
		t.Fatalf("gym eval run wrote %d aggregate entries, want one (one environment server)", len(agg.CollectionFile))
	}
	entry := agg.CollectionFile[0]
	if entry["_ng_environment_server"] != "env" {
		t.Errorf("aggregate entry for %v, want env", entry["_ng_environment_server"])
	}
	// What the collection wrote is what it read from us.
	for _, k := range []string{"agent_metrics", "key_metrics", "group_level_metrics", "repeat_level_metrics"} {
		for _, d := range diffMetrics(k, entry[k], agg.Ours[k]) {
			t.Errorf("the collection's file vs our reply: %s", d)
		}
	}
	if n := agg.Ours["agent_metrics"].(map[string]any)["num_repeats"]; n != 3.0 {
		t.Errorf("num_repeats %v, want 3", n)
	}
}

// diffMetrics lists where got and want differ: keys missing on either
// side and values that differ; a number differs by more than a relative
// 1e-12 only on a ci_* key (scipy's t quantile), anywhere else not at all.
func diffMetrics(path string, got, want any) []string {
	var out []string
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: got %v, want an object", path, got)}
		}
		keys := make([]string, 0, len(w)+len(g))
		for k := range w {
			keys = append(keys, k)
		}
		for k := range g {
			if _, ok := w[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			gv, gok := g[k]
			wv, wok := w[k]
			switch {
			case !gok:
				out = append(out, fmt.Sprintf("%s.%s: missing, want %v", path, k, wv))
			case !wok:
				out = append(out, fmt.Sprintf("%s.%s: %v, which Gym does not have", path, k, gv))
			default:
				out = append(out, diffMetrics(path+"."+k, gv, wv)...)
			}
		}
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return []string{fmt.Sprintf("%s: got %v, want %d elements", path, got, len(w))}
		}
		for i := range w {
			out = append(out, diffMetrics(fmt.Sprintf("%s[%d]", path, i), g[i], w[i])...)
		}
	case float64:
		g, ok := got.(float64)
		key := path[strings.LastIndexByte(path, '.')+1:]
		if ok && (g == w || strings.HasPrefix(key, "ci_") && math.Abs(g-w) <= 1e-12*math.Abs(w)) {
			return nil
		}
		out = append(out, fmt.Sprintf("%s: got %v, want %v", path, got, w))
	default:
		if fmt.Sprint(got) != fmt.Sprint(want) {
			out = append(out, fmt.Sprintf("%s: got %v, want %v", path, got, want))
		}
	}
	return out
}
