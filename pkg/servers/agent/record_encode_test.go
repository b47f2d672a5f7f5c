package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/ctlplane/ctlplanetest"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/openai"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// TestSessionRecordOutIsSessionRecord: Export encodes a record in one pass
// (sessionRecordOut, written by appendSessionRecord) with the bytes of
// sessionRecord holding the loop state's encoding, which Install decodes.
func TestSessionRecordOutIsSessionRecord(t *testing.T) {
	var resp openai.Response
	if err := codec.Unmarshal([]byte(`{"id":"resp_1","object":"response","created_at":1767225600,"model":"policy","output":[`+
		`{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"<Paris>\"}","status":"completed",`+
		`"prompt_token_ids":[1,2,3],"generation_token_ids":[4,5],"generation_log_probs":[-0.25,-1e-7]}],`+
		`"parallel_tool_calls":true,"tool_choice":"auto","tools":[],"temperature":1.0,"top_p":null,"status":"completed","incomplete_details":null,`+
		`"usage":{"input_tokens":3,"input_tokens_details":{"cached_tokens":0},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":5},`+
		`"error":null,"instructions":null,"metadata":{},"max_output_tokens":256}`), &resp); err != nil {
		t.Fatal(err)
	}
	st := LoopState{
		Step: 1, NewOutputs: append(resp.Output, openai.Item{Type: openai.ItemFunctionCallOutput, CallID: "call_1", Output: openai.TextContent(`{"city":"<Paris>","weather_description":"sunny & \u2028 mild"}`)}),
		Usage: resp.Usage, LastModelResponse: &resp, ModelCalls: 1,
		Turns:       []Turn{{Step: 1, ResponseID: "resp_1", Status: "completed", OutputItems: 1, FunctionCalls: 1}},
		ToolRecords: []ToolRecord{{Step: 1, CallID: "call_1", Name: "get_weather", Status: 200}},
	}
	usage := openai.ResponseUsage{InputTokens: 7}
	session := sessionState{
		Request: codec.RawMessage(`{"responses_create_params":{"input":"x"}}`), ResourcesSessionID: "rs-1", Activations: 1,
		CompletedReply: jsonNull, Observations: Observations{Usage: &usage, ResourcesSessionID: "rs-1"},
	}
	id := rollout.EpisodeID{RolloutID: "r", Attempt: 2}
	for _, loop := range []*LoopState{&st, nil} {
		boundary := jsonNull
		if loop != nil {
			b, err := codec.Marshal(*loop)
			if err != nil {
				t.Fatal(err)
			}
			boundary = b
		}
		want, err := codec.Marshal(sessionRecord{Type: recordSession, EpisodeID: id, SessionID: "s-1", Session: session, Boundary: boundary})
		if err != nil {
			t.Fatal(err)
		}
		got, err := codec.Marshal(&sessionRecordOut{Type: recordSession, EpisodeID: id, SessionID: "s-1", Session: session, Boundary: loop})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("one-pass encoding\n %s\nsessionRecord's\n %s", got, want)
		}
		appended, err := appendSessionRecord(nil, &sessionRecordOut{Type: recordSession, EpisodeID: id, SessionID: "s-1", Session: session, Boundary: loop}, nil)
		if err != nil || !bytes.Equal(appended, want) {
			t.Fatalf("appendSessionRecord's encoding (%v)\n %s\nsessionRecord's\n %s", err, appended, want)
		}
		if _, err := decodeSessionRecord(ctlplane.Record{EpisodeID: id, Data: appended}, nil); err != nil {
			t.Fatalf("Install refuses the record: %v", err)
		}
	}
}

// realisticLoopState is an activation at its second model call after one
// get_weather round, as the loop builds it from a model reply with token
// fields.
func realisticLoopState(tb testing.TB) LoopState {
	tb.Helper()
	var resp openai.Response
	if err := codec.Unmarshal([]byte(`{"id":"resp_1","object":"response","created_at":1767225600,"model":"policy","output":[`+
		`{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"<Paris>\"}","status":"completed",`+
		`"prompt_token_ids":[1,2,3],"generation_token_ids":[4,5],"generation_log_probs":[-0.25,-1e-7]}],`+
		`"parallel_tool_calls":true,"tool_choice":"auto","tools":[{"type":"function","name":"get_weather","description":"Get the weather.","strict":true,"parameters":{"type":"object","properties":{"city":{"type":"string"}}}}],"temperature":1.0,"top_p":null,"status":"completed","incomplete_details":null,`+
		`"usage":{"input_tokens":3,"input_tokens_details":{"cached_tokens":0},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":5},`+
		`"error":null,"instructions":null,"metadata":{},"max_output_tokens":256}`), &resp); err != nil {
		tb.Fatal(err)
	}
	last := resp
	last.Output = nil
	return LoopState{
		Step: 1, NewOutputs: append(resp.Output, openai.Item{Type: openai.ItemFunctionCallOutput, CallID: "call_1", Output: openai.TextContent(`{"city":"<Paris>","weather_description":"sunny & ` + "\u2028" + ` mild"}`)}),
		Usage: resp.Usage, LastModelResponse: &last, ModelCalls: 1,
		Turns:       []Turn{{Step: 1, ResponseID: "resp_1", Status: "completed", OutputItems: 1, FunctionCalls: 1}},
		ToolRecords: []ToolRecord{{Step: 1, CallID: "call_1", Name: "get_weather", Status: 200}},
	}
}

// realisticSession is a session's state as Export copies it out.
func realisticSession() sessionState {
	usage := openai.ResponseUsage{InputTokens: 7}
	return sessionState{
		Request:            codec.RawMessage(`{"responses_create_params":{"input":"What is the weather in Paris?","instructions":"Answer in one short sentence."}}`),
		ResourcesSessionID: "rs-1", Activations: 1, CompletedReply: jsonNull,
		Observations: Observations{Usage: &usage, ResourcesSessionID: "rs-1"},
	}
}

// checkAppendSessionRecord checks appendSessionRecord against
// codec.Marshal, the encoder it replaces: the same bytes, after what dst
// held, or an error where codec.Marshal has one.
func checkAppendSessionRecord(t *testing.T, rec *sessionRecordOut) {
	t.Helper()
	want, werr := codec.Marshal(rec)
	prefix := []byte("held:")
	got, gerr := appendSessionRecord(prefix, rec, nil)
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("errors differ: codec.Marshal %v, appendSessionRecord %v", werr, gerr)
	}
	if werr != nil {
		return
	}
	if !bytes.HasPrefix(got, prefix) || !bytes.Equal(got[len(prefix):], want) {
		t.Fatalf("appendSessionRecord wrote\n %s\ncodec.Marshal\n %s", got, want)
	}
}

// spliceBoundary is how Export wrote a restored session's record before
// appendSessionRecord: the restored bytes, as they are, in place of the
// null boundary that ends the record encoded without a loop state.
func spliceBoundary(data []byte, boundary codec.RawMessage) ([]byte, bool) {
	head, ok := bytes.CutSuffix(data, []byte(`"boundary":null}`))
	if !ok {
		return nil, false
	}
	return append(append(append(head, `"boundary":`...), boundary...), '}'), true
}

// checkAppendRestored checks that a record without a loop state carries
// restored as its boundary byte for byte, as the splice did.
func checkAppendRestored(t *testing.T, rec *sessionRecordOut, restored codec.RawMessage) {
	t.Helper()
	data, err := codec.Marshal(rec)
	if err != nil {
		return
	}
	want, ok := spliceBoundary(data, restored)
	if !ok {
		t.Fatalf("codec.Marshal's record does not end with a null boundary: %s", data)
	}
	got, err := appendSessionRecord(nil, rec, restored)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("restored record\n %s (%v)\nspliced\n %s", got, err, want)
	}
}

func TestAppendSessionRecord_MatchesMarshal(t *testing.T) {
	tricky := "<a href=\"x\">&amp;</a> \u2028\u2029 \x01\b\f\n\r\t \\ \xff\xe2\x80 é😀 ’"
	id := rollout.EpisodeID{RolloutID: "rollout-000001", Attempt: 2}
	base := func() sessionRecordOut {
		st := realisticLoopState(t)
		return sessionRecordOut{Type: recordSession, EpisodeID: id, SessionID: "s-1", Session: realisticSession(), Boundary: &st}
	}
	ptr := func(f float64) *float64 { return &f }
	num := func(n int) *int { return &n }
	yes, no := true, false
	cases := map[string]func(r *sessionRecordOut){
		"realistic": func(*sessionRecordOut) {},
		"no loop state": func(r *sessionRecordOut) {
			r.Boundary = nil
		},
		"zero loop state": func(r *sessionRecordOut) {
			r.Boundary = &LoopState{}
		},
		"empty slices and maps": func(r *sessionRecordOut) {
			r.Boundary.NewOutputs, r.Boundary.Turns, r.Boundary.ToolRecords = []openai.Item{}, []Turn{}, []ToolRecord{}
			r.Boundary.LastModelResponse.Output, r.Boundary.LastModelResponse.Tools = []openai.Item{}, []openai.Tool{}
			r.Boundary.LastModelResponse.Metadata = map[string]string{}
		},
		"nil everything": func(r *sessionRecordOut) {
			r.Session = sessionState{}
			*r.Boundary = LoopState{Step: -3, PendingTools: true, LastModelResponse: &openai.Response{}, ModelCalls: math.MaxInt}
		},
		"tricky strings": func(r *sessionRecordOut) {
			r.Type, r.SessionID, r.EpisodeID.RolloutID = tricky, tricky, tricky
			r.Session.ResourcesSessionID, r.Session.Observations.ResourcesSessionID = tricky, tricky
			r.Session.ResourcesCookies = tricky
			r.Boundary.Turns = append(r.Boundary.Turns, Turn{Step: 2, ResponseID: tricky, Status: tricky, OutputItems: -1})
			r.Boundary.ToolRecords = append(r.Boundary.ToolRecords, ToolRecord{Step: math.MinInt, CallID: tricky, Name: tricky})
			resp := r.Boundary.LastModelResponse
			resp.ID, resp.Object, resp.Model, resp.Status, resp.Instructions = tricky, tricky, tricky, tricky, &tricky
			resp.Metadata = map[string]string{"z": tricky, tricky: "a", "a<": "&", "\xfe": "invalid", "\u2028": ""}
			resp.IncompleteDetails = &openai.IncompleteDetails{Reason: tricky}
			resp.Tools = append(resp.Tools, openai.Tool{Type: tricky, Name: tricky, Description: tricky, Strict: &no})
		},
		"raw values that are not compact": func(r *sessionRecordOut) {
			r.Session.Request = codec.RawMessage(" {\n\t\"input\" : [ \"<b> & \u2028\" , 1.50, true, null ] ,\"x\":{ }} ")
			r.Session.CompletedReply = codec.RawMessage(`{"id":"resp_9","output":[],"escaped":"\u003c\"\\/"}`)
			resp := r.Boundary.LastModelResponse
			resp.ToolChoice = codec.RawMessage(` { "type" : "function", "name" : "get_weather" } `)
			resp.Error = codec.RawMessage(`{"code":"server_error","message":"a & b"}`)
			resp.Tools = append(resp.Tools, openai.Tool{Type: "function", Name: "f", Parameters: codec.RawMessage("{ \"a\" :\"\u2029\" }"), Strict: &yes})
		},
		"resources cookies": func(r *sessionRecordOut) {
			r.Session.ResourcesCookies = `CounterResourcesServer___counter=rs-1; SimpleAgent___a="eyJ4IjogMX0=.aB.Zk"`
		},
		"raw values that are compact": func(r *sessionRecordOut) {
			r.Session.Request = codec.RawMessage(`{"a":"spaces inside strings stay","b":"’…—","c":"\u2028 as an escape"}`)
			r.Boundary.LastModelResponse.ToolChoice = codec.RawMessage(`"required"`)
		},
		"numbers": func(r *sessionRecordOut) {
			resp := r.Boundary.LastModelResponse
			resp.CreatedAt, resp.Temperature, resp.TopP, resp.MaxOutputTokens = -1e21, ptr(1e-7), ptr(1e21), num(-1)
			r.Boundary.Usage = &openai.ResponseUsage{InputTokens: math.MaxInt, TotalTokens: -5,
				InputTokensDetails: openai.InputTokensDetails{CachedTokens: num(0)}}
			r.Session.Observations.Usage = nil
			r.EpisodeID.Attempt = math.MaxInt
		},
		"every item type": func(r *sessionRecordOut) {
			secret := "enc<>"
			r.Boundary.NewOutputs = append(r.Boundary.NewOutputs,
				openai.Item{Role: "user", Content: openai.TextContent(tricky)},
				openai.Item{Type: openai.ItemReasoning, ID: "rs_1", Summary: []openai.SummaryText{{Type: "summary_text", Text: tricky}}, EncryptedContent: &secret},
				openai.Item{Type: openai.ItemMessage, Role: "assistant", ID: "msg_1", Status: "completed", Content: &openai.MessageContent{IsParts: true, Parts: []openai.ContentPart{
					openai.OutputText(tricky),
					{Type: "output_text", Text: "t", Annotations: []any{map[string]any{"url": "<x>", "b": 1.5}}, Logprobs: codec.RawMessage(` [ {"token" : "<" } ] `)},
					{Type: "input_image", ImageURL: codec.RawMessage(`{"url": "u&v"}`), Detail: "low"},
				}}, TokenFields: openai.TokenFields{PromptTokenIDs: []int{1}, GenerationTokenIDs: []int{2, 3}, GenerationLogProbs: []float64{-1e-7, -0.5}}},
				openai.Item{Type: openai.ItemFunctionCallOutput, CallID: "c", Output: &openai.MessageContent{IsParts: true, Parts: []openai.ContentPart{{Type: "input_text", Text: tricky}}}},
				openai.Item{Type: "mcp_call"},
			)
		},
		"invalid raw value": func(r *sessionRecordOut) {
			r.Boundary.LastModelResponse.Error = codec.RawMessage(`{"code":`)
		},
		"empty raw value": func(r *sessionRecordOut) {
			r.Session.CompletedReply = codec.RawMessage{}
		},
		"NaN temperature": func(r *sessionRecordOut) {
			r.Boundary.LastModelResponse.Temperature = ptr(math.NaN())
		},
		"infinite log-prob": func(r *sessionRecordOut) {
			r.Boundary.NewOutputs[0].GenerationLogProbs = []float64{math.Inf(-1)}
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			rec := base()
			mutate(&rec)
			checkAppendSessionRecord(t, &rec)
		})
	}
	t.Run("restored", func(t *testing.T) {
		rec := base()
		loop, err := codec.Marshal(rec.Boundary)
		if err != nil {
			t.Fatal(err)
		}
		rec.Boundary = nil
		for _, restored := range []codec.RawMessage{loop, codec.RawMessage(`{ "step" : 0, "usage":"many" }`), codec.RawMessage(`null`)} {
			checkAppendRestored(t, &rec, restored)
		}
	})
}

// TestSessionRecordEncoder_KnowsEveryField: appendSessionRecord writes each
// field of these structs by hand; one added to a struct must be added
// there too, or records lose it. (The differential tests catch it as well,
// but only for a field their records set.)
func TestSessionRecordEncoder_KnowsEveryField(t *testing.T) {
	for _, c := range []struct {
		typ    reflect.Type
		fields int
	}{
		{reflect.TypeFor[sessionRecordOut](), 5},
		{reflect.TypeFor[rollout.EpisodeID](), 2},
		{reflect.TypeFor[sessionState](), 7},
		{reflect.TypeFor[Observations](), 6},
		{reflect.TypeFor[LoopState](), 8},
		{reflect.TypeFor[Turn](), 5},
		{reflect.TypeFor[ToolRecord](), 4},
	} {
		if got := c.typ.NumField(); got != c.fields {
			t.Errorf("%v has %d fields but record_encode.go writes %d: write the new field in its appender there (appendSessionRecord and the functions it calls), check it with TestAppendSessionRecord_MatchesMarshal, then update this count",
				c.typ, got, c.fields)
		}
	}
	// sessionRecord is what Install decodes: Export's records must keep
	// its fields.
	if got, want := reflect.TypeFor[sessionRecord]().NumField(), reflect.TypeFor[sessionRecordOut]().NumField(); got != want {
		t.Errorf("sessionRecord has %d fields, sessionRecordOut %d: Export must write every field Install reads", got, want)
	}
}

// fuzzRecord builds a session record from fuzzed values: every string field
// holds s (or a variant), every raw field raw, every integer n, every float
// f, and each bit of shape picks nil, empty or set for one slice, map or
// pointer.
func fuzzRecord(s string, raw []byte, n int64, f float64, shape uint64) sessionRecordOut {
	bit := func(i uint) bool { return shape&(1<<i) != 0 }
	str := func(i uint) string {
		if bit(i) {
			return s + "<&>\u2028"
		}
		return s
	}
	rawOr := func(i uint) codec.RawMessage {
		switch {
		case !bit(i):
			return nil
		case bit(i + 1):
			return codec.RawMessage(`{"k": "` + s + `" }`)
		}
		return codec.RawMessage(raw)
	}
	k := int(n)
	items := []openai.Item{
		{Type: openai.ItemFunctionCall, ID: str(0), CallID: s, Name: str(1), Arguments: s, Status: str(2),
			TokenFields: openai.TokenFields{PromptTokenIDs: []int{k, -k, 0}, GenerationTokenIDs: []int{k}, GenerationLogProbs: []float64{f, -f}}},
		{Type: openai.ItemFunctionCallOutput, CallID: s, Output: openai.TextContent(s)},
		{Role: s, Content: &openai.MessageContent{IsParts: true, Parts: []openai.ContentPart{
			{Type: "output_text", Text: s, Logprobs: rawOr(3)}, {Type: s, Text: str(5), ImageURL: rawOr(6)},
		}}},
		{Type: openai.ItemReasoning, Summary: []openai.SummaryText{{Type: s, Text: s}}, EncryptedContent: &s},
	}
	resp := &openai.Response{
		ID: s, Object: str(8), CreatedAt: float64(n), Model: s, ParallelToolCalls: bit(9), ToolChoice: rawOr(10),
		Status: str(12), Error: rawOr(13), MaxOutputTokens: &k,
	}
	if bit(15) {
		resp.Output = items[:shape%uint64(len(items)+1)]
	}
	if bit(16) {
		strict := bit(17)
		resp.Tools = []openai.Tool{{Type: s, Name: str(18), Description: s, Parameters: rawOr(19), Strict: &strict}, {Type: s}}
	}
	if bit(21) {
		resp.Temperature, resp.TopP = &f, &f
	}
	if bit(22) {
		resp.IncompleteDetails, resp.Instructions = &openai.IncompleteDetails{Reason: s}, &s
	}
	if bit(23) {
		resp.Metadata = map[string]string{s: s, str(24): "x", "a": str(25)}
	} else if bit(24) {
		resp.Metadata = map[string]string{}
	}
	usage := &openai.ResponseUsage{InputTokens: k, OutputTokens: -k, TotalTokens: k}
	if bit(26) {
		usage.InputTokensDetails.CachedTokens, usage.OutputTokensDetails.ReasoningTokens = &k, &k
	}
	if bit(27) {
		resp.Usage = usage
	}
	st := &LoopState{Step: k, PendingTools: bit(28), ModelCalls: -k}
	if bit(29) {
		st.NewOutputs = items
	} else if bit(30) {
		st.NewOutputs = []openai.Item{}
	}
	if bit(31) {
		st.Usage = usage
	}
	if bit(32) {
		st.LastModelResponse = resp
	}
	if bit(33) {
		st.Turns = []Turn{{Step: k, ResponseID: s, Status: str(34), OutputItems: k, FunctionCalls: -k}}
	} else if bit(34) {
		st.Turns = []Turn{}
	}
	if bit(35) {
		st.ToolRecords = []ToolRecord{{Step: k, CallID: s, Name: str(36), Status: k}, {}}
	} else if bit(36) {
		st.ToolRecords = []ToolRecord{}
	}
	rec := sessionRecordOut{
		Type: str(37), EpisodeID: rollout.EpisodeID{RolloutID: s, Attempt: k}, SessionID: str(38),
		Session: sessionState{
			Request: rawOr(39), ResourcesSessionID: s, ResourcesCookies: str(46), Activations: k, CompletedActivation: -k, CompletedReply: rawOr(41),
			Observations: Observations{Activations: k, Steps: k, ModelCalls: k, ToolCalls: k, ResourcesSessionID: str(43)},
		},
	}
	if bit(44) {
		rec.Session.Observations.Usage = usage
	}
	if bit(45) {
		rec.Boundary = st
	}
	return rec
}

// FuzzAppendSessionRecord: a record of any strings (invalid UTF-8, <, >,
// &, U+2028), raw values (valid or not, compact or not), numbers (NaN,
// infinities) and nil, empty or set slices, maps and pointers encodes as
// codec.Marshal encodes it, or fails where it fails.
func FuzzAppendSessionRecord(f *testing.F) {
	for _, s := range []string{"", "plain", "<a href=\"x\">&amp;</a>", "\u2028\u2029", "\x00\x01\b\f\n\r\t\x1f\x7f", "\xff\xfe", "é😀\\\"’", "\xe2\x80"} {
		f.Add(s, []byte(`{"a" : [1, "<&>"] }`), int64(7), 0.5, uint64(0))
		f.Add(s, []byte(`"auto"`), int64(-1)<<40, -1e-7, ^uint64(0))
	}
	for _, v := range []float64{1e21, 1e20, math.SmallestNonzeroFloat64, math.MaxFloat64, math.Copysign(0, -1), math.NaN(), math.Inf(1)} {
		f.Add("x", []byte(`null`), int64(math.MaxInt64), v, uint64(0xAAAA_AAAA_AAAA_AAAA))
	}
	f.Add("x", []byte(`{`), int64(0), 1.0, uint64(0x5555_5555_5555_5555))
	f.Add("x", []byte{}, int64(0), 1.0, ^uint64(0))
	f.Add("x", []byte("\"\u2028\xff\""), int64(0), 1.0, ^uint64(0))
	f.Fuzz(func(t *testing.T, s string, raw []byte, n int64, v float64, shape uint64) {
		rec := fuzzRecord(s, raw, n, v, shape)
		checkAppendSessionRecord(t, &rec)
		if rec.Boundary == nil && raw != nil {
			checkAppendRestored(t, &rec, raw)
		}
	})
}

// FuzzAppendSessionRecordJSON: any record Export could hold, as decoded
// from JSON, encodes as codec.Marshal encodes it.
func FuzzAppendSessionRecordJSON(f *testing.F) {
	st := realisticLoopState(f)
	for _, rec := range []sessionRecordOut{
		{Type: recordSession, EpisodeID: rollout.EpisodeID{RolloutID: "r", Attempt: 1}, SessionID: "s", Session: realisticSession(), Boundary: &st},
		{Type: recordSession, Session: realisticSession()},
	} {
		data, err := codec.Marshal(&rec)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"session":{"request":{"a" : "\u003c"}},"boundary":{"new_outputs":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"x","annotations":[{"u":"\u2028"}],"logprobs":[]}]}],"last_model_response":{"metadata":{"b":"1","a":"\ud800"},"tools":[{"type":"function","name":"f","parameters":{ }}],"tool_choice":{"type": "function"},"temperature":1e-300}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var rec sessionRecordOut
		if codec.Unmarshal(data, &rec) != nil {
			return
		}
		checkAppendSessionRecord(t, &rec)
	})
}

// TestExport_ReusesBuffersAcrossWindows: across windows whose slots are
// reused, some records outgrowing their slot's room, every record emit
// sees is its own session's, as codec.Marshal encodes it (a restored
// session's with its boundary as the checkpoint held it), in order.
func TestExport_ReusesBuffersAcrossWindows(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Checkpoint = ctlplanetest.Config()
	srv, err := New(cfg, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	ids := ctlplanetest.EpisodeIDs(2*encodeWindow + 3)
	want := make([][]byte, len(ids))
	for i, id := range ids {
		sessionID := fmt.Sprintf("session-%06d", i)
		request := codec.RawMessage(fmt.Sprintf(`{"row": %d, "note": "<%d>"}`, i, i))
		rec := sessionRecordOut{Type: recordSession, EpisodeID: id, SessionID: sessionID, Session: sessionState{
			Request: request, ResourcesSessionID: "rs", Activations: 1, CompletedReply: jsonNull,
			Observations: Observations{ResourcesSessionID: "rs"},
		}}
		if i%7 == 3 {
			// A restored session nothing has continued yet.
			restored := codec.RawMessage(fmt.Sprintf(`{ "step" : %d }`, i))
			srv.mu.Lock()
			srv.addSessionLocked(&session{
				id: sessionID, episode: id, resourcesSessionID: "rs", request: request, activations: 1,
				observations: Observations{ResourcesSessionID: "rs"}, restoredLoop: &restoredLoop{raw: restored}, restored: true,
			})
			srv.mu.Unlock()
			data, err := codec.Marshal(&rec)
			if err != nil {
				t.Fatal(err)
			}
			want[i], _ = spliceBoundary(data, restored)
			continue
		}
		st := realisticLoopState(t)
		st.Step, st.Turns[0].ResponseID = i, fmt.Sprintf("resp_%d", i)
		if i%10 == 0 {
			// A record that outgrows its slot's room.
			st.NewOutputs = append(st.NewOutputs, openai.Item{Role: "user", Content: openai.TextContent(strings.Repeat("long ", recordSizeHint))})
		}
		if err := StartHeldActivation(context.Background(), srv, id, sessionID, "rs", request, &st); err != nil {
			t.Fatal(err)
		}
		rec.Boundary = &st
		if want[i], err = codec.Marshal(&rec); err != nil {
			t.Fatal(err)
		}
		if i%5 == 1 {
			// The loop moves on after its boundary; the record holds the
			// state at the boundary.
			st.Step++
			st.NewOutputs = append(st.NewOutputs, openai.Item{Role: "user", Content: openai.TextContent("after the boundary")})
		}
	}
	n := 0
	_, err = participant{srv}.Export(context.Background(), ctlplane.NewScope(ids), func(r ctlplane.Record) error {
		if n >= len(ids) || r.EpisodeID != ids[n] || !bytes.Equal(r.Data, want[n]) {
			t.Fatalf("record %d for %s:\n %s\nwant\n %s", n, r.EpisodeID, r.Data, want[min(n, len(want)-1)])
		}
		n++
		return nil
	})
	if err != nil || n != len(ids) {
		t.Fatalf("Export emitted %d of %d records: %v", n, len(ids), err)
	}

	// An emit that fails stops the export there, while the next window is
	// being encoded (the race detector sees the slots).
	errFull := errors.New("disk full")
	n = 0
	_, err = participant{srv}.Export(context.Background(), ctlplane.NewScope(ids), func(ctlplane.Record) error {
		n++
		if n == encodeWindow+5 {
			return errFull
		}
		return nil
	})
	if !errors.Is(err, errFull) || n != encodeWindow+5 {
		t.Fatalf("Export with a failing emit: %d records emitted, %v", n, err)
	}

	// A loop state JSON cannot hold (an infinite log-prob) fails the export,
	// naming its session, though it was met at the boundary.
	st := realisticLoopState(t)
	st.NewOutputs[0].GenerationLogProbs = codec.Floats{math.Inf(-1)}
	bad := rollout.EpisodeID{RolloutID: "unencodable"}
	if err := StartHeldActivation(context.Background(), srv, bad, "session-unencodable", "rs", codec.RawMessage(`{}`), &st); err != nil {
		t.Fatal(err)
	}
	_, err = participant{srv}.Export(context.Background(), ctlplane.NewScope(append(slices.Clone(ids), bad)), func(ctlplane.Record) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "session-unencodable") {
		t.Fatalf("Export of a loop state with an infinite log-prob: %v, want an error naming the session", err)
	}
}
