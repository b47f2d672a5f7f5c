// Package rollout names rollouts, attempts and capture keys (SPEC §2) and
// reads a rollout's identity from a NeMo Gym dataset row.
package rollout

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxIDLength is the longest rollout id SPEC §2 allows.
const MaxIDLength = 128

// The id pattern and the attempt suffix are matched by hand rather than by
// regexp: every checkpoint record, ledger key and fenced request checks them,
// 100,000 times and more per checkpoint. rollout_test.go checks both against
// the regular expressions they implement.

// attemptSuffix finds what a capture key of attempt N>0 ends with,
// "-a<N>" (N is 1 to 9 digits without a leading zero, the pattern
// -a([1-9][0-9]{0,8})$), and returns where it starts and N; start is -1
// when s has none. A rollout id must not end with it, or a capture key
// could not be read back.
func attemptSuffix(s string) (start, n int) {
	i := strings.LastIndex(s, "-a")
	if i < 0 {
		return -1, 0
	}
	digits := s[i+2:]
	if len(digits) == 0 || len(digits) > 9 || digits[0] == '0' {
		return -1, 0
	}
	for j := 0; j < len(digits); j++ {
		if digits[j] < '0' || digits[j] > '9' {
			return -1, 0
		}
		n = n*10 + int(digits[j]-'0')
	}
	return i, n
}

func isAlnum(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

// ErrInvalidID reports a rollout id, capture key or checkpoint id that does not
// match the SPEC pattern.
var ErrInvalidID = errors.New("invalid id")

// ValidID reports whether s matches ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$. Checkpoint
// ids, instance names and kinds use the same pattern.
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > MaxIDLength || !isAlnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// ValidateRolloutID checks a rollout id: the SPEC pattern, and no trailing
// "-a<N>", which would make its capture keys ambiguous.
func ValidateRolloutID(s string) error {
	if !ValidID(s) {
		return fmt.Errorf("%w: rollout id %q must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", ErrInvalidID, s)
	}
	if start, _ := attemptSuffix(s); start >= 0 {
		return fmt.Errorf("%w: rollout id %q must not end in -a<N>, which names an attempt", ErrInvalidID, s)
	}
	return nil
}

// EpisodeID names one execution (attempt) of a rollout.
type EpisodeID struct {
	RolloutID string `json:"rollout_id"`
	Attempt   int    `json:"attempt"`
}

// CaptureKey is the one-string name of an attempt: r for attempt 0, r-aN after.
func (e EpisodeID) CaptureKey() string {
	if e.Attempt == 0 {
		return e.RolloutID
	}
	return e.RolloutID + "-a" + strconv.Itoa(e.Attempt)
}

// AppendCaptureKey appends the capture key to dst.
func (e EpisodeID) AppendCaptureKey(dst []byte) []byte {
	dst = append(dst, e.RolloutID...)
	if e.Attempt == 0 {
		return dst
	}
	return strconv.AppendInt(append(dst, "-a"...), int64(e.Attempt), 10)
}

// CutEpisodeIDJSON reads an episode id off the front of b in the form our
// encoders write it, {"rollout_id":"<id>","attempt":<n>}, without a JSON
// decoder: a restore reads one per record and a control body one per
// episode, 100,000 and more. It returns the rollout id's bytes (in b) and
// the attempt where the id is printable ASCII without a backslash and n a
// plain integer of at most 18 digits, so that a strict decoder would read
// the same; ok false, for any other form, leaves the caller to decode it.
func CutEpisodeIDJSON(b []byte) (rolloutID []byte, attempt int, rest []byte, ok bool) {
	rest, ok = bytes.CutPrefix(b, []byte(`{"rollout_id":"`))
	if !ok {
		return nil, 0, b, false
	}
	end := bytes.IndexByte(rest, '"')
	if end < 0 {
		return nil, 0, b, false
	}
	rolloutID = rest[:end]
	for _, c := range rolloutID {
		// Escapes, control characters and non-ASCII bytes would decode to
		// other bytes than these.
		if c < 0x20 || c == '\\' || c >= 0x7f {
			return nil, 0, b, false
		}
	}
	if rest, ok = bytes.CutPrefix(rest[end+1:], []byte(`,"attempt":`)); !ok {
		return nil, 0, b, false
	}
	digits := 0
	for digits < len(rest) && rest[digits] >= '0' && rest[digits] <= '9' {
		attempt = attempt*10 + int(rest[digits]-'0')
		digits++
	}
	if digits == 0 || digits > 18 || (digits > 1 && rest[0] == '0') {
		return nil, 0, b, false
	}
	if rest, ok = bytes.CutPrefix(rest[digits:], []byte("}")); !ok {
		return nil, 0, b, false
	}
	return rolloutID, attempt, rest, true
}

// CompareCaptureKeys orders episodes as their capture keys order (the order
// of checkpoint records and replies), without building the keys.
func CompareCaptureKeys(a, b EpisodeID) int {
	if a.Attempt == 0 && b.Attempt == 0 {
		return strings.Compare(a.RolloutID, b.RolloutID)
	}
	var bufA, bufB [160]byte
	return bytes.Compare(a.AppendCaptureKey(bufA[:0]), b.AppendCaptureKey(bufB[:0]))
}

// String returns the capture key.
func (e EpisodeID) String() string { return e.CaptureKey() }

// Next is the attempt that continues this one after a restore.
func (e EpisodeID) Next() EpisodeID { return EpisodeID{RolloutID: e.RolloutID, Attempt: e.Attempt + 1} }

// MaxAttempt is the highest attempt number: a capture key's -aN suffix has
// at most nine digits, so a higher attempt's key would read back as attempt 0
// of another rollout id.
const MaxAttempt = 999_999_999

// Validate checks the rollout id and that the attempt is in 0..MaxAttempt.
func (e EpisodeID) Validate() error {
	if err := ValidateRolloutID(e.RolloutID); err != nil {
		return err
	}
	if e.Attempt < 0 {
		return fmt.Errorf("%w: attempt %d is negative", ErrInvalidID, e.Attempt)
	}
	if e.Attempt > MaxAttempt {
		return fmt.Errorf("%w: attempt %d is above %d", ErrInvalidID, e.Attempt, MaxAttempt)
	}
	return nil
}

// ParseCaptureKey reads a capture key back into its episode id. The key of
// a later attempt of a maximum-length rollout id is longer than MaxIDLength,
// so the suffix is split off before the rollout id is checked.
func ParseCaptureKey(key string) (EpisodeID, error) {
	if start, n := attemptSuffix(key); start >= 0 {
		id := EpisodeID{RolloutID: key[:start], Attempt: n}
		if err := id.Validate(); err != nil {
			return EpisodeID{}, err
		}
		return id, nil
	}
	if !ValidID(key) {
		return EpisodeID{}, fmt.Errorf("%w: capture key %q", ErrInvalidID, key)
	}
	return EpisodeID{RolloutID: key}, nil
}

// ValidCaptureKey reports whether key is the capture key of a valid episode.
// Capture keys can be longer than ValidID allows (see ParseCaptureKey).
func ValidCaptureKey(key string) bool {
	_, err := ParseCaptureKey(key)
	return err == nil
}

// Row field names of NeMo Gym's rollout collection (SPEC §2).
const (
	FieldRolloutID    = "_ng_rollout_id"
	FieldAttemptIndex = "_ng_attempt_index"
	FieldTaskIndex    = "_ng_task_index"
	FieldRolloutIndex = "_ng_rollout_index"
	FieldAgentRef     = "agent_ref"
	FieldParams       = "responses_create_params"
)

// ErrRolloutIDRequired reports a row that names no rollout.
var ErrRolloutIDRequired = errors.New("rollout id required: send _ng_rollout_id, or _ng_task_index and _ng_rollout_index, or the /ng-rollout/<capture_key> prefix")

// FromRow reads the episode id of a dataset row given as decoded JSON. The
// rollout id is _ng_rollout_id, or <_ng_task_index>-<_ng_rollout_index>; the
// attempt is _ng_attempt_index (0 when absent).
func FromRow(row map[string]any) (EpisodeID, error) {
	var id EpisodeID
	if v, ok := row[FieldRolloutID]; ok && v != nil {
		s, ok := v.(string)
		if !ok {
			return id, fmt.Errorf("%w: %s must be a string", ErrInvalidID, FieldRolloutID)
		}
		id.RolloutID = s
	} else {
		t, okT := intField(row, FieldTaskIndex)
		r, okR := intField(row, FieldRolloutIndex)
		if !okT || !okR {
			return id, ErrRolloutIDRequired
		}
		id.RolloutID = strconv.FormatInt(t, 10) + "-" + strconv.FormatInt(r, 10)
	}
	if v, ok := row[FieldAttemptIndex]; ok && v != nil {
		n, ok := intField(row, FieldAttemptIndex)
		if !ok {
			return id, fmt.Errorf("%w: %s must be a non-negative integer, got %v", ErrInvalidID, FieldAttemptIndex, v)
		}
		id.Attempt = int(n)
	}
	return id, id.Validate()
}

// intField reads a non-negative integer that JSON decoding may have produced as
// float64, json.Number-like string or int.
func intField(row map[string]any, name string) (int64, bool) {
	switch v := row[name].(type) {
	case float64:
		if v < 0 || v != float64(int64(v)) || v > 1<<40 {
			return 0, false
		}
		return int64(v), true
	case int:
		return int64(v), v >= 0
	case int64:
		return v, v >= 0
	case interface{ String() string }: // json.Number from UseNumber decoders
		n, err := strconv.ParseInt(strings.TrimSpace(v.String()), 10, 64)
		return n, err == nil && n >= 0
	}
	return 0, false
}
