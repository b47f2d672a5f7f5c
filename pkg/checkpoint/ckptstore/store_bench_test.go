package ckptstore_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/checkpoint/ckptstore"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// benchRecord is a record shaped as an agent's at a rollout's second model
// call (the largest of the fleet's): a flat line's object with the episode
// id first, strings, and arrays of token ids and log-probabilities, which
// are most of its bytes.
func benchRecord(i int) []byte {
	id := rollout.EpisodeID{RolloutID: fmt.Sprintf("w%06d", i)}
	b := []byte(`{"episode_id":{"rollout_id":"` + id.RolloutID + `","attempt":0},"type":"agent_session","session_id":"agent-session-`)
	b = strconv.AppendInt(b, int64(i)*7919, 16)
	b = append(b, `","session":{"request":{"input":[{"content":"What is the weather in City `...)
	b = strconv.AppendInt(b, int64(i), 10)
	b = append(b, `? Call get_weather with {\"city\": \"City\"}.","role":"user"}]},"activations":1},"boundary":{"step":1,"new_outputs":[{"type":"function_call","prompt_token_ids":[`...)
	for k := range 140 {
		if k > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(1+(k*7919+i)%32000), 10)
	}
	b = append(b, `],"generation_token_ids":[`...)
	for k := range 30 {
		if k > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(1+(k*104729+i)%32000), 10)
	}
	b = append(b, `],"generation_log_probs":[`...)
	for k := range 30 {
		if k > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendFloat(b, -float64((k*31+i)%50000)/10000, 'f', -1, 64)
	}
	b = append(b, `]},{"type":"function_call_output","output":"{\"city\":\"City\",\"weather_description\":\"The weather is foggy.\"}"}],"usage":{"input_tokens":143,"output_tokens":29,"total_tokens":172},"last_model_response":{"id":"resp_`...)
	b = strconv.AppendInt(b, int64(i)*104729, 16)
	b = append(b, `","object":"response","created_at":1796608964,"model":"fake-model","output":null,"parallel_tool_calls":true,"tool_choice":"auto","tools":[{"type":"function","name":"get_weather","description":"Get the current weather of a city.","parameters":{"properties":{"city":{"type":"string"}},"required":["city"],"type":"object"},"strict":true}],"temperature":null,"status":"completed","error":null,"metadata":null},"model_calls":1}}`...)
	return b
}

// benchRecords are n records as benchRecord makes them.
func benchRecords(n int) []ckptstore.Record {
	out := make([]ckptstore.Record, n)
	for i := range out {
		out[i] = ckptstore.Record{EpisodeID: rollout.EpisodeID{RolloutID: fmt.Sprintf("w%06d", i)}, Data: benchRecord(i)}
	}
	return out
}

const benchRecordCount = 16000

// BenchmarkWrite is one participant's commit of 16,000 agent-sized
// records to the local filesystem, fsyncs included: the store's work per
// byte (checks, framing, digest, writes).
func BenchmarkWrite(b *testing.B) {
	recs := benchRecords(benchRecordCount)
	var size int64
	for _, r := range recs {
		size += int64(len(r.Data) + 1)
	}
	s := tempStore(b)
	b.SetBytes(size)
	b.ResetTimer()
	for i := range b.N {
		t := ckptstore.Target{Dir: b.TempDir(), Kind: "agent", Instance: "a", CheckpointID: "c" + strconv.Itoa(i)}
		if _, err := s.Write(context.Background(), t, nil, func(add func(ckptstore.Record) error) (map[string]any, error) {
			for _, r := range recs {
				if err := add(r); err != nil {
					return nil, err
				}
			}
			return nil, nil
		}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRead is a restore's read of what BenchmarkWrite writes: the
// whole file read, hashed, counted and framed.
func BenchmarkRead(b *testing.B) {
	recs := benchRecords(benchRecordCount)
	s := tempStore(b)
	t := ckptstore.Target{Dir: b.TempDir(), Kind: "agent", Instance: "a", CheckpointID: "c"}
	w, err := s.Write(context.Background(), t, nil, func(add func(ckptstore.Record) error) (map[string]any, error) {
		for _, r := range recs {
			if err := add(r); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(w.Bytes)
	b.ResetTimer()
	for range b.N {
		_, got, _, err := s.Read(context.Background(), t, nil)
		if err != nil {
			b.Fatal(err)
		}
		if len(got) != len(recs) {
			b.Fatalf("read %d records, wrote %d", len(got), len(recs))
		}
	}
}
