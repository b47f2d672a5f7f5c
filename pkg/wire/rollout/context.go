package rollout

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// PathPrefix is the first path segment that carries a capture key on data
// routes: /ng-rollout/<capture_key>/...
const PathPrefix = "/ng-rollout/"

// TokenCaptureSegment may follow the capture key: NeMo Gym's agents put it
// there when their training-token capture is on
// (nemo_gym/config_types.py TOKEN_CAPTURE_PATH_SEGMENT, Gym commit
// 07d6b0d07b22), and its model server strips it with the prefix. Every call
// under the prefix is captured here, so the segment changes nothing but
// the route.
const TokenCaptureSegment = "/training-token-capture"

type ctxKey struct{}

// WithEpisode returns a context that carries the episode a request belongs to.
func WithEpisode(ctx context.Context, id EpisodeID) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// FromContext returns the episode a request belongs to, if it named one.
func FromContext(ctx context.Context) (EpisodeID, bool) {
	id, ok := ctx.Value(ctxKey{}).(EpisodeID)
	return id, ok
}

// SplitPath splits /ng-rollout/<capture_key>/rest, or
// /ng-rollout/<capture_key>/training-token-capture/rest, into the capture
// key and /rest, as NeMo Gym's model server does
// (^/ng-rollout/(?P<id>[^/]+)(/training-token-capture)?(?P<rest>/.*)$). ok
// is false when the path carries no prefix.
func SplitPath(path string) (key, rest string, ok bool) {
	if !strings.HasPrefix(path, PathPrefix) {
		return "", path, false
	}
	tail := path[len(PathPrefix):]
	i := strings.IndexByte(tail, '/')
	if i <= 0 {
		return "", path, false
	}
	key, rest = tail[:i], tail[i:]
	// As in Gym's expression, the segment is taken only when a path
	// follows it: /ng-rollout/k/training-token-capture alone is that route.
	if after, found := strings.CutPrefix(rest, TokenCaptureSegment); found && strings.HasPrefix(after, "/") {
		rest = after
	}
	return key, rest, true
}

// Path builds the prefixed form of path for an episode.
func Path(id EpisodeID, path string) string {
	return PathPrefix + id.CaptureKey() + path
}

// StripPrefix is middleware that removes the /ng-rollout/<capture_key> prefix
// before routing and puts the episode in the request context. A malformed
// capture key is answered by onInvalid.
func StripPrefix(onInvalid func(http.ResponseWriter, *http.Request, error)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r2, err := Unprefix(r)
			if err != nil {
				onInvalid(w, r, err)
				return
			}
			next.ServeHTTP(w, r2)
		})
	}
}

// Unprefix is StripPrefix for one request: r itself when its path has no
// /ng-rollout/<capture_key>/ prefix, else a shallow copy routed as if
// unprefixed with the episode in its context; an error (ErrInvalidID) for
// a prefix whose key does not parse.
func Unprefix(r *http.Request) (*http.Request, error) {
	return unprefix(r, nil)
}

// UnprefixIn is Unprefix with ctx as the context of the request it
// returns, always a shallow copy of r: one copy where Unprefix and
// WithContext would make two.
func UnprefixIn(ctx context.Context, r *http.Request) (*http.Request, error) {
	return unprefix(r, ctx)
}

// unprefix is Unprefix, in ctx when it is not nil.
func unprefix(r *http.Request, ctx context.Context) (*http.Request, error) {
	// Split the escaped path: in the decoded one an escaped "/" inside the
	// key (a%2Fb) would end the key early and send the rest of it to
	// another route.
	rawKey, rawRest, ok := SplitPath(r.URL.EscapedPath())
	if !ok {
		if ctx != nil {
			return r.WithContext(ctx), nil
		}
		return r, nil
	}
	key, err := url.PathUnescape(rawKey)
	if err != nil {
		return nil, fmt.Errorf("%w: capture key %q is not a valid path segment", ErrInvalidID, rawKey)
	}
	id, err := ParseCaptureKey(key)
	if err != nil {
		return nil, err
	}
	rest, err := url.PathUnescape(rawRest)
	if err != nil {
		return nil, fmt.Errorf("%w: path %q is not validly escaped", ErrInvalidID, rawRest)
	}
	if ctx == nil {
		ctx = r.Context()
	}
	// A shallow copy: only the URL changes, and the handler never sees
	// the prefixed path.
	r2 := r.WithContext(WithEpisode(ctx, id))
	u := *r.URL
	u.Path, u.RawPath = rest, ""
	// chi routes on RawPath when it is set (an escaped "/" in a segment),
	// so RawPath keeps the escaped rest when it is not the default
	// encoding of Path, as in url.URL.
	if u.EscapedPath() != rawRest {
		u.RawPath = rawRest
	}
	r2.URL = &u
	return r2, nil
}
