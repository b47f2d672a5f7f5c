package rollout_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/gymfleet/gymfleet/pkg/wire/rollout"
)

func TestContext(t *testing.T) {
	if id, ok := rollout.FromContext(context.Background()); ok {
		t.Fatalf("empty context carries %+v", id)
	}
	want := rollout.EpisodeID{RolloutID: "w", Attempt: 2}
	got, ok := rollout.FromContext(rollout.WithEpisode(context.Background(), want))
	if !ok || got != want {
		t.Fatalf("FromContext = %+v, %v; want %+v", got, ok, want)
	}
}

func TestPath(t *testing.T) {
	tests := []struct {
		id   rollout.EpisodeID
		path string
		want string
	}{
		{rollout.EpisodeID{RolloutID: "w"}, "/v1/responses", "/ng-rollout/w/v1/responses"},
		{rollout.EpisodeID{RolloutID: "w", Attempt: 3}, "/seed_session", "/ng-rollout/w-a3/seed_session"},
	}
	for _, tt := range tests {
		got := rollout.Path(tt.id, tt.path)
		if got != tt.want {
			t.Errorf("Path(%+v, %q) = %q, want %q", tt.id, tt.path, got, tt.want)
		}
		key, rest, ok := rollout.SplitPath(got)
		if !ok || key != tt.id.CaptureKey() || rest != tt.path {
			t.Errorf("SplitPath(%q) = %q, %q, %v", got, key, rest, ok)
		}
	}
}

func TestSplitPath(t *testing.T) {
	tests := []struct {
		path, key, rest string
		ok              bool
	}{
		{"/ng-rollout/w-a1/v1/chat/completions", "w-a1", "/v1/chat/completions", true},
		{"/ng-rollout/w/", "w", "/", true},
		{"/ng-rollout/w", "", "/ng-rollout/w", false},
		{"/ng-rollout//x", "", "/ng-rollout//x", false},
		{"/ng-rollout/", "", "/ng-rollout/", false},
		{"/v1/models", "", "/v1/models", false},
		{"/x/ng-rollout/w/y", "", "/x/ng-rollout/w/y", false},
		// NeMo Gym's training-capture segment (nemo_gym/config_types.py,
		// base_responses_api_agent.py at Gym 07d6b0d07b22) routes as the
		// plain prefix.
		{"/ng-rollout/w-a1/training-token-capture/v1/responses", "w-a1", "/v1/responses", true},
		{"/ng-rollout/3-1/training-token-capture/v1/chat/completions", "3-1", "/v1/chat/completions", true},
		{"/ng-rollout/w/training-token-capture/", "w", "/", true},
		{"/ng-rollout/w/training-token-capture", "w", "/training-token-capture", true},
		{"/ng-rollout/w/training-token-captured/x", "w", "/training-token-captured/x", true},
		{"/ng-rollout/w/v1/training-token-capture/x", "w", "/v1/training-token-capture/x", true},
	}
	for _, tt := range tests {
		key, rest, ok := rollout.SplitPath(tt.path)
		if key != tt.key || rest != tt.rest || ok != tt.ok {
			t.Errorf("SplitPath(%q) = %q, %q, %v; want %q, %q, %v", tt.path, key, rest, ok, tt.key, tt.rest, tt.ok)
		}
	}
}

// seen is what the handler behind StripPrefix observed.
type seen struct {
	path, rawPath, param string
	episode              rollout.EpisodeID
	hasEpisode           bool
}

// newStripRouter is a chi router behind StripPrefix, the way httpserver
// mounts it, recording what its one route saw.
func newStripRouter(t *testing.T, got *seen, invalid *error) http.Handler {
	t.Helper()
	r := chi.NewRouter()
	r.Use(rollout.StripPrefix(func(w http.ResponseWriter, req *http.Request, err error) {
		*invalid = err
		http.Error(w, "bad key", http.StatusBadRequest)
	}))
	record := func(w http.ResponseWriter, req *http.Request) {
		*got = seen{path: req.URL.Path, rawPath: req.URL.RawPath, param: chi.URLParam(req, "name")}
		got.episode, got.hasEpisode = rollout.FromContext(req.Context())
		w.WriteHeader(http.StatusNoContent)
	}
	r.Get("/items/{name}", record)
	r.Get("/items/{name}/detail", record)
	return r
}

func TestStripPrefix(t *testing.T) {
	tests := []struct {
		name       string
		target     string
		wantStatus int
		want       seen
	}{
		{
			name: "unprefixed", target: "/items/a", wantStatus: http.StatusNoContent,
			want: seen{path: "/items/a", param: "a"},
		},
		{
			name: "attempt 0", target: "/ng-rollout/w/items/a", wantStatus: http.StatusNoContent,
			want: seen{path: "/items/a", param: "a", episode: rollout.EpisodeID{RolloutID: "w"}, hasEpisode: true},
		},
		{
			name: "later attempt", target: "/ng-rollout/3-0-a2/items/b/detail", wantStatus: http.StatusNoContent,
			want: seen{path: "/items/b/detail", param: "b", episode: rollout.EpisodeID{RolloutID: "3-0", Attempt: 2}, hasEpisode: true},
		},
		{
			// An escaped slash keeps its segment whole with or without the
			// prefix: chi routes on RawPath, which must lose the prefix too.
			name: "escaped slash unprefixed", target: "/items/a%2Fb", wantStatus: http.StatusNoContent,
			want: seen{path: "/items/a/b", rawPath: "/items/a%2Fb", param: "a%2Fb"},
		},
		{
			name: "escaped slash prefixed", target: "/ng-rollout/w-a1/items/a%2Fb", wantStatus: http.StatusNoContent,
			want: seen{path: "/items/a/b", rawPath: "/items/a%2Fb", param: "a%2Fb", episode: rollout.EpisodeID{RolloutID: "w", Attempt: 1}, hasEpisode: true},
		},
		{
			name: "training-token-capture segment", target: "/ng-rollout/w-a1/training-token-capture/items/a%2Fb", wantStatus: http.StatusNoContent,
			want: seen{path: "/items/a/b", rawPath: "/items/a%2Fb", param: "a%2Fb", episode: rollout.EpisodeID{RolloutID: "w", Attempt: 1}, hasEpisode: true},
		},
		{
			// The key itself escaped: RawPath no longer matches the
			// stripped path once split, so routing falls back to Path.
			name: "escaped key", target: "/ng-rollout/%77/items/c", wantStatus: http.StatusNoContent,
			want: seen{path: "/items/c", param: "c", episode: rollout.EpisodeID{RolloutID: "w"}, hasEpisode: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got seen
			var invalid error
			h := newStripRouter(t, &got, &invalid)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tt.target, nil))
			if rec.Code != tt.wantStatus {
				t.Fatalf("status = %d, want %d (body %q)", rec.Code, tt.wantStatus, rec.Body)
			}
			if invalid != nil {
				t.Fatalf("onInvalid called with %v", invalid)
			}
			if got != tt.want {
				t.Fatalf("handler saw %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestStripPrefix_InvalidKey(t *testing.T) {
	for _, target := range []string{
		"/ng-rollout/w-a1-a2/items/a", // a rollout id ending in -aN
		"/ng-rollout/.w/items/a",
		"/ng-rollout/w%20x/items/a",
		"/ng-rollout/w%2Fitems/a", // an escaped "/" does not end the key
		"/ng-rollout/a%2Fb/items/c",
		"/ng-rollout/" + strings.Repeat("w", rollout.MaxIDLength+1) + "/items/a",
	} {
		t.Run(target[:min(len(target), 40)], func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, target, nil)
			var got seen
			var invalid error
			h := newStripRouter(t, &got, &invalid)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusBadRequest || !errors.Is(invalid, rollout.ErrInvalidID) {
				t.Fatalf("status %d, onInvalid(%v); want 400 and ErrInvalidID", rec.Code, invalid)
			}
			if got != (seen{}) {
				t.Fatalf("the handler ran: %+v", got)
			}
		})
	}
}

func TestStripPrefix_LeavesOriginalRequestAlone(t *testing.T) {
	var inner *http.Request
	h := rollout.StripPrefix(func(http.ResponseWriter, *http.Request, error) { t.Fatal("onInvalid called") })(
		http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { inner = r }))
	req := httptest.NewRequest(http.MethodGet, "/ng-rollout/w/x?q=1", nil)
	h.ServeHTTP(httptest.NewRecorder(), req)
	if req.URL.Path != "/ng-rollout/w/x" {
		t.Fatalf("the caller's request was modified: %q", req.URL.Path)
	}
	if inner == nil || inner.URL.Path != "/x" || inner.URL.RawQuery != "q=1" {
		t.Fatalf("inner request = %+v", inner)
	}
}
