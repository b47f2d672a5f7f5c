package ckptstore

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// One line of a records file is one record, flat, as NeMo Gym's store
// writes and reads it (nemo_gym/_checkpoint/store.py @ e7e449e9aa0d,
// _record_line and _read: json.dumps of CheckpointRecord.to_json_record,
// control.py @ 62aca7a25f12's successor read as id 70112680612:
// model_dump, episode_id first):
//
//	{"episode_id":{"rollout_id":"<id>","attempt":<n>},<the record's other members>}
//
// Before this layout our writer wrapped the record instead,
// {"episode_id":…,"record":<record>}. A line whose only members are
// episode_id and record is read that way, so checkpoints written before
// the change restore; no record of ours or of upstream's has a member named
// record beside episode_id alone.

// episodeIDMember starts every line the writer writes.
var episodeIDMember = []byte(`{"episode_id":`)

// wrappedRecordMember follows the episode id in a line of the wrapped
// layout.
var wrappedRecordMember = []byte(`,"record":`)

// errNotObject reports record data that is not a JSON object.
var errNotObject = errors.New("a record is a JSON object")

// appendRecord appends r's line and its newline (recordLine).
func appendRecord(dst []byte, r Record) ([]byte, error) {
	line, built, err := recordLine(dst, r)
	if err != nil {
		return dst, err
	}
	if len(built) == len(dst) {
		built = append(built, line...)
	}
	return append(built, '\n'), nil
}

// recordLine returns r's line, without its newline. r.Data is the record:
// a JSON object with or without its episode_id member. Where it starts
// with the episode id (as every participant of ours writes it) it is the
// line as it is, and line is r.Data's bytes (not copied; built is dst);
// otherwise the id is put first, and the line is built in dst: line is
// the bytes appended, built dst with them. An episode_id member naming
// another episode is refused.
func recordLine(dst []byte, r Record) (line, built []byte, err error) {
	data := bytes.TrimSpace(r.Data)
	if len(data) < 2 || data[0] != '{' || data[len(data)-1] != '}' {
		return nil, dst, errNotObject
	}
	if rest, ok := bytes.CutPrefix(data, episodeIDMember); ok {
		if id, attempt, _, ok := rollout.CutEpisodeIDJSON(rest); ok {
			if string(id) != r.EpisodeID.RolloutID || attempt != r.EpisodeID.Attempt {
				return nil, dst, fmt.Errorf("the record names episode %s-a%d, filed under %s", id, attempt, r.EpisodeID)
			}
			return data, dst, nil
		}
	}
	var members map[string]codec.RawMessage
	if err := codec.UnmarshalStrict(data, &members); err != nil {
		return nil, dst, fmt.Errorf("%w: %s", errNotObject, codec.DescribeError(err))
	}
	if raw, ok := members["episode_id"]; ok {
		var id rollout.EpisodeID
		if err := codec.UnmarshalStrict(raw, &id); err != nil || id != r.EpisodeID {
			return nil, dst, fmt.Errorf("the record's episode_id %s is not %s", raw, r.EpisodeID)
		}
		return data, dst, nil
	}
	start := len(dst)
	built = appendEpisodeIDMember(dst, r.EpisodeID)
	if inner := bytes.TrimSpace(data[1 : len(data)-1]); len(inner) > 0 {
		built = append(built, ',')
		built = append(built, inner...)
	}
	built = append(built, '}')
	return built[start:], built, nil
}

// appendEpisodeIDMember appends {"episode_id":{…} (the id needs no
// escaping: a valid rollout id is plain ASCII).
func appendEpisodeIDMember(dst []byte, id rollout.EpisodeID) []byte {
	dst = append(dst, `{"episode_id":{"rollout_id":"`...)
	dst = append(dst, id.RolloutID...)
	dst = append(dst, `","attempt":`...)
	dst = strconv.AppendInt(dst, int64(id.Attempt), 10)
	return append(dst, '}')
}

// readLine reads one line (with its newline): the fast framing where the
// line starts as the writer writes it, else the strict decoder.
func readLine(line []byte) (Record, error) {
	if rec, ok := readCanonical(line); ok {
		return rec, nil
	}
	return decodeLine(line)
}

// readCanonical frames a line that starts as appendRecord writes it,
// without the reflection of a JSON decoder: a restore reads 100,000 lines
// and more. The record of a flat line is the whole object; of a wrapped
// line, the value of its record member. ok false means only that the line
// is laid out otherwise (decodeLine reads it).
//
// It does not check that a flat record is JSON: every participant decodes
// its records strictly, which refuses it there (as Python's json.loads
// refuses the line in upstream's reader).
func readCanonical(line []byte) (rec Record, ok bool) {
	body, ok := bytes.CutSuffix(line, []byte("\n"))
	if !ok || len(body) == 0 || body[len(body)-1] != '}' {
		return Record{}, false
	}
	rest, ok := bytes.CutPrefix(body, episodeIDMember)
	if !ok {
		return Record{}, false
	}
	id, attempt, rest, ok := rollout.CutEpisodeIDJSON(rest)
	if !ok || len(rest) == 0 {
		return Record{}, false
	}
	episode := rollout.EpisodeID{RolloutID: string(id), Attempt: attempt}
	if value, wrapped := bytes.CutPrefix(rest, wrappedRecordMember); wrapped {
		// The wrapped layout only where the rest is one value: a flat
		// record may have a member named record among others.
		value = bytes.Trim(value[:len(value)-1], " \t\r")
		if len(value) > 0 && codec.Valid(value) {
			return Record{EpisodeID: episode, Data: value}, true
		}
	}
	if rest[0] != ',' && rest[0] != '}' {
		return Record{}, false
	}
	return Record{EpisodeID: episode, Data: body}, true
}

// decodeLine reads any line that is one JSON object with an episode_id
// member (upstream's json.dumps puts spaces after its separators), flat
// or wrapped, strictly.
func decodeLine(line []byte) (Record, error) {
	body := bytes.TrimRight(line, "\r\n")
	var members map[string]codec.RawMessage
	if err := codec.UnmarshalStrict(body, &members); err != nil {
		return Record{}, errors.New(codec.DescribeError(err))
	}
	raw, ok := members["episode_id"]
	if !ok {
		return Record{}, errors.New("the record has no episode_id")
	}
	var rec Record
	if err := codec.UnmarshalStrict(raw, &rec.EpisodeID); err != nil {
		return Record{}, fmt.Errorf("episode_id: %s", codec.DescribeError(err))
	}
	if value, wrapped := members["record"]; wrapped && len(members) == 2 {
		rec.Data = bytes.TrimSpace(value)
		return rec, nil
	}
	rec.Data = bytes.TrimSpace(body)
	return rec, nil
}
