// Package rollout names rollouts, attempts and capture keys (SPEC §2) and
// reads a rollout's identity from a NeMo Gym dataset row.
package rollout

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxIDLength is the longest rollout id SPEC §2 allows. Upstream's pattern
// has no bound, but NeMo Gym's stores write "<capture_key>.capture.incomplete" as one file name
// (nemo_gym/base_responses_api_model.py at 07d6b0d07b22): with the capture
// key's "-a<9 digits>" and that 19-byte suffix, 224 is the longest rollout
// id whose every file fits a 255-byte name, so no id we accept is one a Gym
// server beside ours cannot store.
const MaxIDLength = 224

// maxCaptureKeyLength is the longest capture key: a MaxIDLength id and the
// suffix of attempt MaxAttempt.
const maxCaptureKeyLength = MaxIDLength + len("-a999999999")

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

// endsLikeAttempt reports whether s ends in "-a" and a number without a
// leading zero of any length (-a[1-9][0-9]*$): a capture key's attempt
// suffix, or one too long for an attempt. A rollout id must not end so, or
// a key such as r-a<20 digits> would read as attempt 0 of that id instead of
// an attempt out of range.
func endsLikeAttempt(s string) bool {
	i := strings.LastIndex(s, "-a")
	if i < 0 {
		return false
	}
	digits := s[i+2:]
	if len(digits) == 0 || digits[0] == '0' {
		return false
	}
	for j := 0; j < len(digits); j++ {
		if digits[j] < '0' || digits[j] > '9' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

// ErrInvalidID reports a rollout id, capture key or checkpoint id that does not
// match the SPEC pattern.
var ErrInvalidID = errors.New("invalid id")

// MaxNameLength is the longest checkpoint id, instance name, kind or
// session id: the reference's bound on checkpoint ids (1..128).
const MaxNameLength = 128

// ValidID reports whether s matches ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$: a
// checkpoint id, instance name, kind or session id. Rollout ids may be
// longer (ValidateRolloutID).
func ValidID(s string) bool { return validPattern(s, MaxNameLength) }

// validPattern reports whether s matches ^[A-Za-z0-9][A-Za-z0-9._-]*$ in at
// most max bytes.
func validPattern(s string, max int) bool {
	if len(s) == 0 || len(s) > max || !isAlnum(s[0]) {
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
	if len(s) > MaxIDLength {
		return fmt.Errorf("%w: rollout id of %d bytes is longer than the bound of %d bytes (%.32q...)", ErrInvalidID, len(s), MaxIDLength, s)
	}
	if !validPattern(s, MaxIDLength) {
		return fmt.Errorf("%w: rollout id %q must match ^[A-Za-z0-9][A-Za-z0-9._-]*$ (at most %d bytes)", ErrInvalidID, s, MaxIDLength)
	}
	if endsLikeAttempt(s) {
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
	var bufA, bufB [maxCaptureKeyLength]byte
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
	if endsLikeAttempt(key) {
		return EpisodeID{}, fmt.Errorf("%w: capture key %q names an attempt above %d", ErrInvalidID, key, MaxAttempt)
	}
	if !validPattern(key, MaxIDLength) {
		if len(key) > MaxIDLength {
			return EpisodeID{}, fmt.Errorf("%w: capture key of %d bytes names a rollout id longer than the bound of %d bytes (%.32q...)", ErrInvalidID, len(key), MaxIDLength, key)
		}
		return EpisodeID{}, fmt.Errorf("%w: capture key %q", ErrInvalidID, key)
	}
	return EpisodeID{RolloutID: key}, nil
}

// ValidCaptureKey reports whether key is the capture key of a valid episode.
// Capture keys can be longer than a rollout id (see ParseCaptureKey).
func ValidCaptureKey(key string) bool {
	_, err := ParseCaptureKey(key)
	return err == nil
}

// Row field names of NeMo Gym's rollout collection (SPEC §2), and the row
// index NeMo RL stamps on its rows (nemo_rl/experience/rollouts.py
// _prepare_nemo_gym_rows and rollout_manager.py _build_inputs at 7ea279abfbeb).
const (
	FieldRolloutID    = "_ng_rollout_id"
	FieldAttemptIndex = "_ng_attempt_index"
	FieldTaskIndex    = "_ng_task_index"
	FieldRolloutIndex = "_ng_rollout_index"
	FieldRowIdx       = "_rowidx"
	FieldAgentRef     = "agent_ref"
	FieldParams       = "responses_create_params"
)

// IdentityFields are the row fields FromRow and Generate read (an array, so
// that no caller can change the package's).
func IdentityFields() [5]string {
	return [...]string{FieldRolloutID, FieldAttemptIndex, FieldTaskIndex, FieldRolloutIndex, FieldRowIdx}
}

// ErrRolloutIDRequired reports a row that names no rollout.
var ErrRolloutIDRequired = errors.New("rollout id required: send _ng_rollout_id, or _ng_task_index and _ng_rollout_index, or the /ng-rollout/<capture_key> prefix")

// FromRow reads the episode id a dataset row names, as NeMo Gym's
// maybe_rollout_id_from_run_body does (nemo_gym/rollout_correlation.py at
// 07d6b0d07b22): the rollout id is _ng_rollout_id, or
// <_ng_task_index>-<_ng_rollout_index>; the attempt is _ng_attempt_index
// (0 when absent). A row naming neither is ErrRolloutIDRequired: upstream
// leaves such a row uncaptured, and Resolve names it with Generate.
// Indices are non-negative integers, as JSON numbers or decimal strings
// (Gym formats and int()s what it is given).
func FromRow(row map[string]any) (EpisodeID, error) {
	var id EpisodeID
	if v, ok := row[FieldRolloutID]; ok && v != nil {
		s, ok := v.(string)
		if !ok {
			return id, fmt.Errorf("%w: %s must be a string", ErrInvalidID, FieldRolloutID)
		}
		id.RolloutID = s
	} else {
		t, okT, err := indexField(row, FieldTaskIndex)
		if err != nil {
			return id, err
		}
		r, okR, err := indexField(row, FieldRolloutIndex)
		if err != nil {
			return id, err
		}
		if !okT || !okR {
			return id, ErrRolloutIDRequired
		}
		id.RolloutID = strconv.FormatInt(t, 10) + "-" + strconv.FormatInt(r, 10)
	}
	n, err := attemptField(row)
	if err != nil {
		return id, err
	}
	id.Attempt = n
	return id, id.Validate()
}

// Generate names a row that FromRow cannot name (NeMo RL's rows carry only
// _rowidx, and on its async path _ng_task_index): "t<task>-row<rowidx>-g<hex>",
// with each part present only when the row has it, and 64 random bits that
// make every /run of such a row a rollout of its own. Neither index is
// unique on its own across NeMo RL's steps (_rowidx restarts at 0 in every
// batch), and NeMo RL sends a row again after a failure while the first
// execution may still be running or have left a ledger under its key; a
// derived id would refuse the resend as a duplicate or mix two executions'
// captures. The reply's episode_id, and the environment's GET /episodes
// while it runs, tell the caller the id.
func Generate(row map[string]any, nonce [8]byte) (EpisodeID, error) {
	var id EpisodeID
	var b []byte
	if t, ok, err := indexField(row, FieldTaskIndex); err != nil {
		return id, err
	} else if ok {
		b = strconv.AppendInt(append(b, 't'), t, 10)
		b = append(b, '-')
	}
	if r, ok, err := indexField(row, FieldRowIdx); err != nil {
		return id, err
	} else if ok {
		b = strconv.AppendInt(append(b, "row"...), r, 10)
		b = append(b, '-')
	}
	b = append(b, 'g')
	b = hex.AppendEncode(b, nonce[:])
	id.RolloutID = string(b)
	n, err := attemptField(row)
	if err != nil {
		return id, err
	}
	id.Attempt = n
	return id, id.Validate()
}

// Resolve is FromRow, and Generate with a random nonce for a row FromRow
// cannot name; generated reports the latter.
func Resolve(row map[string]any) (id EpisodeID, generated bool, err error) {
	id, err = FromRow(row)
	if !errors.Is(err, ErrRolloutIDRequired) {
		return id, false, err
	}
	id, err = Generate(row, NewNonce())
	return id, true, err
}

// NewNonce returns 64 random bits for Generate.
func NewNonce() [8]byte {
	var n [8]byte
	_, _ = rand.Read(n[:]) // crypto/rand.Read never fails (Go 1.24+)
	return n
}

// attemptField reads _ng_attempt_index: absent or null is 0.
func attemptField(row map[string]any) (int, error) {
	v, ok := row[FieldAttemptIndex]
	if !ok || v == nil {
		return 0, nil
	}
	n, ok := intValue(v)
	if !ok || n > MaxAttempt {
		return 0, fmt.Errorf("%w: %s must be an integer from 0 to %d (a number or a decimal string), got %v", ErrInvalidID, FieldAttemptIndex, MaxAttempt, v)
	}
	return int(n), nil
}

// indexField reads an index field: ok false when absent or null, an error
// when present but not a non-negative integer.
func indexField(row map[string]any, name string) (n int64, ok bool, err error) {
	v, present := row[name]
	if !present || v == nil {
		return 0, false, nil
	}
	if n, ok = intValue(v); !ok {
		return 0, false, fmt.Errorf("%w: %s must be a non-negative integer (a number or a decimal string), got %v", ErrInvalidID, name, v)
	}
	return n, true, nil
}

// intValue reads a non-negative integer that JSON decoding may have produced
// as float64, json.Number, int or a decimal string ("2", as NeMo Gym int()s).
func intValue(v any) (int64, bool) {
	switch v := v.(type) {
	case float64:
		if v < 0 || v != float64(int64(v)) || v > 1<<40 {
			return 0, false
		}
		return int64(v), true
	case int:
		return int64(v), v >= 0
	case int64:
		return v, v >= 0
	case string:
		return decimal(strings.TrimSpace(v))
	case interface{ String() string }: // json.Number from UseNumber decoders
		return decimal(strings.TrimSpace(v.String()))
	}
	return 0, false
}

// decimal reads 1 to 18 ASCII digits.
func decimal(s string) (int64, bool) {
	if len(s) == 0 || len(s) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int64(s[i]-'0')
	}
	return n, true
}
