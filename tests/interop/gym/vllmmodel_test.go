package gym

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/tests/interop/interoptest"
)

// TestVLLMModelInFrontOfBackend: Gym's vllm_model, configured as NeMo RL's
// training runs configure it (responses_api_models/vllm_model/configs/
// vllm_model_for_training.yaml: token ids returned, the reasoning parser
// on), in front of our fakeinference, and our model server in front of the
// same fakeinference, answer the same Responses requests with the same
// thing: the same output items (tool calls, messages, their token ids and
// log probabilities), status and usage (interoptest.CompareResponses): the
// stand-in must give Gym what vLLM gives. The same comparison in front of
// a real vLLM is tests/interop/vllm's TestGymVLLMModel.
func TestVLLMModelInFrontOfBackend(t *testing.T) {
	f := startFleet(t, fleetSpec{})
	port := takePorts(t, 1)[0]
	doc, err := gymEnv.VLLMModelConfig("gym_policy", port, f.fake+"/v1", fakeModel)
	if err != nil {
		t.Fatal(err)
	}
	g := startGymServer(t, "gym_policy", "responses_api_models/vllm_model", port, doc)
	waitGymServers(t, g)

	demo := readJSONL(t, filepath.Join(repoRoot, "data", "demo.jsonl"))[0]
	params := demo["responses_create_params"].(map[string]any)
	toolTurn := deepCopy(params)
	toolTurn["temperature"] = 0.0
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
		for _, d := range interoptest.CompareResponses(gym, ours, interoptest.CompareOptions{}) {
			t.Errorf("%s: %s", name, d)
		}
		if !interoptest.HasTokenIDs(gym) {
			t.Errorf("%s: Gym's vllm_model returned no token ids: %v", name, gym["output"])
		}
	}
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
