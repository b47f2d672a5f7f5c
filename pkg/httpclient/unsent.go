package httpclient

import (
	"net/http"
	"strings"
	"time"
)

// notEstablished is how net/http's HTTP/2 transport reports a request it
// did not send because the new connection chosen for it closed before
// carrying any stream (the error value is unexported). We saw it at 50k
// rollouts on 2 cores, where servers close fresh connections (net/http's
// server drops one whose SETTINGS acknowledgement misses a 2-second timer,
// which a CPU-starved pair of processes can). The request never left, so
// sending it again is safe, even a /run or a control POST.
const notEstablished = "http2: client conn could not be established"

// unsentRetries bounds the sends of one request its connections never
// carried.
const unsentRetries = 5

// resendUnsent sends again a request that no connection carried (see
// notEstablished), after a short pause, a bounded number of times. Every
// other error, and every reply, is returned as it is.
type resendUnsent struct {
	next interface {
		http.RoundTripper
		CloseIdleConnections()
	}
	// pause is the wait before the nth resend.
	pause func(n int) time.Duration
}

func (r resendUnsent) RoundTrip(req *http.Request) (*http.Response, error) {
	for n := 1; ; n++ {
		resp, err := r.next.RoundTrip(req)
		if err == nil || n > unsentRetries || !strings.Contains(err.Error(), notEstablished) {
			return resp, err
		}
		if req.Body != nil && req.Body != http.NoBody {
			if req.GetBody == nil {
				return nil, err
			}
			body, berr := req.GetBody()
			if berr != nil {
				return nil, err
			}
			req = req.Clone(req.Context())
			req.Body = body
		}
		t := time.NewTimer(r.pause(n))
		select {
		case <-t.C:
		case <-req.Context().Done():
			t.Stop()
			return nil, err
		}
	}
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the
// transport.
func (r resendUnsent) CloseIdleConnections() { r.next.CloseIdleConnections() }

// unsentPause waits 50 ms, then twice as long each time (50 ms to 800 ms).
func unsentPause(n int) time.Duration { return 50 * time.Millisecond << (n - 1) }
