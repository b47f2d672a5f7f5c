package fakeinference

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// ErrorInfo and ErrorResponse are the error body vLLM's OpenAI server
// answers with (ErrorInfo/ErrorResponse in
// vllm/entrypoints/openai/engine/protocol.py, vLLM commit
// 040a2cc2a6295ea9c313d86526ff90a103eacb3e): code is the HTTP status and
// param names the request field at fault, or is null. The OpenAI-compatible
// routes of this server imitate vLLM, so they use it; the server's own
// routes use the fleet's apierror envelope.
type ErrorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// ErrorResponse is {"error": ErrorInfo}.
type ErrorResponse struct {
	Error ErrorInfo `json:"error"`
}

// RequestError is a refused (or scripted to fail) OpenAI-compatible call:
// its status and the ErrorInfo it is answered with. Type "" means the type
// vLLM gives the status (ErrorType); Param "" is a null param.
type RequestError struct {
	Status  int
	Type    string
	Message string
	Param   string
}

func (e *RequestError) Error() string { return e.Message }

// Info is the error's vLLM ErrorInfo.
func (e *RequestError) Info() ErrorInfo {
	info := ErrorInfo{Message: e.Message, Type: e.Type, Code: e.Status}
	if info.Type == "" {
		info.Type = ErrorType(e.Status)
	}
	if e.Param != "" {
		p := e.Param
		info.Param = &p
	}
	return info
}

// ErrorType is the type vLLM's create_error_response gives a status
// (vllm/entrypoints/openai/engine/serving.py, vLLM commit
// 00bd1493b3e82d6c13c68ee8a0e1c5a96707e190): validation errors are
// BadRequestError, an unknown model NotFoundError, NotImplementedError 501,
// anything else InternalServerError.
func ErrorType(status int) string {
	switch {
	case status == http.StatusNotFound:
		return "NotFoundError"
	case status == http.StatusNotImplemented:
		return "NotImplementedError"
	case status == http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	case status >= 500:
		return "InternalServerError"
	}
	return "BadRequestError"
}

// badRequest is a 400 naming param ("" for none), as vLLM's
// VLLMValidationError is answered.
func badRequest(param, format string, args ...any) *RequestError {
	return &RequestError{Status: http.StatusBadRequest, Param: param, Message: fmt.Sprintf(format, args...)}
}

func writeVLLMError(w http.ResponseWriter, e *RequestError) {
	httpserver.WriteJSON(w, e.Status, ErrorResponse{Error: e.Info()})
}

// streamErrorData is the data of the event vLLM's chat stream generator
// sends when generation fails mid-stream: the ErrorResponse as Python's
// json.dumps writes it (", " and ": " separators), followed by
// "data: [DONE]" (chat_completion_stream_generator in
// vllm/entrypoints/openai/chat_completion/serving.py, vLLM commit
// 006c49d485f9ca479bf4989cbb694d0ac02f44b5, and create_streaming_error_response
// in engine/serving.py).
func streamErrorData(info ErrorInfo) []byte {
	b := append([]byte(nil), `{"error": {"message": `...)
	b = codec.AppendString(b, info.Message)
	b = append(b, `, "type": `...)
	b = codec.AppendString(b, info.Type)
	b = append(b, `, "param": `...)
	if info.Param == nil {
		b = append(b, "null"...)
	} else {
		b = codec.AppendString(b, *info.Param)
	}
	b = append(b, `, "code": `...)
	b = strconv.AppendInt(b, int64(info.Code), 10)
	return append(b, "}}"...)
}
