package rollout_test

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// The patterns SPEC §2 states; rollout matches them by hand, for speed.
var (
	namePattern   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	idPattern     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,223}$`)
	attemptSuffix = regexp.MustCompile(`-a([1-9][0-9]{0,8})$`)
	// attemptLike is what a rollout id must not end with: an attempt
	// suffix, or one with too many digits for an attempt.
	attemptLike = regexp.MustCompile(`-a[1-9][0-9]*$`)
)

// parseByPattern is ParseCaptureKey as the regular expressions define it.
func parseByPattern(key string) (rollout.EpisodeID, bool) {
	if m := attemptSuffix.FindStringSubmatchIndex(key); m != nil {
		n, err := strconv.Atoi(key[m[2]:m[3]])
		id := rollout.EpisodeID{RolloutID: key[:m[0]], Attempt: n}
		return id, err == nil && idPattern.MatchString(id.RolloutID) && !attemptLike.MatchString(id.RolloutID)
	}
	return rollout.EpisodeID{RolloutID: key}, idPattern.MatchString(key) && !attemptLike.MatchString(key)
}

func checkAgainstPatterns(t *testing.T, s string) {
	t.Helper()
	if got, want := rollout.ValidID(s), namePattern.MatchString(s); got != want {
		t.Fatalf("ValidID(%q) = %v, the pattern says %v", s, got, want)
	}
	wantValid := idPattern.MatchString(s) && !attemptLike.MatchString(s)
	if got := rollout.ValidateRolloutID(s) == nil; got != wantValid {
		t.Fatalf("ValidateRolloutID(%q) accepts = %v, the patterns say %v", s, got, wantValid)
	}
	id, err := rollout.ParseCaptureKey(s)
	wantID, ok := parseByPattern(s)
	if (err == nil) != ok || (ok && id != wantID) {
		t.Fatalf("ParseCaptureKey(%q) = %+v, %v; the patterns say %+v, %v", s, id, err, wantID, ok)
	}
}

var patternSeeds = []string{
	"", "r", "R9", "_r", ".r", "-r", "r_", "r.", "r-", "a b", "r/x", "r\x00", "é", "ré", "r\xff",
	"r-a1", "r-a0", "r-a01", "r-a10", "r-a999999999", "r-a1000000000", "r-a", "-a1", "r-a1-a2", "r-a-a2",
	"r-a1x", "r-A1", "r--a1", "ra1", "3-0-a12", "r-a१", "r-a１",
	strings.Repeat("r", 127), strings.Repeat("r", 128), strings.Repeat("r", 129),
	strings.Repeat("r", 223), strings.Repeat("r", 224), strings.Repeat("r", 225),
	strings.Repeat("r", 224) + "-a7", strings.Repeat("r", 225) + "-a7", strings.Repeat("é", 112),
}

func TestPatternsByHand(t *testing.T) {
	for _, s := range patternSeeds {
		checkAgainstPatterns(t, s)
	}
}

// FuzzPatternsByHand: ValidID, ValidateRolloutID and ParseCaptureKey agree
// with the regular expressions of SPEC §2 on any string.
func FuzzPatternsByHand(f *testing.F) {
	for _, s := range patternSeeds {
		f.Add(s)
	}
	f.Fuzz(checkAgainstPatterns)
}

// FuzzCompareCaptureKeys: CompareCaptureKeys orders as the capture keys do.
func FuzzCompareCaptureKeys(f *testing.F) {
	f.Add("r", 0, "r", 1)
	f.Add("r", 2, "r", 10)
	f.Add("r-a", 0, "r", 1)
	f.Add("r", 1, "r-b", 0)
	f.Add(strings.Repeat("x", 128), 999999999, strings.Repeat("x", 128), 99999999)
	f.Add(strings.Repeat("x", 224), 999999999, strings.Repeat("x", 224), 99999999)
	f.Fuzz(func(t *testing.T, ra string, aa int, rb string, ab int) {
		a, b := rollout.EpisodeID{RolloutID: ra, Attempt: aa}, rollout.EpisodeID{RolloutID: rb, Attempt: ab}
		if a.Validate() != nil || b.Validate() != nil {
			return
		}
		if got, want := rollout.CompareCaptureKeys(a, b), strings.Compare(a.CaptureKey(), b.CaptureKey()); got != want {
			t.Fatalf("CompareCaptureKeys(%v, %v) = %d, the keys compare %d", a, b, got, want)
		}
		if got := string(a.AppendCaptureKey([]byte("p:"))); got != "p:"+a.CaptureKey() {
			t.Fatalf("AppendCaptureKey(%v) = %q", a, got)
		}
	})
}

func TestCompareCaptureKeysDoesNotAllocate(t *testing.T) {
	long := strings.Repeat("x", rollout.MaxIDLength)
	a, b := rollout.EpisodeID{RolloutID: long, Attempt: 999999999}, rollout.EpisodeID{RolloutID: long, Attempt: 99999999}
	if n := testing.AllocsPerRun(100, func() { rollout.CompareCaptureKeys(a, b) }); n != 0 {
		t.Fatalf("CompareCaptureKeys allocates %v times", n)
	}
}

// The checks every checkpoint record and fenced request runs stay free of
// allocations at the longest ids.
func TestHotPathsDoNotAllocate(t *testing.T) {
	long := strings.Repeat("x", rollout.MaxIDLength)
	key := long + "-a999999999"
	rec := []byte(`{"rollout_id":"` + long + `","attempt":7},"rest"`)
	id := rollout.EpisodeID{RolloutID: long, Attempt: 7}
	buf := make([]byte, 0, 256)
	for name, fn := range map[string]func(){
		"ValidateRolloutID": func() { _ = rollout.ValidateRolloutID(long) },
		"ValidID":           func() { _ = rollout.ValidID("checkpoint-1") },
		"ParseCaptureKey":   func() { _, _ = rollout.ParseCaptureKey(key) },
		"ValidCaptureKey":   func() { _ = rollout.ValidCaptureKey(long) },
		"Validate":          func() { _ = id.Validate() },
		"AppendCaptureKey":  func() { buf = id.AppendCaptureKey(buf[:0]) },
		"CutEpisodeIDJSON":  func() { _, _, _, _ = rollout.CutEpisodeIDJSON(rec) },
	} {
		if n := testing.AllocsPerRun(100, fn); n != 0 {
			t.Errorf("%s allocates %v times", name, n)
		}
	}
}
