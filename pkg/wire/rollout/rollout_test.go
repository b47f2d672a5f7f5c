package rollout_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
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
		"r-a12345678901234567890", "r-a1000000000", // attempts above MaxAttempt
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
		strings.Repeat("r", 224), strings.Repeat("r", 224) + "-a9", strings.Repeat("r", 225),
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
	valid := []string{"w", "3-0", "A.b_c-d", "r-a0", "r-a01", "r-aa1", "ra1", "r-a", "x-b2", strings.Repeat("9", 128), strings.Repeat("9", 224)}
	invalid := []string{"", "-r", ".r", "r/1", "r:1", strings.Repeat("9", 225), "r-a1", "r-a12", "3-0-a999999999", "a-a1", "r-a1000000000", "r-a12345678901234567890"}
	for _, s := range valid {
		if err := rollout.ValidateRolloutID(s); err != nil {
			t.Errorf("ValidateRolloutID(%q) = %v, want nil", s, err)
		}
		if len(s) <= rollout.MaxNameLength && !rollout.ValidID(s) {
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
		{name: "rowidx only", row: `{"_rowidx":3}`, wantErr: rollout.ErrRolloutIDRequired},
		{name: "task index and rowidx", row: `{"_ng_task_index":3,"_rowidx":1}`, wantErr: rollout.ErrRolloutIDRequired},
		{name: "null indices", row: `{"_ng_task_index":null,"_ng_rollout_index":null}`, wantErr: rollout.ErrRolloutIDRequired},
		{name: "fractional task index", row: `{"_ng_task_index":3.5,"_ng_rollout_index":0}`, wantErr: rollout.ErrInvalidID},
		{name: "negative rollout index", row: `{"_ng_task_index":3,"_ng_rollout_index":-1}`, wantErr: rollout.ErrInvalidID},
		{name: "string task index", row: `{"_ng_task_index":"3","_ng_rollout_index":0}`, want: rollout.EpisodeID{RolloutID: "3-0"}},
		{name: "non-decimal string task index", row: `{"_ng_task_index":"three","_ng_rollout_index":0}`, wantErr: rollout.ErrInvalidID},
		{name: "string attempt", row: `{"_ng_rollout_id":"w","_ng_attempt_index":"1"}`, want: rollout.EpisodeID{RolloutID: "w", Attempt: 1}},
		{name: "string attempt with spaces", row: `{"_ng_rollout_id":"w","_ng_attempt_index":" 12 "}`, want: rollout.EpisodeID{RolloutID: "w", Attempt: 12}},
		{name: "signed string attempt", row: `{"_ng_rollout_id":"w","_ng_attempt_index":"-1"}`, wantErr: rollout.ErrInvalidID},
		{name: "fractional string attempt", row: `{"_ng_rollout_id":"w","_ng_attempt_index":"1.0"}`, wantErr: rollout.ErrInvalidID},
		{name: "empty string attempt", row: `{"_ng_rollout_id":"w","_ng_attempt_index":""}`, wantErr: rollout.ErrInvalidID},
		{name: "attempt above the bound", row: `{"_ng_rollout_id":"w","_ng_attempt_index":"1000000000"}`, wantErr: rollout.ErrInvalidID},
		{name: "longest rollout id", row: `{"_ng_rollout_id":"` + strings.Repeat("w", rollout.MaxIDLength) + `"}`, want: rollout.EpisodeID{RolloutID: strings.Repeat("w", rollout.MaxIDLength)}},
		{name: "rollout id past the bound", row: `{"_ng_rollout_id":"` + strings.Repeat("w", rollout.MaxIDLength+1) + `"}`, wantErr: rollout.ErrInvalidID},
		{name: "numeric rollout id", row: `{"_ng_rollout_id":7}`, wantErr: rollout.ErrInvalidID},
		{name: "object rollout id", row: `{"_ng_rollout_id":{"a":1}}`, wantErr: rollout.ErrInvalidID},
		{name: "empty rollout id", row: `{"_ng_rollout_id":""}`, wantErr: rollout.ErrInvalidID},
		{name: "bad rollout id", row: `{"_ng_rollout_id":"a/b"}`, wantErr: rollout.ErrInvalidID},
		{name: "rollout id naming an attempt", row: `{"_ng_rollout_id":"w-a1"}`, wantErr: rollout.ErrInvalidID},
		{name: "negative attempt", row: `{"_ng_rollout_id":"w","_ng_attempt_index":-1}`, wantErr: rollout.ErrInvalidID},
		{name: "fractional attempt", row: `{"_ng_rollout_id":"w","_ng_attempt_index":1.5}`, wantErr: rollout.ErrInvalidID},
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

func TestValidateRolloutID_NamesTheBound(t *testing.T) {
	err := rollout.ValidateRolloutID(strings.Repeat("x", rollout.MaxIDLength+1))
	if err == nil || !strings.Contains(err.Error(), "bound of 224 bytes") {
		t.Fatalf("ValidateRolloutID(225 bytes) = %v, want an error naming the bound", err)
	}
	for _, key := range []string{strings.Repeat("x", rollout.MaxIDLength+1), strings.Repeat("x", rollout.MaxIDLength+1) + "-a2"} {
		if _, err := rollout.ParseCaptureKey(key); err == nil || !strings.Contains(err.Error(), "bound of 224 bytes") {
			t.Fatalf("ParseCaptureKey(%d bytes) = %v, want an error naming the bound", len(key), err)
		}
	}
}

func TestGenerate(t *testing.T) {
	nonce := [8]byte{0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3}
	tests := []struct {
		name    string
		row     string
		want    rollout.EpisodeID
		wantErr bool
	}{
		// NeMo RL's sync path (rollouts.py _prepare_nemo_gym_rows at 7ea279abfbeb).
		{name: "rowidx", row: `{"_rowidx":3}`, want: rollout.EpisodeID{RolloutID: "row3-gdeadbeef00010203"}},
		// NeMo RL's async path (trajectory_collector.py _stamp_nemo_gym_task_indices).
		{name: "task index and rowidx", row: `{"_ng_task_index":17,"_rowidx":0}`, want: rollout.EpisodeID{RolloutID: "t17-row0-gdeadbeef00010203"}},
		{name: "task index alone", row: `{"_ng_task_index":17}`, want: rollout.EpisodeID{RolloutID: "t17-gdeadbeef00010203"}},
		{name: "nothing", row: `{}`, want: rollout.EpisodeID{RolloutID: "gdeadbeef00010203"}},
		{name: "string rowidx", row: `{"_rowidx":"4"}`, want: rollout.EpisodeID{RolloutID: "row4-gdeadbeef00010203"}},
		{name: "attempt as a string", row: `{"_rowidx":1,"_ng_attempt_index":"2"}`, want: rollout.EpisodeID{RolloutID: "row1-gdeadbeef00010203", Attempt: 2}},
		{name: "bad rowidx", row: `{"_rowidx":-1}`, wantErr: true},
		{name: "bad attempt", row: `{"_rowidx":1,"_ng_attempt_index":"x"}`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var row map[string]any
			if err := json.Unmarshal([]byte(tt.row), &row); err != nil {
				t.Fatal(err)
			}
			got, err := rollout.Generate(row, nonce)
			if tt.wantErr {
				if !errors.Is(err, rollout.ErrInvalidID) {
					t.Fatalf("Generate(%s) = %+v, %v; want ErrInvalidID", tt.row, got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Generate(%s) = %+v, %v; want %+v", tt.row, got, err, tt.want)
			}
			if back, err := rollout.ParseCaptureKey(got.CaptureKey()); err != nil || back != got {
				t.Fatalf("ParseCaptureKey(%q) = %+v, %v", got.CaptureKey(), back, err)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	row := map[string]any{"_ng_task_index": 5.0, "_rowidx": 2.0}
	a, genA, errA := rollout.Resolve(row)
	b, genB, errB := rollout.Resolve(row)
	if errA != nil || errB != nil || !genA || !genB {
		t.Fatalf("Resolve = %v %v %v, %v %v %v", a, genA, errA, b, genB, errB)
	}
	if a == b || !strings.HasPrefix(a.RolloutID, "t5-row2-g") {
		t.Fatalf("two /runs of one id-less row are %v and %v: want distinct ids named t5-row2-g<hex>", a, b)
	}
	got, gen, err := rollout.Resolve(map[string]any{"_ng_task_index": 5.0, "_ng_rollout_index": 1.0, "_ng_attempt_index": "1"})
	if err != nil || gen || got != (rollout.EpisodeID{RolloutID: "5-1", Attempt: 1}) {
		t.Fatalf("Resolve of a Gym row = %v %v %v, want 5-1 attempt 1, not generated", got, gen, err)
	}
	if _, _, err := rollout.Resolve(map[string]any{"_rowidx": "x"}); !errors.Is(err, rollout.ErrInvalidID) {
		t.Fatalf("Resolve of a bad _rowidx = %v, want ErrInvalidID", err)
	}
}

// FuzzResolve: any identity fields either give a valid episode whose capture
// key reads back, or an error; never a panic.
func FuzzResolve(f *testing.F) {
	f.Add(`{"_rowidx":3}`)
	f.Add(`{"_ng_task_index":1,"_rowidx":0,"_ng_attempt_index":"2"}`)
	f.Add(`{"_ng_task_index":"1","_ng_rollout_index":2}`)
	f.Add(`{"_ng_rollout_id":"w","_ng_attempt_index":1}`)
	f.Add(`{"_ng_rollout_id":null,"_ng_task_index":1e300}`)
	f.Fuzz(func(t *testing.T, body string) {
		var row map[string]any
		if json.Unmarshal([]byte(body), &row) != nil {
			return
		}
		id, _, err := rollout.Resolve(row)
		if err != nil {
			return
		}
		if id.Validate() != nil {
			t.Fatalf("Resolve(%s) = %+v, which does not validate", body, id)
		}
		if back, err := rollout.ParseCaptureKey(id.CaptureKey()); err != nil || back != id {
			t.Fatalf("ParseCaptureKey(%q) = %+v, %v", id.CaptureKey(), back, err)
		}
	})
}
