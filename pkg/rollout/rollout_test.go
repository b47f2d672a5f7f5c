package rollout_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/rollout"
)

func TestEpisodeID_CaptureKeyRoundTrip(t *testing.T) {
	long := strings.Repeat("r", rollout.MaxIDLength)
	tests := []struct {
		id  rollout.EpisodeID
		key string
	}{
		{rollout.EpisodeID{RolloutID: "w"}, "w"},
		{rollout.EpisodeID{RolloutID: "w", Attempt: 1}, "w-a1"},
		{rollout.EpisodeID{RolloutID: "3-0", Attempt: 12}, "3-0-a12"},
		{rollout.EpisodeID{RolloutID: "task.7_b-c"}, "task.7_b-c"},
		// Lookalikes of an attempt suffix that are not one: attempt 0 is
		// never written, and leading zeros are not an attempt number.
		{rollout.EpisodeID{RolloutID: "r-a0"}, "r-a0"},
		{rollout.EpisodeID{RolloutID: "r-a01"}, "r-a01"},
		{rollout.EpisodeID{RolloutID: "r-a0", Attempt: 3}, "r-a0-a3"},
		{rollout.EpisodeID{RolloutID: "r-b1", Attempt: 2}, "r-b1-a2"},
		{rollout.EpisodeID{RolloutID: "ra1", Attempt: 2}, "ra1-a2"},
		{rollout.EpisodeID{RolloutID: "r", Attempt: 999999999}, "r-a999999999"},
		// Attempt numbers have at most nine digits, so ten are part of the id.
		{rollout.EpisodeID{RolloutID: "r-a1000000000"}, "r-a1000000000"},
		// A rollout id of the maximum length still has capture keys for
		// its later attempts, although they are longer than an id may be.
		{rollout.EpisodeID{RolloutID: long}, long},
		{rollout.EpisodeID{RolloutID: long, Attempt: 7}, long + "-a7"},
	}
	for _, tt := range tests {
		t.Run(shortName(tt.key), func(t *testing.T) {
			if err := tt.id.Validate(); err != nil {
				t.Fatalf("Validate(%+v): %v", tt.id, err)
			}
			if got := tt.id.CaptureKey(); got != tt.key {
				t.Fatalf("CaptureKey(%+v) = %q, want %q", tt.id, got, tt.key)
			}
			if got := tt.id.String(); got != tt.key {
				t.Fatalf("String(%+v) = %q, want %q", tt.id, got, tt.key)
			}
			got, err := rollout.ParseCaptureKey(tt.key)
			if err != nil {
				t.Fatalf("ParseCaptureKey(%q): %v", tt.key, err)
			}
			if got != tt.id {
				t.Fatalf("ParseCaptureKey(%q) = %+v, want %+v", tt.key, got, tt.id)
			}
			if !rollout.ValidCaptureKey(tt.key) {
				t.Fatalf("ValidCaptureKey(%q) = false", tt.key)
			}
		})
	}
}

// shortName keeps subtest names of maximum-length ids readable.
func shortName(key string) string {
	if len(key) <= 32 {
		return key
	}
	return key[:8] + "..." + key[len(key)-8:]
}

func TestParseCaptureKey_Invalid(t *testing.T) {
	for _, key := range []string{
		"", "-a1", ".r", "_r", "r/x", "r x", "r-a1-a2", // a rollout id cannot itself end in -aN
		"ré", strings.Repeat("r", rollout.MaxIDLength+1),
		strings.Repeat("r", rollout.MaxIDLength+1) + "-a1",
		"../etc-a1",
	} {
		t.Run(shortName(key), func(t *testing.T) {
			id, err := rollout.ParseCaptureKey(key)
			if !errors.Is(err, rollout.ErrInvalidID) {
				t.Fatalf("ParseCaptureKey(%q) = %+v, %v; want ErrInvalidID", key, id, err)
			}
			if rollout.ValidCaptureKey(key) {
				t.Fatalf("ValidCaptureKey(%q) = true", key)
			}
		})
	}
}

// FuzzParseCaptureKey: a key that parses names a valid episode whose capture
// key is exactly the key, and the episode's next attempt round-trips too.
func FuzzParseCaptureKey(f *testing.F) {
	for _, s := range []string{
		"w", "w-a1", "3-0-a12", "r-a0", "r-a01", "r-a0-a3", "x-a1-a2", "-a1", "", "a b", "r-a999999999", "r-a1000000000",
		strings.Repeat("r", 128), strings.Repeat("r", 128) + "-a9", strings.Repeat("r", 129),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		id, err := rollout.ParseCaptureKey(key)
		if err != nil {
			if !errors.Is(err, rollout.ErrInvalidID) {
				t.Fatalf("ParseCaptureKey(%q) error %v does not match ErrInvalidID", key, err)
			}
			return
		}
		if err := id.Validate(); err != nil {
			t.Fatalf("ParseCaptureKey(%q) = %+v, which does not validate: %v", key, id, err)
		}
		if got := id.CaptureKey(); got != key {
			t.Fatalf("ParseCaptureKey(%q) = %+v, whose capture key is %q", key, id, got)
		}
		if next := id.Next(); next.Attempt <= rollout.MaxAttempt {
			back, err := rollout.ParseCaptureKey(next.CaptureKey())
			if err != nil || back != next {
				t.Fatalf("next attempt %+v of %q: ParseCaptureKey(%q) = %+v, %v", next, key, next.CaptureKey(), back, err)
			}
		}
	})
}

func TestValidateRolloutID(t *testing.T) {
	valid := []string{"w", "3-0", "A.b_c-d", "r-a0", "r-a01", "r-aa1", "ra1", "r-a", "x-b2", strings.Repeat("9", 128)}
	invalid := []string{"", "-r", ".r", "r/1", "r:1", strings.Repeat("9", 129), "r-a1", "r-a12", "3-0-a999999999", "a-a1"}
	for _, s := range valid {
		if err := rollout.ValidateRolloutID(s); err != nil {
			t.Errorf("ValidateRolloutID(%q) = %v, want nil", s, err)
		}
		if !rollout.ValidID(s) {
			t.Errorf("ValidID(%q) = false", s)
		}
	}
	for _, s := range invalid {
		if err := rollout.ValidateRolloutID(s); !errors.Is(err, rollout.ErrInvalidID) {
			t.Errorf("ValidateRolloutID(%q) = %v, want ErrInvalidID", s, err)
		}
	}
	// The -aN rule is about rollout ids only: such a string is a fine
	// checkpoint id or instance name.
	if !rollout.ValidID("r-a1") {
		t.Error(`ValidID("r-a1") = false`)
	}
}

func TestEpisodeID_ValidateAndNext(t *testing.T) {
	if err := (rollout.EpisodeID{RolloutID: "w", Attempt: -1}).Validate(); !errors.Is(err, rollout.ErrInvalidID) {
		t.Errorf("negative attempt: %v", err)
	}
	if err := (rollout.EpisodeID{RolloutID: "w", Attempt: 1_000_000_000}).Validate(); !errors.Is(err, rollout.ErrInvalidID) {
		t.Errorf("attempt beyond nine digits: %v", err)
	}
	if err := (rollout.EpisodeID{RolloutID: "w-a2"}).Validate(); !errors.Is(err, rollout.ErrInvalidID) {
		t.Errorf("rollout id ending in -aN: %v", err)
	}
	id := rollout.EpisodeID{RolloutID: "w", Attempt: 2}
	if got, want := id.Next(), (rollout.EpisodeID{RolloutID: "w", Attempt: 3}); got != want {
		t.Errorf("Next = %+v, want %+v", got, want)
	}
	b, err := json.Marshal(id)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `{"rollout_id":"w","attempt":2}`; got != want {
		t.Errorf("JSON = %s, want %s", got, want)
	}
}

func TestFromRow(t *testing.T) {
	tests := []struct {
		name    string
		row     string
		want    rollout.EpisodeID
		wantErr error
	}{
		{name: "rollout id", row: `{"_ng_rollout_id":"w"}`, want: rollout.EpisodeID{RolloutID: "w"}},
		{name: "rollout id and attempt", row: `{"_ng_rollout_id":"w","_ng_attempt_index":2}`, want: rollout.EpisodeID{RolloutID: "w", Attempt: 2}},
		{name: "indices", row: `{"_ng_task_index":3,"_ng_rollout_index":0}`, want: rollout.EpisodeID{RolloutID: "3-0"}},
		{name: "indices and attempt", row: `{"_ng_task_index":3,"_ng_rollout_index":1,"_ng_attempt_index":1}`, want: rollout.EpisodeID{RolloutID: "3-1", Attempt: 1}},
		{name: "rollout id wins over indices", row: `{"_ng_rollout_id":"w","_ng_task_index":3,"_ng_rollout_index":0}`, want: rollout.EpisodeID{RolloutID: "w"}},
		{name: "null rollout id falls back to indices", row: `{"_ng_rollout_id":null,"_ng_task_index":3,"_ng_rollout_index":0}`, want: rollout.EpisodeID{RolloutID: "3-0"}},
		{name: "null attempt is 0", row: `{"_ng_rollout_id":"w","_ng_attempt_index":null}`, want: rollout.EpisodeID{RolloutID: "w"}},
		{name: "integral float indices", row: `{"_ng_task_index":3.0,"_ng_rollout_index":1e1,"_ng_attempt_index":2.0}`, want: rollout.EpisodeID{RolloutID: "3-10", Attempt: 2}},
		{name: "empty row", row: `{}`, wantErr: rollout.ErrRolloutIDRequired},
		{name: "task index only", row: `{"_ng_task_index":3}`, wantErr: rollout.ErrRolloutIDRequired},
		{name: "fractional task index", row: `{"_ng_task_index":3.5,"_ng_rollout_index":0}`, wantErr: rollout.ErrRolloutIDRequired},
		{name: "negative rollout index", row: `{"_ng_task_index":3,"_ng_rollout_index":-1}`, wantErr: rollout.ErrRolloutIDRequired},
		{name: "string task index", row: `{"_ng_task_index":"3","_ng_rollout_index":0}`, wantErr: rollout.ErrRolloutIDRequired},
		{name: "numeric rollout id", row: `{"_ng_rollout_id":7}`, wantErr: rollout.ErrInvalidID},
		{name: "object rollout id", row: `{"_ng_rollout_id":{"a":1}}`, wantErr: rollout.ErrInvalidID},
		{name: "empty rollout id", row: `{"_ng_rollout_id":""}`, wantErr: rollout.ErrInvalidID},
		{name: "bad rollout id", row: `{"_ng_rollout_id":"a/b"}`, wantErr: rollout.ErrInvalidID},
		{name: "rollout id naming an attempt", row: `{"_ng_rollout_id":"w-a1"}`, wantErr: rollout.ErrInvalidID},
		{name: "negative attempt", row: `{"_ng_rollout_id":"w","_ng_attempt_index":-1}`, wantErr: rollout.ErrInvalidID},
		{name: "fractional attempt", row: `{"_ng_rollout_id":"w","_ng_attempt_index":1.5}`, wantErr: rollout.ErrInvalidID},
		{name: "string attempt", row: `{"_ng_rollout_id":"w","_ng_attempt_index":"1"}`, wantErr: rollout.ErrInvalidID},
		{name: "bool attempt", row: `{"_ng_rollout_id":"w","_ng_attempt_index":true}`, wantErr: rollout.ErrInvalidID},
		{name: "huge attempt", row: `{"_ng_rollout_id":"w","_ng_attempt_index":1e30}`, wantErr: rollout.ErrInvalidID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var row map[string]any
			if err := json.Unmarshal([]byte(tt.row), &row); err != nil {
				t.Fatal(err)
			}
			got, err := rollout.FromRow(row)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("FromRow(%s) = %+v, %v; want %v", tt.row, got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("FromRow(%s): %v", tt.row, err)
			}
			if got != tt.want {
				t.Fatalf("FromRow(%s) = %+v, want %+v", tt.row, got, tt.want)
			}
		})
	}
}

// Rows decoded with UseNumber, or built in Go, carry other number types.
func TestFromRow_NumberTypes(t *testing.T) {
	tests := []struct {
		name    string
		row     map[string]any
		want    rollout.EpisodeID
		wantErr bool
	}{
		{name: "json.Number", row: map[string]any{"_ng_task_index": json.Number("4"), "_ng_rollout_index": json.Number(" 2"), "_ng_attempt_index": json.Number("1")}, want: rollout.EpisodeID{RolloutID: "4-2", Attempt: 1}},
		{name: "fractional json.Number", row: map[string]any{"_ng_rollout_id": "w", "_ng_attempt_index": json.Number("1.0")}, wantErr: true},
		{name: "negative json.Number", row: map[string]any{"_ng_rollout_id": "w", "_ng_attempt_index": json.Number("-1")}, wantErr: true},
		{name: "int", row: map[string]any{"_ng_task_index": 4, "_ng_rollout_index": 0, "_ng_attempt_index": 3}, want: rollout.EpisodeID{RolloutID: "4-0", Attempt: 3}},
		{name: "int64", row: map[string]any{"_ng_task_index": int64(4), "_ng_rollout_index": int64(5)}, want: rollout.EpisodeID{RolloutID: "4-5"}},
		{name: "negative int", row: map[string]any{"_ng_rollout_id": "w", "_ng_attempt_index": -2}, wantErr: true},
		{name: "negative int64", row: map[string]any{"_ng_task_index": int64(-4), "_ng_rollout_index": int64(5)}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := rollout.FromRow(tt.row)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("FromRow = %+v, want an error", got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("FromRow = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}
