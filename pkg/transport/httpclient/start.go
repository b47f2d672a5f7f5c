package httpclient

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"

	"go.opentelemetry.io/otel/trace"

	"github.com/gymfleet/gymfleet/pkg/infra/tracing"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// Starter is a transport that can send a request without a goroutine
// waiting for its reply: the h2c pool, over h2client.Conn.Start, and the
// transports wrapping it.
type Starter interface {
	// StartRoundTrip sends req and calls done, once, with what RoundTrip
	// would return, but once the reply has arrived whole: its body
	// buffered (at most maxBody bytes) and read without waiting. done may
	// be called before StartRoundTrip returns, on its caller's goroutine
	// (a transport that cannot do otherwise waits there), or later on
	// another goroutine. Unlike RoundTrip, it may add headers to req:
	// its callers build a request for the one call, and a copy would be
	// kept for as long as the call is awaited.
	StartRoundTrip(req *http.Request, maxBody int64, done func(*http.Response, error))
}

// StartRoundTrip sends req on rt as a Starter does: without a goroutine
// waiting when rt is one, else by a RoundTrip on the calling goroutine,
// the reply read whole.
func StartRoundTrip(rt http.RoundTripper, req *http.Request, maxBody int64, done func(*http.Response, error)) {
	if s, ok := rt.(Starter); ok {
		s.StartRoundTrip(req, maxBody, done)
		return
	}
	done(wholeReply(rt.RoundTrip(req))(maxBody))
}

// wholeReply reads a reply's body whole, up to maxBody, in place of the
// body as it streams: the curried form lets a RoundTrip's two results be
// passed straight in.
func wholeReply(resp *http.Response, err error) func(maxBody int64) (*http.Response, error) {
	return func(maxBody int64) (*http.Response, error) {
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
		if err != nil {
			return nil, err
		}
		if int64(len(b)) > maxBody {
			return nil, fmt.Errorf("httpclient: the reply is longer than %d bytes", maxBody)
		}
		resp.Body = io.NopCloser(bytes.NewReader(b))
		return resp, nil
	}
}

// StartRoundTrip sends req on a connection with a free stream as RoundTrip
// does; the reply goes to done once whole (h2client.Conn.Start), or, from
// a host that speaks only HTTP/1.1, from a RoundTrip on the caller's
// goroutine.
func (p *h2cPool) StartRoundTrip(req *http.Request, maxBody int64, done func(*http.Response, error)) {
	if req.URL == nil || (req.URL.Scheme != "http" && req.URL.Scheme != "https") {
		closeBody(req)
		done(nil, fmt.Errorf("h2c transport: only http:// and https:// addresses, got %v", req.URL))
		return
	}
	secure := req.URL.Scheme == "https"
	key := req.URL.Scheme + "://" + hostPort(req.URL)
	for {
		cc, opening, http1, preopen := p.pick(key)
		switch {
		case cc != nil:
			p.startPreopen(preopen, key, req.URL)
			cc.Start(req, maxBody, done)
			return
		case http1 && secure:
			done(wholeReply(p.tls1.RoundTrip(req))(maxBody))
			return
		case http1:
			done(wholeReply(p.http1.RoundTrip(req))(maxBody))
			return
		case opening != nil:
			select {
			case <-opening:
			case <-req.Context().Done():
				closeBody(req)
				done(nil, context.Cause(req.Context()))
				return
			}
		default: // this request opens the connection
			if err := p.open(req.Context(), key, req.URL); err != nil {
				closeBody(req)
				done(nil, err)
				return
			}
		}
	}
}

// StartRoundTrip is RoundTrip for a Starter beneath: a request the server
// never processed is sent again, on the goroutine its failure arrived on
// (rare; it waits there between sends).
func (r resendUnsent) StartRoundTrip(req *http.Request, maxBody int64, done func(*http.Response, error)) {
	if trace.SpanContextFromContext(req.Context()).IsValid() {
		tracing.Inject(req.Context(), req.Header)
	}
	StartRoundTrip(r.next, req, maxBody, func(resp *http.Response, err error) {
		if err == nil || !neverProcessed(err) {
			done(resp, err)
			return
		}
		done(wholeReply(r.resend(req, err))(maxBody))
	})
}

// Start sends one request with a JSON body (nil for none), as Do does, and
// calls done, once, with the whole reply: over a transport that is a
// Starter (the lean stack's, between our servers) no goroutine waits for
// it, and done runs on a goroutine of its own; otherwise the request is
// made on the calling goroutine and done is called before Start returns.
// Like Do, it never retries. The body must not change until done is
// called: a request sent again is encoded again (see newStartRequest).
func Start(ctx context.Context, c *http.Client, method, url string, header http.Header, body any, done func(*Reply, error)) {
	req, err := newStartRequest(ctx, method, url, header, body)
	if err != nil {
		done(nil, err)
		return
	}
	StartSend(c, req, MaxReplyBytes, func(resp *http.Response, err error) {
		if err != nil {
			done(nil, err)
			return
		}
		done(readAll(method, url, resp))
	})
}

// StartSend is Send for a caller that does not wait for the reply: done
// gets the reply once it has arrived whole (at most maxBody bytes), or
// Send's error, as StartRoundTrip says.
func StartSend(c *http.Client, req *http.Request, maxBody int64, done func(*http.Response, error)) {
	if c.Jar != nil || c.Timeout != 0 || c.Transport == nil {
		done(wholeReply(c.Do(req))(maxBody))
		return
	}
	StartRoundTrip(c.Transport, req, maxBody, func(resp *http.Response, err error) {
		if err != nil {
			done(nil, sendError(req, err))
			return
		}
		done(resp, nil)
	})
}

// StartJSON is PostJSON for Start: done gets the reply, and out decoded
// from a 2xx reply (unless out is nil). The reply is decoded on the
// goroutine done runs on, which does not wait afterwards: no goroutine of
// its own is needed to keep a waiting stack small (freshstack).
func StartJSON(ctx context.Context, c *http.Client, url string, header http.Header, in, out any, done func(*Reply, error)) {
	Start(ctx, c, http.MethodPost, url, header, in, func(rep *Reply, err error) {
		if err != nil {
			done(nil, err)
			return
		}
		done(rep, checkJSONReply(url, rep, out, func(b []byte, v any) error { return codec.Unmarshal(b, v) }))
	})
}

// checkJSONReply is PostJSON's check of a reply: its error, or out decoded
// from it with decode.
func checkJSONReply(url string, rep *Reply, out any, decode func([]byte, any) error) error {
	if err := rep.Err(url); err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	if err := decode(rep.Body, out); err != nil {
		return &apierror.Error{Code: apierror.UpstreamError, Detail: fmt.Sprintf("decoding reply of %s: %v", url, err)}
	}
	return nil
}

// newStartRequest is newRequest for Start. A body that is not bytes
// already is encoded to be sent, and again if it is sent again: the
// bytes are let go once written, so a call awaited for minutes keeps its
// body's value (most often shared with its caller's state) and not an
// encoding of it besides.
func newStartRequest(ctx context.Context, method, url string, header http.Header, body any) (*http.Request, error) {
	switch body.(type) {
	case nil, []byte, codec.RawMessage:
		return newRequest(ctx, method, url, header, body)
	}
	encode := func() ([]byte, error) { return encodeBody(body) }
	b, err := encode()
	if err != nil {
		return nil, fmt.Errorf("encoding request to %s: %w", url, err)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return nil, err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	if req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Body, req.ContentLength = &sentBody{b: b}, int64(len(b))
	req.GetBody = func() (io.ReadCloser, error) {
		b, err := encode()
		if err != nil {
			return nil, err
		}
		return &sentBody{b: b}, nil
	}
	return req, nil
}

// sentBody is a request body that lets go of its bytes once they are read.
type sentBody struct{ b []byte }

func (r *sentBody) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		r.b = nil
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	if len(r.b) == 0 {
		r.b = nil
	}
	return n, nil
}

func (r *sentBody) Close() error {
	r.b = nil
	return nil
}
