package sessioncookie_test

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/transport/sessioncookie"
)

func TestName(t *testing.T) {
	// Gym's own: "StatefulCounterResourcesServer___example_session_state_mgmt_resources_server"
	// (nemo_gym/server_utils.py get_session_middleware_key, Gym 07d6b0d07b22).
	if got, want := sessioncookie.Name("CounterResourcesServer", "counter.a-1"), "CounterResourcesServer___counter.a-1"; got != want {
		t.Fatalf("Name = %q, want %q", got, want)
	}
	if got, want := sessioncookie.Name("X", "a b;c=d"), "X___a_b_c_d"; got != want {
		t.Fatalf("Name = %q, want %q", got, want)
	}
}

func TestSetThenFromSetCookie(t *testing.T) {
	h := http.Header{}
	sessioncookie.Set(h, "CounterResourcesServer___counter", "resources-session-1")
	line := h.Get("Set-Cookie")
	for _, want := range []string{"CounterResourcesServer___counter=resources-session-1", "Path=/", "HttpOnly", "SameSite=Lax"} {
		if !strings.Contains(line, want) {
			t.Errorf("Set-Cookie %q lacks %q", line, want)
		}
	}
	got, err := sessioncookie.FromSetCookie(h)
	if err != nil || got != "CounterResourcesServer___counter=resources-session-1" {
		t.Fatalf("FromSetCookie = %q, %v", got, err)
	}
	if err := sessioncookie.Check(got); err != nil {
		t.Fatalf("Check(%q) = %v", got, err)
	}
}

func TestFromSetCookie(t *testing.T) {
	// A Starlette session cookie as Gym's SessionMiddleware sets it.
	gym := `StatefulCounterResourcesServer___c=eyJzZXNzaW9uX2lkIjogIjEifQ==.aB9x.Zk; path=/; Max-Age=1209600; httponly; samesite=lax`
	tests := []struct {
		name  string
		lines []string
		want  string
	}{
		{"none", nil, ""},
		{"gym", []string{gym}, "StatefulCounterResourcesServer___c=eyJzZXNzaW9uX2lkIjogIjEifQ==.aB9x.Zk"},
		{"two, last value wins", []string{"a=1", "b=2", "a=3"}, "a=3; b=2"},
		{"deleted", []string{"a=1", "b=2; Max-Age=0"}, "a=1"},
		{"malformed line skipped", []string{"=x", "a=1"}, "a=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for _, l := range tt.lines {
				h.Add("Set-Cookie", l)
			}
			got, err := sessioncookie.FromSetCookie(h)
			if err != nil || got != tt.want {
				t.Fatalf("FromSetCookie = %q, %v; want %q", got, err, tt.want)
			}
			if err := sessioncookie.Check(got); err != nil {
				t.Fatalf("Check(%q) = %v", got, err)
			}
		})
	}
}

func TestBounds(t *testing.T) {
	h := http.Header{}
	for i := range sessioncookie.MaxCookies + 1 {
		h.Add("Set-Cookie", fmt.Sprintf("c%d=v", i))
	}
	if _, err := sessioncookie.FromSetCookie(h); !errors.Is(err, sessioncookie.ErrTooLarge) {
		t.Fatalf("%d cookies: err = %v, want ErrTooLarge", sessioncookie.MaxCookies+1, err)
	}
	big := http.Header{"Set-Cookie": {"a=" + strings.Repeat("x", sessioncookie.MaxHeaderBytes)}}
	if _, err := sessioncookie.FromSetCookie(big); !errors.Is(err, sessioncookie.ErrTooLarge) {
		t.Fatalf("big cookie: err = %v, want ErrTooLarge", err)
	}
	half := strings.Repeat("x", sessioncookie.MaxHeaderBytes/2)
	two := http.Header{"Set-Cookie": {"a=" + half, "b=" + half}}
	if _, err := sessioncookie.FromSetCookie(two); !errors.Is(err, sessioncookie.ErrTooLarge) {
		t.Fatalf("two halves: err = %v, want ErrTooLarge", err)
	}
	if err := sessioncookie.Check("a=" + strings.Repeat("x", sessioncookie.MaxHeaderBytes)); !errors.Is(err, sessioncookie.ErrTooLarge) {
		t.Fatalf("Check big: %v", err)
	}
	var many []string
	for i := range sessioncookie.MaxCookies + 1 {
		many = append(many, fmt.Sprintf("c%d=v", i))
	}
	if err := sessioncookie.Check(strings.Join(many, "; ")); !errors.Is(err, sessioncookie.ErrTooLarge) {
		t.Fatalf("Check many: %v", err)
	}
	if err := sessioncookie.Check("a=1; ;;b"); err == nil {
		t.Fatal("Check accepted a malformed header")
	}
}

func TestHeader(t *testing.T) {
	if h := sessioncookie.Header(nil, ""); h != nil {
		t.Fatalf("Header(nil, \"\") = %v", h)
	}
	h := sessioncookie.Header(http.Header{"X": {"1"}}, "a=1")
	if h.Get("Cookie") != "a=1" || h.Get("X") != "1" {
		t.Fatalf("Header = %v", h)
	}
}
