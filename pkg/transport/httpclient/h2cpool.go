package httpclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/gymfleet/gymfleet/pkg/transport/h2client"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

// h2cPool is the round tripper between our own servers: HTTP/2 without TLS
// (http://) or over TLS with ALPN (https://) over connections it opens itself (h2client: a request waiting for its
// reply holds no goroutine of its own) and hands a request only after the
// server has answered on them.
//
// net/http's pool puts requests on a new connection as soon as it is
// dialed. Its server closes a connection whose client SETTINGS it has not
// read within a fixed 2 s, and on 2 cores with 100,000 goroutines runnable
// it sometimes has not, which dropped every stream of the new connection
// at once: requests that had been sent and so could not be sent again. Here the first request
// on a connection is the pool's own `OPTIONS *` (answered by net/http's
// server itself, no handler runs), and the server answering it has read our
// SETTINGS; a connection dropped before that carried nothing of ours and is
// simply opened again.
//
// The same handshake finds out a server that does not speak h2c: it
// answers the preface in HTTP/1.x (h2client.ErrHTTP1Server). With an
// http1 transport (ProtocolAuto) the host is then marked, for the pool's
// lifetime, and its requests go to http1 from then on, the one that opened
// the connection included: none of them was sent on it, only the
// handshake was, so even a POST goes out once. Without one (h2c only) the
// request fails at once with that error. Over TLS the server says so by
// ALPN instead: one that picks "http/1.1" marks the host the same way, and
// its requests go to tls1.
type h2cPool struct {
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	maxConns int // per host
	// handshakeTimeout bounds the first exchange on a new connection.
	handshakeTimeout time.Duration
	// handshakes bounds the connections opened for one request whose
	// handshake failed before the pool gives up.
	handshakes int
	// http1 takes the requests of hosts that speak only HTTP/1.1; nil when
	// the pool speaks h2c only.
	http1 Transport
	// tls is what https:// connections are opened with (ALPN h2 then
	// http/1.1, the roots to verify the server by); tls1 takes the requests
	// of https:// hosts that chose HTTP/1.1.
	tls  *tls.Config
	tls1 Transport

	mu sync.Mutex
	// hosts has an entry per scheme and address the pool was asked for
	// (hostKey): the peers a server is configured with, so it stays small.
	hosts map[string]*hostConns
	// preopening counts the connections being opened ahead of need, each
	// on a goroutine of the pool's; preopened is signalled (with mu) as
	// each ends, for CloseIdleConnections to wait for them.
	preopening int
	preopened  *sync.Cond
}

// preopenShare is the part of a connection's stream slots which, once no
// more are free on the newest connection, has the pool open the next one:
// a burst then finds it ready rather than every request waiting, each on
// a goroutine, for a connection to be dialed and answered.
const preopenShare = 4

// hostConns is the pool's state for one host.
type hostConns struct {
	conns []*h2client.Conn
	// next is where pick starts looking: the connection that last had a
	// stream free.
	next int
	// opening is closed when the connection being opened is ready or has
	// failed; nil when none is being opened. One at a time per host: a burst
	// waits for it rather than dialing a connection per request.
	opening chan struct{}
	// cancelPreopen stops the connection being opened ahead of need, if
	// that is what opening is.
	cancelPreopen context.CancelFunc
	// http1 is set once the host answered the h2c preface in HTTP/1.x and
	// the pool has an http1 transport: its requests go there.
	http1 bool
}

func newH2CPool(dial func(ctx context.Context, network, addr string) (net.Conn, error), maxConns int, http1 Transport) *h2cPool {
	p := &h2cPool{dial: dial, maxConns: maxConns, handshakeTimeout: 30 * time.Second, handshakes: 5, http1: http1, hosts: map[string]*hostConns{}}
	p.preopened = sync.NewCond(&p.mu)
	return p
}

// withTLS lets the pool open https:// connections with conf, handing the
// hosts that choose HTTP/1.1 to tls1.
func (p *h2cPool) withTLS(conf *tls.Config, tls1 Transport) *h2cPool {
	p.tls, p.tls1 = conf, tls1
	return p
}

// RoundTrip sends req on a connection with a free stream, opening one when
// none has and the host is under maxConns, else waiting on the least busy;
// or on the http1 transport when the host speaks only HTTP/1.1.
func (p *h2cPool) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL == nil || (req.URL.Scheme != "http" && req.URL.Scheme != "https") {
		closeBody(req)
		return nil, fmt.Errorf("h2c transport: only http:// and https:// addresses, got %v", req.URL)
	}
	secure := req.URL.Scheme == "https"
	addr := hostPort(req.URL)
	key := req.URL.Scheme + "://" + addr
	for {
		cc, opening, http1, preopen := p.pick(key)
		switch {
		case cc != nil:
			p.startPreopen(preopen, key, req.URL)
			return cc.RoundTrip(req)
		case http1 && secure:
			return p.tls1.RoundTrip(req)
		case http1:
			return p.http1.RoundTrip(req)
		case opening != nil:
			select {
			case <-opening:
			case <-req.Context().Done():
				closeBody(req)
				return nil, context.Cause(req.Context())
			}
		default: // this request opens the connection
			if err := p.open(req.Context(), key, req.URL); err != nil {
				closeBody(req)
				return nil, err
			}
		}
	}
}

// pick returns a connection with a stream reserved for the caller, or the
// channel of a connection being opened to wait for, or http1 when the host
// speaks only HTTP/1.1, or none of these when the caller is to open a
// connection itself (p.open).
//
// It looks first at the connection that last had a stream free: held
// requests fill connections one after another, and every call of a burst
// trying each full one in turn, under the pool's lock, is what that lock
// would convoy on. A connection that cannot take requests any more is
// dropped when a pass meets it.
//
// When the newest connection is down to its last share of free slots,
// the next one is opened ahead of need: preopen is then the context the
// caller hands to startPreopen, and waiters meet it as any opening.
func (p *h2cPool) pick(key string) (cc *h2client.Conn, opening chan struct{}, http1 bool, preopen context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.hosts[key]
	if h == nil {
		h = &hostConns{}
		p.hosts[key] = h
	}
	if h.http1 {
		return nil, nil, true, nil
	}
	var chosen *h2client.Conn
	free, limit := 0, 0
	var dead []*h2client.Conn // rare: a connection closed since the last pick
	for k := range len(h.conns) {
		i := (h.next + k) % len(h.conns)
		cc := h.conns[i]
		f, l, err := cc.Reserve()
		if err == nil {
			chosen, h.next, free, limit = cc, i, f, l
			break
		}
		if !errors.Is(err, h2client.ErrNoStreamFree) {
			dead = append(dead, cc)
		}
	}
	if len(dead) > 0 {
		h.conns = slices.DeleteFunc(h.conns, func(cc *h2client.Conn) bool { return slices.Contains(dead, cc) })
		h.next = max(slices.Index(h.conns, chosen), 0)
	}
	if chosen != nil {
		if free*preopenShare <= limit && h.opening == nil && len(h.conns) < p.maxConns && chosen == h.conns[len(h.conns)-1] {
			ctx, cancel := context.WithCancel(context.Background())
			h.opening, h.cancelPreopen = make(chan struct{}), cancel
			p.preopening++
			return chosen, nil, false, ctx
		}
		return chosen, nil, false, nil
	}
	if h.opening != nil {
		return nil, h.opening, false, nil
	}
	if len(h.conns) >= p.maxConns {
		// Every connection is at the server's stream limit: the request
		// waits inside the least busy one for a stream to end.
		least := h.conns[0]
		for _, cc := range h.conns[1:] {
			if cc.InFlight() < least.InFlight() {
				least = cc
			}
		}
		return least, nil, false, nil
	}
	h.opening = make(chan struct{})
	return nil, nil, false, nil
}

// startPreopen opens, on a goroutine of the pool's, the connection pick
// decided to open ahead of need (ctx non-nil). A failure is dropped: the
// next request that finds no stream free opens one itself and meets the
// error.
func (p *h2cPool) startPreopen(ctx context.Context, key string, u *url.URL) {
	if ctx == nil {
		return
	}
	target := &url.URL{Scheme: u.Scheme, Host: u.Host}
	go func() {
		_ = p.open(ctx, key, target)
		p.mu.Lock()
		p.preopening--
		p.preopened.Broadcast()
		p.mu.Unlock()
	}()
}

// open opens a connection to u's host (the pool's entry key) and adds it to
// the pool once the server has answered on it. A connection the server
// closed during the handshake is opened again, up to p.handshakes times; a
// dial or TLS error is returned as it is. A server that answered in
// HTTP/1.x, or chose HTTP/1.1 by ALPN, marks the host for http1 (tls1)
// when the pool has it (nil error); a plain one fails the call when it has
// not. Requests waiting on the host are woken either way.
func (p *h2cPool) open(reqCtx context.Context, key string, u *url.URL) (err error) {
	addr := hostPort(u)
	// The connection is the pool's, not the request's: its dial and
	// handshake carry none of the request's values (a client trace would
	// count the handshake as a request written), only its cancellation.
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	defer context.AfterFunc(reqCtx, func() { cancel(context.Cause(reqCtx)) })()
	var cc *h2client.Conn
	http1 := false
	defer func() {
		p.mu.Lock()
		h := p.hosts[key]
		if cc != nil {
			h.conns = append(h.conns, cc)
		}
		h.http1 = h.http1 || http1
		close(h.opening)
		h.opening = nil
		if h.cancelPreopen != nil {
			h.cancelPreopen()
			h.cancelPreopen = nil
		}
		p.mu.Unlock()
	}()
	for attempt := 1; ; attempt++ {
		if u.Scheme == "https" {
			var h2 bool
			cc, h2, err = p.dialTLS(ctx, u)
			if err == nil && !h2 {
				http1 = true // the server chose HTTP/1.1 by ALPN
				return nil
			}
		} else {
			cc, err = h2client.Dial(ctx, p.dial, addr)
		}
		if err != nil {
			return err
		}
		herr := p.handshake(ctx, cc, u.Scheme, addr)
		if herr == nil {
			return nil
		}
		cc.Close()
		cc = nil
		if errors.Is(herr, h2client.ErrHTTP1Server) {
			if p.http1 == nil {
				return fmt.Errorf("h2c connection to %s: %w", addr, herr)
			}
			http1 = true
			return nil
		}
		if ctx.Err() != nil || attempt >= p.handshakes {
			return fmt.Errorf("h2c connection to %s: no answer to the first request (%d tries): %w", addr, attempt, herr)
		}
	}
}

// handshake sends `OPTIONS *` on cc and waits for any answer: the server has
// then read the client's SETTINGS, so its first-SETTINGS timer cannot drop
// the connection any more. Any status will do; a server that is not Go's
// may answer 4xx.
func (p *h2cPool) handshake(ctx context.Context, cc *h2client.Conn, scheme, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, p.handshakeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodOptions, scheme+"://"+addr, nil)
	if err != nil {
		return err
	}
	req.URL.Opaque = "*"
	resp, err := cc.RoundTrip(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if cc.Err() != nil {
		return errors.New("connection closed after the first answer")
	}
	return nil
}

// dialTLS opens a TLS connection to u's host, verifying its certificate
// against the pool's roots, and starts HTTP/2 on it when the server chose
// "h2" by ALPN (h2 true); otherwise it closes it and returns h2 false. The
// handshake is bounded by the pool's handshake timeout.
func (p *h2cPool) dialTLS(ctx context.Context, u *url.URL) (*h2client.Conn, bool, error) {
	addr := hostPort(u)
	if p.tls == nil {
		return nil, false, fmt.Errorf("h2c transport: https://%s: the transport has no TLS configuration", addr)
	}
	nc, err := p.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, false, err
	}
	conf := p.tls.Clone()
	conf.ServerName = u.Hostname()
	tc := tls.Client(nc, conf)
	hctx, cancel := context.WithTimeout(ctx, p.handshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		nc.Close()
		var verify *tls.CertificateVerificationError
		var alert tls.AlertError
		if errors.As(err, &verify) || errors.As(err, &alert) || ctx.Err() != nil {
			return nil, false, fmt.Errorf("TLS handshake with %s: %w", addr, err)
		}
		// The connection failed under the handshake (a server restarting):
		// nothing of the request went out, so it may be sent again, as
		// after a failed dial.
		return nil, false, fmt.Errorf("%w: TLS handshake with %s: %w", h2client.ErrNotProcessed, addr, err)
	}
	if tc.ConnectionState().NegotiatedProtocol != httpconf.ALPNHTTP2 {
		tc.Close()
		return nil, false, nil
	}
	cc, err := h2client.NewConn(tc)
	return cc, err == nil, err
}

// CloseIdleConnections closes every connection carrying no request, the
// http1 and tls1 transports' included.
func (p *h2cPool) CloseIdleConnections() {
	if p.http1 != nil {
		p.http1.CloseIdleConnections()
	}
	if p.tls1 != nil && p.tls1 != p.http1 {
		p.tls1.CloseIdleConnections()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// Connections opened ahead of need would be idle: stop them first.
	for _, h := range p.hosts {
		if h.cancelPreopen != nil {
			h.cancelPreopen()
		}
	}
	for p.preopening > 0 {
		p.preopened.Wait()
	}
	for _, h := range p.hosts {
		busy := h.conns[:0]
		for _, cc := range h.conns {
			if cc.InFlight() == 0 {
				cc.Close()
			} else {
				busy = append(busy, cc)
			}
		}
		clear(h.conns[len(busy):])
		h.conns = busy
	}
}

// hostPort is u's host and port, its scheme's default port when it has
// none.
func hostPort(u *url.URL) string {
	port := u.Port()
	switch {
	case port != "":
	case u.Scheme == "https":
		port = "443"
	default:
		port = "80"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// closeBody closes a request body the round tripper will not send, as the
// RoundTripper contract asks.
func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}
