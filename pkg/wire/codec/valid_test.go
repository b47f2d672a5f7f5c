package codec_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	gojson "github.com/goccy/go-json"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// TestValid_EveryPositionInAWord puts each byte that ends or breaks a
// string's run at every offset of a string longer than a word, where
// Valid's search eight bytes at a time must find it, beside bytes that
// look like it once a borrow has carried.
func TestValid_EveryPositionInAWord(t *testing.T) {
	specials := []string{`"`, `\`, `\"`, `\\`, `\u00e9`, `\u12`, `\x`, "\x00", "\x1f", "\x20", "\x7f", "\x80", "\xff", "\x21", "\x23", "\x5b", "\x5d", "é", "\x01\x22"}
	for _, s := range specials {
		for pos := range 20 {
			for _, tail := range []string{"", "abcdefghijklmnop"} {
				str := strings.Repeat("a", pos) + s + tail
				for _, doc := range []string{`"` + str + `"`, `{"` + str + `":1}`, `["` + str + `",2]`, `"` + str} {
					if got, want := codec.Valid([]byte(doc)), json.Valid([]byte(doc)); got != want {
						t.Errorf("Valid(%q) = %v, encoding/json says %v", doc, got, want)
					}
				}
			}
		}
	}
}

// validBenchRecord is a checkpoint record as the agent writes one: keys,
// short strings, and arrays of token ids and log-probabilities.
func validBenchRecord() []byte {
	var b strings.Builder
	b.WriteString(`{"episode_id":{"rollout_id":"w000042","attempt":0},"type":"agent_session","session_id":"agent-session-c8121d86dd6bd98861e8590e3def1f47","session":{"request":{"input":[{"content":"What is the weather in City0? Call get_weather with {\"city\": \"City0\"}.","role":"user"}]}},"boundary":{"step":1,"new_outputs":[{"type":"function_call","prompt_token_ids":[`)
	for k := range 140 {
		if k > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(1 + (k*7919)%32000))
	}
	b.WriteString(`],"generation_log_probs":[`)
	for k := range 30 {
		if k > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatFloat(-float64((k*31)%50000)/10000, 'f', -1, 64))
	}
	b.WriteString(`]}],"last_model_response":{"id":"resp_749f643dcf417c5f5a16dd98c8673082","object":"response","created_at":1796608964,"model":"fake-model","output":null,"parallel_tool_calls":true,"tools":[{"type":"function","name":"get_weather","description":"Get the current weather of a city.","strict":true}],"temperature":null,"error":null}}}`)
	return []byte(b.String())
}

func BenchmarkValid(b *testing.B) {
	rec := validBenchRecord()
	for _, v := range []struct {
		name  string
		valid func([]byte) bool
	}{{"codec", codec.Valid}, {"goccy", gojson.Valid}, {"encoding-json", json.Valid}} {
		b.Run(v.name, func(b *testing.B) {
			b.SetBytes(int64(len(rec)))
			for range b.N {
				if !v.valid(rec) {
					b.Fatal("invalid")
				}
			}
		})
	}
}
