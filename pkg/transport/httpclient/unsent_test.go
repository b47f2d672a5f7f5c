package httpclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gymfleet/gymfleet/pkg/transport/h2client"
)

// scriptedTransport fails its first sends with the errors it is given and
// then replies 200, recording each body it was sent.
type scriptedTransport struct {
	errs   []error
	bodies []string
	closed int
}

func (s *scriptedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	b, _ := io.ReadAll(req.Body)
	s.bodies = append(s.bodies, string(b))
	if n := len(s.bodies); n <= len(s.errs) {
		return nil, s.errs[n-1]
	}
	return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
}

func (s *scriptedTransport) CloseIdleConnections() { s.closed++ }

func unsentErr() error {
	return fmt.Errorf("%w: stream refused (REFUSED_STREAM)", h2client.ErrNotProcessed)
}

func post(t *testing.T, ctx context.Context, rt http.RoundTripper) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://example.invalid/run", strings.NewReader(`{"row":1}`))
	if err != nil {
		t.Fatal(err)
	}
	return rt.RoundTrip(req)
}

func TestResendUnsent(t *testing.T) {
	noPause := func(int) time.Duration { return 0 }
	t.Run("an unsent request is sent again with its whole body", func(t *testing.T) {
		next := &scriptedTransport{errs: []error{unsentErr(), unsentErr()}}
		resp, err := post(t, context.Background(), resendUnsent{next: next, pause: noPause})
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("RoundTrip = %v, %v", resp, err)
		}
		if len(next.bodies) != 3 || next.bodies[0] != `{"row":1}` || next.bodies[2] != `{"row":1}` {
			t.Errorf("bodies sent %q", next.bodies)
		}
	})
	t.Run("a request whose connection could not be opened is sent again", func(t *testing.T) {
		dialTimedOut := fmt.Errorf("h2c: %w", &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded})
		next := &scriptedTransport{errs: []error{dialTimedOut}}
		resp, err := post(t, context.Background(), resendUnsent{next: next, pause: noPause})
		if err != nil || resp.StatusCode != 200 || len(next.bodies) != 2 || next.bodies[1] != `{"row":1}` {
			t.Fatalf("RoundTrip = %v, %v after bodies %q; want 200 on the second send", resp, err, next.bodies)
		}
	})
	t.Run("a failed read on an open connection is not retried", func(t *testing.T) {
		next := &scriptedTransport{errs: []error{&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}}}
		if _, err := post(t, context.Background(), resendUnsent{next: next, pause: noPause}); err == nil || len(next.bodies) != 1 {
			t.Fatalf("err %v after %d sends, want the error after 1", err, len(next.bodies))
		}
	})
	t.Run("a server that speaks HTTP/1.x is not sent to again", func(t *testing.T) {
		http1 := fmt.Errorf("h2c connection to x: %w", h2client.ErrHTTP1Server)
		next := &scriptedTransport{errs: []error{http1}}
		if _, err := post(t, context.Background(), resendUnsent{next: next, pause: noPause}); !errors.Is(err, h2client.ErrHTTP1Server) || len(next.bodies) != 1 {
			t.Fatalf("err %v after %d sends, want ErrHTTP1Server after 1", err, len(next.bodies))
		}
	})
	t.Run("any other error is not retried", func(t *testing.T) {
		next := &scriptedTransport{errs: []error{errors.New("http2: client connection lost")}}
		if _, err := post(t, context.Background(), resendUnsent{next: next, pause: noPause}); err == nil || len(next.bodies) != 1 {
			t.Fatalf("err %v after %d sends, want the error after 1", err, len(next.bodies))
		}
	})
	t.Run("resends are bounded", func(t *testing.T) {
		next := &scriptedTransport{errs: make([]error, 20)}
		for i := range next.errs {
			next.errs[i] = unsentErr()
		}
		_, err := post(t, context.Background(), resendUnsent{next: next, pause: noPause})
		if !errors.Is(err, h2client.ErrNotProcessed) || len(next.bodies) != unsentRetries+1 {
			t.Fatalf("err %v after %d sends, want it after %d", err, len(next.bodies), unsentRetries+1)
		}
	})
	t.Run("a cancelled request stops waiting", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		next := &scriptedTransport{errs: []error{unsentErr()}}
		if _, err := post(t, ctx, resendUnsent{next: next, pause: func(int) time.Duration { return time.Hour }}); err == nil || len(next.bodies) != 1 {
			t.Fatalf("err %v after %d sends", err, len(next.bodies))
		}
	})
	t.Run("idle connections are closed through it", func(t *testing.T) {
		next := &scriptedTransport{}
		(&http.Client{Transport: resendUnsent{next: next, pause: noPause}}).CloseIdleConnections()
		if next.closed != 1 {
			t.Errorf("CloseIdleConnections reached the transport %d times", next.closed)
		}
	})
	if got := unsentPause(1); got != 50*time.Millisecond || unsentPause(5) != 800*time.Millisecond {
		t.Errorf("pauses %v..%v", got, unsentPause(5))
	}
}
