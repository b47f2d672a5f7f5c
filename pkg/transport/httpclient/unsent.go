package httpclient

import (
	"errors"
	"net"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/infra/backoff"
	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
	"github.com/gymfleet/gymfleet/pkg/transport/h2client"
)

// unsentRetries bounds the sends of one request its connections never
// carried.
const unsentRetries = 5

// resendUnsent sends again a request the server never processed (see
// neverProcessed), after a short pause, a bounded number of times. Every
// other error, and every reply, is returned as it is.
type resendUnsent struct {
	next Transport
	// pause is the wait before the nth resend.
	pause func(n int) time.Duration
}

func (r resendUnsent) RoundTrip(req *http.Request) (*http.Response, error) {
	req = withTraceparent(req)
	resp, err := r.next.RoundTrip(req)
	if err == nil {
		return resp, nil
	}
	return r.resend(req, err)
}

// withTraceparent is req carrying its context's trace to the server (W3C
// traceparent), req itself when its context has none. The request is
// copied: a RoundTripper does not change its caller's.
func withTraceparent(req *http.Request) *http.Request {
	if !trace.SpanContextFromContext(req.Context()).IsValid() {
		return req
	}
	c := *req
	c.Header = req.Header.Clone()
	if c.Header == nil {
		c.Header = http.Header{}
	}
	tracing.Inject(req.Context(), c.Header)
	return &c
}

// resend sends again a request whose first send failed with err when err
// says the server never processed it, and returns err otherwise. Apart
// from RoundTrip, whose frame stays on the stack of every caller waiting
// for a reply.
func (r resendUnsent) resend(req *http.Request, err error) (*http.Response, error) {
	if !neverProcessed(err) {
		return nil, err
	}
	for n := 1; ; n++ {
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
		var resp *http.Response
		resp, err = r.next.RoundTrip(req)
		if err == nil || n >= unsentRetries || !neverProcessed(err) {
			return resp, err
		}
	}
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the
// transport.
func (r resendUnsent) CloseIdleConnections() { r.next.CloseIdleConnections() }

// unsentPause waits 50 ms, then twice as long each time (50 ms to 800 ms).
func unsentPause(n int) time.Duration {
	return backoff.Policy{Initial: 50 * time.Millisecond, Max: 800 * time.Millisecond}.Delay(n)
}

// NeverProcessed reports whether err (of a request through this package's
// clients, after their own resends) says the server never processed the
// request, so that sending it elsewhere is safe; see neverProcessed.
func NeverProcessed(err error) bool { return neverProcessed(err) }

// neverProcessed reports whether err says the server never processed the
// request, so that sending it again is safe, even a /run or a control POST
// (RFC 9113 §8.7):
//   - h2client.ErrNotProcessed: a stream the server refused, one above the
//     last stream a GOAWAY accepted, a request on a connection that had
//     failed before the request's stream was written, one whose header
//     block could not be written whole (the peer reset the connection
//     before its read loop told);
//   - a dial error: a connection that could not be opened carried nothing.
//     (At 50,000 rollouts in flight the model server's dial to the
//     inference worker on loopback timed out after its 10 s, both processes
//     starved of CPU, and the rollout it was for failed.)
//
// A new connection the server drops before answering (net/http's server
// drops one whose SETTINGS it has not read within a fixed 2 s, which a
// CPU-starved pair of processes can miss) carries no request: h2cPool
// sends its own first and opens another, and on the nethttp stack the
// connection holds requests until the server's SETTINGS ACK (gatedConn).
//
// A server that answered in HTTP/1.x (h2client.ErrHTTP1Server) processed
// nothing either, but sending again over h2c would only fail the same way:
// the error is returned at once.
func neverProcessed(err error) bool {
	if errors.Is(err, h2client.ErrHTTP1Server) {
		return false
	}
	if errors.Is(err, h2client.ErrNotProcessed) {
		return true
	}
	op, ok := errors.AsType[*net.OpError](err)
	return ok && op.Op == "dial"
}
