package agent

import (
	"strconv"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// The session record's encoder. Export writes one record per session, and
// a loop state is kilobytes of JSON: through codec.Marshal a record cost
// goccy's reflection, a scan of every item's MarshalJSON output, a copy of
// the whole record into a slice of its own, and the collection of all of
// it. appendSessionRecord writes the same bytes into a buffer the caller
// reuses, with the appenders of codec and openai.
//
// The bytes are codec.Marshal's for sessionRecordOut, byte for byte:
// record_encode_test.go checks it on realistic records and under fuzzing,
// and fails when a struct written here gains a field this file does not
// write.

// appendSessionRecord appends rec as codec.Marshal(rec) writes it. When
// rec has no loop state and restored is set, restored is the boundary as
// it is: a loop state encoded at its boundary (encodeBoundary), or as the
// checkpoint held it for a restored session nothing has continued yet,
// exported again without decoding it. On an error it returns no bytes.
func appendSessionRecord(b []byte, rec *sessionRecordOut, restored codec.RawMessage) ([]byte, error) {
	b = append(b, `{"episode_id":`...)
	b = appendEpisodeID(b, rec.EpisodeID)
	b = append(b, `,"type":`...)
	b = codec.AppendString(b, rec.Type)
	b = append(b, `,"session_id":`...)
	b = codec.AppendString(b, rec.SessionID)
	b = append(b, `,"session":`...)
	b, err := appendSessionState(b, &rec.Session)
	if err != nil {
		return nil, err
	}
	b = append(b, `,"boundary":`...)
	switch {
	case rec.Boundary != nil:
		if b, err = appendLoopState(b, rec.Boundary); err != nil {
			return nil, err
		}
	case restored != nil:
		b = append(b, restored...)
	default:
		b = append(b, "null"...)
	}
	return append(b, '}'), nil
}

func appendEpisodeID(b []byte, id rollout.EpisodeID) []byte {
	b = append(b, `{"rollout_id":`...)
	b = codec.AppendString(b, id.RolloutID)
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(id.Attempt), 10)
	return append(b, '}')
}

func appendSessionState(b []byte, st *sessionState) ([]byte, error) {
	var err error
	b = append(b, `{"request":`...)
	if b, err = codec.AppendRawMessage(b, st.Request); err != nil {
		return nil, err
	}
	b = append(b, `,"resources_session_id":`...)
	b = codec.AppendString(b, st.ResourcesSessionID)
	if st.ResourcesCookies != "" { // omitempty
		b = append(b, `,"resources_cookies":`...)
		b = codec.AppendString(b, st.ResourcesCookies)
	}
	b = append(b, `,"activations":`...)
	b = strconv.AppendInt(b, int64(st.Activations), 10)
	b = append(b, `,"completed_activation":`...)
	b = strconv.AppendInt(b, int64(st.CompletedActivation), 10)
	b = append(b, `,"completed_reply":`...)
	if b, err = codec.AppendRawMessage(b, st.CompletedReply); err != nil {
		return nil, err
	}
	b = append(b, `,"observations":`...)
	b = appendObservations(b, &st.Observations)
	return append(b, '}'), nil
}

func appendObservations(b []byte, o *Observations) []byte {
	b = append(b, `{"activations":`...)
	b = strconv.AppendInt(b, int64(o.Activations), 10)
	b = append(b, `,"steps":`...)
	b = strconv.AppendInt(b, int64(o.Steps), 10)
	b = append(b, `,"model_calls":`...)
	b = strconv.AppendInt(b, int64(o.ModelCalls), 10)
	b = append(b, `,"tool_calls":`...)
	b = strconv.AppendInt(b, int64(o.ToolCalls), 10)
	b = append(b, `,"usage":`...)
	b = appendUsage(b, o.Usage)
	b = append(b, `,"resources_session_id":`...)
	b = codec.AppendString(b, o.ResourcesSessionID)
	return append(b, '}')
}

func appendLoopState(b []byte, st *LoopState) ([]byte, error) {
	return appendLoopStateSpans(b, st, nil)
}

// appendLoopStateSpans is appendLoopState that, with spans not nil, also
// appends where each of st.NewOutputs starts and ends in b: two offsets
// per item.
func appendLoopStateSpans(b []byte, st *LoopState, spans *[]int) ([]byte, error) {
	var err error
	b = append(b, `{"step":`...)
	b = strconv.AppendInt(b, int64(st.Step), 10)
	b = append(b, `,"pending_tools":`...)
	b = strconv.AppendBool(b, st.PendingTools)
	b = append(b, `,"new_outputs":`...)
	if b, err = appendItems(b, st.NewOutputs, spans); err != nil {
		return nil, err
	}
	b = append(b, `,"usage":`...)
	b = appendUsage(b, st.Usage)
	b = append(b, `,"last_model_response":`...)
	if st.LastModelResponse == nil {
		b = append(b, "null"...)
	} else if b, err = st.LastModelResponse.AppendJSON(b); err != nil {
		return nil, err
	}
	b = append(b, `,"turns":`...)
	b = appendTurns(b, st.Turns)
	b = append(b, `,"tool_records":`...)
	b = appendToolRecords(b, st.ToolRecords)
	b = append(b, `,"model_calls":`...)
	b = strconv.AppendInt(b, int64(st.ModelCalls), 10)
	return append(b, '}'), nil
}

// appendItems appends items as a JSON array, null when nil, and with spans
// not nil where each item starts and ends in b.
func appendItems(b []byte, items []openai.Item, spans *[]int) ([]byte, error) {
	if items == nil {
		return append(b, "null"...), nil
	}
	b = append(b, '[')
	for i := range items {
		if i > 0 {
			b = append(b, ',')
		}
		start := len(b)
		var err error
		if b, err = items[i].AppendJSON(b); err != nil {
			return nil, err
		}
		if spans != nil {
			*spans = append(*spans, start, len(b))
		}
	}
	return append(b, ']'), nil
}

// appendUsage appends u, null when nil.
func appendUsage(b []byte, u *openai.ResponseUsage) []byte {
	if u == nil {
		return append(b, "null"...)
	}
	return u.AppendJSON(b)
}

// appendTurns appends turns as a JSON array, null when nil.
func appendTurns(b []byte, turns []Turn) []byte {
	if turns == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i := range turns {
		t := &turns[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"step":`...)
		b = strconv.AppendInt(b, int64(t.Step), 10)
		b = append(b, `,"response_id":`...)
		b = codec.AppendString(b, t.ResponseID)
		b = append(b, `,"status":`...)
		b = codec.AppendString(b, t.Status)
		b = append(b, `,"output_items":`...)
		b = strconv.AppendInt(b, int64(t.OutputItems), 10)
		b = append(b, `,"function_calls":`...)
		b = strconv.AppendInt(b, int64(t.FunctionCalls), 10)
		b = append(b, '}')
	}
	return append(b, ']')
}

// appendToolRecords appends records as a JSON array, null when nil.
func appendToolRecords(b []byte, records []ToolRecord) []byte {
	if records == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i := range records {
		r := &records[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"step":`...)
		b = strconv.AppendInt(b, int64(r.Step), 10)
		b = append(b, `,"call_id":`...)
		b = codec.AppendString(b, r.CallID)
		b = append(b, `,"name":`...)
		b = codec.AppendString(b, r.Name)
		b = append(b, `,"status":`...)
		b = strconv.AppendInt(b, int64(r.Status), 10)
		b = append(b, '}')
	}
	return append(b, ']')
}
