package modelproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gymfleet/gymfleet/pkg/transport/h2client"
	"github.com/gymfleet/gymfleet/pkg/transport/httpclient"
	"github.com/gymfleet/gymfleet/pkg/transport/httpconf"
)

// Values of upstream.protocol.
const (
	// ProtocolAuto finds the protocol out: a prior-knowledge h2c GET of
	// <base_url>/models, then HTTP/1.1 when the server does not speak h2c.
	ProtocolAuto = "auto"
	// ProtocolH2C is HTTP/2 without TLS (fakeinference, our own servers);
	// with an https base_url, HTTP/2 over TLS chosen by ALPN (HTTP/1.1
	// when the server picks it).
	ProtocolH2C = "h2c"
	// ProtocolHTTP1 is HTTP/1.1 (every vLLM), or HTTPS.
	ProtocolHTTP1 = "http1"
)

// Probe bounds: one probe of the upstream, and how long /readyz reuses a
// probe's answer, so a poller never turns into a probe per request. A
// failure is kept shorter, so a fleet coming up waits little past its
// upstream.
const (
	probeTimeout = 3 * time.Second
	readyTTL     = 2 * time.Second
	notReadyTTL  = 250 * time.Millisecond
)

// upstreamConn holds the clients of the upstream and the protocol they
// speak. With protocol auto the protocol is found out lazily, by the first
// model call or readiness check (gymctl polls /readyz while the fleet comes
// up, so in a fleet that is at start-up); an upstream that does not answer
// yet is probed again by the next one, so start-up neither hangs nor fails
// on an upstream still loading.
type upstreamConn struct {
	log  *slog.Logger
	mode string
	// baseURLs and modelsURLs are every worker's; all workers speak the
	// one protocol found out against whichever answers first.
	baseURLs, modelsURLs []string
	apiKey               string
	// http is the process's http: section, for the probes' transports.
	http httpconf.Config

	// The data and cut clients of each protocol; chosen is nil until the
	// protocol is known.
	h2c, http1       *http.Client
	cutH2C, cutHTTP1 *http.Client
	chosen           atomic.Pointer[http.Client]
	chosenCut        atomic.Pointer[http.Client]
	probeMu          sync.Mutex
	// injected: the data client came from Deps and is used as it is.
	injected bool

	readyMu  sync.Mutex
	readyAt  time.Time
	readyErr error
}

func newUpstreamConn(cfg Config, deps Deps, log *slog.Logger) *upstreamConn {
	bases := cfg.Upstream.Workers()
	u := &upstreamConn{log: log, mode: cfg.Upstream.protocol(), baseURLs: bases, apiKey: cfg.Upstream.APIKey, http: cfg.HTTP}
	for _, b := range bases {
		u.modelsURLs = append(u.modelsURLs, b+"/models")
	}
	if deps.Upstream != nil {
		u.h2c, u.http1, u.injected = deps.Upstream, deps.Upstream, true
		u.chosen.Store(deps.Upstream)
	} else {
		if u.mode != ProtocolHTTP1 {
			u.h2c = httpclient.New(httpclient.Options{H2C: true, MaxConnsPerHost: cfg.Upstream.MaxConnsPerHost, HTTP: cfg.HTTP})
		}
		if u.mode != ProtocolH2C {
			u.http1 = httpclient.New(httpclient.Options{MaxConnsPerHost: cfg.Upstream.MaxConnsPerHost, HTTP: cfg.HTTP})
		}
		switch u.mode {
		case ProtocolH2C:
			u.chosen.Store(u.h2c)
		case ProtocolHTTP1:
			u.chosen.Store(u.http1)
		}
	}
	if cfg.Checkpoint.Enabled {
		if deps.Control != nil {
			u.cutH2C, u.cutHTTP1 = deps.Control, deps.Control
		} else {
			u.cutH2C = httpclient.New(httpclient.Options{H2C: true, HTTP: cfg.HTTP})
			u.cutHTTP1 = httpclient.New(httpclient.Options{HTTP: cfg.HTTP})
		}
		if c := u.chosen.Load(); c != nil {
			u.chooseCut(c)
		}
	}
	return u
}

func (u *upstreamConn) chooseCut(data *http.Client) {
	if u.injected {
		// An injected data client says nothing of the protocol: the
		// configuration does.
		if u.mode == ProtocolH2C {
			u.chosenCut.Store(u.cutH2C)
		} else {
			u.chosenCut.Store(u.cutHTTP1)
		}
		return
	}
	if data == u.h2c {
		u.chosenCut.Store(u.cutH2C)
	} else {
		u.chosenCut.Store(u.cutHTTP1)
	}
}

// client is the data client, once the protocol is known; it finds it out
// first with protocol auto.
func (u *upstreamConn) client(ctx context.Context) (*http.Client, error) {
	if c := u.chosen.Load(); c != nil {
		return c, nil
	}
	return u.resolve(ctx)
}

// cutClient is the control client of the worker's generation-cut route,
// speaking the data client's protocol.
func (u *upstreamConn) cutClient(ctx context.Context) (*http.Client, error) {
	if c := u.chosenCut.Load(); c != nil {
		return c, nil
	}
	if _, err := u.resolve(ctx); err != nil {
		return nil, err
	}
	return u.chosenCut.Load(), nil
}

// resolve probes the upstream, h2c first, and keeps the protocol that
// answers. Probes run one at a time; callers waiting meanwhile take its
// result.
func (u *upstreamConn) resolve(ctx context.Context) (*http.Client, error) {
	u.probeMu.Lock()
	defer u.probeMu.Unlock()
	if c := u.chosen.Load(); c != nil {
		return c, nil
	}
	h2cErr := u.probe(ctx, true)
	if h2cErr == nil {
		u.choose(u.h2c, "h2c")
		return u.h2c, nil
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	http1Err := u.probe(ctx, false)
	if http1Err == nil {
		u.choose(u.http1, "HTTP/1.1")
		return u.http1, nil
	}
	return nil, fmt.Errorf("the upstream %s does not answer GET /models over h2c (%v) or HTTP/1.1 (%v); upstream.protocol auto tries again on the next call", strings.Join(u.modelsURLs, ", "), h2cErr, http1Err)
}

func (u *upstreamConn) choose(c *http.Client, name string) {
	u.chosen.Store(c)
	if u.cutH2C != nil {
		u.chooseCut(c)
	}
	u.log.Info("upstream protocol found out", "protocol", name, "base_urls", u.baseURLs)
}

// probe sends GET <base_url>/models over h2c or HTTP/1.1 to each worker
// until one answers: any HTTP answer means the protocol is the server's. It
// goes on a transport of its own, without the data clients' resending of
// unsent requests, so a probe of an upstream that is down fails at once.
func (u *upstreamConn) probe(ctx context.Context, h2c bool) error {
	_, err := u.probeStatus(ctx, h2c)
	return err
}

// probeStatus is the status of the first worker that answers (200 first).
func (u *upstreamConn) probeStatus(ctx context.Context, h2c bool) (int, error) {
	c := u.h2c
	if !u.injected {
		tr := httpclient.NewTransport(httpclient.Options{H2C: h2c, DialTimeout: probeTimeout, HTTP: u.http})
		defer tr.CloseIdleConnections()
		c = &http.Client{Transport: tr}
	}
	status, firstErr := 0, error(nil)
	for _, mu := range u.modelsURLs {
		st, err := u.getModels(ctx, c, mu)
		if err == nil && st == http.StatusOK {
			return st, nil
		}
		if err == nil && status == 0 {
			status = st
		}
		if err != nil && firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	if status != 0 {
		return status, nil
	}
	return 0, firstErr
}

// getModels sends GET modelsURL with a bounded wait and returns its status.
func (u *upstreamConn) getModels(ctx context.Context, c *http.Client, modelsURL string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, modelsURL, nil)
	if err != nil {
		return 0, err
	}
	if u.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+u.apiKey)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp.StatusCode, nil
}

// ready is /readyz's check: a worker answers GET /models with 200. A
// check's answer is reused for readyTTL (notReadyTTL when it failed).
func (u *upstreamConn) ready() error {
	u.readyMu.Lock()
	defer u.readyMu.Unlock()
	ttl := readyTTL
	if u.readyErr != nil {
		ttl = notReadyTTL
	}
	if !u.readyAt.IsZero() && time.Since(u.readyAt) < ttl {
		return u.readyErr
	}
	u.readyErr = u.checkModels(context.Background())
	u.readyAt = time.Now()
	return u.readyErr
}

func (u *upstreamConn) checkModels(ctx context.Context) error {
	c, err := u.client(ctx)
	if err != nil {
		return err
	}
	status, err := u.probeStatus(ctx, c == u.h2c)
	if err != nil {
		return u.explain(ctx, fmt.Errorf("the upstream %s does not answer: %w", strings.Join(u.modelsURLs, ", "), err))
	}
	if status != http.StatusOK {
		return fmt.Errorf("the upstream %s answered %d", strings.Join(u.modelsURLs, ", "), status)
	}
	return nil
}

// explain adds the likely cause to a transport failure when the protocol
// was forced to h2c and the server speaks HTTP/1.1 (every vLLM): h2c
// against HTTP/1.1 fails as "http2: frame too large", which names neither.
func (u *upstreamConn) explain(ctx context.Context, err error) error {
	if u.mode != ProtocolH2C || u.injected || ctx.Err() != nil {
		return err
	}
	if u.probe(ctx, false) != nil {
		return err
	}
	return fmt.Errorf("%w: the upstream speaks HTTP/1.1 but upstream.protocol is h2c (or upstream.h2c is true); set upstream.protocol to auto or http1", err)
}

// h2cMismatch is in the text of an h2c call an HTTP/1.1 server answered.
const h2cMismatch = "frame too large"

// callError explains a failed call the way explain does, for a call that
// failed the way h2c against HTTP/1.1 fails: h2client's ErrHTTP1Server, or
// a first reply read as a frame too large.
func (u *upstreamConn) callError(ctx context.Context, err error) error {
	if err == nil || !(errors.Is(err, h2client.ErrHTTP1Server) || strings.Contains(err.Error(), h2cMismatch)) {
		return err
	}
	return u.explain(ctx, err)
}

// close drops idle connections of every client.
func (u *upstreamConn) close() {
	for _, c := range []*http.Client{u.h2c, u.http1, u.cutH2C, u.cutHTTP1} {
		if c != nil {
			c.CloseIdleConnections()
		}
	}
}
