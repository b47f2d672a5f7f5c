package fiwire

import "time"

// HoldRequest is the body of POST /_ctl/hold; exactly one field is set.
//   - AfterCalls: every call after the first n received (since start or the
//     last reset) waits until released.
//   - AfterCallsPerRollout: per rollout id (attempts counted together), the
//     (n+1)-th and later calls wait. Calls that name no rollout never wait.
//
// A hold placed while another is active replaces the threshold and keeps the
// calls already waiting: one release frees them all.
type HoldRequest struct {
	AfterCalls           *int `json:"after_calls,omitempty"`
	AfterCallsPerRollout *int `json:"after_calls_per_rollout,omitempty"`
}

// HoldReply answers POST /_ctl/hold: the hold now active and how many calls
// wait.
type HoldReply struct {
	Hold HoldRequest `json:"hold"`
	Held int         `json:"held"`
}

// ReleaseRequest is the optional body of POST /_ctl/release. Calls k
// releases the k oldest held calls and keeps the hold; no body (or no
// calls) releases every held call and removes the hold.
type ReleaseRequest struct {
	Calls *int `json:"calls,omitempty"`
}

// ReleaseReply answers POST /_ctl/release.
type ReleaseReply struct {
	Released int `json:"released"`
}

// CallCount answers GET /_ctl/call_count, cheap enough to poll. Counted
// since start or the last reset; Received = Returned + Cut + Failed + Held +
// InFlight.
type CallCount struct {
	Received int `json:"received"`
	Returned int `json:"returned"`
	Failed   int `json:"failed"`
	Cut      int `json:"cut"`
	Held     int `json:"held"`
	InFlight int `json:"in_flight"`
}

// CallInfo is one entry of GET /_ctl/calls. CompletionTokens of a call
// still generating is the count produced so far.
type CallInfo struct {
	Index              int        `json:"index"`
	CallID             string     `json:"call_id"`
	CaptureKey         *string    `json:"capture_key"`
	RolloutID          *string    `json:"rollout_id"`
	Attempt            *int       `json:"attempt"`
	NMessages          int        `json:"n_messages"`
	Stream             bool       `json:"stream"`
	PromptTokens       int        `json:"prompt_tokens"`
	CompletionTokens   int        `json:"completion_tokens"`
	FinishReason       *string    `json:"finish_reason"`
	Status             string     `json:"status"`
	Held               bool       `json:"held"`
	ContinuedFrom      *string    `json:"continued_from"`
	ReusedPrefixTokens int        `json:"reused_prefix_tokens"`
	ReceivedAt         time.Time  `json:"received_at"`
	FinishedAt         *time.Time `json:"finished_at"`
	// Request is what the call asked for besides its messages.
	Request CallRequest `json:"request"`
}

// CallRequest is what a call asked for besides its messages: the
// parameters a proxy in front of the server sets or forwards, so a test
// can tell what reached the backend. Names are cut at MaxRecordedName
// bytes and tools at MaxRecordedTools, so a call's record stays small.
type CallRequest struct {
	Model string `json:"model"`
	// Tools names the function tools offered, in order.
	Tools []string `json:"tools"`
	// ToolChoice is "auto", "required", "none", "function:<name>", or ""
	// when the request had none.
	ToolChoice string `json:"tool_choice"`
	// MaxTokens is the limit vLLM reads: max_completion_tokens, else
	// max_tokens; nil when neither was sent.
	MaxTokens              *int     `json:"max_tokens"`
	Temperature            *float64 `json:"temperature"`
	TopP                   *float64 `json:"top_p"`
	Logprobs               bool     `json:"logprobs"`
	TopLogprobs            *int     `json:"top_logprobs"`
	ReturnTokenIDs         bool     `json:"return_token_ids"`
	ReturnTokensAsTokenIDs bool     `json:"return_tokens_as_token_ids"`
	IncludeUsage           bool     `json:"include_usage"`
}

// Bounds of a CallRequest.
const (
	MaxRecordedName  = 128
	MaxRecordedTools = 64
)

// CallsReply answers GET /_ctl/calls, in arrival order.
type CallsReply struct {
	Calls []CallInfo `json:"calls"`
}

// CutsReply answers GET /_ctl/cuts: per generation-cut request (that listed
// at least one call), the ids of the calls it cut with a durable prefix.
type CutsReply struct {
	Rounds [][]string `json:"rounds"`
}

// ScriptReply answers POST and GET /_ctl/script: the script every call
// without its own uses (null: the configured script, or none).
type ScriptReply struct {
	Script *Script `json:"script"`
}

// ResetReply answers POST /_ctl/reset.
type ResetReply struct {
	Reset bool `json:"reset"`
}
