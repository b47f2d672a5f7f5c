package gym

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// TestVLLMModelInFrontOfBackend: Gym's vllm_model, configured as NeMo RL's
// training runs configure it (responses_api_models/vllm_model/configs/
// vllm_model_for_training.yaml: token ids returned, the reasoning parser
// on), in front of an inference backend, and our model server in front of
// the same backend, answer the same Responses requests with the same thing:
// the same output items (tool calls, messages, their token ids and log
// probabilities), status and usage. The backend is our fakeinference,
// or a vLLM when GYMFLEET_GYM_VLLM_BACKEND names its base URL (…/v1) and
// GYMFLEET_GYM_VLLM_MODEL its model: the fake must give Gym what vLLM gives.
// A field Gym's reply declares and ours leaves out must be null in Gym's
// (Gym's pydantic models emit every declared field; readers treat an absent
// one as null).
func TestVLLMModelInFrontOfBackend(t *testing.T) {
	spec := fleetSpec{}
	backend, model := os.Getenv("GYMFLEET_GYM_VLLM_BACKEND"), os.Getenv("GYMFLEET_GYM_VLLM_MODEL")
	external := backend != ""
	if external {
		if model == "" {
			t.Fatal("GYMFLEET_GYM_VLLM_BACKEND is set without GYMFLEET_GYM_VLLM_MODEL (the model it serves)")
		}
		spec.upstream, spec.model = backend, model
	}
	f := startFleet(t, spec)
	if backend == "" {
		backend, model = f.fake+"/v1", fakeModel
	}
	t.Logf("backend %s, model %s", backend, model)

	port := takePorts(t, 1)[0]
	doc := vllmModelConfig(t, port, backend, model)
	g := startGymServer(t, "gym_policy", "responses_api_models/vllm_model", port, doc)
	waitGymServers(t, g)

	demo := readJSONL(t, filepath.Join(repoRoot, "data", "demo.jsonl"))[0]
	params := demo["responses_create_params"].(map[string]any)
	toolTurn := deepCopy(params)
	toolTurn["temperature"] = 0.0
	if external {
		// A tiny model's weights call no tool of their own accord; a
		// forced tool choice makes vLLM produce a schema-valid call.
		toolTurn["tool_choice"] = "required"
	}
	plain := map[string]any{"input": "Say hello.", "temperature": 0.0, "max_output_tokens": 64}

	first := postJSON(t, f.model+"/v1/responses", toolTurn)
	var call map[string]any
	for _, it := range first["output"].([]any) {
		if it.(map[string]any)["type"] == "function_call" {
			call = it.(map[string]any)
		}
	}
	requests := map[string]map[string]any{"tool call": toolTurn, "plain": plain}
	if call != nil {
		// The second turn: the call and its output appended, as Gym's
		// simple agent appends them (token fields included).
		followUp := deepCopy(toolTurn)
		input := followUp["input"].([]any)
		followUp["input"] = append(input, call, map[string]any{
			"type": "function_call_output", "call_id": call["call_id"],
			"output": `{"city": "Paris", "weather_description": "The weather in Paris is cold."}`,
		})
		requests["after the tool"] = followUp
	} else {
		t.Errorf("the backend made no tool call for %v", toolTurn["input"])
	}
	for name, req := range requests {
		gym := postJSON(t, url(port)+"/v1/responses", req)
		ours := postJSON(t, f.model+"/v1/responses", req)
		for _, d := range compareResponses(gym, ours) {
			t.Errorf("%s: %s", name, d)
		}
		if !hasTokenIDs(gym) {
			t.Errorf("%s: Gym's vllm_model returned no token ids: %v", name, gym["output"])
		}
	}
}

// vllmModelConfig is the global config Gym's vllm_model is started with:
// vllm_model_for_training.yaml of the installed package, its policy
// placeholders filled, under the instance name gym_policy.
func vllmModelConfig(t *testing.T, port int, backend, model string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(sitePackages, "responses_api_models", "vllm_model", "configs", "vllm_model_for_training.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var file map[string]map[string]map[string]map[string]any
	if err := yaml.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	inner := file["policy_model"]["responses_api_models"]["vllm_model"]
	if inner == nil {
		t.Fatalf("vllm_model_for_training.yaml has no policy_model.responses_api_models.vllm_model: %s", b)
	}
	fill := map[string]any{"${policy_base_url}": []string{backend}, "${policy_api_key}": "dummy_key", "${policy_model_name}": model}
	for k, v := range inner {
		if s, ok := v.(string); ok {
			if r, ok := fill[s]; ok {
				inner[k] = r
			}
		}
	}
	inner["host"], inner["port"] = "127.0.0.1", port
	doc, err := yaml.Marshal(map[string]any{
		"head_server": map[string]any{"host": "127.0.0.1", "port": port},
		"dry_run":     false,
		"gym_policy":  map[string]any{"responses_api_models": map[string]any{"vllm_model": inner}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

func postJSON(t *testing.T, u string, body any) map[string]any {
	t.Helper()
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", u, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %d %s", u, resp.StatusCode, out)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("POST %s: %s: %v", u, out, err)
	}
	return m
}

func hasTokenIDs(resp map[string]any) bool {
	for _, it := range resp["output"].([]any) {
		if ids, ok := it.(map[string]any)["generation_token_ids"].([]any); ok && len(ids) > 0 {
			return true
		}
	}
	return false
}

// compareResponses lists where our Responses reply differs from Gym's:
// status, incomplete_details, model, usage and every output item field by
// field. Ids a server makes up itself (the response's, a message's) and
// created_at are not compared.
func compareResponses(gym, ours map[string]any) []string {
	var out []string
	for _, k := range []string{"status", "incomplete_details", "model", "usage", "error"} {
		if !reflect.DeepEqual(gym[k], ours[k]) {
			out = append(out, fmt.Sprintf("%s: Gym %v, ours %v", k, gym[k], ours[k]))
		}
	}
	gi, _ := gym["output"].([]any)
	oi, _ := ours["output"].([]any)
	if len(gi) != len(oi) {
		return append(out, fmt.Sprintf("output: Gym %d items %v, ours %d %v", len(gi), gi, len(oi), oi))
	}
	for i := range gi {
		g, o := gi[i].(map[string]any), oi[i].(map[string]any)
		keys := map[string]bool{}
		for k := range g {
			keys[k] = true
		}
		for k := range o {
			keys[k] = true
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		for _, k := range sorted {
			if k == "id" && g["type"] == "message" {
				continue
			}
			gv, gok := g[k]
			ov, ook := o[k]
			switch {
			case !ook && gv == nil:
			case !gok:
				out = append(out, fmt.Sprintf("output[%d].%s: ours %v, Gym has no such field", i, k, short(ov)))
			case !reflect.DeepEqual(gv, ov):
				out = append(out, fmt.Sprintf("output[%d].%s: Gym %v, ours %v", i, k, short(gv), short(ov)))
			}
		}
	}
	return out
}

func short(v any) string {
	s := fmt.Sprint(v)
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return strings.ReplaceAll(s, "\n", " ")
}
