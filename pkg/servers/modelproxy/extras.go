package modelproxy

import (
	"bytes"
	"fmt"

	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// Request extras, merged as NeMo Gym's vllm_model merges them
// (VLLMModel._preprocess_chat_completion_create_params in
// responses_api_models/vllm_model/app.py, nemo-gym 0.7.0):
//   - chat_template_kwargs: upstream.chat_template_kwargs, updated by the
//     chat request's own chat_template_kwargs only with
//     upstream.forward_request_chat_template_kwargs (otherwise they are
//     dropped, as Gym drops them by default), then by
//     json.loads(metadata["chat_template_kwargs"]) (e.g. a row's
//     {"enable_thinking": false}); sent only when not empty;
//   - extra_body: upstream.extra_body, updated by
//     json.loads(metadata["extra_body"]) (e.g. a repeat's seed), merged
//     under the request: a field the request (or the server's token-id
//     parameters) already has wins.
//
// Metadata values are JSON object texts; anything else is a 400 naming the
// key. The metadata itself is still forwarded, as Gym forwards it.

// Metadata keys read as extras.
const (
	metaExtraBody          = "extra_body"
	metaChatTemplateKwargs = "chat_template_kwargs"
)

// parseObject reads a JSON object text; "" is no object.
func parseObject(text string) (map[string]codec.RawMessage, error) {
	if len(bytes.TrimSpace([]byte(text))) == 0 {
		return nil, nil
	}
	var m map[string]codec.RawMessage
	if err := codec.Unmarshal([]byte(text), &m); err != nil || m == nil {
		return nil, fmt.Errorf("%q is not a JSON object", truncate(text, 200))
	}
	return m, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// merge returns base updated by over; base is not modified.
func merge(base, over map[string]codec.RawMessage) map[string]codec.RawMessage {
	if len(over) == 0 {
		return base
	}
	if len(base) == 0 {
		return over
	}
	out := make(map[string]codec.RawMessage, len(base)+len(over))
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		out[k] = v
	}
	return out
}

// requestExtras merges the configured extras with a request's own
// chat_template_kwargs (already dropped unless forwarded) and its metadata
// texts. Without any it returns nils and allocates nothing.
func (s *Server) requestExtras(own map[string]codec.RawMessage, metaBody, metaKwargs string) (body, kwargs map[string]codec.RawMessage, err error) {
	body, kwargs = s.extraBody, merge(s.chatTemplateKwargs, own)
	if metaBody != "" {
		m, err := parseObject(metaBody)
		if err != nil {
			return nil, nil, badMetadata(metaExtraBody, err)
		}
		body = merge(body, m)
	}
	if metaKwargs != "" {
		m, err := parseObject(metaKwargs)
		if err != nil {
			return nil, nil, badMetadata(metaChatTemplateKwargs, err)
		}
		kwargs = merge(kwargs, m)
	}
	return body, kwargs, nil
}

func badMetadata(key string, err error) error {
	e := apierror.New(apierror.InvalidRequest, "metadata.%s must be a JSON object text, as NeMo Gym's vllm_model reads it: %v", key, err)
	e.Param = "metadata." + key
	return e
}

// chatMetadataExtras reads the extras' texts from a chat request's
// metadata (an object of strings).
func chatMetadataExtras(raw codec.RawMessage) (body, kwargs string, err error) {
	if len(raw) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return "", "", nil
	}
	var md map[string]codec.RawMessage
	if err := codec.Unmarshal(raw, &md); err != nil {
		return "", "", apierror.New(apierror.InvalidRequest, "metadata must be an object of strings")
	}
	text := func(key string) (string, error) {
		v, ok := md[key]
		if !ok || string(bytes.TrimSpace(v)) == "null" {
			return "", nil
		}
		var s string
		if err := codec.Unmarshal(v, &s); err != nil {
			return "", badMetadata(key, fmt.Errorf("it is not a string"))
		}
		return s, nil
	}
	if body, err = text(metaExtraBody); err != nil {
		return "", "", err
	}
	if kwargs, err = text(metaChatTemplateKwargs); err != nil {
		return "", "", err
	}
	return body, kwargs, nil
}

// ownKwargs reads a chat request's own chat_template_kwargs: an object,
// or nothing (absent or null).
func ownKwargs(raw codec.RawMessage) (map[string]codec.RawMessage, error) {
	if len(raw) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return nil, nil
	}
	var m map[string]codec.RawMessage
	if err := codec.Unmarshal(raw, &m); err != nil || m == nil {
		e := apierror.New(apierror.InvalidRequest, "chat_template_kwargs must be an object")
		e.Param = "chat_template_kwargs"
		return nil, e
	}
	return m, nil
}

// encodeKwargs encodes merged chat_template_kwargs.
func encodeKwargs(kwargs map[string]codec.RawMessage) (codec.RawMessage, error) {
	b, err := encodeObject(kwargs)
	if err != nil {
		return nil, apierror.Wrap(apierror.Internal, err)
	}
	return b, nil
}

// underBody adds the extra body's fields a request does not have.
func underBody(f map[string]codec.RawMessage, extra map[string]codec.RawMessage) {
	for k, v := range extra {
		if _, ok := f[k]; !ok {
			f[k] = v
		}
	}
}
