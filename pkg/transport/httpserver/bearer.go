package httpserver

import (
	"crypto/subtle"
	"net/http"
	"strings"
)

// BearerToken reads the token of an "Authorization: Bearer <token>" header.
// RFC 7235 makes the scheme case-insensitive and lets one or more spaces
// follow it, so "bearer t" and "BEARER  t" name the same token as "Bearer t".
func BearerToken(h http.Header) (string, bool) {
	v := h.Get("Authorization")
	scheme, token, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimLeft(token, " ")
	return token, token != ""
}

// BearerMatches reports whether r carries want as its bearer token, compared
// in constant time. An empty want never matches.
func BearerMatches(r *http.Request, want string) bool {
	got, ok := BearerToken(r.Header)
	if !ok || want == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}
