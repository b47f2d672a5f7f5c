package fakeinference

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/gymfleet/gymfleet/pkg/codec"
)

// Limits of the failure and routed-experts fields of a Script.
const (
	// MaxRoutedExpertsBytes bounds a scripted routed_experts value.
	MaxRoutedExpertsBytes = 1 << 20
	// MaxGeneratedRoutes bounds layers*topk of generated routes, so a
	// generated value stays a few MB at the largest context.
	MaxGeneratedRoutes = 64
)

// Where routed_experts goes in a reply (Script.RoutedExpertsIn).
const (
	// RoutedExpertsInMessage puts it on choices[].message, where NeMo RL's
	// vLLM server puts it and NeMo Gym's vllm_model reads it
	// (attach_routed_experts_to_chat_response_choices in NeMo RL's
	// nemo_rl/models/generation/vllm/utils.py at 7ea279abfbeb;
	// responses_api_models/vllm_model/app.py in NeMo Gym at 07d6b0d07b22).
	RoutedExpertsInMessage = "message"
	// RoutedExpertsInChoice puts it on choices[], as upstream vLLM's
	// ChatCompletionResponseChoice has it (chat_completion/protocol.py,
	// vLLM commit 002032ee2b18e1f7bd924ec47b62504ba3866063).
	RoutedExpertsInChoice = "choice"
	// RoutedExpertsInBoth puts it in both places.
	RoutedExpertsInBoth = "both"
)

// ScriptStreamError makes a call fail after AfterTokens generated tokens
// (Script.StreamError). A streaming call sends those tokens, then vLLM's
// mid-stream error event {"error": {...}} and data: [DONE], with no
// finish_reason; a non-streaming call answers Code with the same error in
// vLLM's error body. Message, Type and Param default to vLLM's generation
// error: "Internal server error", the type of Code, null.
type ScriptStreamError struct {
	AfterTokens int    `json:"after_tokens"`
	Message     string `json:"message,omitempty"`
	Type        string `json:"type,omitempty"`
	Param       string `json:"param,omitempty"`
	// Code is the error's code, and the status of a non-streaming reply;
	// 0 means 500.
	Code int `json:"code,omitempty"`
}

// ScriptTruncate ends a streaming call after AfterTokens generated tokens
// with data: [DONE] and no finish_reason (Script.TruncateStream), as a
// stream cut short upstream looks. Non-streaming calls ignore it.
type ScriptTruncate struct {
	AfterTokens int `json:"after_tokens"`
}

// ScriptRoutedExperts generates routed_experts: one row per prompt and
// generated token, Layers rows of TopK expert ids below Experts, derived
// from the token ids, as NeMo RL's aligned [tokens, layers, topk] routes.
type ScriptRoutedExperts struct {
	Layers  int `json:"layers"`
	TopK    int `json:"topk"`
	Experts int `json:"experts"`
}

// callError is the failure a script asks of a call.
func (e *ScriptStreamError) callError() *RequestError {
	re := &RequestError{Status: e.Code, Type: e.Type, Message: e.Message, Param: e.Param}
	if re.Status == 0 {
		re.Status = http.StatusInternalServerError
	}
	if re.Message == "" {
		re.Message = "Internal server error"
	}
	return re
}

// normalizeFaults validates the failure and routed-experts fields.
func (s *Script) normalizeFaults() error {
	if e := s.StreamError; e != nil {
		if e.AfterTokens < 0 {
			return fmt.Errorf("stream_error.after_tokens must be >= 0, got %d", e.AfterTokens)
		}
		if e.Code != 0 && (e.Code < 400 || e.Code > 599) {
			return fmt.Errorf("stream_error.code must be an HTTP error status (400 to 599), got %d", e.Code)
		}
		if len(e.Message) > 4096 || len(e.Type) > 256 || len(e.Param) > 256 {
			return errors.New("stream_error.message is at most 4096 bytes, type and param at most 256")
		}
	}
	if t := s.TruncateStream; t != nil && t.AfterTokens < 0 {
		return fmt.Errorf("truncate_stream.after_tokens must be >= 0, got %d", t.AfterTokens)
	}
	if s.StreamError != nil && s.TruncateStream != nil {
		return errors.New("set stream_error or truncate_stream, not both")
	}
	switch s.RoutedExpertsIn {
	case "", RoutedExpertsInMessage, RoutedExpertsInChoice, RoutedExpertsInBoth:
	default:
		return fmt.Errorf("routed_experts_in must be %q, %q or %q, got %q", RoutedExpertsInMessage, RoutedExpertsInChoice, RoutedExpertsInBoth, s.RoutedExpertsIn)
	}
	raw := bytes.TrimSpace(s.RoutedExperts)
	if len(raw) == 0 || string(raw) == "null" {
		s.RoutedExperts = nil
		if s.RoutedExpertsIn != "" {
			return errors.New("routed_experts_in needs routed_experts")
		}
		return nil
	}
	if len(raw) > MaxRoutedExpertsBytes {
		return fmt.Errorf("routed_experts is at most %d bytes", MaxRoutedExpertsBytes)
	}
	var buf bytes.Buffer
	if err := codec.Compact(&buf, raw); err != nil {
		return fmt.Errorf("routed_experts is not JSON: %v", err)
	}
	s.RoutedExperts = codec.RawMessage(buf.Bytes())
	switch raw[0] {
	case '"':
		var str string
		if err := codec.Unmarshal(raw, &str); err != nil {
			return fmt.Errorf("routed_experts: %v", err)
		}
		return nil
	case '[':
		var routes [][][]int
		if err := codec.Unmarshal(raw, &routes); err != nil {
			return errors.New("routed_experts must be a string, a [tokens][layers][topk] list of integers, or {layers, topk, experts}")
		}
		return nil
	case '{':
		var g ScriptRoutedExperts
		if err := codec.UnmarshalStrict(raw, &g); err != nil {
			return fmt.Errorf("routed_experts: %s", codec.DescribeError(err))
		}
		if g.Layers < 1 || g.TopK < 1 || g.Layers*g.TopK > MaxGeneratedRoutes || g.Experts < g.TopK || g.Experts > 1<<15 {
			return fmt.Errorf("routed_experts {layers, topk, experts} needs layers, topk >= 1, layers*topk <= %d and topk <= experts <= 32768", MaxGeneratedRoutes)
		}
		return nil
	}
	return errors.New("routed_experts must be a string, a [tokens][layers][topk] list of integers, or {layers, topk, experts}")
}

// routedExperts is the routed_experts value of a reply whose prompt and
// generation are these ids: the scripted value, or routes generated from
// the ids.
func (s *Script) routedExperts(promptIDs []int, gen []genToken) codec.RawMessage {
	if s == nil || len(s.RoutedExperts) == 0 {
		return nil
	}
	if s.RoutedExperts[0] != '{' {
		return s.RoutedExperts
	}
	var g ScriptRoutedExperts
	if err := codec.Unmarshal(s.RoutedExperts, &g); err != nil {
		return nil // validated by Normalize
	}
	b := make([]byte, 0, (len(promptIDs)+len(gen))*(2+g.Layers*(2+g.TopK*6)))
	b = append(b, '[')
	row := func(i, id int) {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		for l := 0; l < g.Layers; l++ {
			if l > 0 {
				b = append(b, ',')
			}
			b = append(b, '[')
			for k := 0; k < g.TopK; k++ {
				if k > 0 {
					b = append(b, ',')
				}
				// TopK consecutive (so distinct) experts, from the token id.
				b = strconv.AppendInt(b, int64((id*7+l*3+k)%g.Experts), 10)
			}
			b = append(b, ']')
		}
		b = append(b, ']')
	}
	for i, id := range promptIDs {
		row(i, id)
	}
	for i, t := range gen {
		row(len(promptIDs)+i, t.id)
	}
	return codec.RawMessage(append(b, ']'))
}

// routedExpertsPlaces reports where the reply carries routed_experts.
func (s *Script) routedExpertsPlaces() (message, choice bool) {
	if s == nil || len(s.RoutedExperts) == 0 {
		return false, false
	}
	switch s.RoutedExpertsIn {
	case RoutedExpertsInChoice:
		return false, true
	case RoutedExpertsInBoth:
		return true, true
	}
	return true, false
}
