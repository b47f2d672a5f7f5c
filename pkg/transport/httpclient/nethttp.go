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
	"sync"
	"time"

	"golang.org/x/net/http2"
)

// newNetHTTP is the transport of the nethttp stack: net/http's own for
// h2c as for HTTP/1.1, the baseline the lean stack is measured against.
//
// Requests net/http's HTTP/2 transport knows the server never processed (a
// refused stream, one above a GOAWAY's last stream, a connection that
// failed before the stream was written) it sends again itself; what it
// returns of those is a dial error, or a request on an h2c connection that
// ended before the server read our SETTINGS (gatedConn), which
// resendUnsent sends again as on the lean stack. https:// addresses go to net/http's TLS transport, HTTP/2
// or HTTP/1.1 as the server picks by ALPN, verified with tlsConf.
func newNetHTTP(opts Options, proto Protocol, tlsConf *tls.Config) Transport {
	switch proto {
	case ProtocolH2C:
		return bySchemes{plain: gateTransport{newNetH2C(opts)}, secure: newNetTLS(opts, tlsConf)}
	case ProtocolAuto:
		http1 := opts
		// As for the lean stack's ProtocolAuto (see NewTransport).
		http1.IdleConnTimeout = min(http1.IdleConnTimeout, peerHTTP1IdleTimeout)
		return &netAuto{
			h2c: gateTransport{newNetH2C(opts)}, http1: newHTTP1(http1, tlsConf), tls: newNetTLS(opts, tlsConf),
			dial: dialer(opts).DialContext, probeTimeout: 30 * time.Second,
			hosts: map[string]*hostProtocol{},
		}
	}
	return newHTTP1(opts, tlsConf)
}

// newNetTLS is net/http's transport for https:// addresses: HTTP/2 or
// HTTP/1.1 over TLS as the server picks by ALPN, with the h2c transport's
// bounds.
func newNetTLS(opts Options, tlsConf *tls.Config) *http.Transport {
	tr := newNetH2C(opts)
	// TLS is net/http's to do over the plain connection: the gate reads
	// frames, not TLS records.
	tr.DialContext = dialer(opts).DialContext
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetHTTP2(true)
	tr.Protocols = &protos
	tr.TLSClientConfig = tlsConf.Clone()
	return tr
}

// bySchemes sends http:// requests to plain and https:// ones to secure.
type bySchemes struct {
	plain  Transport
	secure *http.Transport
}

func (b bySchemes) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL != nil && req.URL.Scheme == "https" {
		return b.secure.RoundTrip(req)
	}
	return b.plain.RoundTrip(req)
}

func (b bySchemes) CloseIdleConnections() {
	b.plain.CloseIdleConnections()
	b.secure.CloseIdleConnections()
}

// newNetH2C is net/http's transport speaking HTTP/2 without TLS (prior
// knowledge) only, with the lean stack's connection bound and receive
// window, over connections that hold requests until the server has read
// the client's SETTINGS (gatedConn; gateTransport says which failed
// requests were never sent).
func newNetH2C(opts Options) *http.Transport {
	conns := opts.MaxConnsPerHost
	if conns <= 0 {
		conns = DefaultH2CConnsPerHost
	}
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	return &http.Transport{
		Proxy:               nil,
		DialContext:         gatedDial(dialer(opts).DialContext),
		Protocols:           &protos,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		IdleConnTimeout:     opts.IdleConnTimeout,
		DisableCompression:  true,
		// No PING health check, as on the lean stack (see newH2C).
		HTTP2: &http.HTTP2Config{MaxReceiveBufferPerConnection: 4<<20 - 1},
	}
}

// netAuto is ProtocolAuto on the nethttp stack: h2c to a server that
// speaks it, HTTP/1.1 to one that answers the h2c preface in HTTP/1.x (a
// NeMo Gym uvicorn server). net/http's h2c transport cannot tell the two
// apart without sending the request (it writes the request right after the
// preface, and fails on the HTTP/1 reply), so the first request to a host
// waits for a probe of its own: a connection that carries the preface and
// an empty SETTINGS frame only, read until the server's first bytes say
// which protocol it speaks, then closed. The answer is remembered for the
// transport's lifetime, as the lean stack's h2cPool remembers it.
type netAuto struct {
	h2c          Transport
	http1        *http.Transport
	tls          *http.Transport // https:// addresses
	dial         func(ctx context.Context, network, addr string) (net.Conn, error)
	probeTimeout time.Duration

	mu sync.Mutex
	// hosts has an entry per address probed or being probed: the peers a
	// server is configured with, so it stays small.
	hosts map[string]*hostProtocol
}

// hostProtocol is what one host speaks, known once done is closed.
type hostProtocol struct {
	done  chan struct{}
	http1 bool
	err   error
}

func (a *netAuto) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL != nil && req.URL.Scheme == "https" {
		return a.tls.RoundTrip(req) // ALPN picks the protocol; no probe
	}
	if req.URL == nil || req.URL.Scheme != "http" {
		return a.http1.RoundTrip(req) // h2c is HTTP/2 without TLS only
	}
	http1, err := a.protocolOf(req.Context(), canonicalAddr(req.URL))
	if err != nil {
		return nil, err
	}
	if http1 {
		return a.http1.RoundTrip(req)
	}
	return a.h2c.RoundTrip(req)
}

// protocolOf reports whether addr speaks only HTTP/1.1, probing it unless
// that is known or being found out. The probe runs on a goroutine of its
// own, bounded by probeTimeout, so a caller that gives up does not fail
// the others waiting for it. A failed probe is forgotten, so the next
// request probes again.
func (a *netAuto) protocolOf(ctx context.Context, addr string) (http1 bool, err error) {
	a.mu.Lock()
	h := a.hosts[addr]
	if h == nil {
		h = &hostProtocol{done: make(chan struct{})}
		a.hosts[addr] = h
		go func() {
			defer close(h.done)
			h.http1, h.err = a.probe(addr)
			if h.err != nil {
				a.mu.Lock()
				delete(a.hosts, addr)
				a.mu.Unlock()
			}
		}()
	}
	a.mu.Unlock()
	select {
	case <-h.done:
		return h.http1, h.err
	case <-ctx.Done():
		return false, context.Cause(ctx)
	}
}

// http1Status begins the status line of an HTTP/1.x reply; a server
// speaking HTTP/2 begins with a SETTINGS frame instead, whose header's
// first bytes are its length, never these.
const http1Status = "HTTP/1."

// probe opens a connection to addr, sends the h2c preface and an empty
// SETTINGS frame, and reads the server's first bytes: an HTTP/1.x status
// line (true) or an HTTP/2 SETTINGS frame (false).
func (a *netAuto) probe(addr string) (http1 bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), a.probeTimeout)
	defer cancel()
	nc, err := a.dial(ctx, "tcp", addr)
	if err != nil {
		return false, err // a dial error: resendUnsent sends the request again
	}
	defer nc.Close()
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Now()) })
	defer stop()
	var out bytes.Buffer
	out.WriteString(http2.ClientPreface)
	if err := http2.NewFramer(&out, nil).WriteSettings(); err != nil {
		return false, err
	}
	if _, err := nc.Write(out.Bytes()); err != nil {
		return false, fmt.Errorf("probing %s for h2c: %w", addr, err)
	}
	first := make([]byte, 9) // a frame header, or the start of a status line
	if _, err := io.ReadFull(nc, first); err != nil {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return false, fmt.Errorf("probing %s for h2c: %w", addr, err)
	}
	if bytes.HasPrefix(first, []byte(http1Status)) {
		return true, nil
	}
	if http2.FrameType(first[3]) == http2.FrameSettings {
		return false, nil
	}
	return false, fmt.Errorf("probing %s for h2c: %w", addr, errNeitherProtocol)
}

// errNeitherProtocol is a probe's answer that is neither HTTP/1.x nor
// HTTP/2.
var errNeitherProtocol = errors.New("the server answered the preface with neither an HTTP/1.x status line nor an HTTP/2 SETTINGS frame")

func (a *netAuto) CloseIdleConnections() {
	a.h2c.CloseIdleConnections()
	a.http1.CloseIdleConnections()
	a.tls.CloseIdleConnections()
}

// canonicalAddr is u's host:port, with the scheme's port when u has none.
func canonicalAddr(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
	}
	return net.JoinHostPort(u.Hostname(), port)
}
