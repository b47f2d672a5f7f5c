// Package sessioncookie carries resources sessions in cookies as NeMo Gym
// does, on both sides: a resources server names its session cookie and
// sets it, and a caller (agent, environment) keeps the cookies a
// /seed_session reply set and sends them on every later call of the
// session.
//
// Upstream (NeMo Gym, commit 07d6b0d07b22): nemo_gym/server_utils.py
// SimpleServer.setup_session_middleware names the cookie
// "{ClassName}___{instance name}" and sets it on every response, path /,
// HttpOnly, SameSite=lax; responses_api_agents/simple_agent/app.py echoes
// the cookies of /seed_session on tool calls and /verify. Gym's client
// keeps no cookie jar (DummyCookieJar): every hop is explicit, so one
// Cookie header per session is all a caller holds.
package sessioncookie

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Bounds on what a caller keeps of a peer's cookies: they are echoed on
// every call and written into checkpoint records, so a peer must not grow
// them without limit. The bounds sit far above a Gym session cookie (one
// signed session id) and match what browsers keep per cookie.
const (
	// MaxCookies is the most cookies one session carries.
	MaxCookies = 16
	// MaxHeaderBytes bounds the Cookie header a session sends.
	MaxHeaderBytes = 4096
)

// Name is a server's session cookie name in Gym's style:
// "<class>___<instance>". Bytes a cookie name cannot hold become '_'.
func Name(class, instance string) string {
	b := []byte(class + "___" + instance)
	for i, c := range b {
		if !isTokenByte(c) {
			b[i] = '_'
		}
	}
	return string(b)
}

// Set adds a Set-Cookie naming session id under name: path /, HttpOnly,
// SameSite=Lax, as Starlette's SessionMiddleware sets Gym's. It has no
// Max-Age: the session lives until /close_session, not for a duration.
func Set(h http.Header, name, id string) {
	c := http.Cookie{Name: name, Value: id, Path: "/", HttpOnly: true, SameSite: http.SameSiteLaxMode}
	h.Add("Set-Cookie", c.String())
}

// Expire adds a Set-Cookie that deletes the cookie name (a closed session).
func Expire(h http.Header, name string) {
	c := http.Cookie{Name: name, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteLaxMode}
	h.Add("Set-Cookie", c.String())
}

// ErrTooLarge is returned for cookies past MaxCookies or MaxHeaderBytes.
var ErrTooLarge = errors.New("session cookies too large")

// FromSetCookie returns the Cookie header value that echoes every cookie
// the Set-Cookie lines of h set ("a=1; b=2"), or "" when they set none.
// A cookie set twice keeps its last value; a deleting one (Max-Age <= 0)
// is left out. Past the bounds it fails with ErrTooLarge.
func FromSetCookie(h http.Header) (string, error) {
	lines := h.Values("Set-Cookie")
	if len(lines) == 0 {
		return "", nil
	}
	if len(lines) > MaxCookies*2 {
		return "", fmt.Errorf("%w: %d Set-Cookie lines (at most %d cookies are kept)", ErrTooLarge, len(lines), MaxCookies)
	}
	var names []string
	values := map[string]string{}
	for _, line := range lines {
		if len(line) > MaxHeaderBytes {
			return "", fmt.Errorf("%w: a Set-Cookie line of %d bytes (at most %d)", ErrTooLarge, len(line), MaxHeaderBytes)
		}
		c, err := http.ParseSetCookie(line)
		if err != nil {
			continue // as a client does: a malformed line sets nothing
		}
		if _, seen := values[c.Name]; !seen {
			names = append(names, c.Name)
		}
		if c.MaxAge < 0 {
			values[c.Name] = "\x00" // deleted; dropped below
			continue
		}
		values[c.Name] = c.Value
	}
	var b strings.Builder
	n := 0
	for _, name := range names {
		v := values[name]
		if v == "\x00" {
			continue
		}
		n++
		if n > MaxCookies {
			return "", fmt.Errorf("%w: more than %d cookies", ErrTooLarge, MaxCookies)
		}
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		b.WriteString((&http.Cookie{Name: name, Value: v}).String())
	}
	if b.Len() > MaxHeaderBytes {
		return "", fmt.Errorf("%w: %d bytes of cookies (at most %d)", ErrTooLarge, b.Len(), MaxHeaderBytes)
	}
	return b.String(), nil
}

// Check validates a Cookie header value a caller stores or receives (a
// checkpoint record, an agent session's open request): "" or a well-formed
// header within the bounds.
func Check(header string) error {
	if header == "" {
		return nil
	}
	if len(header) > MaxHeaderBytes {
		return fmt.Errorf("%w: %d bytes of cookies (at most %d)", ErrTooLarge, len(header), MaxHeaderBytes)
	}
	cs, err := http.ParseCookie(header)
	if err != nil {
		return fmt.Errorf("malformed cookies %.60q: %v", header, err)
	}
	if len(cs) > MaxCookies {
		return fmt.Errorf("%w: %d cookies (at most %d)", ErrTooLarge, len(cs), MaxCookies)
	}
	return nil
}

// Header returns a header carrying cookies in Cookie, added to h (a new
// header when h is nil); cookies "" leaves h as it is.
func Header(h http.Header, cookies string) http.Header {
	if cookies == "" {
		return h
	}
	if h == nil {
		h = http.Header{}
	}
	h.Set("Cookie", cookies)
	return h
}

// isTokenByte reports whether c may appear in a cookie name (an RFC 7230
// token character).
func isTokenByte(c byte) bool {
	if c <= ' ' || c >= 0x7f {
		return false
	}
	return !strings.ContainsRune(`()<>@,;:\"/[]?={}`, rune(c))
}
