// Package httpclient builds the clients the fleet's servers call each other
// with, and the one JSON call helper that turns non-2xx replies into
// apierror values.
//
// Between our own servers the transport speaks HTTP/2 without TLS (prior
// knowledge) on one host, or over TLS chosen by ALPN for https:// peers
// (verified against Options.HTTP.TLS.CAFile), so thousands of rollouts in
// flight share a handful of connections instead of needing a socket each. Peers that may be NeMo
// Gym's servers (uvicorn: HTTP/1.1 only) get ProtocolAuto: h2c first, and
// HTTP/1.1 for a host that answers the h2c preface in HTTP/1.x. Clients carry no overall
// Timeout: generations and held calls are long by design, and every call is
// bounded by its context instead.
package httpclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/gymfleet/gymfleet/pkg/infra/backoff"
	"github.com/gymfleet/gymfleet/pkg/infra/freshstack"
	"github.com/gymfleet/gymfleet/pkg/transport/httpbody"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
	"github.com/gymfleet/gymfleet/pkg/wire/apierror"
	"github.com/gymfleet/gymfleet/pkg/wire/codec"
)

// DefaultH2CConnsPerHost bounds the h2c connections to one server. A
// connection takes requests once the server has answered on it (h2cPool),
// so a burst waits for it rather than dialing more; with the servers' 2,000
// streams per connection (pkg/transport/httpserver) the bound leaves room for 256,000
// requests in flight to one server.
const DefaultH2CConnsPerHost = 128

// DefaultHTTP1ConnsPerHost bounds the HTTP/1.1 connections to one server:
// each request in flight holds one.
const DefaultHTTP1ConnsPerHost = 1024

// Protocol is what a transport speaks to its servers.
type Protocol uint8

const (
	// ProtocolHTTP1 speaks HTTP/1.1 (a vLLM endpoint, for example). It is
	// the zero value: Options{H2C: true} still means ProtocolH2C.
	ProtocolHTTP1 Protocol = iota
	// ProtocolH2C speaks only HTTP/2 without TLS (prior knowledge) to
	// http:// addresses: our own servers. To https:// ones it speaks
	// HTTP/2 over TLS, or HTTP/1.1 when the server picks it by ALPN.
	ProtocolH2C
	// ProtocolAuto speaks h2c to a server that does and HTTP/1.1 to one
	// that answers the h2c preface in HTTP/1.x (NeMo Gym's uvicorn
	// servers), found out per host on the first connection and remembered
	// for the transport's lifetime; https:// addresses get HTTP/2 or
	// HTTP/1.1 as the server picks by ALPN. For peers that may be ours or
	// Gym's.
	ProtocolAuto
)

// Options configures a transport.
type Options struct {
	// Protocol is what the transport speaks; see H2C.
	Protocol Protocol
	// H2C speaks HTTP/2 without TLS only; set it for our own servers. It
	// is Protocol: ProtocolH2C, kept for the callers that set it, and is
	// ignored when Protocol is set.
	H2C bool
	// MaxConnsPerHost bounds connections per host; 0 means
	// DefaultHTTP1ConnsPerHost for HTTP/1.1 and DefaultH2CConnsPerHost for
	// h2c (each with ProtocolAuto).
	MaxConnsPerHost int
	DialTimeout     time.Duration
	IdleConnTimeout time.Duration
	// HTTP is the process's http: section: which HTTP stack the transport
	// speaks (lean or nethttp) and TLS.
	HTTP httpconf.Config
}

// Transport is what New sends requests with.
type Transport interface {
	http.RoundTripper
	CloseIdleConnections()
}

// NewTransport returns a transport configured by opts: for h2c, a pool of
// HTTP/2 connections (h2client) that take requests only once the server
// has answered on them (h2cPool); for HTTP/1.1, net/http's transport; for
// ProtocolAuto, the h2c pool falling back to the HTTP/1.1 transport per
// host. With opts.HTTP's stack nethttp, h2c is net/http's own transport
// instead (newNetHTTP).
//
// A CA file that cannot be read makes a transport that fails every request
// with that error; process configurations refuse it at start
// (httpconf.Config.Validate).
func NewTransport(opts Options) Transport {
	tlsConf, err := opts.HTTP.TLS.ClientConfig()
	if err != nil {
		return failing{err}
	}
	if opts.DialTimeout == 0 {
		opts.DialTimeout = 10 * time.Second
	}
	if opts.IdleConnTimeout == 0 {
		opts.IdleConnTimeout = 90 * time.Second
	}
	proto := opts.Protocol
	if proto == ProtocolHTTP1 && opts.H2C {
		proto = ProtocolH2C
	}
	if opts.HTTP.EffectiveStack() == httpconf.StackNetHTTP {
		return newNetHTTP(opts, proto, tlsConf)
	}
	switch proto {
	case ProtocolH2C:
		return newH2C(opts, nil).withTLS(tlsConf, newHTTP1(opts, tlsConf))
	case ProtocolAuto:
		http1 := opts
		// Idle connections are dropped before the peer drops them, so that
		// a POST is never written into the peer's close (net/http cannot
		// send it again): NeMo Gym's servers close after 30 s idle and its
		// own client after 15 s (timeout_keep_alive and keepalive_timeout
		// in nemo_gym/server_utils.py at 07d6b0d07b22).
		http1.IdleConnTimeout = min(http1.IdleConnTimeout, peerHTTP1IdleTimeout)
		tr := newHTTP1(http1, tlsConf)
		return newH2C(opts, tr).withTLS(tlsConf, tr)
	}
	return newHTTP1(opts, tlsConf)
}

// failing is a transport that fails every request with err.
type failing struct{ err error }

func (f failing) RoundTrip(req *http.Request) (*http.Response, error) {
	closeBody(req)
	return nil, f.err
}

func (failing) CloseIdleConnections() {}

// peerHTTP1IdleTimeout bounds how long ProtocolAuto keeps an idle HTTP/1.1
// connection.
const peerHTTP1IdleTimeout = 15 * time.Second

// newH2C is the h2c pool, handing the hosts that speak only HTTP/1.1 to
// http1 (nil: h2c only).
func newH2C(opts Options, http1 Transport) *h2cPool {
	conns := opts.MaxConnsPerHost
	if conns <= 0 {
		conns = DefaultH2CConnsPerHost
	}
	// No HTTP/2 PING health check: its answer must come from the peer's
	// user space, and a peer with 100,000 goroutines runnable on 2 cores
	// can go longer than the check's timeout without reading; net/http's
	// check then closed the connection and failed every stream on it. A
	// peer that is gone is seen by the
	// kernel instead: its process's death closes the socket at once, its
	// host's by TCP keepalive (dialer).
	return newH2CPool(dialer(opts).DialContext, conns, http1)
}

// newHTTP1 is net/http's HTTP/1.1 transport, keeping connections alive; it
// verifies https:// servers with tlsConf, offering only HTTP/1.1 by ALPN.
func newHTTP1(opts Options, tlsConf *tls.Config) *http.Transport {
	conns := opts.MaxConnsPerHost
	if conns <= 0 {
		conns = DefaultHTTP1ConnsPerHost
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	tlsConf = tlsConf.Clone()
	tlsConf.NextProtos = []string{httpconf.ALPNHTTP11}
	return &http.Transport{
		Proxy:               nil,
		DialContext:         dialer(opts).DialContext,
		TLSClientConfig:     tlsConf,
		Protocols:           &protos,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		IdleConnTimeout:     opts.IdleConnTimeout,
		// Bodies we forward are already compact JSON; gzip only costs CPU on
		// loopback and hides SSE framing.
		DisableCompression: true,
	}
}

// Probe timings of the kernel's TCP keepalive: a connection with nothing
// unacknowledged whose peer host stops answering is closed after about
// keepAliveIdle + keepAliveCount*keepAliveInterval (60 s). The peer's
// kernel answers the probes, so a busy peer process is never mistaken for
// a dead one.
const (
	keepAliveIdle     = 30 * time.Second
	keepAliveInterval = 10 * time.Second
	keepAliveCount    = 3
)

// dialer opens the transport's connections.
func dialer(opts Options) *net.Dialer {
	return &net.Dialer{
		Timeout: opts.DialTimeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: keepAliveIdle, Interval: keepAliveInterval, Count: keepAliveCount,
		},
	}
}

// New returns a client over NewTransport(opts) that sends again, a few
// times, a request the server never processed (see neverProcessed), and
// carries the context's trace to the server as a W3C traceparent.
func New(opts Options) *http.Client {
	return &http.Client{Transport: resendUnsent{next: NewTransport(opts), pause: unsentPause}}
}

// MaxReplyBytes bounds a reply body the JSON helper reads.
const MaxReplyBytes = 256 << 20

// presizeReplyBytes is the most of a reply's declared length allocated
// before its bytes arrive (httpbody.Read).
const presizeReplyBytes = 1 << 20

// ReadReply reads a reply's body whole, up to MaxReplyBytes (a longer one
// is cut there and fails to decode), into a buffer sized from its
// Content-Length.
func ReadReply(resp *http.Response) ([]byte, error) {
	return httpbody.Read(io.LimitReader(resp.Body, MaxReplyBytes), min(resp.ContentLength, MaxReplyBytes), presizeReplyBytes)
}

// Reply is a complete HTTP reply.
type Reply struct {
	Status int
	Header http.Header
	Body   []byte
}

// OK reports a 2xx status.
func (r *Reply) OK() bool { return r.Status >= 200 && r.Status < 300 }

// Err returns nil for a 2xx reply, else the error the reply carries: its
// envelope when it has one, else an upstream_error with the body's text.
func (r *Reply) Err(what string) error {
	if r.OK() {
		return nil
	}
	if e := apierror.Parse(r.Status, r.Body); e != nil {
		return e
	}
	text := strings.TrimSpace(string(r.Body))
	if len(text) > 512 {
		text = text[:512] + "..."
	}
	return &apierror.Error{Code: apierror.UpstreamError, Status: http.StatusBadGateway,
		Detail: fmt.Sprintf("%s answered %d: %s", what, r.Status, text)}
}

// Do sends one request with a JSON body (nil for none) and reads the whole
// reply. It never retries: a POST whose reply was lost is the caller's to
// judge (SPEC §4: no /run or control call is retried blindly).
func Do(ctx context.Context, c *http.Client, method, url string, header http.Header, body any) (*Reply, error) {
	req, err := newRequest(ctx, method, url, header, body)
	if err != nil {
		return nil, err
	}
	resp, err := Send(c, req)
	if err != nil {
		return nil, err
	}
	return readAll(method, url, resp)
}

// encodeBody encodes a request body on a goroutine of its own: goccy's
// encoder would grow the caller's stack (a handler's, or a reply's
// continuation, both deep by then), which the runtime copies frame by
// frame, and which a caller that then waits in the call keeps doubled
// (freshstack).
func encodeBody(v any) ([]byte, error) {
	return freshstack.Call(func() ([]byte, error) { return codec.Marshal(v) })
}

// newRequest builds Do's request. Apart from Do, whose frame stays on the
// stack of a caller waiting for the reply (send says why that matters).
func newRequest(ctx context.Context, method, url string, header http.Header, body any) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		var b []byte
		switch v := body.(type) {
		case []byte:
			b = v
		case codec.RawMessage:
			b = v
		default:
			var err error
			if b, err = encodeBody(v); err != nil {
				return nil, fmt.Errorf("encoding request to %s: %w", url, err)
			}
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	if body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}

// readAll reads a reply whole and closes its body.
func readAll(method, url string, resp *http.Response) (*Reply, error) {
	defer resp.Body.Close()
	b, err := ReadReply(resp)
	if err != nil {
		return nil, fmt.Errorf("reading reply of %s %s: %w", method, url, err)
	}
	return &Reply{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// Send sends req on c's transport directly when c keeps no cookies and has
// no timeout (every client New returns). http.Client.Do adds four frames
// (about 1 KB) to the stack of every goroutine waiting in a call, and at
// 100,000 rollouts held at a model call that is 100,000 stacks, each kept
// at twice the size it needs. A redirect is not followed: no server of ours
// sends one, and its reply is returned as an error like any non-2xx.
func Send(c *http.Client, req *http.Request) (*http.Response, error) {
	if c.Jar != nil || c.Timeout != 0 || c.Transport == nil {
		return c.Do(req)
	}
	resp, err := c.Transport.RoundTrip(req)
	if err != nil {
		return nil, sendError(req, err)
	}
	return resp, nil
}

// sendError is the error http.Client gives a request that failed: a
// *url.Error naming it.
func sendError(req *http.Request, err error) error {
	return &url.Error{Op: urlErrorOp(req.Method), URL: req.URL.String(), Err: err}
}

// urlErrorOp is the Op http.Client gives a *url.Error: "Post", "Get".
func urlErrorOp(method string) string {
	if method == "" {
		return "Get"
	}
	return method[:1] + strings.ToLower(method[1:])
}

// PostJSON posts in and decodes a 2xx reply into out (unless out is nil).
func PostJSON(ctx context.Context, c *http.Client, url string, header http.Header, in, out any) (*Reply, error) {
	rep, err := Do(ctx, c, http.MethodPost, url, header, in)
	if err != nil {
		return nil, err
	}
	return rep, checkJSONReply(url, rep, out, decodeReply)
}

// decodeReply decodes a reply's body into out (unless out is nil), on a
// goroutine of its own: a caller may go on to a call it waits in for long
// (freshstack).
func decodeReply(body []byte, out any) error {
	if out == nil {
		return nil
	}
	var err error
	freshstack.Run(func() { err = codec.Unmarshal(body, out) })
	return err
}

// GetJSON gets url and decodes a 2xx reply into out.
func GetJSON(ctx context.Context, c *http.Client, url string, header http.Header, out any) (*Reply, error) {
	rep, err := Do(ctx, c, http.MethodGet, url, header, nil)
	if err != nil {
		return nil, err
	}
	if err := rep.Err(url); err != nil {
		return rep, err
	}
	if err := decodeReply(rep.Body, out); err != nil {
		return rep, &apierror.Error{Code: apierror.UpstreamError, Detail: fmt.Sprintf("decoding reply of %s: %v", url, err)}
	}
	return rep, nil
}

// NewIdempotentClient returns a client that retries transport errors and 5xx
// replies, for GET requests only. Any other method fails before it is sent:
// retryablehttp re-sends a POST whose reply was lost, which for /run or a
// control call would be a second execution.
func NewIdempotentClient(base *http.Client, retries int) *http.Client {
	rc := retryablehttp.NewClient()
	rc.HTTPClient = base
	rc.RetryMax = retries
	rc.RetryWaitMin = 50 * time.Millisecond
	rc.RetryWaitMax = time.Second
	rc.Logger = nil
	rc.ErrorHandler = retryablehttp.PassthroughErrorHandler
	rc.Backoff = idempotentBackoff
	rc.CheckRetry = func(ctx context.Context, resp *http.Response, err error) (bool, error) {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		return retryablehttp.DefaultRetryPolicy(ctx, resp, err)
	}
	std := rc.StandardClient()
	std.Transport = getOnly{std.Transport}
	return std
}

// idempotentBackoff is the fleet's one backoff (pkg/infra/backoff) for
// retryablehttp's retries, which count attempts from 0, between its
// RetryWaitMin (lo) and RetryWaitMax (hi). A 429 or 503 that names its own
// pause (Retry-After) gets it, but no more than hi: a peer does not get to
// hold a caller's retries for as long as it likes.
func idempotentBackoff(lo, hi time.Duration, attempt int, resp *http.Response) time.Duration {
	pause := backoff.Policy{Initial: lo, Max: hi}.Delay(attempt + 1)
	if resp != nil && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) {
		if asked := retryablehttp.DefaultBackoff(lo, hi, attempt, resp); asked > pause {
			pause = min(asked, hi)
		}
	}
	return pause
}

type getOnly struct{ next http.RoundTripper }

// ErrNotIdempotent is returned for a non-GET request on an idempotent client.
var ErrNotIdempotent = errors.New("the retrying client only sends GET and HEAD requests")

func (g getOnly) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return nil, fmt.Errorf("%s %s: %w", r.Method, r.URL, ErrNotIdempotent)
	}
	return g.next.RoundTrip(r)
}
