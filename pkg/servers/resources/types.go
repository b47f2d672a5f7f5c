package resources

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
)

// Tool describes one tool a server offers (GET /tools).
type Tool struct {
	Name        string           `json:"name"`
	Description string           `json:"description"`
	Parameters  codec.RawMessage `json:"parameters"`
}

// toolFunc runs a tool. sess is nil when a stateless type is called without a
// known session; args is the request body (an empty body reads as {}).
type toolFunc func(sess *session, args []byte) (any, error)

// serverType is the behaviour of one type of resources server.
type serverType struct {
	// class names the type in its session cookie's name, as a NeMo Gym
	// server's class name does in its.
	class string
	// reverify is the type's answer to GET /reverify_mode.
	reverify ReverifyMode
	// stateful types refuse tool calls of unknown sessions.
	stateful bool
	tools    []Tool
	call     map[string]toolFunc
	// seed reads what the type needs from a dataset row and returns the state
	// of a new session. A re-seed validates the row the same way but keeps
	// the existing state (NeMo Gym's setdefault).
	seed func(row map[string]codec.RawMessage) (any, error)
	// verify computes the reward. sess is nil for an unknown session.
	verify func(sess *session, req *verifyRequest) (float64, error)

	// Checkpoint hooks. exportState returns the checkpoint form of a session
	// state (ok false: nothing to export, e.g. a state already dropped);
	// restoreState validates a saved state and returns the session state it
	// rebuilds. Both are nil for types with no state to save, which cannot
	// run in saved mode.
	exportState  func(state any) (raw codec.RawMessage, ok bool)
	restoreState func(raw codec.RawMessage) (any, error)
	// retire frees a retired session's state. It may run again for a
	// session whose earlier retire was cut short, so it tolerates a state
	// already freed.
	retire func(sess *session)
}

// verifyRequest is a decoded /verify body.
type verifyRequest struct {
	// fields is every top-level field of the body, passed through to the reply.
	fields   map[string]codec.RawMessage
	response verifiedResponse
}

// verifiedResponse is what a verifier reads of the verify body's response:
// its output. The rest passes through untouched, so a response another
// server shaped (NeMo Gym dumps created_at as a float, and every unset
// field as null) verifies as ours does.
type verifiedResponse struct {
	Output []openai.Item `json:"output"`
}

// ReverifyMode is NeMo Gym's answer to GET /reverify_mode
// (nemo_gym/base_resources_server.py ReverifyMode, Gym 07d6b0d07b22): can
// a rollout be verified again later from its recorded row and response
// alone, with no session.
type ReverifyMode string

// The reverify modes. Gym's default is unknown.
const (
	// ReverifyStateless: the verifier is a pure function of the request
	// body and the server's config.
	ReverifyStateless ReverifyMode = "stateless"
	// ReverifyUnsupported: the verifier reads session state seeded during
	// the run, which a later verify does not have.
	ReverifyUnsupported ReverifyMode = "unsupported"
	// ReverifyUnknown: not declared.
	ReverifyUnknown ReverifyMode = "unknown"
)

func newServerType(typ string) (*serverType, error) {
	var t *serverType
	switch typ {
	case TypeWeather:
		t = weatherType()
		t.class = "WeatherResourcesServer"
	case TypeSlowVerify:
		// Holding a verify delays it; the reward is still the weather's.
		t = weatherType()
		t.class = "SlowVerifyResourcesServer"
	case TypeCounter:
		t = counterType()
		t.class = "CounterResourcesServer"
	default:
		return nil, fmt.Errorf("unknown resources server type %q", typ)
	}
	if t.retire == nil {
		t.retire = dropState
	}
	return t, nil
}

// dropState is the retire hook of types whose state is plain memory:
// dropping the reference frees it.
func dropState(sess *session) {
	sess.mu.Lock()
	sess.state = nil
	sess.mu.Unlock()
}

// Weather.

// ToolGetWeather is the weather server's one tool.
const ToolGetWeather = "get_weather"

// weatherWords are the conditions a city can have; which one is a pure
// function of the city, so every run of a row sees the same weather.
var weatherWords = [...]string{"cold", "sunny", "rainy", "cloudy", "windy", "snowy", "foggy", "hot"}

// WeatherDescription is what get_weather says about a city.
func WeatherDescription(city string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(city))
	return "The weather in " + city + " is " + weatherWords[h.Sum32()%uint32(len(weatherWords))] + "."
}

type weatherReply struct {
	City               string `json:"city"`
	WeatherDescription string `json:"weather_description"`
}

func weatherType() *serverType {
	return &serverType{
		// The reward reads only the verify body's response.
		reverify: ReverifyStateless,
		tools: []Tool{{
			Name:        ToolGetWeather,
			Description: "Get the current weather of a city.",
			Parameters:  codec.RawMessage(`{"type":"object","properties":{"city":{"type":"string","description":"The city name."}},"required":["city"],"additionalProperties":false}`),
		}},
		call: map[string]toolFunc{
			ToolGetWeather: func(_ *session, args []byte) (any, error) {
				var in struct {
					City *string `json:"city"`
				}
				if err := decodeArgs(args, &in); err != nil {
					return nil, err
				}
				if in.City == nil || *in.City == "" {
					return nil, apierror.New(apierror.InvalidRequest, "get_weather needs a non-empty string field \"city\"")
				}
				return weatherReply{City: *in.City, WeatherDescription: WeatherDescription(*in.City)}, nil
			},
		},
		seed:   func(map[string]codec.RawMessage) (any, error) { return nil, nil },
		verify: func(_ *session, req *verifyRequest) (float64, error) { return weatherReward(req.response.Output), nil },
	}
}

// weatherReward is 1.0 when the last assistant message quotes a description
// some get_weather call of the same output returned.
func weatherReward(output []openai.Item) float64 {
	weatherCalls := map[string]bool{}
	lastText, hasMessage := "", false
	for _, it := range output {
		switch {
		case it.Type == openai.ItemFunctionCall && it.Name == ToolGetWeather:
			weatherCalls[it.CallID] = true
		case it.Type == openai.ItemMessage && it.Role == "assistant":
			lastText, hasMessage = it.Content.String(), true
		}
	}
	if !hasMessage {
		return 0
	}
	for _, it := range output {
		if it.Type != openai.ItemFunctionCallOutput || !weatherCalls[it.CallID] {
			continue
		}
		var out weatherReply
		if err := codec.Unmarshal([]byte(it.Output.String()), &out); err != nil || out.WeatherDescription == "" {
			continue
		}
		if strings.Contains(lastText, out.WeatherDescription) {
			return 1
		}
	}
	return 0
}

// Counter.

// Counter tool names. increment_counter and get_counter_value are NeMo
// Gym's (resources_servers/example_session_state_mgmt/app.py, Gym
// 07d6b0d07b22), so its example datasets run here unchanged.
const (
	ToolIncrement        = "increment"
	ToolIncrementCounter = "increment_counter"
	ToolGetCounterValue  = "get_counter_value"
)

// counterState is a counter session's state, guarded by its session's mu.
type counterState struct {
	count int64
}

type countReply struct {
	Count int64 `json:"count"`
}

// successReply is increment_counter's reply, Gym's IncrementCounterResponse.
type successReply struct {
	Success bool `json:"success"`
}

// addToCounter adds by to a counter session's count and returns the new count.
func addToCounter(sess *session, by int64, tool string) (int64, error) {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	st, err := counterOf(sess)
	if err != nil {
		return 0, err
	}
	if (by > 0 && st.count > math.MaxInt64-by) || (by < 0 && st.count < math.MinInt64-by) {
		return 0, apierror.New(apierror.InvalidRequest, "%s by %d overflows the counter", tool, by)
	}
	st.count += by
	return st.count, nil
}

func counterType() *serverType {
	return &serverType{
		// The reward reads the session's count: a verify without the
		// session it was seeded in (Gym's reverify) cannot give it. Within
		// a live or restored session it may be sent again (verify_mode).
		reverify: ReverifyUnsupported,
		stateful: true,
		tools: []Tool{
			{
				Name:        ToolIncrement,
				Description: "Add an integer to the counter and return the new count.",
				Parameters:  codec.RawMessage(`{"type":"object","properties":{"by":{"type":"integer","description":"How much to add."}},"required":["by"],"additionalProperties":false}`),
			},
			{
				Name:        ToolIncrementCounter,
				Description: "Add an integer to the counter.",
				Parameters:  codec.RawMessage(`{"type":"object","properties":{"count":{"type":"integer","description":""}},"required":["count"],"additionalProperties":false}`),
			},
			{
				Name:        ToolGetCounterValue,
				Description: "Return the counter's current value.",
				Parameters:  codec.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`),
			},
		},
		call: map[string]toolFunc{
			ToolIncrement: func(sess *session, args []byte) (any, error) {
				var in struct {
					By codec.RawMessage `json:"by"`
				}
				if err := decodeArgs(args, &in); err != nil {
					return nil, err
				}
				by, present, err := parseInt(in.By)
				if err != nil || !present {
					return nil, apierror.New(apierror.InvalidRequest, "increment needs an integer field \"by\"")
				}
				n, err := addToCounter(sess, by, ToolIncrement)
				if err != nil {
					return nil, err
				}
				return countReply{Count: n}, nil
			},
			ToolIncrementCounter: func(sess *session, args []byte) (any, error) {
				var in struct {
					Count codec.RawMessage `json:"count"`
				}
				if err := decodeArgs(args, &in); err != nil {
					return nil, err
				}
				by, present, err := parseInt(in.Count)
				if err != nil || !present {
					return nil, apierror.New(apierror.InvalidRequest, "increment_counter needs an integer field \"count\"")
				}
				if _, err := addToCounter(sess, by, ToolIncrementCounter); err != nil {
					return nil, err
				}
				return successReply{Success: true}, nil
			},
			ToolGetCounterValue: func(sess *session, args []byte) (any, error) {
				var in struct{}
				if err := decodeArgs(args, &in); err != nil {
					return nil, err
				}
				sess.mu.Lock()
				defer sess.mu.Unlock()
				st, err := counterOf(sess)
				if err != nil {
					return nil, err
				}
				return countReply{Count: st.count}, nil
			},
		},
		seed: func(row map[string]codec.RawMessage) (any, error) {
			n, _, err := parseInt(row["initial_count"])
			if err != nil {
				return nil, apierror.New(apierror.InvalidRequest, "initial_count: %v", err)
			}
			return &counterState{count: n}, nil
		},
		verify: func(sess *session, req *verifyRequest) (float64, error) {
			want, present, err := parseInt(req.fields["expected_count"])
			if err != nil || !present {
				return 0, apierror.New(apierror.InvalidRequest, "verify needs an integer field \"expected_count\"")
			}
			if sess == nil {
				return 0, nil
			}
			sess.mu.Lock()
			defer sess.mu.Unlock()
			if st, err := counterOf(sess); err == nil && st.count == want {
				return 1, nil
			}
			return 0, nil
		},
		exportState: func(state any) (codec.RawMessage, bool) {
			st, ok := state.(*counterState)
			if !ok {
				return nil, false
			}
			return codec.RawMessage(`{"count":` + strconv.FormatInt(st.count, 10) + `}`), true
		},
		restoreState: restoreCounter,
	}
}

// counterOf returns a counter session's state. A session restored by a
// stateless checkpoint has none until it is seeded again. Called with
// sess.mu held.
func counterOf(sess *session) (*counterState, error) {
	st, ok := sess.state.(*counterState)
	if !ok {
		return nil, apierror.New(apierror.UnknownSession, "session %q has no counter state: seed it first", sess.id)
	}
	return st, nil
}

// restoreCounter validates a saved counter state, {"count": <integer>}.
func restoreCounter(raw codec.RawMessage) (any, error) {
	var in struct {
		Count codec.RawMessage `json:"count"`
	}
	if err := codec.UnmarshalStrict(raw, &in); err != nil {
		return nil, fmt.Errorf("invalid counter state %.60s: %s", raw, codec.DescribeError(err))
	}
	n, present, err := parseInt(in.Count)
	if err != nil || !present {
		return nil, fmt.Errorf("invalid counter state %.60s: count must be an integer", raw)
	}
	return &counterState{count: n}, nil
}

// decodeArgs decodes a tool's arguments object; an empty body is {}.
func decodeArgs(args []byte, v any) error {
	args = bytes.TrimSpace(args)
	if len(args) == 0 {
		return nil
	}
	if args[0] != '{' {
		return apierror.New(apierror.InvalidRequest, "tool arguments must be a JSON object")
	}
	if err := codec.Unmarshal(args, v); err != nil {
		return apierror.New(apierror.InvalidRequest, "tool arguments: %s", codec.DescribeError(err))
	}
	return nil
}

// maxExactFloat is the largest integer a float64 holds exactly.
const maxExactFloat = 1 << 53

// parseInt reads a JSON integer. A missing or null value is not present; an
// integral number written with a fraction or exponent (3.0, 1e2) counts.
func parseInt(raw codec.RawMessage) (n int64, present bool, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return 0, false, nil
	}
	if c := raw[0]; c != '-' && (c < '0' || c > '9') || !codec.Valid(raw) {
		return 0, true, fmt.Errorf("expected an integer, got %.40s", raw)
	}
	if n, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		return n, true, nil
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) > maxExactFloat {
		return 0, true, fmt.Errorf("expected an integer, got %.40s", raw)
	}
	return int64(f), true, nil
}
