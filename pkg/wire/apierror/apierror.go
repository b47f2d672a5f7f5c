// Package apierror is the fleet's one error envelope:
// {"error":{"code":"<code>","detail":"<text>"}}, with every stable machine code
// mapped to its HTTP status in one table.
package apierror

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// Code is a stable machine-readable error code.
type Code string

// The codes of SPEC §3, and the data plane's own.
const (
	Unauthorized       Code = "unauthorized"
	InvalidRequest     Code = "invalid_request"
	RolloutIDRequired  Code = "rollout_id_required"
	StaleCheckpoint    Code = "stale_checkpoint"
	CheckpointConflict Code = "checkpoint_conflict"
	InvalidPhase       Code = "invalid_phase"
	DeadlineExceeded   Code = "deadline_exceeded"
	StaleAttempt       Code = "stale_attempt"
	// StaleEpoch refuses a request, reply or write of a process from an
	// epoch a later restore has superseded (a paused "zombie"), or a
	// request to such a process.
	StaleEpoch             Code = "stale_epoch"
	AdmissionClosed        Code = "admission_closed"
	RestartInScope         Code = "restart_in_scope"
	RetireIncomplete       Code = "retire_incomplete"
	InvalidCheckpointState Code = "invalid_checkpoint_state"
	Internal               Code = "internal"
	// StorageFull (beyond SPEC §3) is a commit that found its storage
	// full (ENOSPC, EDQUOT): nothing was published and the previous
	// checkpoint stands.
	StorageFull Code = "storage_full"
	// CheckpointError is NeMo Gym's ControlError code (errors.py): a
	// participant refusing what it cannot do, such as a commit without a
	// scope on a participant that exports only what a scope names.
	CheckpointError Code = "checkpoint_error"
	// ReplicasUnsupported refuses a restore into a set of replicas it
	// cannot place the checkpoint's records on (docs/CHECKPOINTS.md,
	// "Replicas"): before any participant is called.
	ReplicasUnsupported Code = "replicas_unsupported"

	// Data plane.
	NotFound          Code = "not_found"
	UnknownTool       Code = "unknown_tool"
	UnknownSession    Code = "unknown_session"
	MethodNotAllowed  Code = "method_not_allowed"
	BodyTooLarge      Code = "body_too_large"
	EpisodeRunning    Code = "episode_running"
	TaskMismatch      Code = "task_mismatch"
	ActivationOrder   Code = "activation_out_of_order"
	SessionExists     Code = "session_exists"
	SessionClosed     Code = "session_closed"
	Gone              Code = "gone"
	UpstreamError     Code = "upstream_error"
	UpstreamTimeout   Code = "upstream_timeout"
	ContextLength     Code = "context_length_exceeded"
	Unavailable       Code = "unavailable"
	ClientClosed      Code = "client_closed_request"
	CheckpointOpen    Code = "checkpoint_open"
	NotFreshProcess   Code = "not_fresh_process"
	InvalidCheckpoint Code = InvalidCheckpointState
)

// statusOf is the one mapping from code to HTTP status. Codes missing here are
// a bug caught by TestEveryCodeHasAStatus.
var statusOf = map[Code]int{
	Unauthorized:           http.StatusUnauthorized,
	InvalidRequest:         http.StatusBadRequest,
	RolloutIDRequired:      http.StatusBadRequest,
	StaleCheckpoint:        http.StatusConflict,
	CheckpointConflict:     http.StatusConflict,
	InvalidPhase:           http.StatusConflict,
	CheckpointError:        http.StatusConflict,
	DeadlineExceeded:       http.StatusConflict,
	StaleAttempt:           http.StatusConflict,
	StaleEpoch:             http.StatusConflict,
	AdmissionClosed:        http.StatusConflict,
	RestartInScope:         http.StatusConflict,
	RetireIncomplete:       http.StatusConflict,
	InvalidCheckpointState: http.StatusUnprocessableEntity,
	Internal:               http.StatusInternalServerError,
	NotFound:               http.StatusNotFound,
	UnknownTool:            http.StatusNotFound,
	UnknownSession:         http.StatusNotFound,
	MethodNotAllowed:       http.StatusMethodNotAllowed,
	BodyTooLarge:           http.StatusRequestEntityTooLarge,
	EpisodeRunning:         http.StatusConflict,
	TaskMismatch:           http.StatusConflict,
	ActivationOrder:        http.StatusConflict,
	SessionExists:          http.StatusConflict,
	SessionClosed:          http.StatusConflict,
	Gone:                   http.StatusGone,
	UpstreamError:          http.StatusBadGateway,
	UpstreamTimeout:        http.StatusGatewayTimeout,
	ContextLength:          http.StatusBadRequest,
	Unavailable:            http.StatusServiceUnavailable,
	ClientClosed:           499,
	CheckpointOpen:         http.StatusConflict,
	NotFreshProcess:        http.StatusConflict,
	StorageFull:            http.StatusInsufficientStorage,
	ReplicasUnsupported:    http.StatusUnprocessableEntity,
}

// Codes lists every known code, sorted, for tests and documentation.
func Codes() []Code {
	out := make([]Code, 0, len(statusOf))
	for c := range statusOf {
		out = append(out, c)
	}
	// Map order is random; documentation generated from this must not be.
	slices.Sort(out)
	return out
}

// Status is the HTTP status of a code; unknown codes are 500.
func Status(c Code) int {
	if s, ok := statusOf[c]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// Error is an error with a stable code. Status overrides the code's default
// status when non-zero (invalid_request is 400 or 422).
type Error struct {
	Code   Code
	Detail string
	Status int
	// Type and Param are OpenAI's error.type and error.param, written only
	// by WriteOpenAI; empty Type is derived from the status.
	Type  string
	Param string
	// Retry marks a refusal that did no work for the request and may pass
	// when the same request is sent again (not ready yet, an upstream that
	// never received it or asked to be called later). WriteOpenAI says so
	// in x-should-retry, which OpenAI's SDKs obey over their own rule
	// (they retry 408, 409, 429 and every 5xx): every other error says
	// false, so no SDK sends again a request that was refused for good or
	// may already have generated.
	Retry bool
	cause error
}

func (e *Error) Error() string {
	if e.cause != nil && e.Detail == "" {
		return string(e.Code) + ": " + e.cause.Error()
	}
	return string(e.Code) + ": " + e.Detail
}

// Unwrap returns the cause, if any.
func (e *Error) Unwrap() error { return e.cause }

// HTTPStatus is the status this error is answered with.
func (e *Error) HTTPStatus() int {
	if e.Status != 0 {
		return e.Status
	}
	return Status(e.Code)
}

// New returns an error with a code and a detail text.
func New(c Code, format string, args ...any) *Error {
	return &Error{Code: c, Detail: fmt.Sprintf(format, args...)}
}

// Wrap returns an error with a code whose detail is cause's text.
func Wrap(c Code, cause error) *Error {
	return &Error{Code: c, Detail: cause.Error(), cause: cause}
}

// WithStatus returns a copy of e answered with another status.
func (e *Error) WithStatus(status int) *Error {
	c := *e
	c.Status = status
	return &c
}

// Is matches errors by code, so errors.Is(err, apierror.New(code, "")) works.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && t.Detail == ""
}

// CodeOf returns the code of err: its own if it carries one, deadline_exceeded
// for a context deadline, client_closed_request for a cancelled request, else internal.
func CodeOf(err error) Code {
	var e *Error
	switch {
	case errors.As(err, &e):
		return e.Code
	case errors.Is(err, context.DeadlineExceeded):
		return DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return ClientClosed
	}
	return Internal
}

// From converts any error into an *Error.
func From(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: CodeOf(err), Detail: err.Error(), cause: err}
}

// Envelope is the JSON shape of every error reply.
type Envelope struct {
	Error Body `json:"error"`
}

// Body is the inside of the envelope.
type Body struct {
	Code   Code   `json:"code"`
	Detail string `json:"detail"`
}

// Write answers a request with err in the envelope. Internal errors are logged
// with their cause; their detail still goes to the caller, since every caller
// is one of our own servers or an operator.
func Write(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	e := From(err)
	status := e.HTTPStatus()
	if log != nil && status >= 500 {
		log.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "code", e.Code, "err", err)
	}
	b, _ := codec.MarshalStable(Envelope{Error: Body{Code: e.Code, Detail: e.Detail}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// OpenAIEnvelope is the error reply of an OpenAI-compatible route: the
// error object OpenAI's SDKs read (message, type, param, code), with our
// stable code as code and the detail kept beside it, so our own clients
// (Parse) read it as the fleet's envelope.
type OpenAIEnvelope struct {
	Error OpenAIBody `json:"error"`
}

// OpenAIBody is the inside of OpenAIEnvelope.
type OpenAIBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    Code    `json:"code"`
	Detail  string  `json:"detail"`
}

// OpenAIType is the OpenAI error type of a status: what an SDK shows as
// the error's kind.
func OpenAIType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status >= 400 && status < 500:
		return "invalid_request_error"
	}
	return "server_error"
}

// ShouldRetryHeader is the header OpenAI's SDKs read to decide whether to
// send a failed request again (_should_retry in the Python SDK's
// _base_client.py, openai 3.63.0), over their own rule by status.
const ShouldRetryHeader = "X-Should-Retry"

// Retryable reports whether a client may send the request that got e again
// unchanged: e says so (Retry), or the server is not ready yet.
func (e *Error) Retryable() bool { return e.Retry || e.Code == Unavailable }

// WriteOpenAI answers a request on an OpenAI-compatible route with err in
// OpenAIEnvelope, and tells OpenAI's SDKs whether to send it again
// (ShouldRetryHeader, Retryable); otherwise it is Write.
func WriteOpenAI(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	e := From(err)
	status := e.HTTPStatus()
	if log != nil && status >= 500 {
		log.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "code", e.Code, "err", err)
	}
	b, _ := codec.MarshalStable(OpenAIEnvelopeOf(e))
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set(ShouldRetryHeader, strconv.FormatBool(e.Retryable()))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// OpenAIEnvelopeOf is e as an OpenAI error object.
func OpenAIEnvelopeOf(e *Error) OpenAIEnvelope {
	typ := e.Type
	if typ == "" {
		typ = OpenAIType(e.HTTPStatus())
	}
	var param *string
	if e.Param != "" {
		p := e.Param
		param = &p
	}
	return OpenAIEnvelope{Error: OpenAIBody{Message: e.Detail, Type: typ, Param: param, Code: e.Code, Detail: e.Detail}}
}

// Parse reads an error envelope from a reply body. It returns nil when body is
// not one, so callers can fall back to the raw text.
func Parse(status int, body []byte) *Error {
	var env Envelope
	if err := codec.Unmarshal(body, &env); err != nil || env.Error.Code == "" {
		return nil
	}
	return &Error{Code: env.Error.Code, Detail: env.Error.Detail, Status: status}
}

// HasCode reports whether err carries the code c.
func HasCode(err error, c Code) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == c
}
