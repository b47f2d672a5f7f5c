package httpclient

import (
	"net/http"
	"testing"
	"time"
)

func TestIdempotentBackoff(t *testing.T) {
	const lo, hi = 50 * time.Millisecond, time.Second
	reply := func(status int, retryAfter string) *http.Response {
		r := &http.Response{StatusCode: status, Header: http.Header{}}
		if retryAfter != "" {
			r.Header.Set("Retry-After", retryAfter)
		}
		return r
	}
	for _, tt := range []struct {
		name    string
		attempt int
		resp    *http.Response
		want    time.Duration
	}{
		{"first retry after a transport error", 0, nil, 50 * time.Millisecond},
		{"doubles", 1, nil, 100 * time.Millisecond},
		{"doubles again", 3, reply(http.StatusBadGateway, ""), 400 * time.Millisecond},
		{"capped", 10, nil, time.Second},
		{"Retry-After on 503 is honoured", 0, reply(http.StatusServiceUnavailable, "1"), time.Second},
		{"Retry-After beyond the cap is cut to it", 0, reply(http.StatusTooManyRequests, "3600"), time.Second},
		{"Retry-After on another status is not read", 0, reply(http.StatusInternalServerError, "1"), 50 * time.Millisecond},
		{"an unreadable Retry-After falls back", 1, reply(http.StatusServiceUnavailable, "soon"), 100 * time.Millisecond},
	} {
		if got := idempotentBackoff(lo, hi, tt.attempt, tt.resp); got != tt.want {
			t.Errorf("%s: idempotentBackoff(attempt %d) = %v, want %v", tt.name, tt.attempt, got, tt.want)
		}
	}
}
