// Package rewardprofile computes NeMo Gym's aggregate metrics: the reply of
// POST /aggregate_metrics, which Gym's rollout collection sends the verify
// replies of a run to once every row is done, and reads agent_metrics,
// key_metrics, group_level_metrics and repeat_level_metrics from.
//
// It ports compute_aggregate_metrics and the RewardProfiler it runs
// (nemo_gym/reward_profile.py of nemo-gym 0.7.0, the PyPI release) without
// Gym's benchmark hooks (compute_metrics, get_key_metrics,
// compute_repeat_metrics), which our servers do not override: per task
// index and over every reply, the mean, max, min, median and sample standard
// deviation of every numeric or boolean field of a verify reply and of its
// response.usage, as pandas computes them; per rollout index (a repeat) the
// same with percentiles and a t interval, and those repeats' means summarized
// across repeats; samples flagged mask_sample left out of the quality
// metrics and counted as coverage; and perf_summary from the replies'
// ng_perf. testdata/gym_cases.jsonl holds the replies Gym's own server gave.
package rewardprofile

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// Field names Gym's profiler reads.
const (
	fieldTaskIndex    = "_ng_task_index"
	fieldRolloutIndex = "_ng_rollout_index"
	fieldResponse     = "response"
	fieldUsage        = "usage"
	fieldReward       = "reward"
	fieldMaskSample   = "mask_sample"
	fieldPerf         = "ng_perf"
	// agentNameColumn is the profiler's own grouping column; a verify field
	// of that name would replace it in Gym (see compute).
	agentNameColumn = "agent_name"
)

// statNames are the statistics of RewardProfiler.describe_dataframe, in
// its order (its histograms are dropped by prepare_for_serialization).
func statNames() [5]string { return [...]string{"mean", "max", "min", "median", "std"} }

// Error is a request Gym's profiler cannot compute: Gym answers it with a
// 500 (or 422 from its request model); our servers with 400 invalid_request.
type Error struct{ msg string }

func (e *Error) Error() string { return e.msg }

func errorf(format string, a ...any) error { return &Error{msg: fmt.Sprintf(format, a...)} }

// Request is the body of POST /aggregate_metrics (Gym's
// AggregateMetricsRequest, nemo_gym/config_types.py): the verify replies of
// a run, stripped of response (but its usage), responses_create_params and
// trajectories, as rollout_collection.py _call_aggregate_metrics sends them.
type Request struct {
	VerifyResponses *[]codec.RawMessage `json:"verify_responses"`
}

// DecodeRequest decodes and checks a request body.
func DecodeRequest(body []byte) ([]codec.RawMessage, error) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, errorf("the body must be a JSON object {\"verify_responses\": [...]}")
	}
	var req Request
	if err := codec.Unmarshal(trimmed, &req); err != nil {
		return nil, errorf("%s", codec.DescribeError(err))
	}
	if req.VerifyResponses == nil {
		return nil, errorf("verify_responses is required (a list of verify replies)")
	}
	for i, vr := range *req.VerifyResponses {
		if b := bytes.TrimSpace(vr); len(b) == 0 || b[0] != '{' {
			return nil, errorf("verify_responses[%d] must be a JSON object", i)
		}
	}
	return *req.VerifyResponses, nil
}

// Compute is compute_aggregate_metrics over the verify replies: the reply
// body {"group_level_metrics", "agent_metrics", "key_metrics",
// "perf_summary", "repeat_level_metrics"} as Gym's AggregateMetrics
// serialises it, every field present (empty lists and objects and a null
// perf_summary for no replies).
func Compute(verifyResponses []codec.RawMessage) (codec.RawMessage, error) {
	m, err := compute(verifyResponses)
	if err != nil {
		return nil, err
	}
	return m.appendJSON(nil)
}

// value is a JSON value of a verify reply as Python's json reads it: an
// int, a float, a bool, or anything else (kept as its bytes).
type value struct {
	kind kind
	i    int64
	f    float64
	raw  codec.RawMessage
}

type kind uint8

const (
	kindOther kind = iota
	kindInt
	kindFloat
	kindBool
)

// numeric reports whether Gym's profiler counts v (isinstance int or float,
// bools as 0 and 1), as a float and whether pandas keeps it an integer.
func (v value) numeric() (f float64, isInt, ok bool) {
	switch v.kind {
	case kindInt:
		return float64(v.i), true, true
	case kindBool:
		return float64(v.i), true, true
	case kindFloat:
		return v.f, false, true
	}
	return 0, false, false
}

// obj is a JSON object in key order, as a Python dict keeps it: a key
// repeated keeps its first place and its last value.
type obj struct {
	keys []string
	vals map[string]value
}

func (o *obj) set(k string, v value) {
	if o.vals == nil {
		o.vals = map[string]value{}
	}
	if _, ok := o.vals[k]; !ok {
		o.keys = append(o.keys, k)
	}
	o.vals[k] = v
}

// parseObject reads a JSON object's members in order.
func parseObject(raw []byte) (obj, error) {
	var o obj
	b := codec.SkipSpace(raw)
	if len(b) == 0 || b[0] != '{' {
		return o, errorf("not a JSON object")
	}
	b = codec.SkipSpace(b[1:])
	if len(b) > 0 && b[0] == '}' {
		return o, nil
	}
	for {
		keyRaw, rest, ok := codec.CutValue(b)
		if !ok {
			return o, errorf("malformed object")
		}
		var key string
		if err := codec.Unmarshal(keyRaw, &key); err != nil {
			return o, errorf("malformed object key")
		}
		rest = codec.SkipSpace(rest)
		if len(rest) == 0 || rest[0] != ':' {
			return o, errorf("malformed object")
		}
		valRaw, rest, ok := codec.CutValue(rest[1:])
		if !ok {
			return o, errorf("malformed object")
		}
		o.set(key, parseValue(valRaw))
		rest = codec.SkipSpace(rest)
		if len(rest) == 0 {
			return o, errorf("malformed object")
		}
		if rest[0] == '}' {
			return o, nil
		}
		if rest[0] != ',' {
			return o, errorf("malformed object")
		}
		b = codec.SkipSpace(rest[1:])
	}
}

// parseValue classifies a valid JSON value as Python's json.loads types it:
// a number with a fraction or exponent is a float, else an int (one beyond
// int64 is read as a float).
func parseValue(raw []byte) value {
	switch {
	case len(raw) == 0:
		return value{raw: raw}
	case string(raw) == "true":
		return value{kind: kindBool, i: 1, raw: raw}
	case string(raw) == "false":
		return value{kind: kindBool, i: 0, raw: raw}
	case raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9'):
		if !bytes.ContainsAny(raw, ".eE") {
			if n, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
				return value{kind: kindInt, i: n, raw: raw}
			}
		}
		if f, err := strconv.ParseFloat(string(raw), 64); err == nil && !math.IsInf(f, 0) {
			return value{kind: kindFloat, f: f, raw: raw}
		}
	}
	return value{raw: raw}
}

// reply is one verify reply as the profiler reads it.
type reply struct {
	task, rollout int64
	fields        obj
	usage         obj
	// masked is a truthy mask_sample: a completed rollout whose reward is
	// not a measurement (select_measured).
	masked bool
	// perf is the reply's ng_perf object, nil without one.
	perf *obj
}

// indexOf reads _ng_task_index or _ng_rollout_index, 0 when absent: Gym's
// profiler keys every reply by the two (reward_profile._rollout_key, which
// reads row.get(key, 0)).
func indexOf(o obj, name string, i int) (int64, error) {
	v, ok := o.vals[name]
	if !ok {
		return 0, nil
	}
	if v.kind != kindInt {
		return 0, errorf("verify_responses[%d].%s must be an integer, got %s", i, name, v.raw)
	}
	return v.i, nil
}

func parseReply(raw []byte, i int) (reply, error) {
	o, err := parseObject(raw)
	if err != nil {
		return reply{}, errorf("verify_responses[%d]: %v", i, err)
	}
	r := reply{fields: o}
	if r.task, err = indexOf(o, fieldTaskIndex, i); err != nil {
		return reply{}, err
	}
	if r.rollout, err = indexOf(o, fieldRolloutIndex, i); err != nil {
		return reply{}, err
	}
	if m, ok := o.vals[fieldMaskSample]; ok {
		r.masked = !falsy(m)
	}
	if p, ok := o.vals[fieldPerf]; ok {
		// compute_perf_summary takes ng_perf only when it is a dict.
		if po, err := parseObject(p.raw); err == nil {
			r.perf = &po
		}
	}
	if resp, ok := o.vals[fieldResponse]; ok && !falsy(resp) {
		// Gym reads (result.get("response") or {}).get("usage") or {}:
		// response must be an object or empty, and usage too.
		ro, err := parseObject(resp.raw)
		if err != nil {
			return reply{}, errorf("verify_responses[%d].response must be an object", i)
		}
		if u, ok := ro.vals[fieldUsage]; ok && !falsy(u) {
			if r.usage, err = parseObject(u.raw); err != nil {
				return reply{}, errorf("verify_responses[%d].response.usage must be an object", i)
			}
		}
	}
	return r, nil
}

// falsy is Python's truth test for the values `usage or {}` skips.
func falsy(v value) bool {
	switch v.kind {
	case kindInt, kindBool:
		return v.i == 0
	case kindFloat:
		return v.f == 0
	}
	switch string(bytes.TrimSpace(v.raw)) {
	case "null", `""`, "[]", "{}":
		return true
	}
	return false
}

// numericFields are the fields a reply puts in the profiler's frame, in
// order: the reply's, then its usage's (`result | usage`: usage wins a
// shared name, which keeps the reply's place), numbers and bools only, none
// whose name starts with an underscore (Gym's bookkeeping: the indexes,
// NeMo RL's _rowidx, the attempt index). mask_sample is no measurement
// (select_measured strips it).
func (r reply) numericFields(each func(name string, f float64, isInt bool)) {
	merged := obj{keys: slices.Clone(r.fields.keys), vals: make(map[string]value, len(r.fields.vals)+len(r.usage.vals))}
	for k, v := range r.fields.vals {
		merged.vals[k] = v
	}
	for _, k := range r.usage.keys {
		merged.set(k, r.usage.vals[k])
	}
	for _, k := range merged.keys {
		if strings.HasPrefix(k, "_") || k == fieldMaskSample {
			continue
		}
		if f, isInt, ok := merged.vals[k].numeric(); ok {
			each(k, f, isInt)
		}
	}
}
