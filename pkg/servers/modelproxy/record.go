package modelproxy

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/gymfleet/gymfleet/pkg/tokencapture"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// ModelRecord is the model participant's record of one episode: the
// ledger rows of its delivered calls and at most one generation cut (the
// call the agent will re-issue, whose prefix the worker staged).
type ModelRecord struct {
	// EpisodeID is the records line's episode_id member, which a record
	// read back from a checkpoint carries (records are flat: ckptstore
	// line.go); absent in a record of a checkpoint written before.
	EpisodeID      *rollout.EpisodeID `json:"episode_id,omitempty"`
	Rows           []tokencapture.Row `json:"rows"`
	GenerationCuts []GenerationCut    `json:"generation_cuts"`
}

// GenerationCut names an undelivered call and the staged prefix its
// re-issue continues. The re-issue is recognised by its capture key (the
// next attempt of the record's episode) and request digest.
type GenerationCut struct {
	ModelCallID   string       `json:"model_call_id"`
	RequestDigest string       `json:"request_digest"`
	Continuation  Continuation `json:"continuation"`
}

// Continuation is where the prefix is staged and what it holds.
type Continuation struct {
	// SourceCaptureKey and SourceModelCallID name the call that was cut.
	SourceCaptureKey  string   `json:"source_capture_key"`
	SourceModelCallID string   `json:"source_model_call_id"`
	StagingKeys       []string `json:"staging_keys"`
	PrefixTokenCount  int      `json:"prefix_token_count"`
	PrefixDigest      string   `json:"prefix_digest"`
}

// appendModelRecord appends to dst the ModelRecord of rows (each a Row as
// codec.Marshal encodes it, which is what the ledger's ReadRawRows gives)
// and at most one cut, with the same bytes as codec.Marshal of the record,
// without decoding the rows. It returns every token-store key the record
// refers to: the cut's and those of prefixes its rows continued.
func appendModelRecord(dst []byte, rows []codec.RawMessage, cut *GenerationCut) (data []byte, stagingKeys []string, err error) {
	cuts := []byte("[]")
	if cut != nil {
		if cuts, err = codec.Marshal([]GenerationCut{*cut}); err != nil {
			return nil, nil, err
		}
		stagingKeys = append(stagingKeys, cut.Continuation.StagingKeys...)
	}
	size := len(`{"rows":[],"generation_cuts":}`) + len(cuts)
	for _, r := range rows {
		size += len(r) + 1
	}
	data = slices.Grow(dst, size)
	data = append(data, `{"rows":[`...)
	for i, r := range rows {
		if i > 0 {
			data = append(data, ',')
		}
		data = append(data, r...)
		// Only a row that continued a cut prefix names the field.
		if mayNameContinuedFrom(r) {
			var c struct {
				ContinuedFrom string `json:"continued_from"`
			}
			if err := codec.Unmarshal(r, &c); err != nil {
				return nil, nil, fmt.Errorf("rows[%d]: %w", i, err)
			}
			if c.ContinuedFrom != "" {
				stagingKeys = append(stagingKeys, c.ContinuedFrom)
			}
		}
	}
	data = append(data, `],"generation_cuts":`...)
	data = append(data, cuts...)
	data = append(data, '}')
	return data, stagingKeys, nil
}

// mayNameContinuedFrom reports whether row may have a continued_from
// member. A row as codec.Marshal writes a Row (or an ImportRow) starts
// with call_id and keeps the struct's order, in which continued_from can
// only follow finish_reason: only that tail is searched, not the token
// arrays that are most of the row. A row laid out otherwise is searched
// whole. A key cannot match inside a string value, whose quotes are
// escaped.
func mayNameContinuedFrom(row []byte) bool {
	if bytes.HasPrefix(row, []byte(`{"call_id":`)) {
		if i := bytes.LastIndex(row, []byte(`,"finish_reason":`)); i >= 0 {
			return bytes.Contains(row[i:], []byte(`"continued_from"`))
		}
	}
	return bytes.Contains(row, []byte(`"continued_from"`))
}

// DecodeModelRecord decodes a record strictly (unknown fields refused) and
// validates it: rows with valid, distinct call ids in increasing seq order
// and as many log-probs as generated tokens; at most one cut, whose ids,
// digest and single staging key are valid.
func DecodeModelRecord(data []byte) (*ModelRecord, error) {
	rec, err := decodeImportRecord(data)
	if err != nil {
		return nil, err
	}
	m := &ModelRecord{EpisodeID: rec.EpisodeID, GenerationCuts: rec.GenerationCuts}
	if rec.Rows != nil {
		m.Rows = make([]tokencapture.Row, len(rec.Rows))
	}
	for i, r := range rec.Rows {
		if m.Rows[i], err = r.Row(); err != nil {
			return nil, fmt.Errorf("rows[%d]: %w", i, err)
		}
	}
	return m, nil
}

// importRecord is a ModelRecord as Install reads it: its rows as the
// ledger imports them, with their token arrays validated but left as JSON.
type importRecord struct {
	EpisodeID      *rollout.EpisodeID       `json:"episode_id,omitempty"`
	Rows           []tokencapture.ImportRow `json:"rows"`
	GenerationCuts []GenerationCut          `json:"generation_cuts"`
}

// decodeImportRecord decodes and validates a record as DecodeModelRecord
// does (which is built on it), without decoding the token arrays.
func decodeImportRecord(data []byte) (*importRecord, error) {
	m, ok := cutImportRecord(data)
	if !ok {
		m = &importRecord{}
		if err := unmarshalImportRecord(data, m); err != nil {
			return nil, err
		}
	}
	if err := m.validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// cutImportRecord reads a record laid out as appendModelRecord writes it,
// with rows as the ledger writes them (tokencapture.CutImportRow), which is
// what Export writes: a restore then needs no generic decoder. ok false
// means only that the record is laid out otherwise.
func cutImportRecord(data []byte) (m *importRecord, ok bool) {
	var id *rollout.EpisodeID
	var rest []byte
	if after, flat := bytes.CutPrefix(data, []byte(`{"episode_id":`)); flat {
		rid, attempt, after, cut := rollout.CutEpisodeIDJSON(after)
		if !cut {
			return nil, false
		}
		id = &rollout.EpisodeID{RolloutID: string(rid), Attempt: attempt}
		if rest, ok = bytes.CutPrefix(after, []byte(`,"rows":[`)); !ok {
			return nil, false
		}
	} else if rest, ok = bytes.CutPrefix(data, []byte(`{"rows":[`)); !ok {
		return nil, false
	}
	m = &importRecord{EpisodeID: id, Rows: []tokencapture.ImportRow{}}
	for len(rest) > 0 && rest[0] != ']' {
		if len(m.Rows) > 0 {
			if rest, ok = bytes.CutPrefix(rest, []byte(",")); !ok {
				return nil, false
			}
		}
		var row tokencapture.ImportRow
		if row, rest, ok = tokencapture.CutImportRow(rest); !ok {
			return nil, false
		}
		m.Rows = append(m.Rows, row)
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(`],"generation_cuts":`)); !ok {
		return nil, false
	}
	cuts, ok := bytes.CutSuffix(rest, []byte("}"))
	switch {
	case !ok:
		return nil, false
	case string(cuts) == "[]":
		m.GenerationCuts = []GenerationCut{}
	case codec.UnmarshalStrictFast(cuts, &m.GenerationCuts) != nil:
		return nil, false
	}
	return m, true
}

// unmarshalImportRecord decodes a record of any layout into m, which is
// zero, with the generic decoder.
func unmarshalImportRecord(data []byte, m *importRecord) error {
	if err := codec.UnmarshalStrictFast(data, m); err != nil {
		// A refusal names the type it expected (importRecord, ImportRow):
		// decoding a ModelRecord again, on this rare path, refuses the
		// data with the words it always used.
		var named ModelRecord
		if namedErr := codec.UnmarshalStrictFast(data, &named); namedErr != nil {
			err = namedErr
		}
		return fmt.Errorf("not a model record: %s", codec.DescribeError(err))
	}
	return nil
}

// validate checks what DecodeModelRecord promises of a record's rows and
// cut.
func (m *importRecord) validate() error {
	seen := make(map[string]bool, len(m.Rows))
	var lastSeq int64
	for i := range m.Rows {
		r := &m.Rows[i]
		switch {
		case !validCallID(r.CallID):
			return fmt.Errorf("rows[%d].call_id %q is not a model call id", i, r.CallID)
		case seen[r.CallID]:
			return fmt.Errorf("rows[%d].call_id %q appears twice", i, r.CallID)
		case r.CaptureKey != "" && !validSourceKey(r.CaptureKey):
			return fmt.Errorf("rows[%d].capture_key %q is not a capture key", i, r.CaptureKey)
		case r.ParentCallID != "" && !validCallID(r.ParentCallID):
			return fmt.Errorf("rows[%d].parent_call_id %q is not a model call id", i, r.ParentCallID)
		case r.Seq <= lastSeq:
			return fmt.Errorf("rows[%d].seq %d does not follow %d", i, r.Seq, lastSeq)
		case r.GenerationTokenIDs.Len() != r.GenerationLogProbs.Len():
			return fmt.Errorf("rows[%d] has %d generation tokens but %d log-probs", i, r.GenerationTokenIDs.Len(), r.GenerationLogProbs.Len())
		case r.ContinuedFrom != "" && !validStagingKey(r.ContinuedFrom):
			return fmt.Errorf("rows[%d].continued_from is not a staging key", i)
		}
		seen[r.CallID] = true
		lastSeq = r.Seq
	}
	if len(m.GenerationCuts) > 1 {
		return fmt.Errorf("a record holds at most one generation cut, this one %d", len(m.GenerationCuts))
	}
	for _, c := range m.GenerationCuts {
		if err := c.validate(); err != nil {
			return fmt.Errorf("generation_cuts[0]: %w", err)
		}
	}
	return nil
}

func (c GenerationCut) validate() error {
	k := c.Continuation
	switch {
	case !validCallID(c.ModelCallID):
		return fmt.Errorf("model_call_id %q is not a model call id", c.ModelCallID)
	case !validRequestDigest(c.RequestDigest):
		return errors.New("request_digest is not a sha256 in hex")
	case !validSourceKey(k.SourceCaptureKey):
		return fmt.Errorf("continuation.source_capture_key %q is not a capture key", k.SourceCaptureKey)
	case !validCallID(k.SourceModelCallID):
		return fmt.Errorf("continuation.source_model_call_id %q is not a model call id", k.SourceModelCallID)
	case len(k.StagingKeys) != 1 || !validStagingKey(k.StagingKeys[0]):
		// The worker continues one staged prefix per call (X-Ng-Continue-Cut).
		return errors.New("continuation.staging_keys must hold exactly one staging key")
	case k.PrefixTokenCount <= 0:
		return errors.New("continuation.prefix_token_count must be positive")
	case k.PrefixDigest == "" || len(k.PrefixDigest) > 256:
		return errors.New("continuation.prefix_digest must be 1 to 256 characters")
	}
	return nil
}

// appendEpisodeIDMember appends {"episode_id":{…}, the start of a records
// line (a valid rollout id needs no escaping).
func appendEpisodeIDMember(dst []byte, id rollout.EpisodeID) []byte {
	dst = append(dst, `{"episode_id":{"rollout_id":"`...)
	dst = append(dst, id.RolloutID...)
	dst = append(dst, `","attempt":`...)
	dst = strconv.AppendInt(dst, int64(id.Attempt), 10)
	return append(dst, '}')
}
