package agent

import (
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/ctlplane"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

// TestLegacyBoundary_Cookies: a legacy boundary carries the resources
// session's cookies across a restore; one recorded before cookies were
// carried restores with none; malformed cookies are refused.
func TestLegacyBoundary_Cookies(t *testing.T) {
	p := &legacyProgress{next: stageSeed, rsid: "rs", cookies: `A___b=s1.x; B___c="q"`}
	b, err := codec.Marshal(legacyBoundary{Next: p.next, ResourcesSessionID: p.rsid, ResourcesCookies: p.cookies, VerifyMode: "wait"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeLegacyBoundary(b)
	if err != nil || got.cookies != p.cookies || got.resources().header().Get("Cookie") != p.cookies {
		t.Fatalf("decode %s = %+v, %v", b, got, err)
	}
	old, err := decodeLegacyBoundary(codec.RawMessage(`{"next":"seed","resources_session_id":"rs","verify_mode":"wait"}`))
	if err != nil || old.cookies != "" || old.resources().header().Get("Cookie") != "" {
		t.Fatalf("a record without cookies: %+v, %v", old, err)
	}
	for _, bad := range []string{"a=1; ;;b", "a=" + strings.Repeat("x", 5000)} {
		raw, _ := codec.Marshal(legacyBoundary{Next: stageSeed, ResourcesSessionID: "rs", ResourcesCookies: bad, VerifyMode: "wait"})
		if _, err := decodeLegacyBoundary(raw); err == nil {
			t.Errorf("cookies %.20q accepted", bad)
		}
	}
}

// TestSessionRecord_CookiesOptional: a session record written before
// cookies were carried restores with none; one with cookies keeps them.
func TestSessionRecord_CookiesOptional(t *testing.T) {
	for _, c := range []struct{ cookies, field string }{{"", ""}, {"A___b=s1", `"resources_cookies":"A___b=s1",`}} {
		rec := `{"type":"agent_session","episode_id":{"rollout_id":"r","attempt":0},"session_id":"s","session":{"request":null,"resources_session_id":"rs",` + c.field +
			`"activations":0,"completed_activation":0,"completed_reply":null,"observations":{"activations":0,"steps":0,"model_calls":0,"tool_calls":0,"usage":null,"resources_session_id":"rs"}},"boundary":null}`
		sess, err := decodeSessionRecord(ctlplane.Record{EpisodeID: rollout.EpisodeID{RolloutID: "r"}, Data: []byte(rec)}, nil)
		if err != nil || sess.resourcesCookies != c.cookies {
			t.Errorf("record %s: %+v, %v", rec, sess, err)
		}
	}
}
