package fiwire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// MaxScriptToolRounds bounds a script's tool rounds and tool calls.
const MaxScriptToolRounds = 1000

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

// Script scripts the fake policy. Each field overrides only its own part of
// the default policy:
//   - ToolCalls, when present, are the rounds (round k calls ToolCalls[k];
//     rounds past the list repeat its last entry);
//   - ToolRounds, when present, is the number of rounds (default: the length
//     of ToolCalls, or of the rounds read from the user's text);
//   - FinalText, when not empty, is the final answer.
//
// The fields after those script how a reply fails or what it carries
// besides the message (faults.go):
//   - StreamError fails the call after some tokens, as vLLM fails a
//     generation mid-stream;
//   - TruncateStream ends a stream with [DONE] and no finish_reason;
//   - RoutedExperts is a routed_experts value (a string, a
//     [tokens][layers][topk] list, or {layers, topk, experts} to generate
//     one row per prompt and generated token), placed per RoutedExpertsIn
//     ("message", the default; "choice"; or "both");
//   - TokensPerSecond, when above 0, paces this call's generation instead
//     of the server's tokens_per_second (a slow generation, for a client's
//     timeout).
type Script struct {
	ToolRounds *int             `json:"tool_rounds,omitempty"`
	ToolCalls  []ScriptToolCall `json:"tool_calls,omitempty"`
	FinalText  string           `json:"final_text,omitempty"`

	StreamError     *ScriptStreamError `json:"stream_error,omitempty"`
	TruncateStream  *ScriptTruncate    `json:"truncate_stream,omitempty"`
	RoutedExperts   codec.RawMessage   `json:"routed_experts,omitempty"`
	RoutedExpertsIn string             `json:"routed_experts_in,omitempty"`

	TokensPerSecond float64 `json:"tokens_per_second,omitempty"`
}

// MinScriptTokensPerSecond is the slowest pace a script may ask for, so a
// scripted call still ends within minutes.
const MinScriptTokensPerSecond = 0.1

// ScriptToolCall is one scripted tool call. Arguments is a JSON object, or a
// JSON string holding one; absent means {}.
type ScriptToolCall struct {
	Name      string           `json:"name"`
	Arguments codec.RawMessage `json:"arguments,omitempty"`
}

// IsZero reports a script that sets nothing (the body {} clears the script).
func (s *Script) IsZero() bool {
	return s == nil || (s.ToolRounds == nil && s.ToolCalls == nil && s.FinalText == "" &&
		s.StreamError == nil && s.TruncateStream == nil && len(s.RoutedExperts) == 0 && s.RoutedExpertsIn == "" &&
		s.TokensPerSecond == 0)
}

// ParseScript decodes and normalises a script from JSON text. Unknown fields
// are refused, so a misspelt field never silently does nothing.
func ParseScript(text string) (*Script, error) {
	var s Script
	if err := codec.UnmarshalStrict([]byte(text), &s); err != nil {
		return nil, fmt.Errorf("script is not a valid script object: %s", codec.DescribeError(err))
	}
	if err := s.Normalize(); err != nil {
		return nil, err
	}
	return &s, nil
}

// Normalize validates the script and rewrites every tool call's arguments
// as compact JSON object text.
func (s *Script) Normalize() error {
	if s.ToolRounds != nil && (*s.ToolRounds < 0 || *s.ToolRounds > MaxScriptToolRounds) {
		return fmt.Errorf("tool_rounds must be in [0, %d], got %d", MaxScriptToolRounds, *s.ToolRounds)
	}
	if len(s.ToolCalls) > MaxScriptToolRounds {
		return fmt.Errorf("at most %d tool_calls", MaxScriptToolRounds)
	}
	for i := range s.ToolCalls {
		tc := &s.ToolCalls[i]
		if strings.TrimSpace(tc.Name) == "" || len(tc.Name) > 256 {
			return fmt.Errorf("tool_calls[%d].name must be 1 to 256 characters", i)
		}
		args, err := normalizeArguments(tc.Arguments)
		if err != nil {
			return fmt.Errorf("tool_calls[%d].arguments: %w", i, err)
		}
		tc.Arguments = codec.RawMessage(args)
	}
	return s.normalizeFaults()
}

func normalizeArguments(raw codec.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "{}", nil
	}
	if raw[0] == '"' {
		var inner string
		if err := json.Unmarshal(raw, &inner); err != nil {
			return "", errors.New("not a JSON string")
		}
		raw = bytes.TrimSpace([]byte(inner))
	}
	if len(raw) == 0 || raw[0] != '{' || !json.Valid(raw) {
		return "", errors.New("must be a JSON object (or a string holding one)")
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return "", err
	}
	return buf.String(), nil
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
	if tps := s.TokensPerSecond; tps != 0 && !(tps >= MinScriptTokensPerSecond && tps <= 1e9) {
		return fmt.Errorf("tokens_per_second must be 0 (the server's pace) or in [%v, 1e9], got %v", MinScriptTokensPerSecond, tps)
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
