package httpserver_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gymfleet/gymfleet/pkg/transport/httpserver"
)

func TestBearerMatches(t *testing.T) {
	for _, tc := range []struct {
		header string
		want   bool
	}{
		{"Bearer s3cret", true},
		{"bearer s3cret", true},
		{"BEARER s3cret", true},
		{"Bearer   s3cret", true},
		{"Bearer s3cret ", false},
		{"Bearer S3CRET", false}, // the token itself is case-sensitive
		{"Bearer", false},
		{"Bearer ", false},
		{"Basic s3cret", false},
		{"Bearers3cret", false},
		{"", false},
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		if tc.header != "" {
			r.Header.Set("Authorization", tc.header)
		}
		if got := httpserver.BearerMatches(r, "s3cret"); got != tc.want {
			t.Errorf("BearerMatches(%q) = %v, want %v", tc.header, got, tc.want)
		}
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer ")
	if httpserver.BearerMatches(r, "") {
		t.Error("an empty configured token matched an empty bearer token")
	}
}
