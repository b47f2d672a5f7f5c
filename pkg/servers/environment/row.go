package environment

import (
	"bytes"
	"context"
	"errors"

	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// Row is a /run body: a NeMo Gym dataset row kept as raw JSON per field, so
// task fields reach /seed_session and /verify byte for byte.
type Row map[string]codec.RawMessage

// RunRequest is a decoded /run body.
type RunRequest struct {
	// Row is the whole row as received.
	Row Row
	// Episode is the attempt the row names, or the one generated for it.
	Episode rollout.EpisodeID
	// Generated is set when the row named no rollout (NeMo RL's rows) and
	// Episode was generated for it (rollout.Generate).
	Generated bool
	// Agent is agent_ref.name, or empty when the row names none.
	Agent string
	// Params is responses_create_params.
	Params codec.RawMessage
}

// DecodeRunRequest decodes and checks a /run body. The episode is the one the
// row names (rollout.FromRow); else the one of an /ng-rollout/<capture_key>/run
// prefix ctx carries; else one generated from what the row has
// (rollout.Generate: NeMo RL's rows carry only _rowidx and maybe
// _ng_task_index). Errors are apierror values: invalid_request.
func DecodeRunRequest(ctx context.Context, body []byte) (*RunRequest, error) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' {
		return nil, apierror.New(apierror.InvalidRequest, "the /run body must be a JSON object (a NeMo Gym dataset row)")
	}
	var row Row
	if err := codec.Unmarshal(body, &row); err != nil {
		return nil, apierror.New(apierror.InvalidRequest, "%s", codec.DescribeError(err))
	}
	params, ok := row[rollout.FieldParams]
	if !ok || !isObject(params) {
		return nil, apierror.New(apierror.InvalidRequest, "%s is required and must be a JSON object", rollout.FieldParams)
	}

	fields := rollout.IdentityFields()
	ident := make(map[string]any, len(fields))
	for _, f := range fields {
		raw, ok := row[f]
		if !ok {
			continue
		}
		var v any
		if err := codec.Unmarshal(raw, &v); err != nil {
			return nil, apierror.New(apierror.InvalidRequest, "field %s: %s", f, codec.DescribeError(err))
		}
		ident[f] = v
	}
	id, err := rollout.FromRow(ident)
	prefixed, hasPrefix := rollout.FromContext(ctx)
	generated := false
	switch {
	case errors.Is(err, rollout.ErrRolloutIDRequired) && hasPrefix:
		id = prefixed
	case errors.Is(err, rollout.ErrRolloutIDRequired):
		if id, err = rollout.Generate(ident, rollout.NewNonce()); err != nil {
			return nil, apierror.Wrap(apierror.InvalidRequest, err)
		}
		generated = true
	case err != nil:
		return nil, apierror.Wrap(apierror.InvalidRequest, err)
	case hasPrefix && prefixed != id:
		return nil, apierror.New(apierror.InvalidRequest, "the path names attempt %s but the row names %s", prefixed, id)
	}

	req := &RunRequest{Row: row, Episode: id, Generated: generated, Params: params}
	if raw, ok := row[rollout.FieldAgentRef]; ok && !isNull(raw) {
		var ref struct {
			Name *string `json:"name"`
		}
		if !isObject(raw) || codec.Unmarshal(raw, &ref) != nil || ref.Name == nil || *ref.Name == "" {
			return nil, apierror.New(apierror.InvalidRequest, "%s must be an object with a non-empty string name", rollout.FieldAgentRef)
		}
		req.Agent = *ref.Name
	}
	return req, nil
}

// with returns a copy of the row with one more field.
func (r Row) with(key string, value codec.RawMessage) Row {
	out := make(Row, len(r)+1)
	for k, v := range r {
		out[k] = v
	}
	out[key] = value
	return out
}

func isObject(raw codec.RawMessage) bool {
	b := bytes.TrimSpace(raw)
	return len(b) > 0 && b[0] == '{'
}

func isNull(raw codec.RawMessage) bool {
	return bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}
